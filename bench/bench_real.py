"""Real-mode benchmark on one machine (GPUs from flags).

1. submit -> running latency: the control plane (one process per service, scheduler on the wall
   clock) and 8 real node agents; jobs submitted one at a time, latency = submit sent -> the
   `job.started` event received. Targets: p50 < 50 ms, p99 < 200 ms.
2. heartbeat scale: 500 simulated agents (registered, then heartbeating every second) on one NATS
   server for `--hb-seconds`; no node may be declared lost.

    python bench/bench_real.py [--jobs 200] [--agents 8] [--sim-agents 500] [--hb-seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import msgspec

from gpuyard.cli_cluster import control_plane_configs
from gpuyard.embedded import EmbeddedNats
from gpuyard.launcher import ServiceSet
from gpuyard.shared.connection import Bus, connect
from gpuyard.shared.contract import Empty, Event, GpuMetrics, Heartbeat, RegisterNode
from gpuyard.shared.endpoints import (
    CLUSTER as CLUSTER_INFO,
)
from gpuyard.shared.endpoints import (
    EVENT,
    HEARTBEAT,
    HEARTBEATS,
    REGISTER,
    STATUS,
    SUBMIT,
    Subjects,
)
from gpuyard.shared.model import NodeSpec

CLUSTER = "bench"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def wait_nodes(bus: Bus, n: int, within_s: float = 60) -> None:
    deadline = time.monotonic() + within_s
    while True:
        info = await bus.call(CLUSTER_INFO, Empty())
        if len(info.nodes) >= n:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(info.nodes)} of {n} nodes registered")
        await asyncio.sleep(0.1)


async def latency(url: str, agents: int, jobs: int, root: Path) -> dict[str, float]:
    procs = []
    for i in range(agents):
        procs.append(
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "gpuyard.services.nodeagent",
                "--nats",
                url,
                "--cluster",
                CLUSTER,
                "--node-id",
                f"n{i}",
                "--gpus",
                "2",
                "--no-nvml",
                "--address",
                "127.0.0.1",
                "--state-dir",
                str(root / f"n{i}"),
                "--checkpoint-root",
                str(root / "ckpt"),
                "--log-level",
                "warning",
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
        )
    bus = Bus(await connect(url, name="bench"), Subjects(CLUSTER))
    try:
        await wait_nodes(bus, agents)
        started: dict[str, asyncio.Future[float]] = {}
        decoder = msgspec.json.Decoder(Event)

        async def on_started(msg: object) -> None:
            event = decoder.decode(msg.data)  # type: ignore[attr-defined]
            fut = started.get(event.job_id or "")
            if fut is not None and not fut.done():
                fut.set_result(time.perf_counter())

        await bus.nc.subscribe(bus.subjects.of(EVENT, type="job.started"), cb=on_started)
        samples = []
        loop = asyncio.get_running_loop()
        for i in range(jobs):
            job_id = f"b{i}"
            started[job_id] = loop.create_future()
            job = {"job_id": job_id, "num_gpus": 1 + i % 2, "command": ["sleep", "0.3"]}
            t0 = time.perf_counter()
            reply = await bus.call(SUBMIT, {"jobs": [job]})
            assert reply.results[0].verdict == "admit", reply.results[0].reason
            async with asyncio.timeout(10):
                t1 = await started[job_id]
            samples.append((t1 - t0) * 1000)
            await asyncio.sleep(0.01)
        for _ in range(600):  # all done before the agents leave
            status = await bus.call(STATUS, Empty())
            if status.finished >= jobs:
                break
            await asyncio.sleep(0.1)
        return {
            "jobs": jobs, "agents": agents, "p50_ms": statistics.median(samples),
            "p99_ms": pct(samples, 99), "max_ms": max(samples), "mean_ms": statistics.fmean(samples),
        }  # fmt: skip
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await p.wait()
        await bus.close()


async def heartbeats(url: str, n: int, seconds: float) -> dict[str, float]:
    bus = Bus(await connect(url, name="bench-hb"), Subjects(CLUSTER))
    lost: list[str] = []

    async def on_lost(msg: object) -> None:
        lost.append(msgspec.json.decode(msg.data, type=Event).node_id or "")  # type: ignore[attr-defined]

    await bus.nc.subscribe(bus.subjects.of(EVENT, type="node.lost"), cb=on_lost)
    try:
        nodes = [
            NodeSpec(node_id=f"sim{i:04d}", num_gpus=8, gpu_type="h100", labels={"boot": "x"})
            for i in range(n)
        ]
        await asyncio.gather(
            *(
                bus.call(REGISTER, RegisterNode(now=time.time(), node=node))
                for node in nodes
            )
        )
        gpus = [GpuMetrics(index=g, utilization=50.0, memory_used_mib=1000) for g in range(8)]

        async def agent(node: NodeSpec, offset: float) -> None:
            await asyncio.sleep(offset)
            while True:
                hb = Heartbeat(now=time.time(), node_id=node.node_id, boot_id="x", gpus=gpus)
                await bus.publish(HEARTBEAT, hb, node=node.node_id)
                await asyncio.sleep(1.0)

        tasks = [asyncio.create_task(agent(nd, i / n)) for i, nd in enumerate(nodes)]
        started = time.monotonic()
        await asyncio.sleep(seconds)
        page = await bus.call(HEARTBEATS, Empty())
        now = time.time()
        ages = [now - t for nid, t in page.received.items() if nid.startswith("sim")]
        for t in tasks:
            t.cancel()
        info = await bus.call(CLUSTER_INFO, Empty())
        return {
            "sim_agents": n, "seconds": round(time.monotonic() - started, 1),
            "heartbeats_sent": n * seconds, "nodes_lost": len(lost),
            "nodes_present": sum(1 for x in info.nodes if x.node_id.startswith("sim")),
            "max_heartbeat_age_s": max(ages) if ages else float("nan"),
        }  # fmt: skip
    finally:
        await bus.close()


async def main(args: argparse.Namespace) -> None:
    async with EmbeddedNats() as url:
        configs = control_plane_configs(round_s=5.0, heartbeat_timeout_s=args.hb_timeout)
        configs["scheduler"].event_storage = "memory"
        with tempfile.TemporaryDirectory(prefix="gpuyard-bench-") as tmp:
            async with ServiceSet(url, CLUSTER, configs, processes=True, log_level="warning"):
                lat = await latency(url, args.agents, args.jobs, Path(tmp))
                print(
                    f"submit->running over {lat['jobs']} jobs, {lat['agents']} agents: "
                    f"p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms, "
                    f"max {lat['max_ms']:.1f} ms, mean {lat['mean_ms']:.1f} ms "
                    f"(targets p50 < 50, p99 < 200)",
                    flush=True,
                )
                hb = await heartbeats(url, args.sim_agents, args.hb_seconds)
                print(
                    f"heartbeats: {hb['sim_agents']} simulated agents for {hb['seconds']} s, "
                    f"timeout {args.hb_timeout} s: {hb['nodes_lost']} nodes declared lost, "
                    f"{hb['nodes_present']} present, oldest heartbeat {hb['max_heartbeat_age_s']:.2f} s",
                    flush=True,
                )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--agents", type=int, default=8)
    p.add_argument("--sim-agents", type=int, default=500)
    p.add_argument("--hb-seconds", type=float, default=30.0)
    p.add_argument("--hb-timeout", type=float, default=3.0)
    import uvloop

    uvloop.run(main(p.parse_args()))
