"""Kueue's scheduler performance test (bench/bench_kueue.py's shape) at a tenth of its jobs on a
real cluster: the control plane in processes of their own under `kueue`, node agents with
pretend GPUs running real processes (`sleep`), one submitter per queue (its user), jobs
submitted at their arrival times on the wall clock.

  5 cohorts x 6 queues (quota 20, borrowing limit 100, reclaim any, lower priority preempted
  within a queue) on 600 GPUs; per queue 35 small (1 GPU), 10 medium (5) and 5 large (20) jobs,
  1,500 in all; times at 1/100 of the simulation's (runs of 2 s, 5 s and 10 s; one small job a
  second per queue, a medium every 5 s, a large every 12 s).

    python bench/bench_kueue_real.py [--scale 0.1] [--time-scale 0.01] [--agents 10]

Prints submission -> running (the `job.started` event) for the jobs whose queue had room within
its nominal quota when they were submitted, none of its jobs waiting and its jobs arriving with
them of higher priority counted first: Kueue runs those at once, reclaiming lent GPUs if it must
(target: p99 <= 100 ms); the same for every job (queueing included, for information); usage,
borrowing and preemptions as bench_kueue.py.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import msgspec
from bench_kueue import BORROW, CLASSES, COHORTS, QUEUES, QUOTA, queue_names
from bench_real import CLUSTER, pct, service_stats, start_agent, stop_all, wait_nodes
from machine import open_to_jobs

from gpuyard.cli.cluster import control_plane_configs
from gpuyard.policies.kueue import queue_params
from gpuyard.run.embedded import EmbeddedNats
from gpuyard.run.launcher import ServiceSet
from gpuyard.shared.connection import Bus, NatsAuth, connect
from gpuyard.shared.contract import Empty, Event
from gpuyard.shared.endpoints import EVENT, STATUS, SUBMIT, Subjects
from gpuyard.shared.identity import Caller

ENDS = ("job.completed", "job.failed", "job.cancelled", "job.timeout", "job.preempted")


class Jobs:
    """What the event stream says of each job: who holds how many GPUs per queue, who waits,
    when each first started."""

    def __init__(self) -> None:
        self.spec: dict[str, tuple[str, int]] = {}  # job -> (queue, GPUs)
        self.held: dict[str, int] = defaultdict(int)
        self.waiting: dict[str, int] = defaultdict(int)
        self.running: set[str] = set()
        self.started: dict[str, float] = {}
        self.ended = 0
        self.preempted = 0
        self.peak: dict[str, int] = defaultdict(int)
        self.gpu_s: dict[str, float] = defaultdict(float)
        self.since: dict[str, float] = {}
        self.done = asyncio.Event()
        self.decoder = msgspec.json.Decoder(Event)

    def submitted(self, arriving: list[tuple[str, dict[str, Any]]]) -> set[str]:
        """Count the jobs that arrive together as waiting; those whose queue has room for them
        within its quota, none of its jobs waiting before them and its other arrivals of higher
        priority (or as high and before them) counted first."""
        room: set[str] = set()
        ahead: dict[str, int] = defaultdict(int)
        first = sorted(arriving, key=lambda qj: -int(qj[1]["priority"]))  # (stable)
        for queue, job in first:
            job_id, gpus = str(job["job_id"]), int(job["num_gpus"])
            ahead[queue] += gpus
            if self.waiting[queue] == 0 and self.held[queue] + ahead[queue] <= QUOTA:
                room.add(job_id)
        for queue, job in arriving:
            self.spec[str(job["job_id"])] = (queue, int(job["num_gpus"]))
            self.waiting[queue] += 1
        return room

    async def on_event(self, msg: object) -> None:
        event = self.decoder.decode(msg.data)  # type: ignore[attr-defined]
        now = time.perf_counter()
        job = event.job_id or ""
        if job not in self.spec:
            return
        queue, gpus = self.spec[job]
        if event.type == "job.started" and job not in self.running:
            self.running.add(job)
            self.started.setdefault(job, now)
            self.since[job] = now
            self.waiting[queue] -= 1
            self.held[queue] += gpus
            self.peak[queue] = max(self.peak[queue], self.held[queue])
        elif event.type in ENDS and job in self.running:
            self.running.discard(job)
            self.held[queue] -= gpus
            self.gpu_s[queue] += gpus * (now - self.since.pop(job))
            if event.type == "job.preempted":
                self.waiting[queue] += 1
                self.preempted += 1
        if event.type in ENDS and event.type != "job.preempted":
            self.ended += 1
            if self.ended == len(self.spec):
                self.done.set()


async def run(args: argparse.Namespace, root: Path) -> None:
    names = queue_names()
    lines = []
    for name, cohort in names:
        lines += [
            "[[queue]]", f'name = "{name}"', f'users = ["{name}"]', f'cohort = "{cohort}"',
            f"quota = {{ gpu = {QUOTA} }}", f"borrowing_limit = {{ gpu = {BORROW} }}",
            'reclaim_within_cohort = "any"', 'within_queue = "lower_priority"', "",
        ]  # fmt: skip
    (root / "queues.toml").write_text("\n".join(lines))
    plan: list[tuple[float, str, dict[str, Any]]] = []  # (when, queue, job)
    for name, _ in names:
        for cls, count, every, gpus, runs, priority in CLASSES:
            for k in range(round(count * args.scale)):
                job = {"job_id": f"{name}-{cls}-{k}", "num_gpus": gpus, "priority": priority,
                       "processes": "per_node", "name": cls,
                       "command": ["sleep", f"{runs * args.time_scale:g}"]}  # fmt: skip
                plan.append(((k + 1) * every * args.time_scale, name, job))
    plan.sort(key=lambda p: p[0])
    gpus = COHORTS * QUEUES * QUOTA
    per_agent = -(-gpus // args.agents)
    async with EmbeddedNats() as url:
        configs = control_plane_configs(
            policy="kueue", policy_params=queue_params(root / "queues.toml"), durable=False
        )
        configs["scheduler"].event_storage = "memory"
        async with ServiceSet(url, CLUSTER, configs, processes=True, log_level="warning"):
            procs = [
                await start_agent(url, f"n{i}", root, gpus=per_agent, gpu_type="gpu")
                for i in range(args.agents)
            ]
            watcher = Bus(await connect(url, name="bench"), Subjects(CLUSTER))
            submitters: dict[str, Bus] = {}
            try:
                await wait_nodes(watcher, args.agents)
                jobs = Jobs()
                for kind in ("job.started", *ENDS):
                    await watcher.nc.subscribe(
                        watcher.subjects.of(EVENT, type=kind), cb=jobs.on_event
                    )
                for name, _ in names:  # (each queue's jobs submitted by its user)
                    auth = NatsAuth(identity=Caller("user", name).token)
                    submitters[name] = Bus(await connect(url, name=name, auth=auth),
                                           Subjects(CLUSTER), request_timeout=30,
                                           caller=auth.caller)  # fmt: skip
                sent: dict[str, float] = {}
                at_once: set[str] = set()

                async def submit(queue: str, job: dict[str, Any]) -> None:
                    sent[str(job["job_id"])] = time.perf_counter()
                    reply = await submitters[queue].call(SUBMIT, {"jobs": [job]})
                    assert reply.results[0].verdict == "admit", reply.results[0].reason

                t0 = time.perf_counter()
                tasks = []
                for when, group in itertools.groupby(plan, key=lambda p: p[0]):
                    arriving = [(queue, job) for _, queue, job in group]
                    delay = t0 + when - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    at_once |= jobs.submitted(arriving)
                    tasks += [asyncio.create_task(submit(q, j)) for q, j in arriving]
                await asyncio.gather(*tasks)
                async with asyncio.timeout(args.timeout):
                    await jobs.done.wait()
                wall = time.perf_counter() - t0
                status = await watcher.call(STATUS, Empty())
                if args.stats:
                    await service_stats(watcher)
            finally:
                await stop_all(procs)
                for bus in (watcher, *submitters.values()):
                    await bus.close()
    report(args, plan, jobs, sent, at_once, wall, status.finished)


def report(
    args: argparse.Namespace, plan: list[tuple[float, str, dict[str, Any]]], jobs: Jobs,
    sent: dict[str, float], at_once: set[str], wall: float, finished: int,
) -> None:  # fmt: skip
    def ms(ids: list[str]) -> str:
        values = [(jobs.started[j] - sent[j]) * 1000 for j in ids]
        return (f"p50 {statistics.median(values):.1f} ms, p99 {pct(values, 99):.1f} ms, max "
                f"{max(values):.1f} ms over {len(values):,} jobs")  # fmt: skip

    room = sorted(at_once)
    quota_s = QUOTA * wall
    shares = [jobs.gpu_s[q] / quota_s for q, _ in queue_names()]
    print(f"kueue on a real cluster: {len(plan):,} jobs ({args.scale:g} of Kueue's test, times x "
          f"{args.time_scale:g}) on {args.agents} agents, {COHORTS * QUEUES * QUOTA} pretend "
          f"GPUs; all ended in {wall:.1f} s (the scheduler counts {finished:,})")  # fmt: skip
    print(f"  submission -> running, with room in the queue's quota: {ms(room)} "
          "(target p99 <= 100 ms)")  # fmt: skip
    print(f"  submission -> running, every job (queueing included): {ms(sorted(jobs.started))}")
    print(f"  usage of quota: all {sum(shares) / len(shares):.1%}, lowest queue {min(shares):.1%}"
          f"; most held at once {max(jobs.peak.values())} GPUs (quota {QUOTA}), "
          f"{sum(p > QUOTA for p in jobs.peak.values())} of {len(shares)} queues borrowed; "
          f"{jobs.preempted:,} preemptions")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=0.1, help="share of Kueue's jobs")
    parser.add_argument("--time-scale", type=float, default=0.01,
                        help="real seconds per simulated second")  # fmt: skip
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--stats", action="store_true", help="each service's requests and calls")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuyard-bench-") as tmp:
        open_to_jobs(Path(tmp))
        import uvloop

        uvloop.run(run(args, Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
