"""Operations over NATS: read the event stream, show and swap policies, gather a cluster's status.

Plain async functions on a `Bus`, used by `gpuyard tail|policy|status` (gpuyard/cli/ops.py), tests
and benchmarks.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

from gpuyard.shared.connection import Bus, raise_dropped_cancellation
from gpuyard.shared.contract import (
    ClusterInfo,
    Empty,
    Event,
    EventType,
    Ping,
    PolicyInfo,
    SchedulerStatus,
    SetPolicy,
)
from gpuyard.shared.endpoints import (
    CLUSTER,
    EVENT,
    PING,
    POLICY,
    POLICY_SET,
    STATUS,
    Subjects,
)
from gpuyard.shared.errors import RemoteError
from gpuyard.shared.roster import CONTROL_PLANE, SERVICE_TOKENS, SERVICES

_event_decoder = msgspec.json.Decoder(Event)


class NoEventStream(RuntimeError):
    """The cluster has no event stream (no scheduler ever started, or no JetStream)."""


class EventsInterrupted(RuntimeError):
    """Following events, the connection was lost (closed, or reconnected to a server that may no
    longer have our consumer): `follow_events` resumes after the last event read."""


# --------------------------------------------------------------------------- events


@dataclass(frozen=True)
class StoredEvent:
    """One event as the stream keeps it: its sequence, when it was stored, and the event."""

    seq: int
    stored: dt.datetime
    subject: str
    event: Event | None
    """None when the message on the stream is not a valid Event (`raw` holds it)."""
    raw: bytes = b""

    def to_builtins(self) -> dict[str, Any]:
        body = (
            msgspec.to_builtins(self.event)
            if self.event is not None
            else {"raw": self.raw.decode(errors="replace")}
        )
        return {"seq": self.seq, "stored": self.stored.isoformat(), "subject": self.subject, **body}


_DURATION = re.compile(r"^\s*(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>ms|s|m|h|d|w)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(text: str, *, now: dt.datetime | None = None) -> dt.datetime:
    """`10m`, `2h`, `30s`, `1d`, or an ISO date/time (UTC unless it says otherwise)."""
    m = _DURATION.match(text)
    now = now or dt.datetime.now(dt.UTC)
    if m:
        try:
            return now - dt.timedelta(seconds=float(m["n"]) * _UNITS[m["unit"] or "s"])
        except OverflowError:  # (before the year 1)
            raise ValueError(f"--since {text!r} is before any time there is") from None
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"--since {text!r} is neither a duration (10m, 2h) nor an ISO time"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def unknown_event_types(types: Sequence[str]) -> list[str]:
    """The patterns among `types` (`job.started`, `job.*`, `node.>`) that match no event type."""
    known = [t.split(".") for t in get_args(EventType)]

    def matches(pattern: list[str], tokens: list[str]) -> bool:
        for i, p in enumerate(pattern):
            if p == ">":  # (the last token only: the rest of the subject)
                return i == len(pattern) - 1 and len(tokens) > i
            if i >= len(tokens) or (p != "*" and p != tokens[i]):
                return False
        return len(pattern) == len(tokens)

    return [t for t in types if not any(matches(t.split("."), k) for k in known)]


def event_filters(subjects: Subjects, types: Sequence[str]) -> list[str]:
    """Stream filter subjects for event types (`job.started`, `job.*`, `node.>`); all by default."""
    return [subjects.of(EVENT, type=t) for t in types] or [subjects.of(EVENT, type=">")]


Start = Literal["all", "new"] | dt.datetime | int
"""Every stored event, only new ones, those stored since a time, or from a stream sequence on."""


READER_IDLE_S = 5.0
"""How long our consumer of the event stream outlives us (the server's default for ephemeral
consumers; the stream's limit would keep it a minute)."""


def consumer_config(filters: list[str], start: Start) -> ConsumerConfig:
    config = ConsumerConfig(inactive_threshold=READER_IDLE_S)
    if len(filters) > 1:
        config.filter_subjects = filters
    if start == "new":
        config.deliver_policy = DeliverPolicy.NEW
    elif isinstance(start, dt.datetime):
        config.deliver_policy = DeliverPolicy.BY_START_TIME
        config.opt_start_time = start
    elif isinstance(start, int):
        config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
        config.opt_start_seq = start
    return config


def _stored(msg: Msg, seq: int | None = None, stored: dt.datetime | None = None) -> StoredEvent:
    """The event a message carries, with its place in the stream (`seq`, `stored`: the given
    ones for an event that no stream holds)."""
    try:
        event: Event | None = _event_decoder.decode(msg.data)
    except (msgspec.ValidationError, msgspec.DecodeError):
        event = None
    if seq is None or stored is None:
        seq, stored = msg.metadata.sequence.stream, msg.metadata.timestamp
    return StoredEvent(
        seq=seq, stored=stored, subject=msg.subject, event=event,
        raw=msg.data if event is None else b"",
    )  # fmt: skip


async def read_events(
    nc: Client, subjects: Subjects, *, types: Sequence[str] = (), start: Start = "all",
    follow: bool = False, idle_s: float = 0.5, check_s: float = 1.0,
) -> AsyncIterator[StoredEvent]:  # fmt: skip
    """The cluster's stored events through an ordered, ephemeral JetStream consumer.

    Without `follow` it ends after the last event stored when it began; with it, it waits for more
    until cancelled, and raises EventsInterrupted when the connection closes or reconnects (seen
    within `check_s`; `follow_events` resumes). A cluster that stores no events (a sweep's runs)
    has only `follow`: its events as they are published from then on (sequence 0: not stored).
    """
    js = nc.jetstream()
    from nats.js.errors import NotFoundError

    filters = event_filters(subjects, types)
    try:
        await js.stream_info(subjects.stream_name)
    except NotFoundError:
        raise_dropped_cancellation()
        if not follow:
            raise NoEventStream(
                f"cluster {subjects.cluster!r} has no event stream {subjects.stream_name} (has "
                "its scheduler run on this server? a sweep's runs store none: --follow shows "
                "their events as they come)"
            ) from None
        async for stored in _published_events(nc, filters, check_s):
            yield stored
        return
    # Delivered to a queue of our own by a callback: `next_msg` costs a task (and a uuid) per
    # message, most of the time of reading a simulation's tens of thousands of events.
    arrived: asyncio.Queue[Msg] = asyncio.Queue()

    async def deliver(msg: Msg) -> None:
        arrived.put_nowait(msg)

    sub = await js.subscribe(
        filters[0], stream=subjects.stream_name, ordered_consumer=True, cb=deliver,
        config=consumer_config(filters, start), idle_heartbeat=2.0,
    )  # fmt: skip
    reconnects = nc.stats["reconnects"]
    try:
        while True:
            raise_dropped_cancellation()
            if arrived.empty():
                try:  # (not `wait_for`: on Python 3.11 it may swallow a Ctrl-C's cancellation)
                    async with asyncio.timeout(check_s if follow else idle_s):
                        msg = await arrived.get()
                except TimeoutError:
                    if follow:
                        if nc.is_closed or nc.stats["reconnects"] != reconnects:
                            raise EventsInterrupted("the connection to NATS was lost") from None
                        continue
                    if (await sub.consumer_info()).num_pending == 0:
                        return
                    continue
            else:
                msg = arrived.get_nowait()
            yield _stored(msg)
            if not follow and msg.metadata.num_pending == 0:
                return
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def _published_events(
    nc: Client, filters: list[str], check_s: float
) -> AsyncIterator[StoredEvent]:
    """Events as they are published, until cancelled (a cluster that stores none), or
    EventsInterrupted once the connection is closed (a reconnected one subscribes again itself)."""
    arrived: asyncio.Queue[Msg] = asyncio.Queue()

    async def deliver(msg: Msg) -> None:
        arrived.put_nowait(msg)

    subs = [await nc.subscribe(subject, cb=deliver) for subject in filters]
    try:
        while True:
            raise_dropped_cancellation()
            try:  # (not `wait_for`: see `read_events`)
                async with asyncio.timeout(check_s):
                    msg = await arrived.get()
            except TimeoutError:
                if nc.is_closed:
                    raise EventsInterrupted("the connection to NATS was closed") from None
                continue
            yield _stored(msg, seq=0, stored=dt.datetime.now(dt.UTC))
    finally:
        for sub in subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


async def follow_events(
    connection: Client, reconnect: Callable[[], Awaitable[Client]], subjects: Subjects, *,
    types: Sequence[str] = (), start: Start = "all", check_s: float = 1.0,
    on_lost: Callable[[int | None], object] | None = None,
) -> AsyncIterator[StoredEvent]:  # fmt: skip
    """`read_events(follow=True)` that outlives its connection: when the server goes away, it
    resumes (`reconnect` gives a new connection once the old one is closed; it may take as long
    as the server is away) from the stream sequence after the last event it gave: no event twice,
    none skipped. `on_lost(last sequence)` is called once per loss. Every connection it got from
    `reconnect` is closed when it ends; `connection` is the caller's."""
    import nats.errors

    nc, last = connection, 0
    if start == "new":  # from a sequence: what comes while we reconnect is not "before" us
        with contextlib.suppress(Exception):  # (no stream: read_events says so)
            info = await nc.jetstream().stream_info(subjects.stream_name)
            start = info.state.last_seq + 1
    try:
        while True:
            try:
                async for stored in read_events(
                    nc, subjects, types=types, start=last + 1 if last else start, follow=True,
                    check_s=check_s,
                ):  # fmt: skip
                    if stored.seq and stored.seq <= last:
                        continue  # (delivered again by a consumer the client reset itself)
                    last = stored.seq or last
                    yield stored
            except (EventsInterrupted, nats.errors.Error, TimeoutError) as exc:
                # (a server just back may not answer JetStream requests yet: the same again)
                if isinstance(exc, EventsInterrupted) and on_lost is not None:
                    on_lost(last or None)
                if nc.is_closed:
                    nc = await reconnect()
                else:
                    await asyncio.sleep(check_s)
                raise_dropped_cancellation()
    finally:
        if nc is not connection:
            with contextlib.suppress(Exception):
                await nc.close()


def matches(stored: StoredEvent, *, job: str | None = None, node: str | None = None) -> bool:
    """Client-side filters: a job's events; a node's events (node events and jobs' GPUs there)."""
    e = stored.event
    if e is None:
        return job is None and node is None
    if job is not None and e.job_id != job:
        return False
    return node is None or e.node_id == node or any(g.node_id == node for g in e.gpus)


def format_time(now: float) -> str:
    """Wall-clock times (epoch seconds) as UTC ISO; virtual times as seconds since the start."""
    if now >= 1e9:
        return dt.datetime.fromtimestamp(now, dt.UTC).isoformat(timespec="milliseconds")
    return f"t={now:,.1f}s"


def format_event(stored: StoredEvent) -> str:
    """One readable line: time, type, job, node, GPUs, reason."""
    e = stored.event
    if e is None:
        return f"#{stored.seq:<7} {stored.subject}  (not an event) {stored.raw[:200]!r}"
    parts = [f"#{stored.seq or '-':<7}", f"{format_time(e.now):>24}", f"{e.type:<15}"]
    if e.job_id:
        parts.append(f"job={e.job_id}")
    if e.node_id:
        parts.append(f"node={e.node_id}")
    if e.gpus:
        nodes: dict[str, list[int]] = {}
        for g in e.gpus:
            nodes.setdefault(g.node_id, []).append(g.index)
        parts.append("gpus=" + ",".join(f"{n}:{'+'.join(map(str, ix))}" for n, ix in nodes.items()))
    if e.reason:
        parts.append(f"reason={e.reason!r}")
    if e.service:
        parts.append(f"[{e.service}]")
    return " ".join(parts)


# --------------------------------------------------------------------------- policies


async def set_policy(
    bus: Bus, service: str, policy: str, params: dict[str, Any], *, now: float | None = None
) -> PolicyInfo:
    """Swap `service`'s policy; RemoteError (naming the field) when the policy or a parameter is bad."""
    return await bus.call(
        POLICY_SET, SetPolicy(policy=policy, params=params, now=now), svc=SERVICE_TOKENS[service]
    )


async def show_policies(
    bus: Bus, services: Sequence[str] = CONTROL_PLANE
) -> dict[str, PolicyInfo | str]:
    """Each service's active policy, or why it could not be asked."""
    results = await asyncio.gather(
        *(bus.call(POLICY, Empty(), within_s=3.0, svc=SERVICE_TOKENS[s]) for s in services),
        return_exceptions=True,
    )
    return {
        s: r if isinstance(r, PolicyInfo) else str(r)
        for s, r in zip(services, results, strict=True)
    }


# --------------------------------------------------------------------------- status


class ServiceStatus(msgspec.Struct, kw_only=True):
    service: str
    up: bool
    version: str | None = None
    contract: int | None = None
    policy: str | None = None
    params: dict[str, Any] = {}
    error: str | None = None


class ClusterStatus(msgspec.Struct, kw_only=True):
    cluster: str
    services: list[ServiceStatus]
    scheduler: SchedulerStatus | None = None
    nodes: ClusterInfo | None = None


async def _service_status(bus: Bus, name: str) -> ServiceStatus:
    token = SERVICE_TOKENS[name]
    try:
        pong = await bus.call(PING, Ping(), within_s=2.0, svc=token)
    except RemoteError as exc:
        return ServiceStatus(service=name, up=False, error=str(exc))
    status = ServiceStatus(
        service=name, up=True, version=pong.version, contract=pong.contract, policy=pong.policy
    )
    if pong.policy is not None:
        with contextlib.suppress(RemoteError):  # an older service without the policy route
            status.params = (await bus.call(POLICY, Empty(), within_s=2.0, svc=token)).params
    return status


async def cluster_status(bus: Bus) -> ClusterStatus:
    """Services (version, policy), the scheduler's queue, placement's nodes; whatever answers.
    The simclock is listed only when it answers: a real cluster has none."""
    services = list(await asyncio.gather(*(_service_status(bus, s) for s in SERVICES)))
    services = [s for s in services if s.up or s.service != "simclock"]
    up = {s.service for s in services if s.up}
    status = ClusterStatus(cluster=bus.subjects.cluster, services=services)
    if "scheduler" in up:
        with contextlib.suppress(RemoteError):
            status.scheduler = await bus.call(STATUS, Empty(), within_s=3.0)
    if "placement" in up:
        with contextlib.suppress(RemoteError):
            status.nodes = await bus.call(CLUSTER, Empty(), within_s=3.0)
    return status


def format_status(status: ClusterStatus) -> list[str]:
    lines = [f"cluster {status.cluster}", "", f"{'SERVICE':<11} {'STATE':<6} {'VERSION':<9} POLICY"]
    for s in status.services:
        params = " ".join(f"{k}={v}" for k, v in s.params.items())
        policy = f"{s.policy} {params}".strip() if s.policy else "-"
        lines.append(
            f"{s.service:<11} {'up' if s.up else 'down':<6} {s.version or '-':<9} {policy}"
        )
    if status.scheduler is not None:
        q = status.scheduler
        lines += ["", f"jobs: {q.queued} queued, {q.running} running, {q.finished} finished; "
                      f"{q.busy_gpus} GPUs busy"]  # fmt: skip
    if status.nodes is not None:
        info = status.nodes
        busy_by_node: dict[str, int] = {}
        for gpus in info.busy.values():
            for g in gpus:
                busy_by_node[g.node_id] = busy_by_node.get(g.node_id, 0) + 1
        capacity = ", ".join(f"{n} {t}" for t, n in sorted(info.capacity.items())) or "no GPUs"
        down = f", {len(info.down)} down" if info.down else ""
        lines += ["", f"nodes: {len(info.nodes)} up ({capacity}){down}"]
        for node in info.nodes[:50]:
            lines.append(
                f"  {node.node_id:<20} {node.gpu_type:<8} {busy_by_node.get(node.node_id, 0)}/{node.num_gpus} GPUs busy"
            )
        if len(info.nodes) > 50:
            lines.append(f"  ... and {len(info.nodes) - 50} more")
    return lines
