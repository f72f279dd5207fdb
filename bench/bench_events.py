"""Does the event stream keep up? Throughput into the cluster's JetStream stream, and tail latency.

    python bench/bench_events.py [--events 100000] [--rate 10000] [--seconds 5] [--storage file]

1. burst: publish `--events` events through a Bus as fast as possible; time until all are stored.
2. paced: publish at `--rate` events/s for `--seconds`; check every one is stored.
3. tail latency: while (2) runs at `--rate`, a `tail --follow` consumer (gpuyard.ops.read_events,
   an ordered JetStream consumer) measures publish -> receive time of each event; and again at
   100 events/s (an idle cluster). Target: p99 < 100 ms.

The publisher runs on its own event loop in a thread, the consumer on the main loop, each with its
own NATS connection to a private nats-server.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time

from gpuyard.ops import read_events
from gpuyard.run.embedded import EmbeddedNats
from gpuyard.shared.connection import Bus, connect, ensure_event_stream
from gpuyard.shared.contract import Event
from gpuyard.shared.endpoints import Subjects


async def stored_count(bus: Bus) -> int:
    info = await bus.nc.jetstream().stream_info(bus.subjects.stream_name)
    return info.state.messages


async def wait_stored(bus: Bus, target: int, within_s: float = 60.0) -> float:
    """Seconds until the stream holds `target` messages."""
    started = time.perf_counter()
    while await stored_count(bus) < target:
        if time.perf_counter() - started > within_s:
            raise TimeoutError(f"only {await stored_count(bus)}/{target} events stored")
        await asyncio.sleep(0.005)
    return time.perf_counter() - started


def event(i: int) -> Event:
    """`now` carries the wall-clock publish time, so the consumer can measure latency."""
    return Event(type="job.started", now=time.time(), job_id=f"j{i}", service="bench")


async def burst(bus: Bus, n: int) -> dict[str, float]:
    before = await stored_count(bus)
    started = time.perf_counter()
    for i in range(n):
        await bus.emit(event(i))
    await bus.nc.flush()
    published = time.perf_counter() - started
    await wait_stored(bus, before + n)
    total = time.perf_counter() - started
    return {
        "events": n,
        "publish_per_s": n / published,
        "stored_per_s": n / total,
        "seconds": total,
    }


async def paced(url: str, subjects: Subjects, rate: float, seconds: float) -> int:
    """Publish at `rate` events/s (in 10 ms batches) for `seconds`; returns how many were sent."""
    bus = Bus(await connect(url, name="bench-publisher"), subjects)
    sent, started = 0, time.perf_counter()
    try:
        while (elapsed := time.perf_counter() - started) < seconds:
            due = int(rate * elapsed)
            while sent < due:
                await bus.emit(event(sent))
                sent += 1
            await asyncio.sleep(0.01 - (time.perf_counter() - started) % 0.01)
        await bus.nc.flush()
    finally:
        await bus.close()
    return sent


def paced_in_thread(
    url: str, subjects: Subjects, rate: float, seconds: float
) -> tuple[threading.Thread, list[int]]:
    result: list[int] = []

    def run() -> None:
        result.append(asyncio.run(paced(url, subjects, rate, seconds)))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def quantiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000

    return {"n": len(ordered), "p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": ordered[-1] * 1000,
            "mean_ms": statistics.fmean(ordered) * 1000}  # fmt: skip


async def tail_latency(
    url: str, bus: Bus, rate: float, seconds: float
) -> tuple[dict[str, float], int]:
    """Follow the stream while a publisher runs at `rate`; latency of each event; events stored."""
    latencies: list[float] = []
    before = await stored_count(bus)

    async def follow() -> None:
        async for stored in read_events(bus.nc, bus.subjects, start="new", follow=True):
            if stored.event is not None:
                latencies.append(time.time() - stored.event.now)

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.3)  # the consumer exists before the first event
    thread, sent = paced_in_thread(url, bus.subjects, rate, seconds)
    await asyncio.to_thread(thread.join)
    await wait_stored(bus, before + sent[0])
    async with asyncio.timeout(30):
        while len(latencies) < sent[0]:  # noqa: ASYNC110 (a poll, once per run)
            await asyncio.sleep(0.01)
    task.cancel()
    return quantiles(latencies), sent[0]


async def main(args: argparse.Namespace) -> None:
    subjects = Subjects("bench")
    async with EmbeddedNats() as url:
        bus = Bus(await connect(url, name="bench"), subjects)
        await ensure_event_stream(bus.nc, subjects, max_age_s=3600, storage=args.storage)
        print(f"stream {subjects.stream_name} ({args.storage} storage), nats-server {url}")

        b = await burst(bus, args.events)
        print(f"burst:  {b['events']:,} events published at {b['publish_per_s']:,.0f}/s, "
              f"all stored after {b['seconds']:.2f} s = {b['stored_per_s']:,.0f} events/s stored")  # fmt: skip

        stats, sent = await tail_latency(url, bus, args.rate, args.seconds)
        print(f"paced:  {sent:,} events at {args.rate:,.0f}/s for {args.seconds:.0f} s, all stored; "
              f"tail --follow received {stats['n']:,}")  # fmt: skip
        print(f"        tail latency at {args.rate:,.0f}/s: p50 {stats['p50_ms']:.1f} ms, "
              f"p99 {stats['p99_ms']:.1f} ms, max {stats['max_ms']:.1f} ms")  # fmt: skip

        idle, sent = await tail_latency(url, bus, 100, 3)
        print(f"        tail latency at 100/s ({sent} events): p50 {idle['p50_ms']:.1f} ms, "
              f"p99 {idle['p99_ms']:.1f} ms, max {idle['max_ms']:.1f} ms")  # fmt: skip
        ok = stats["p99_ms"] < 100 and idle["p99_ms"] < 100
        print(f"target p99 < 100 ms: {'met' if ok else 'NOT met'}")
        await bus.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=100_000, help="events in the burst")
    parser.add_argument("--rate", type=float, default=10_000.0, help="paced events per second")
    parser.add_argument("--seconds", type=float, default=5.0, help="paced run length")
    parser.add_argument("--storage", choices=["file", "memory"], default="file")
    asyncio.run(main(parser.parse_args()))
