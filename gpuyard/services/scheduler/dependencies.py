"""Jobs that wait for others (`JobSpec.depends_on`, Slurm's `--dependency`): which do, on whom,
and what each job's start or end decides for them. No I/O: the job table acts on the answers
(a job whose dependencies hold joins the queue; one whose can no longer hold is cancelled).

A dependency is looked at again only when a job it names starts or ends: what changes, not
every waiting job at every decision."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

from gpuyard.shared.model import DependencyKind, JobRecord, JobState, parse_dependency

Verdict = Literal["holds", "waits", "never"]
NEVER_SATISFIED = "DependencyNeverSatisfied"
WAITING = "Dependency"


def verdict(kind: DependencyKind, state: JobState | None, started: bool) -> Verdict:
    """One dependency on a job now in `state` (None: not here yet, or unknown), started or not."""
    ended = state is not None and state not in ("queued", "running")
    if kind == "after":
        return "holds" if started or ended else "waits"
    if not ended:
        return "waits"
    if kind in ("afterany", "singleton"):
        return "holds"
    if kind == "afterok":
        return "holds" if state == "completed" else "never"
    return "never" if state == "completed" else "holds"  # afternotok


class Dependencies:
    """The jobs waiting for others, and who waits on whom."""

    def __init__(self) -> None:
        self.blocked: dict[str, JobRecord] = {}
        """Waiting jobs whose dependencies do not hold yet (not active: no decision starts them)."""
        self.waiting_on: dict[str, set[str]] = {}
        """A job -> the blocked jobs that wait for it to start or end."""
        self.outcomes: dict[str, JobState] = {}
        """How jobs that left the table's memory ended (a later job may name them)."""
        self.needs: dict[str, list[tuple[DependencyKind, str]]] = {}
        """A blocked job's dependencies, one job each (a singleton's: on the jobs before it)."""

    def of(
        self, record: JobRecord, others: Callable[[], Iterable[JobRecord]]
    ) -> list[tuple[DependencyKind, str]]:
        """`record`'s dependencies, one job each: a singleton waits for every job before it of
        the same user and name that has not ended (`others`: the jobs not ended)."""
        found: list[tuple[DependencyKind, str]] = []
        for kind, jobs in parse_dependency(record.spec.depends_on):
            if kind == "singleton":
                spec = record.spec
                jobs = [
                    r.job_id for r in others()
                    if r.seq < record.seq and r.spec.user == spec.user and r.spec.name == spec.name
                ]  # fmt: skip
            found += [(kind, job) for job in jobs]
        return found

    def judge(
        self, needs: list[tuple[DependencyKind, str]], lookup: Callable[[str], JobRecord | None]
    ) -> tuple[Verdict, list[str]]:
        """Whether every dependency holds, one never can, or some wait (and for whom)."""
        waits: list[str] = []
        for kind, job_id in needs:
            record = lookup(job_id)
            if record is not None:
                v = verdict(kind, record.state, record.first_start is not None)
            else:
                state = self.outcomes.get(job_id)
                v = verdict(kind, state, state is not None)
            if v == "never":
                return "never", []
            if v == "waits":
                waits.append(job_id)
        return ("waits", waits) if waits else ("holds", [])

    def block(self, record: JobRecord, needs: list[tuple[DependencyKind, str]],
              waits: list[str]) -> None:  # fmt: skip
        self.blocked[record.job_id] = record
        self.needs[record.job_id] = needs
        for job_id in waits:
            self.waiting_on.setdefault(job_id, set()).add(record.job_id)

    def unblock(self, job_id: str) -> None:
        self.blocked.pop(job_id, None)
        self.needs.pop(job_id, None)

    def waiting_for(self, job_id: str) -> list[JobRecord]:
        """The blocked jobs that wait for `job_id` (which started or ended), in admission order:
        each is judged again (and waits again, if it still does)."""
        waiting = self.waiting_on.pop(job_id, set())
        return sorted((self.blocked[j] for j in waiting if j in self.blocked), key=lambda r: r.seq)
