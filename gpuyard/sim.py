"""One simulation run: start the services on a NATS server, replay the workload through the
simclock, collect the results over NATS, write them."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import msgspec
from msgspec import Struct

from gpuyard.embedded import EmbeddedNats
from gpuyard.launcher import ServiceSet
from gpuyard.report import write_results
from gpuyard.services.simclock.service import SimClockConfig, write_workload
from gpuyard.shared.bus import Bus, connect
from gpuyard.shared.contract import (
    Ack,
    JobRecord,
    JobsPage,
    PageQuery,
    Progress,
    RunRequest,
    Subjects,
    TimelinePage,
    TimelinePoint,
)
from gpuyard.shared.model import ClusterSpec, JobSpec


class SimOptions(Struct, kw_only=True, forbid_unknown_fields=True):
    """Everything that determines a simulation's results (plus where to write them)."""

    cluster: ClusterSpec
    policy: str = "fifo"
    policy_params: dict[str, Any] = {}
    admission: str = "accept-all"
    admission_params: dict[str, Any] = {}
    placement: str = "consolidated"
    placement_params: dict[str, Any] = {}
    round_s: float = 300.0
    mode: Literal["rounds", "events"] = "events"
    blox: bool = False
    """Blox's simulator semantics: jobs are admitted and seen finished only at round starts."""
    gpu_speed: dict[str, float] = {}


class SimResult(Struct, kw_only=True):
    summary: dict[str, Any]
    jobs: list[JobRecord]
    timeline: list[TimelinePoint]
    wall_s: float


def service_configs(options: SimOptions, workload_path: Path) -> dict[str, Any]:
    # Imported here: the configs belong to their services, and only the launcher needs them all.
    from gpuyard.services.admission.service import AdmissionConfig
    from gpuyard.services.placement.service import PlacementConfig
    from gpuyard.services.scheduler.service import SchedulerConfig

    return {
        "placement": PlacementConfig(policy=options.placement, params=options.placement_params),
        "scheduler": SchedulerConfig(
            policy=options.policy, params=options.policy_params, round_s=options.round_s,
            mode=options.mode,
        ),  # fmt: skip
        "admission": AdmissionConfig(policy=options.admission, params=options.admission_params),
        "simclock": SimClockConfig(
            workload=str(workload_path), cluster=options.cluster, gpu_speed=options.gpu_speed,
            completion_quantum=options.round_s if options.blox else None,
            arrival_quantum=options.round_s if options.blox else None,
        ),  # fmt: skip
    }


async def fetch_pages(bus: Bus, subject: str, reply_type: type[Any], field: str) -> list[Any]:
    items: list[Any] = []
    while True:
        page = await bus.request(subject, PageQuery(offset=len(items)), reply_type)
        batch = getattr(page, field)
        items += batch
        if not batch or len(items) >= page.total:
            return items


async def simulate(
    options: SimOptions,
    jobs: list[JobSpec],
    out: Path,
    *,
    nats_url: str | None = None,
    cluster_name: str = "sim",
    processes: bool = False,
    on_progress: Callable[[Progress], None] | None = None,
    log_level: str = "warning",
) -> SimResult:
    """Run one simulation and write its results into `out`. Without `nats_url`, on a private server."""
    out.mkdir(parents=True, exist_ok=True)
    workload_path = out / "workload.jsonl"
    write_workload(jobs, workload_path)
    (out / "options.json").write_bytes(msgspec.json.format(msgspec.json.encode(options)))
    started = time.perf_counter()
    async with contextlib.AsyncExitStack() as stack:
        url = nats_url or await stack.enter_async_context(EmbeddedNats())
        subjects = Subjects(cluster_name)
        services = ServiceSet(
            url, cluster_name, service_configs(options, workload_path), processes=processes,
            log_file=out / "services.log", log_level=log_level,
        )  # fmt: skip
        await stack.enter_async_context(services)
        nc = await connect(url, name=f"gpuyard-sim-{cluster_name}")
        bus = Bus(nc, subjects)
        stack.push_async_callback(bus.close)
        finished: asyncio.Future[Progress] = asyncio.get_running_loop().create_future()
        decoder = msgspec.json.Decoder(Progress)

        async def on_progress_msg(msg: Any) -> None:
            progress = decoder.decode(msg.data)
            if on_progress is not None:
                on_progress(progress)
            if progress.done and not finished.done():
                finished.set_result(progress)

        await nc.subscribe(subjects.progress, cb=on_progress_msg)
        await bus.request(f"{subjects.clock}.run", RunRequest(), Ack)
        final = await finished
        if final.error:
            raise RuntimeError(f"simulation {cluster_name!r} failed: {final.error}")
        records = await fetch_pages(bus, f"{subjects.scheduler}.jobs", JobsPage, "jobs")
        points = await fetch_pages(bus, f"{subjects.clock}.timeline", TimelinePage, "points")
    wall = time.perf_counter() - started
    summary = write_results(
        records, points, options.cluster.total_gpus, out,
        extra={"policy": options.policy, "simulated_s": final.now, "instants": final.instants,
               "wall_s": round(wall, 3)},
    )  # fmt: skip
    return SimResult(summary=summary, jobs=records, timeline=points, wall_s=wall)


class ProgressBar:
    """One line, redrawn in place on a terminal; a line every few seconds otherwise."""

    def __init__(self, label: str, stream: Any = sys.stderr) -> None:
        self.label = label
        self.stream = stream
        self.tty = stream.isatty()
        self.last = 0.0

    def __call__(self, p: Progress) -> None:
        now = time.monotonic()
        if not (p.done or self.tty or now - self.last >= 5):
            return
        self.last = now
        frac = p.finished / p.total if p.total else 1.0
        bar = "#" * int(30 * frac)
        line = (
            f"{self.label} [{bar:<30}] {p.finished}/{p.total} jobs  "
            f"t={p.now / 3600:,.1f} h  {p.instants} instants"
        )
        end = "\n" if p.done or not self.tty else "\r"
        print(line, end=end, file=self.stream, flush=True)


def poisson_workload(
    n_jobs: int, jobs_per_hour: float, seed: int, gpu_demand: dict[int, float] | None = None
) -> list[JobSpec]:
    """The Blox/Gavel synthetic workload: Poisson arrivals at `jobs_per_hour`; durations 80%
    60·10^U(1.5,3) s and 20% 60·10^U(3,4) s; GPU demand drawn from `gpu_demand` ({gpus: weight})."""
    import numpy as np

    demand = gpu_demand or {1: 1.0}
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(3600.0 / jobs_per_hour, n_jobs)
    arrivals = np.cumsum(gaps) - gaps[0]
    long = rng.random(n_jobs) < 0.2
    exponent = np.where(long, rng.uniform(3, 4, n_jobs), rng.uniform(1.5, 3, n_jobs))
    durations = 60 * 10**exponent
    sizes = list(demand)
    weights = np.array([demand[s] for s in sizes], dtype=float)
    gpus = rng.choice(sizes, size=n_jobs, p=weights / weights.sum())
    return [
        JobSpec(
            job_id=f"j{i}", num_gpus=int(gpus[i]), duration=float(durations[i]),
            submit_time=float(arrivals[i]),
        )  # fmt: skip
        for i in range(n_jobs)
    ]
