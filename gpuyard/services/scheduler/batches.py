"""Adaptive batch sizes on a real cluster (Pollux's co-adaptive jobs): the scheduler fits each
job's goodput model to what the job measured, as Pollux's agent does inside the job, and chooses
the batch each launch trains with.

A real adaptive job (`JobSpec.adaptive_batch`) reports its step times by configuration and its
gradient statistics through `gpuyard.jobclient`; its node agent forwards rank 0's in its
heartbeats, and placement hands them over with each apply's progress (`StepsReport.profile`).
Here they are merged per job (a configuration's latest measurement replaces the one before:
each run reports only its own), the step-time model refitted when a configuration is new or its
times moved (`fit_goodput_hints`, in a worker thread: a fit takes tens of milliseconds), and the
hints stored in `JobRecord.goodput`, where a goodput-aware policy reads them as in a simulation.
Where the scheduler was given its models' profiles (`SchedulerConfig.goodput_profiles`), a job's
fit takes its model's profiled step times where it has not measured its own (the prior), else
its observations alone. The merged measurements live in memory: a restarted scheduler keeps the
hints it stored and refits from what the jobs report from then on.

At each launch of an adaptive job the scheduler gives it the batch (`BatchChoice`) that
maximises its goodput on its allocation (`choose_batch`), or, before it has hints, its
`batch_size` split over its GPUs; placement passes it in the launch and the agent in the job's
environment.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from gpuyard.shared.contract import BatchChoice, ClusterInfo
from gpuyard.shared.goodput import (
    choose_batch,
    fit_goodput_hints,
    load_applications,
    profile_grad_params,
)
from gpuyard.shared.model import (
    ACTIVE_STATES,
    ANY_GPU,
    PROFILE_MAX_CONFIGS,
    Allocation,
    GoodputProfile,
    JobRecord,
    StepTimes,
)

from .jobs import JobTable

REFIT_CHANGE = 0.05
"""A configuration's step time that moved by more than this fraction since the last fit refits
(and gradient statistics that moved so much replace the hints' own)."""

Config = tuple[int, int, int]
"""(nodes, replicas, per-GPU batch)."""


class AdaptiveBatches:
    """The adaptive jobs' measurements, fits and batch choices (module docstring)."""

    def __init__(self, table: JobTable, log: Any) -> None:
        self.table = table
        self.log = log
        self.times: dict[str, dict[Config, StepTimes]] = {}
        """Per job: its latest step times at each configuration (the latest last)."""
        self.latest: dict[str, GoodputProfile] = {}
        """Per job: its measurements merged, as its latest report left them."""
        self.fitted: dict[str, GoodputProfile] = {}
        """Per job: the measurements its last fit saw."""
        self.fits: dict[str, asyncio.Task[None]] = {}
        self.said: dict[str, list[str]] = {}
        """Per job: the problems last logged of its measurements (each said once)."""
        self.chosen: dict[str, BatchChoice] = {}
        """The batches of the allocations last applied, by job."""
        self.priors: dict[str, list[StepTimes]] = {}
        """Per model (job type): its profiled step times, the prior of its jobs' fits."""

    # ------------------------------------------------------------------ measurements

    def observe(self, record: JobRecord, profile: GoodputProfile) -> None:
        """A job's measurements as its latest report tells them: merged, then fitted (in the
        background) if they changed enough; otherwise its hints take the new gradient
        statistics at once (no fit) where they moved by more than `REFIT_CHANGE`."""
        job_id = record.job_id
        init = record.spec.batch_size
        if init is None or record.spec.adaptive_batch is None:
            self._say(job_id, ["goodput measurements of a job without adaptive_batch: ignored"])
            return
        self.said.setdefault(job_id, [])
        times = self.times.setdefault(job_id, {})
        for t in profile.times:
            key = (t.num_nodes, t.num_replicas, t.local_bsz)
            times.pop(key, None)
            times[key] = t
        while len(times) > PROFILE_MAX_CONFIGS:
            del times[next(iter(times))]
        merged = GoodputProfile(
            times=list(times.values()), grad_sqr=profile.grad_sqr, grad_var=profile.grad_var,
            batch_size=profile.batch_size,
        )  # fmt: skip
        self.latest[job_id] = merged
        if self._due(record, merged):
            if job_id not in self.fits:
                self.fits[job_id] = asyncio.create_task(self._fit(job_id))
            return
        if record.goodput is None or job_id in self.fits:
            return
        problems: list[str] = []
        grad = profile_grad_params(merged, init, problems)
        if problems:
            self._say(job_id, problems)
        told = record.goodput
        if grad is not None and (
            _apart(told.grad_sqr, grad.sqr) or _apart(told.grad_var, grad.var)
        ):
            hints = msgspec.structs.replace(
                told, grad_sqr=grad.sqr, grad_var=grad.var, batch_size=merged.batch_size
            )
            self.table.told_goodput(record, hints)

    def _due(self, record: JobRecord, merged: GoodputProfile) -> bool:
        """Whether the measurements need a fit: they have gradient statistics and step times,
        and, since the last fit, a configuration is new or its times moved by more than
        `REFIT_CHANGE` (or, while the job has no hints, its gradient statistics did)."""
        if merged.grad_sqr is None or merged.grad_var is None or not merged.times:
            return False
        last = self.fitted.get(record.job_id)
        if last is None:
            return True
        if record.goodput is None and (  # (the last fit gave none: its gradients may now do)
            last.batch_size != merged.batch_size
            or _apart(last.grad_sqr or 0.0, merged.grad_sqr)
            or _apart(last.grad_var or 0.0, merged.grad_var)
        ):
            return True
        seen = {(t.num_nodes, t.num_replicas, t.local_bsz): t for t in last.times}
        for t in merged.times:
            before = seen.get((t.num_nodes, t.num_replicas, t.local_bsz))
            if before is None or _apart(before.optim_s, t.optim_s) or _apart(
                before.optim_s - before.sync_s, t.optim_s - t.sync_s
            ) or _apart(before.accum_s, t.accum_s):  # fmt: skip
                return True
        return False

    async def _fit(self, job_id: str) -> None:
        """Fit the job's latest measurements; again while newer ones that need it came
        meanwhile."""
        try:
            while (profile := self.latest.get(job_id)) is not None:
                record = self.table.get(job_id)
                if record is None or record.spec.batch_size is None:
                    return
                try:
                    prior = self.priors.get(record.spec.job_type, ())
                    hints, problems = await asyncio.to_thread(
                        fit_goodput_hints, profile, record.spec.batch_size, prior
                    )
                except Exception as exc:  # (a numerical failure must not stop the scheduler)
                    hints, problems = None, [f"the fit failed: {type(exc).__name__}: {exc}"]
                self._say(job_id, problems)
                self.fitted[job_id] = profile
                record = self.table.get(job_id)
                if hints is not None and record is not None and record.state in ACTIVE_STATES:
                    self.table.told_goodput(record, hints)
                    self.log.info(
                        "goodput.fitted", job_id=job_id, configs=len(profile.times),
                        perf=[float(f"{v:.6g}") for v in hints.perf], batch_size=hints.batch_size,
                    )  # fmt: skip
                latest = self.latest.get(job_id)
                if record is None or latest is None or not self._due(record, latest):
                    return
        finally:
            self.fits.pop(job_id, None)

    def _say(self, job_id: str, problems: list[str]) -> None:
        """Log what was left out of a job's measurements, once (not at every report)."""
        if problems and self.said.get(job_id) != problems:
            self.log.warning("goodput.observations_ignored", job_id=job_id, problems=problems)
        self.said[job_id] = problems

    def forget(self, keep: Iterable[str]) -> None:
        """Drop what is kept of jobs not in `keep` (they ended). (`said` has every job with
        something kept: every report's measurements are judged.)"""
        kept = set(keep)
        for held in (self.times, self.latest, self.fitted, self.said):
            for job_id in [j for j in held if j not in kept]:
                del held[job_id]

    def close(self) -> None:
        for task in self.fits.values():
            task.cancel()

    # ------------------------------------------------------------------ launches

    def choose(
        self, allocations: list[Allocation], active: dict[str, JobRecord], cluster: ClusterInfo
    ) -> dict[str, BatchChoice]:
        """The batch each allocated adaptive job trains with if launched now: on its GPUs, over
        the nodes its layout names (else as few as its GPUs fit on)."""
        chosen: dict[str, BatchChoice] = {}
        per_node: dict[str, int] = {}  # the most GPUs of a node, by type (made when needed)
        for a in allocations:
            record = active.get(a.job_id)
            if record is None or (limits := record.spec.adaptive_batch) is None:
                continue
            assert record.spec.batch_size is not None  # (JobSpec checks it)
            if not per_node:
                for node in cluster.nodes:
                    for kind in (node.gpu_type, ANY_GPU):
                        per_node[kind] = max(per_node.get(kind, 0), node.num_gpus)
            replicas = max(a.num_gpus, 1)
            widest = per_node.get(a.gpu_type, 0) or per_node.get(ANY_GPU, 0) or replicas
            nodes = len(a.layout) if a.layout else math.ceil(replicas / widest)
            batch, local_bsz, accum_steps = choose_batch(
                record.goodput, record.spec.batch_size, limits.max_batch_size,
                limits.atomic_range(), min(max(nodes, 1), replicas), replicas,
            )  # fmt: skip
            chosen[a.job_id] = BatchChoice(batch, local_bsz, accum_steps)
        self.chosen = chosen
        return chosen


def profiled_times(folder: str | Path) -> dict[str, list[StepTimes]]:
    """Each profiled model's step times (`Application.profiled_times`), from a folder of
    Pollux's profiles; ValueError naming what is wrong with it."""
    return {name: app.profiled_times() for name, app in load_applications(Path(folder)).items()}


def _apart(before: float, now: float) -> bool:
    return abs(now - before) > REFIT_CHANGE * max(abs(before), 1e-12)
