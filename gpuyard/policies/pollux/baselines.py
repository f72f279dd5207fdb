"""The baselines of Pollux's artifact (OSDI '21, `simulator/optimus.py`, `simulator/tiresias.py`),
as its simulator runs them on its workloads: Optimus+Oracle and Tiresias+TunedJobs.

Both decide every round over the active jobs in arrival order, and list their allocations in the
order the artifact places them (with the `most-free` placement, the nodes with the most free
GPUs first): the GPUs a job gets, and so its throughput, are the artifact's.
"""

from __future__ import annotations

import math

from msgspec import Struct

from gpuyard.shared.goodput import Application
from gpuyard.shared.model import Allocation, JobSpec
from gpuyard.shared.policy import JobView, SchedulingInput, SchedulingPolicy

from .profiles import UsesProfiles

GPUS_PER_NODE = 4
"""The artifact's nodes (Optimus predicts a job's step time on nodes of 4 GPUs, filled in turn)."""


class PolluxOptimus(UsesProfiles):
    """Optimus+Oracle (Pollux's artifact): every job gets one GPU (in arrival order, while there
    are GPUs), then each free GPU goes to the job whose predicted time left drops most with one
    more (step time with n GPUs minus with n + 1, times its iterations left), up to its batch
    size over the model's smallest per-GPU batch (ncf: 1 GPU). An oracle: step times and
    iterations left come from the model's profile, at the job's batch size (`JobSpec.batch_size`)
    and epoch (from its progress). Registry name `pollux-optimus`; `--pollux --policy optimus`."""

    def schedule(self, inp: SchedulingInput) -> list[Allocation]:
        apps = self.apps
        jobs = list(inp.jobs)
        by_id = {j.job_id: j for j in jobs}
        remaining = {j.job_id: _iterations_left(apps[j.spec.job_type], j) for j in jobs}
        free = inp.cluster.total_gpus
        replicas: dict[str, int] = {}
        gain: dict[str, float] = {}
        for job in jobs:  # (the artifact sorts by its minimum, 1 for every job: arrival order)
            key = job.job_id
            if free < 1:
                replicas[key], gain[key] = 0, 0.0
                continue
            replicas[key] = 1
            free -= 1
            gain[key] = self._gain(job, apps, 1, remaining[key], free)
        while free > 0 and gain and max(gain.values()) > 0:
            key = max(gain, key=gain.__getitem__)  # (the first of the best, in arrival order)
            job = by_id[key]
            replicas[key] += 1
            # (the artifact checks the GPUs left before taking this one: never fewer than 1 here)
            gain[key] = self._gain(job, apps, replicas[key], remaining[key], free)
            free -= 1
        order = sorted(jobs, key=lambda j: replicas[j.job_id])  # stable: arrival order
        return [Allocation(j.job_id, replicas[j.job_id]) for j in order if replicas[j.job_id]]

    def next_decision_time(self, inp: SchedulingInput) -> float | None:
        return inp.now + inp.cluster.round_s if inp.jobs else None

    def gpu_range(self, app: Application, spec: JobSpec) -> tuple[int, int]:
        assert spec.batch_size is not None  # (`accepts`)
        return 1, 1 if app.name == "ncf" else max(spec.batch_size // app.min_local_bsz, 1)

    @staticmethod
    def _gain(
        job: JobView, apps: dict[str, Application], n: int, remaining: float, free: int
    ) -> float:
        app = apps[job.spec.job_type]
        if n + 1 > job.spec.gpu_range[1] or free < 1:  # (`gpu_range`, as `accepts` set it)
            return 0.0
        return (step_time(app, job, n) - step_time(app, job, n + 1)) * remaining


def _iterations_left(app: Application, job: JobView) -> float:
    """Iterations from the job's epoch to the one it completes at, at its batch size (1 once it
    is there)."""
    assert job.spec.batch_size is not None
    batch = job.spec.batch_size
    epoch = app.epoch_of(job.steps_done)
    last = app.completion_epoch(batch)
    if last <= epoch:
        return 1.0
    return app.iterations(batch, last) - app.iterations(batch, epoch)


def step_time(app: Application, job: JobView, replicas: int) -> float:
    """Optimus+Oracle's step time of `job` on `replicas` GPUs: its batch size split over them
    (accumulating gradients where a GPU's share exceeds the model's largest per-GPU batch, at
    least once on one GPU), on nodes of 4 GPUs filled in turn, from the model's profile."""
    assert job.spec.batch_size is not None
    placement = (GPUS_PER_NODE,) * (replicas // GPUS_PER_NODE)
    if replicas % GPUS_PER_NODE:
        placement += (replicas % GPUS_PER_NODE,)
    local = math.ceil(job.spec.batch_size / replicas - 1e-8)
    accum = math.ceil(local / app.max_local_bsz - 1e-8) - 1
    if replicas == 1:
        accum = max(1, accum)
    atomic = math.ceil(local / (accum + 1) - 1e-8)
    atomic = min(atomic, int(app.max_batch_size / (replicas * (accum + 1))))
    step, sync = app.throughput(placement, atomic)
    return step + (step - sync) * accum


class TiresiasTunedState(Struct, kw_only=True):
    """The artifact's Tiresias: its two queues (in the order jobs entered them), the jobs it
    last set running, and each job's running seconds and when they were last counted."""

    queues: tuple[list[str], list[str]] = ([], [])
    running: list[str] = []
    executed: dict[str, int] = {}
    checked: dict[str, int] = {}


TIRESIAS_THRESHOLD_GPU_S = 16 * 3600
"""The artifact's one queue limit: 16 GPU-hours of running (seconds run times GPUs asked)."""


class PolluxTiresias(SchedulingPolicy):
    """Tiresias+TunedJobs (Pollux's artifact): each job runs on the GPUs and batch size its user
    asked for (the workload's `num_replicas`, `batch_size`), two queues, a job moving to the
    second once its running seconds times its GPUs reach 16 hours; queues in order, each in the
    order jobs entered it, a job that does not fit skipped (no starvation prevention: the
    artifact's `solve_starvation` is 0). Seconds are counted at each decision, as whole seconds,
    from the decision that set the job running. Registry name `pollux-tiresias`;
    `--pollux --policy tiresias`."""

    State = TiresiasTunedState

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        self.state = TiresiasTunedState()

    def snapshot(self) -> TiresiasTunedState:
        return self.state

    def restore(self, state: TiresiasTunedState) -> None:
        self.state = state

    def schedule(self, inp: SchedulingInput) -> list[Allocation]:
        now = int(inp.now)
        jobs = {j.job_id: j for j in inp.jobs}
        state = self.state
        first = [k for k in state.queues[0] if k in jobs]
        second = [k for k in state.queues[1] if k in jobs]
        running = {k for k in state.running if k in jobs}
        executed = {k: v for k, v in state.executed.items() if k in jobs}
        checked = {k: v for k, v in state.checked.items() if k in jobs}
        queued = set(first) | set(second)
        first += [k for k in jobs if k not in queued]  # (new jobs wait in the first queue)
        for key, job in jobs.items():
            if key in running:
                executed[key] = executed.get(key, 0) + int(now - checked.get(key, 0))
                if key in first and executed[key] * job.spec.num_gpus >= TIRESIAS_THRESHOLD_GPU_S:
                    first.remove(key)
                    second.append(key)
            checked[key] = now
        free = inp.cluster.total_gpus
        running = set()
        for key in (*first, *second):
            if jobs[key].spec.num_gpus <= free:
                running.add(key)
                free -= jobs[key].spec.num_gpus
        self.state = TiresiasTunedState(
            queues=(first, second), running=[k for k in jobs if k in running],
            executed=executed, checked=checked,
        )  # fmt: skip
        return [Allocation(k, jobs[k].spec.num_gpus) for k in (*first, *second) if k in running]

    def next_decision_time(self, inp: SchedulingInput) -> float | None:
        return inp.now + inp.cluster.round_s if inp.jobs else None
