"""Job arrays' `%N` (`gpuyard submit --array 0-99%10`): at most N tasks of an array are active
(waiting to start, or running) at once; the others wait here, in task order, with reason
`JobArrayTaskLimit`, and come in as tasks of their array leave. No I/O: the job table asks."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

from gpuyard.shared.model import JobRecord

TASK_LIMIT = "JobArrayTaskLimit"
ArrayKey = tuple[str, str]
"""(user, array id): an array's tasks (one user's: nobody else's tasks count against it)."""


def array_key(record: JobRecord) -> ArrayKey | None:
    """The array whose limit the job counts against (None: not a task of a limited array)."""
    array = record.spec.array
    if array is None or array.limit is None:
        return None
    return (record.spec.user, array.array_id or record.job_id)


class ArrayLimits:
    def __init__(self) -> None:
        self.let_in: dict[ArrayKey, set[str]] = {}
        """Per array, the tasks let in (some may have left since: counted when looked at)."""
        self.order: dict[ArrayKey, deque[str]] = {}
        """Per array, the tasks waiting for room, in order (some may have left: skipped)."""
        self.waiting: dict[str, JobRecord] = {}
        """The tasks waiting for room in their array."""

    def admits(self, record: JobRecord, active: Callable[[str], bool]) -> bool:
        """Whether the task may be active now (its array has room, or it is no limited array's);
        if not, it waits here."""
        key = array_key(record)
        if key is None:
            return True
        assert record.spec.array is not None and record.spec.array.limit is not None
        live = self._live(key, active)
        if len(live) < record.spec.array.limit:
            self.let_in[key] = live | {record.job_id}
            return True
        self.waiting[record.job_id] = record
        self.order.setdefault(key, deque()).append(record.job_id)
        return False

    def counted(self, record: JobRecord) -> None:
        """An active task, taken back after a restart: it holds its place in its array."""
        if (key := array_key(record)) is not None:
            self.let_in.setdefault(key, set()).add(record.job_id)

    def leave(self, job_id: str) -> None:
        """A waiting task left (it ended)."""
        self.waiting.pop(job_id, None)

    def next_in(self, record: JobRecord, active: Callable[[str], bool]) -> list[JobRecord]:
        """A task of `record`'s array left the active ones: the waiting tasks there is room for
        now (they leave this waiting list; the table lets them in)."""
        key = array_key(record)
        order = self.order.get(key) if key is not None else None
        if key is None or not order:
            return []
        assert record.spec.array is not None and record.spec.array.limit is not None
        room = record.spec.array.limit - len(self._live(key, active))
        found: list[JobRecord] = []
        while order and len(found) < room:
            task = self.waiting.pop(order.popleft(), None)
            if task is not None:
                found.append(task)
        if not order:
            del self.order[key]
        return found

    def records(self) -> Iterator[JobRecord]:
        yield from self.waiting.values()

    def _live(self, key: ArrayKey, active: Callable[[str], bool]) -> set[str]:
        """The array's tasks let in that are still active (an array none is: forgotten)."""
        live = {j for j in self.let_in.pop(key, ()) if active(j)}
        if live:
            self.let_in[key] = live
        return live
