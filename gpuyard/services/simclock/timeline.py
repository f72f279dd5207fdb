"""The run's timeline (cluster counts at every instant the clock visited), kept as columns, and
with queues the GPUs each queue's jobs hold, kept as their changes.

A million-job replay visits millions of instants: a `TimelinePoint` object per instant would hold
some 250 bytes each, five numbers in typed arrays hold 40. Points are made when they are served.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable

import numpy as np

from gpuyard.services.simclock.config import QueueMap
from gpuyard.shared.contract import QueueGpus, TimelinePoint

QUEUE_ROWS_PER_PAGE = 20_000
"""At most this many queue rows in a page (a page then has fewer points): a message stays well
under a server's payload limit however many queues change at each instant."""


class QueueChanges:
    """The GPUs each queue's jobs hold over time, as the simulated nodes change: every part of a
    job that starts or stops adds or takes its GPUs to or from its queue's count (a GPU that two
    jobs share counts for each). A change costs an entry; an instant at which none happens, none
    (a count of every queue at every instant would be millions of rows that mostly repeat).

    Changes may come out of time order (the exits the scheduler went on through are taken after
    the launches it decided beyond them): the series is made from them in time order when it is
    served."""

    def __init__(self, queues: QueueMap) -> None:
        self.names = list(queues.names)
        index = {name: i for i, name in enumerate(self.names)}
        self._of_user = {user: index[q] for user, q in queues.users.items() if q in index}
        self._default = index.get(queues.default_queue, -1)
        self._time = array("d")
        self._queue = array("q")
        self._delta = array("q")
        self._series: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self._time)

    def index_of(self, user: str) -> int:
        """The index of the queue of `user`'s jobs (-1: none)."""
        return self._of_user.get(user, self._default)

    def change(self, time: float, queue: int, gpus: int) -> None:
        """Queue number `queue`'s jobs hold `gpus` more (fewer, if negative) from `time` on."""
        if queue >= 0 and gpus:
            self._time.append(time)
            self._queue.append(queue)
            self._delta.append(gpus)
            self._series = None

    def series(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(time, queue index, GPUs held from then on): a row where a queue's count changed, by
        time then queue (made once for the changes so far)."""
        if self._series is not None:
            return self._series
        time, queue, delta = np.array(self._time), np.array(self._queue), np.array(self._delta)
        if not len(time):
            self._series = (time, queue, delta)
            return self._series
        order = np.lexsort((queue, time))
        time, queue, delta = time[order], queue[order], delta[order]
        # One row per (time, queue): its net change (a job restarted on other GPUs: none).
        first = np.flatnonzero(np.r_[True, (time[1:] != time[:-1]) | (queue[1:] != queue[:-1])])
        net = np.add.reduceat(delta, first)
        time, queue = time[first], queue[first]
        # Each queue's running sum of its changes, in time order (a stable sort keeps it).
        by_queue = np.argsort(queue, kind="stable")
        summed = np.cumsum(net[by_queue])
        grouped = queue[by_queue]
        starts = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])
        before = summed[starts] - net[by_queue][starts]  # (the sum of the queues before it)
        gpus = np.empty_like(summed)
        gpus[by_queue] = summed - np.repeat(before, np.diff(np.r_[starts, len(grouped)]))
        kept = net != 0
        self._series = (time[kept], queue[kept], gpus[kept])
        return self._series

    def between(self, start: float, end: float) -> tuple[int, int]:
        """The rows of `series` from `start` (included) to `end` (not), as an index range."""
        time = self.series()[0]
        first, last = np.searchsorted(time, [start, end], side="left")
        return int(first), int(last)

    def rows(self, first: int, last: int) -> list[QueueGpus]:
        time, queue, gpus = (column[first:last].tolist() for column in self.series())
        names = self.names
        return [QueueGpus(t, names[q], g) for t, q, g in zip(time, queue, gpus, strict=True)]


class Timeline:
    def __init__(self, queues: QueueChanges | None = None) -> None:
        self._time = array("d")
        self._counts = [array("q") for _ in range(4)]  # busy GPUs, queued, running, GPUs
        self.queues = queues

    def __len__(self) -> int:
        return len(self._time)

    def last(self) -> TimelinePoint | None:
        return self._point(len(self._time) - 1) if self._time else None

    def put(self, point: TimelinePoint) -> None:
        """The point at its time: the last one again if it is at the same time, else a new one."""
        values = (point.busy_gpus, point.queued, point.running, point.gpus)
        if self._time and self._time[-1] == point.time:
            for column, value in zip(self._counts, values, strict=True):
                column[-1] = value
            return
        self._time.append(point.time)
        for column, value in zip(self._counts, values, strict=True):
            column.append(value)

    def insert(self, at: int, points: Iterable[TimelinePoint]) -> None:
        """`points`, in order, before the point at index `at`."""
        points = list(points)
        self._time[at:at] = array("d", (p.time for p in points))
        for i, column in enumerate(self._counts):
            column[at:at] = array("q", (_counts(p)[i] for p in points))

    def page(self, offset: int, limit: int) -> list[TimelinePoint]:
        return [self._point(i) for i in range(offset, min(offset + limit, len(self._time)))]

    def queue_page(self, offset: int, limit: int) -> tuple[int, list[QueueGpus]]:
        """The queue rows that go with the page of points from `offset`, and how many points it
        then holds (`limit`, or fewer to keep to `QUEUE_ROWS_PER_PAGE`). A page has the rows
        from its first point's time to the next page's first point's (the first page's from
        the start, the last's to the end): its pages in turn give every row once."""
        changes, time = self.queues, self._time
        if changes is None:
            return limit, []
        start = -math.inf if offset == 0 else time[offset] if offset < len(time) else math.inf

        def span(points: int) -> tuple[int, int]:
            end = offset + points
            return changes.between(start, time[end] if end < len(time) else math.inf)

        first, last = span(limit)
        while last - first > QUEUE_ROWS_PER_PAGE and limit > 1:
            limit //= 2
            first, last = span(limit)
        return limit, changes.rows(first, last)

    def _point(self, i: int) -> TimelinePoint:
        busy, queued, running, gpus = (column[i] for column in self._counts)
        return TimelinePoint(self._time[i], busy, queued, running, gpus)


def _counts(point: TimelinePoint) -> tuple[int, int, int, int]:
    return point.busy_gpus, point.queued, point.running, point.gpus
