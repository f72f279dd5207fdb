"""Standbys: a second instance of each durable service waits on the leader lease (one key in the
service's replicated bucket) and takes over, with the stored state, when the active instance is
killed, paused or stops. Real nats-servers, real services as processes, real agents and jobs."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpuyard.shared.connection import Bus, connect
from gpuyard.shared.contract import EnqueueRequest, JobQuery
from gpuyard.shared.endpoints import ENQUEUE, QUERY, Subjects
from gpuyard.shared.errors import NotLeading
from gpuyard.shared.leader import LEASE_KEY, Lease
from gpuyard.shared.model import JobSpec
from gpuyard.shared.store import KvStore

from . import test_ha
from .polling import until_async
from .test_ha import SERVERS, Brokers
from .test_real_cluster import CLUSTER
from .test_recovery import ProcessCluster, _assert_exactly_once

brokers = test_ha.brokers  # (the fixture: three brokers in one NATS cluster)


LEASE_S = 1.0


@pytest.fixture
async def bucket(nats_url: str) -> AsyncIterator[KvStore]:
    nc = await connect(nats_url, name="lease-test")
    store = KvStore(nc, "lease", "scheduler")
    await store.open()
    try:
        yield store
    finally:
        await nc.close()


@pytest.mark.slow
async def test_of_two_contenders_one_wins_and_a_paused_holder_loses(bucket: KvStore) -> None:
    a, b = Lease(bucket.kv, "a", LEASE_S), Lease(bucket.kv, "b", LEASE_S)
    contending = {asyncio.ensure_future(a.acquire()): a, asyncio.ensure_future(b.acquire()): b}
    done, waiting = await asyncio.wait(contending, return_when=asyncio.FIRST_COMPLETED, timeout=10)
    assert len(done) == 1 and next(iter(done)).result() == "free"
    holder, other = contending[next(iter(done))], contending[next(iter(waiting))]
    # The holder renews: for several leases the other one keeps waiting.
    await asyncio.sleep(3 * LEASE_S)
    assert not next(iter(waiting)).done() and holder.holds() and not other.holds()
    assert (await bucket.kv.get(LEASE_KEY)).value.decode() == holder.holder
    # The holder pauses (its renewals stop, as in a process stopped or cut off): the other takes
    # the lease once it has seen it unrenewed for a whole lease.
    assert holder._renewer is not None
    holder._renewer.cancel()
    assert await asyncio.wait_for(next(iter(waiting)), 10 * LEASE_S) == "lapsed"
    assert other.holds() and not holder.holds()  # (it stopped acting before the other began)
    # The old holder, back, finds the lease taken when it confirms it: it acts no more.
    with pytest.raises(NotLeading, match=f"taken over by {other.holder}"):
        await holder.confirm()
    assert holder.lost.is_set() and holder.lost_reason == f"taken over by {other.holder}"
    # The new holder releases it (a graceful stop): a contender takes it at once, as free.
    await other.release()
    c = Lease(bucket.kv, "c", LEASE_S)
    assert await asyncio.wait_for(c.acquire(), LEASE_S) == "free"
    await c.release()


@pytest.mark.slow
async def test_a_replacement_seizes_the_lease_its_standby_waits_on(bucket: KvStore) -> None:
    """A plain start (a replacement, `gpuyard service` without --standby) takes the lease at once
    from its holder, whose next renewal finds it taken; the standby goes on waiting."""
    old, standby, new = (Lease(bucket.kv, n, LEASE_S) for n in ("old", "standby", "new"))
    assert await old.acquire() == "free"
    waiting = asyncio.ensure_future(standby.acquire())
    assert await new.seize()
    async with asyncio.timeout(5 * LEASE_S):
        await old.lost.wait()
    assert old.lost_reason == "taken over by new"
    await asyncio.sleep(2 * LEASE_S)
    assert not waiting.done() and new.holds()
    waiting.cancel()
    await new.release()


# ---------------------------------------------------------------------- services as processes


def _events(log: Path, event: str, service: str) -> list[dict[str, Any]]:
    """The JSON log lines of `service` saying `event`."""
    lines: list[dict[str, Any]] = []
    for line in (log.read_text() if log.exists() else "").splitlines():
        if f'"{event}"' in line:
            with_json = json.loads(line)
            if with_json.get("event") == event and with_json.get("service") == service:
                lines.append(with_json)
    return lines


async def _scheduler(url: str, root: Path, lease_s: float, *extra: str) -> Any:
    """A durable scheduler on its own (rounds only when ticked: it needs no placement here)."""
    config = root / "scheduler.json"
    config.write_text(json.dumps({
        "durable": True, "lease_s": lease_s, "event_storage": "memory", "mode": "rounds",
    }))  # fmt: skip
    log = (root / "services.log").open("ab")
    try:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gpuyard.cli", "service", "scheduler", "--nats", url,
            "--cluster", "sb", "--config", str(config), *extra, stdout=log, stderr=log,
        )  # fmt: skip
    finally:
        log.close()


async def _enqueue(bus: Bus, job_id: str) -> None:
    spec = JobSpec(job_id=job_id, num_gpus=1, duration=10.0, submit_time=0.0)
    await bus.call(ENQUEUE, EnqueueRequest(now=0.0, jobs=[spec]), within_s=5.0, retry_for_s=30.0)


async def _job_ids(bus: Bus) -> list[str]:
    page = await bus.call(QUERY, JobQuery(), within_s=5.0, retry_for_s=30.0)
    return [j.job_id for j in page.jobs]


async def _micro_ids(bus: Bus, name: str) -> set[str]:
    """The instance ids of every process serving `name` (NATS micro PING: each answers)."""
    inbox = bus.nc.new_inbox()
    ids: set[str] = set()

    async def on_reply(msg: Any) -> None:
        ids.add(json.loads(msg.data)["id"])

    sub = await bus.nc.subscribe(inbox, cb=on_reply)
    await bus.nc.publish(f"$SRV.PING.gpuyard-{name}", b"", reply=inbox)
    await asyncio.sleep(0.5)
    await sub.unsubscribe()
    return ids


@pytest.mark.slow
async def test_a_paused_leader_loses_its_lease_to_the_standby_and_stops_serving(
    nats_url: str, tmp_path: Path
) -> None:
    """SIGSTOP the active scheduler past its lease: the standby takes over (`leader.acquired`,
    lapsed) with the stored jobs; SIGCONT: the old one finds its lease gone (`leader.lost`), stops
    serving and stands by. Exactly one instance serves before and after."""
    log = tmp_path / "services.log"
    active = await _scheduler(nats_url, tmp_path, LEASE_S)
    nc = await connect(nats_url, name="test")
    bus = Bus(nc, Subjects("sb"))
    standby = None
    try:
        await _enqueue(bus, "a")
        standby = await _scheduler(nats_url, tmp_path, LEASE_S, "--standby")
        await until_async(lambda: _ready(log, "service.standing_by"), "the standby waiting")
        assert len(await _micro_ids(bus, "scheduler")) == 1
        active.send_signal(signal.SIGSTOP)
        try:
            await until_async(
                lambda: _ready(log, "leader.acquired", how="lapsed"), "the standby leading",
            )  # fmt: skip
        finally:  # (while stopped, its subscriptions stay: requests sent to it would time out)
            active.send_signal(signal.SIGCONT)
        await until_async(lambda: _ready(log, "leader.lost"), "the old leader stepping down")
        (lost,) = _events(log, "leader.lost", "scheduler")
        assert lost["reason"].startswith("taken over by ")
        await _enqueue(bus, "b")
        await until_async(
            lambda: _ready(log, "service.standing_by", count=2), "the old leader standing by"
        )
        await _enqueue(bus, "c")
        assert len(await _micro_ids(bus, "scheduler")) == 1  # the old one serves no more
        assert await _job_ids(bus) == ["a", "b", "c"]  # (the stored jobs, through both leaders)
        assert len(_events(log, "leader.acquired", "scheduler")) == 2
        assert active.returncode is None and standby.returncode is None
    finally:
        await nc.close()
        await _terminate(active, standby)


async def _terminate(*procs: asyncio.subprocess.Process | None) -> None:
    for proc in procs:
        if proc is not None and proc.returncode is None:
            proc.terminate()
            await proc.wait()


@pytest.mark.slow
async def test_a_graceful_stop_hands_the_lease_over_at_once(nats_url: str, tmp_path: Path) -> None:
    """SIGTERM the active scheduler: it releases its lease and the standby takes it as free,
    without waiting out the lease (60 s here: longer than the test waits)."""
    log = tmp_path / "services.log"
    active = await _scheduler(nats_url, tmp_path, 60.0)
    nc = await connect(nats_url, name="test")
    bus = Bus(nc, Subjects("sb"))
    standby = None
    try:
        await _enqueue(bus, "a")
        standby = await _scheduler(nats_url, tmp_path, 60.0, "--standby")
        await until_async(lambda: _ready(log, "service.standing_by"), "the standby waiting")
        active.terminate()
        assert await asyncio.wait_for(active.wait(), 30) == 0
        await until_async(
            lambda: _ready(log, "leader.acquired", how="free"),
            "the standby taking the released lease", within_s=20,
        )  # fmt: skip
        assert _events(log, "leader.released", "scheduler")
        await _enqueue(bus, "b")
        assert await _job_ids(bus) == ["a", "b"]
    finally:
        await nc.close()
        await _terminate(active, standby)


async def _ready(log: Path, event: str, count: int = 1, **fields: Any) -> bool:
    """Whether the scheduler's log has `count` lines of `event` with these fields."""
    lines = await asyncio.to_thread(_events, log, event, "scheduler")
    return sum(all(line.get(k) == v for k, v in fields.items()) for line in lines) >= count


def test_a_standby_needs_a_durable_service(tmp_path: Path) -> None:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", "service", "scheduler", "--standby"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1].endswith(
        'bad configuration: --standby needs a durable service (`"durable": true` in its '
        "config): a standby takes over the state the running instance stored"
    )


# ---------------------------------------------------------------------- a cluster, under load


def _leaders(log: Path) -> dict[str, int]:
    """Per service, the pid of the process that leads now (as the log says)."""
    leading: dict[str, int] = {}
    for line in log.read_text().splitlines():
        if '"leader.' not in line:
            continue
        entry = json.loads(line)
        if entry["event"] == "leader.acquired":
            leading[entry["service"]] = entry["pid"]
        elif entry["event"] == "leader.lost" and leading.get(entry["service"]) == entry["pid"]:
            del leading[entry["service"]]
    return leading


@pytest.mark.slow
async def test_standbys_take_over_from_killed_leaders_under_load_and_lose_nothing(
    brokers: Brokers, tmp_path: Path
) -> None:
    """Three brokers, every durable service with a standby, two agents running real jobs. Kill -9
    the broker leading the scheduler's bucket and the active scheduler, then the active placement,
    then the active admission, submitting all along: each time a standby takes the lease over
    (the old leader never came back), the jobs submitted while none led are all decided, and
    every job ends exactly once."""
    cluster = ProcessCluster(brokers.url, tmp_path)
    for config in cluster.configs.values():
        config.replicas = SERVERS
    cluster.configs["scheduler"].policy, cluster.configs["scheduler"].params = "fifo", {}
    cluster.configs["placement"].heartbeat_timeout_s = 10.0  # (clients move to another server)
    log = tmp_path / "control.log"
    async with cluster:
        for name in ("scheduler", "placement", "admission"):
            await cluster.services.add_standby(name)
        await until_async(
            lambda: _count(log, "service.standing_by", 3), "three standbys", within_s=60
        )
        ids = iter(f"t{i}" for i in range(12))
        submitted: list[str] = []

        async def submit(n: int) -> None:
            for job_id in [next(ids) for _ in range(n)]:
                await cluster.submit_retrying(job_id)
                submitted.append(job_id)

        await submit(3)
        await until_async(lambda: _some_running(cluster), "jobs running", within_s=30)
        first = await asyncio.to_thread(_leaders, log)
        assert first.keys() == {"scheduler", "placement", "admission"}
        victim = await brokers.leader_of(f"KV_gpuyard_{CLUSTER}_scheduler")
        brokers.kill(victim)
        killed: dict[str, int] = {}
        for name in ("scheduler", "placement", "admission"):
            # (a broker's death may have moved a lease already: kill whoever leads now)
            pid = (await asyncio.to_thread(_leaders, log))[name]
            os.kill(pid, signal.SIGKILL)
            killed[name] = pid
            await submit(3)  # while none leads: each waits for the standby, none is lost
            await until_async(
                lambda name=name: _led_by_other(log, name, killed[name]),
                f"a standby leading {name}", within_s=60,
            )  # fmt: skip
        page = await cluster.until_all_ended(len(submitted), within_s=120)
        _assert_exactly_once(cluster, page, submitted)
        assert len(submitted) == 12
        leaders = await asyncio.to_thread(_leaders, log)
        assert all(leaders[n] not in (first[n], killed[n]) for n in killed), (first, leaders)
        standbys = {n: {p.pid for p in ps} for n, ps in cluster.services.standbys.items()}
        assert all(leaders[n] in standbys[n] for n in killed), (standbys, leaders)


async def _count(log: Path, event: str, n: int) -> bool:
    lines = await asyncio.to_thread(lambda: log.read_text() if log.exists() else "")
    return lines.count(f'"event": "{event}"') >= n


async def _led_by_other(log: Path, name: str, dead: int) -> bool:
    leader = (await asyncio.to_thread(_leaders, log)).get(name)
    return leader is not None and leader != dead


async def _some_running(cluster: ProcessCluster) -> bool:
    page = await cluster.all_jobs()
    return any(j.state == "running" for j in page.jobs)
