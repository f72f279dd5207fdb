"""The run's timeline (cluster counts at every instant the clock visited), kept as columns.

A million-job replay visits millions of instants: a `TimelinePoint` object per instant would hold
some 250 bytes each, five numbers in typed arrays hold 40. Points are made when they are served.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

from gpuyard.shared.contract import TimelinePoint


class Timeline:
    def __init__(self) -> None:
        self._time = array("d")
        self._counts = [array("q") for _ in range(4)]  # busy GPUs, queued, running, GPUs

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

    def _point(self, i: int) -> TimelinePoint:
        busy, queued, running, gpus = (column[i] for column in self._counts)
        return TimelinePoint(self._time[i], busy, queued, running, gpus)


def _counts(point: TimelinePoint) -> tuple[int, int, int, int]:
    return point.busy_gpus, point.queued, point.running, point.gpus
