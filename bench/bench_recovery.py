"""How fast does a killed scheduler come back? Target: its first round within 2 s of the restart.

    python bench/bench_recovery.py [--jobs 2000] [--nodes 16] [--gpus 4] [--round 5]

A private nats-server; placement and admission in this process, durable, as `gpuyard up` runs them;
the scheduler as its own process (wall clock, durable); `--nodes` nodes answered by a fake node
agent. `--jobs` one-GPU jobs are submitted (as many run as there are GPUs, the rest queue), the
scheduler is killed with SIGKILL and started again, and we time: process start -> answers a ping,
-> its first round done (its first `place.apply`). `--round` is long on purpose: the first round
after a restart must not wait for it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from typing import Any

import msgspec

from gpuyard.cli.cluster import control_plane_configs
from gpuyard.run.embedded import EmbeddedNats
from gpuyard.run.launcher import ServiceSet
from gpuyard.shared.connection import Bus, connect
from gpuyard.shared.contract import (
    Empty,
    JobQuery,
    NodeCommand,
    NodeCommandReply,
    Ping,
    RegisterNode,
)
from gpuyard.shared.endpoints import NODE_COMMAND, PING, QUERY, REGISTER, STATS, SUBMIT, Subjects
from gpuyard.shared.errors import RemoteError
from gpuyard.shared.model import NodeSpec

CLUSTER = "bench-recovery"


async def fake_node_agents(bus: Bus) -> None:
    """Every node command is answered at once (launched, preempted)."""
    decoder = msgspec.json.Decoder(NodeCommand)

    async def answer(msg: Any) -> None:
        cmd = decoder.decode(msg.data)
        reply = NodeCommandReply(preempted=cmd.preempt, launched=[x.job_id for x in cmd.launch])
        await msg.respond(msgspec.json.encode(reply))

    await bus.nc.subscribe(bus.subjects.every(NODE_COMMAND), cb=answer)


async def until(check: Any, within_s: float = 60.0, every_s: float = 0.005) -> float:
    """Seconds until `await check()` is true."""
    started = time.perf_counter()
    while not await check():
        if time.perf_counter() - started > within_s:
            raise TimeoutError("gave up waiting")
        await asyncio.sleep(every_s)
    return time.perf_counter() - started


async def bench(args: argparse.Namespace) -> None:
    configs = control_plane_configs(round_s=args.round)
    scheduler_config = configs.pop("scheduler")
    scheduler_config.event_storage = "memory"
    async with EmbeddedNats() as url:
        plane = ServiceSet(url, CLUSTER, configs)
        await plane.start()
        sched = ServiceSet(url, CLUSTER, {"scheduler": scheduler_config}, processes=True)
        await sched.start()
        bus = Bus(await connect(url, name="bench"), Subjects(CLUSTER), request_timeout=30)
        try:
            await fake_node_agents(bus)
            for i in range(args.nodes):
                node = NodeSpec(node_id=f"n{i}", num_gpus=args.gpus)
                await bus.call(REGISTER, RegisterNode(now=0.0, node=node))
            for first in range(0, args.jobs, 500):
                jobs = [
                    {"num_gpus": 1, "command": ["x"]} for _ in range(min(500, args.jobs - first))
                ]
                await bus.call(SUBMIT, {"jobs": jobs})

            async def running() -> bool:
                page = await bus.call(QUERY, JobQuery(states=["running"], limit=1))
                return page.total == min(args.jobs, args.nodes * args.gpus)

            await until(running)
            os.kill(sched.process("scheduler").pid, signal.SIGKILL)
            await sched.process("scheduler").wait()
            started = time.perf_counter()
            await sched.replace("scheduler")

            async def answers() -> bool:
                try:
                    await bus.call(PING, Ping(), within_s=0.5, svc="sched")
                except RemoteError:
                    return False
                return True

            async def first_round() -> bool:
                stats = await bus.call(STATS, Empty(), within_s=5.0, svc="sched")
                return stats.requests.get("place.apply", [0])[0] >= 1

            await until(answers)
            ready = time.perf_counter() - started
            await until(first_round)
            round_done = time.perf_counter() - started
            page = await bus.call(QUERY, JobQuery(limit=1))
            verdict = "OK" if round_done < 2.0 else "SLOW"
            print(
                f"jobs {page.total} ({min(args.jobs, args.nodes * args.gpus)} running), "
                f"round_s {args.round:g}: restarted scheduler answers after {ready:.3f} s, "
                f"first round done after {round_done:.3f} s (target < 2 s: {verdict})"
            )
        finally:
            await bus.close()
            await sched.stop()
            await plane.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--round", type=float, default=5.0)
    args = p.parse_args()
    import uvloop

    uvloop.run(bench(args))


if __name__ == "__main__":
    main()
