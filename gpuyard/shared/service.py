"""The base of every service: one ordered subscription, typed routes from the endpoint table, error
replies, a swappable policy, durable state, takeover by a replacement, and NATS micro discovery.

A `Service` listens on its subject prefix through one subscription: its requests are handled one at
a time, in arrival order, which keeps each service's state a simple sequential state machine and makes
simulations deterministic (a service that `commits_in_groups` still handles them so, and only defers
its write and answers while more wait). Handlers must not call (directly or through others) back into their own
service, or the chain deadlocks; the call graph is admission -> scheduler -> placement -> node agents.

Discovery: every service also answers the NATS micro protocol (`$SRV.PING|INFO|STATS[.<name>[.<id>]]`)
on a separate subscription, so `nats micro ls` and `nats micro info gpuyard-scheduler` list gpuyard's
services and endpoints; the endpoints themselves stay on the one ordered subscription.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import msgspec
import structlog
from nats.aio.msg import Msg
from nats.micro.service import (
    EndpointInfo,
    EndpointStats,
    ServiceInfo,
    ServicePing,
)
from nats.micro.service import ServiceStats as MicroStats

from . import __version__
from .connection import (
    Bus,
    NatsAuth,
    TlsFailure,
    add_nats_arguments,
    connect,
    decoder,
    encode,
    resolve_connection,
)
from .contract import (
    CONTRACT_VERSION,
    STATUS_HEADER,
    VERSION_HEADER,
    Empty,
    ErrorReply,
    Event,
    Ping,
    PolicyInfo,
    Pong,
    ServiceStats,
    SetPolicy,
)
from .endpoints import (
    PING,
    POLICY,
    POLICY_SET,
    SENDERS_KEPT,
    STATS,
    TAKEOVER,
    Endpoint,
    Subjects,
    subject_matches,
)
from .errors import (
    NOT_LEADING,
    BadRequest,
    NotLeading,
    RemoteError,
    error_from_validation,
    policy_error_field,
    policy_failure,
    policy_frame,
)
from .identity import Caller
from .leader import LEASE_S, Lease
from .policy import Policy, PolicyError, Registry
from .roster import SERVICE_TOKENS, SERVICES
from .store import KvStore, NullStore, StoreError, open_store

T = TypeVar("T")

# Normal traffic carries no headers (they cost ~10% per message); only error replies are marked.
# A client may still send `Gpuyard-Contract`, and services refuse a version they do not speak;
# our own clients check the version once, in the services' ping replies.
_ERROR_HEADERS = {VERSION_HEADER: str(CONTRACT_VERSION), STATUS_HEADER: "error"}

Handler = Callable[..., Awaitable[Any]]
"""A request's handler: `handler(request)`, or `handler(request, caller=...)` where the subject names
its sender."""


@dataclass
class _Route:
    endpoint: Endpoint[Any, Any]
    handler: Handler
    decoder: msgspec.json.Decoder[Any]
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    last_error: str = ""


class _Answer(msgspec.Struct):
    """A reply to send once the state the request changed is written (a Struct: one a request)."""

    msg: Msg
    route: _Route | None
    data: bytes
    """The encoded reply, or error reply (b"" for a reply completed at the commit: `later`)."""
    error: bool = False
    later: Any = None


@dataclass
class Later(Generic[T]):
    """A handler's reply that the service completes when it commits (`Service.before_commit`:
    admission tells the scheduler of the submissions of a group in one request), encoded then."""

    reply: T


TAKEOVER_TRIES = 5
"""How often a replacement asks the running instance to hand over, when a standby took the lease
in between each time."""

GROUP_MAX = 64
"""A service that commits in groups answers at least every this many requests."""


def _describe(exc: Exception) -> str:
    return str(exc) if isinstance(exc, RemoteError) else f"{type(exc).__name__}: {exc}"


class Service:
    """Base of every service: one ordered subscription on its prefix, typed routes, error replies.

    Subclasses set `name`, return their routes from `routes()` ({endpoint: handler}), and, when they
    have a policy, set `policies` (the registry) and `self.policy`/`self.policy_name`/`policy_params`.
    """

    name: ClassVar[str] = ""
    policies: ClassVar[Registry[Any] | None] = None
    answered_elsewhere: ClassVar[frozenset[str]] = frozenset()
    """Requests under our prefix that another service answers (a node agent's own heartbeats,
    placement's): left unanswered rather than refused."""
    """The registry this service's policy comes from (None: the service has no policy)."""
    decoded_as: ClassVar[dict[Endpoint[Any, Any], type[Any]]] = {}
    """Requests this service decodes as another type than the contract's, to judge their parts
    one by one (admission: each job spec of a submission)."""
    commits_in_groups: ClassVar[bool] = False
    """Under load, handle the requests already queued before writing the state once and answering
    them all (group commit: one write to the store for many requests, not one each). Only for a
    service that nothing it calls ever calls back from a handler: an answer held back would hold
    up a caller that the service is itself waiting for."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        if self.name in SERVICES:  # our requests act for this service (`svc.scheduler`)
            bus.caller = Caller("svc", self.name)
        self.log = structlog.get_logger().bind(service=self.name, cluster=bus.subjects.cluster)
        self._subs: list[Any] = []
        self._serving: list[Any] = []
        """The subscriptions whose messages go through `_dispatch`."""
        self._routes: dict[str, _Route] = {}
        self._unanswered: list[_Answer] = []
        """Requests handled whose state is not written yet (a group being committed)."""
        self.handled = 0
        self.handler_s = 0.0
        self.policy_s = 0.0
        """Subclasses add the time their policy takes here."""
        self.decision_s: list[float] = []
        """The scheduler: each decision's policy time, in order."""
        self.decisions_of_changes = 0
        """The scheduler: decisions that told only what changed."""
        self.policy: Any = None
        self.policy_name: str | None = None
        self.store: NullStore = NullStore()
        self.handed_over = asyncio.Event()
        """Set when a replacement process took over: the process may exit."""
        self.instance_id = uuid.uuid4().hex
        self.started_at = datetime.now(UTC)
        self.standby = False
        """Durable services: wait for the leader lease before serving (`--standby`), rather than
        take over from the running instance at once."""
        self.lease: Lease | None = None
        """Durable services: the leader lease this instance holds while it serves."""
        self._takeover_sub: Any = None
        self._lease_watch: asyncio.Task[None] | None = None
        self.stood_down = asyncio.Event()
        """Set when this instance lost its lease and stopped serving: it is done (a process
        starts a fresh instance, as a standby)."""

    # ------------------------------------------------------------------ for subclasses

    @property
    def durable(self) -> bool:
        return bool(getattr(getattr(self, "config", None), "durable", False))

    @property
    def replicas(self) -> int:
        return int(getattr(getattr(self, "config", None), "replicas", 1))

    @property
    def lease_s(self) -> float:
        return float(getattr(getattr(self, "config", None), "lease_s", LEASE_S))

    async def restore(self, values: dict[str, bytes]) -> None:
        """Take up the state loaded from the store (called before the first request)."""

    async def persist(self) -> None:
        """Write what the last request changed to `self.store` (called before its reply)."""

    async def hand_over(self) -> None:
        """A replacement takes over: stop background tasks (subscriptions are drained after)."""

    def routes(self) -> dict[Endpoint[Any, Any], Handler]:
        """The endpoints this service serves under its prefix, with their handlers."""
        return {}

    @property
    def token(self) -> str:
        """This service's subject token (`sched`), the `{svc}` of the common endpoints."""
        return SERVICE_TOKENS[self.name]

    @property
    def prefix(self) -> str:
        return f"{self.bus.subjects.root}.{self.token}"

    def subject_params(self) -> dict[str, str]:
        """Placeholders of this instance's endpoints (a node agent adds its `node`)."""
        return {"svc": self.token}

    # ------------------------------------------------------------------ policies

    def make_policy(self, name: str, params: dict[str, Any]) -> Policy:
        """A policy instance from this service's registry; raises PolicyError."""
        assert self.policies is not None
        policy: Policy = self.policies.create(name, params)
        return policy

    def install_policy(self, name: str, params: dict[str, Any]) -> None:
        """Make `name` the active policy (raise PolicyError, keeping the old one, when bad)."""
        self.policy = self.make_policy(name, params)
        self.policy_name = name

    def policy_swapped(self) -> None:
        """Called after a runtime swap (the scheduler decides again, stores it, ...)."""

    def policy_info(self, previous: str | None = None) -> PolicyInfo:
        params = msgspec.to_builtins(self.policy.params) if self.policy is not None else {}
        return PolicyInfo(
            service=self.name, policy=self.policy_name, params=params, previous=previous
        )

    async def get_policy(self, _: Empty) -> PolicyInfo:
        return self.policy_info()

    async def set_policy(self, req: SetPolicy) -> PolicyInfo:
        if self.policies is None:
            raise BadRequest(f"the {self.name} service has no policy", field="$.policy")
        old = self.policy_name
        # The same policy with new parameters goes on from its state (a queue's decayed usage
        # survives a new queues file, as it survives a restart).
        kept = self.policy.snapshot() if req.policy == old else None
        try:
            self.install_policy(req.policy, dict(req.params))
        except PolicyError as exc:
            raise BadRequest(str(exc), field=policy_error_field(str(exc))) from None
        if kept is not None:
            self.policy.restore(kept)
        self.policy_swapped()
        info = self.policy_info(previous=old)
        await self._policy_changed(old, info, "set", req.now)
        return info

    async def _policy_changed(
        self, old: str | None, info: PolicyInfo, how: str, now: float | None = None
    ) -> None:
        self.log.info("policy.changed", old=old, new=info.policy, params=info.params, how=how)
        reason = f"{old} -> {info.policy} {encode(info.params).decode()}"
        await self.bus.emit(
            Event(
                type="policy.changed", now=now if now is not None else time.time(),
                reason=reason if how == "set" else f"{reason} ({how})", service=self.name,
            )
        )  # fmt: skip

    # ------------------------------------------------------------------ every service

    async def ping(self, _: Ping) -> Pong:
        return Pong(
            service=self.name, cluster=self.bus.subjects.cluster, version=__version__,
            policy=self.policy_name,
        )  # fmt: skip

    async def stats(self, _: Empty) -> ServiceStats:
        return ServiceStats(
            service=self.name, handled=self.handled, handler_s=self.handler_s,
            policy_s=self.policy_s, requests=self.bus.request_stats, decision_s=self.decision_s,
            decisions_of_changes=self.decisions_of_changes,
        )  # fmt: skip

    # ------------------------------------------------------------------ durable state, takeover

    async def prepare(self) -> None:
        """Durable services: become the leader (a standby waits for the lease; any other instance
        has the running one hand over), then load the state the previous leader left.

        The old instance stops taking requests and finishes those in hand before it answers; a
        request that arrives in between finds nobody listening and its caller retries.
        """
        if not self.durable:
            return
        self.store = await open_store(
            self.bus.nc, self.bus.subjects.cluster, self.name, durable=True,
            replicas=self.replicas,
        )  # fmt: skip
        assert isinstance(self.store, KvStore)
        self.lease = Lease(self.store.kv, self.instance_id, self.lease_s, self.log)
        previous: PolicyInfo | None = None
        if self.standby:
            self.log.info(
                "service.standing_by", lease_s=self.lease_s, instance=self.instance_id,
                pid=os.getpid(),
            )  # fmt: skip
            await self.lease.acquire()
        else:
            previous = await self._take_over()
        self.bus.fence = self.store.fence = self.lease
        self._lease_watch = asyncio.create_task(self._stand_down_when_lost(self.lease))
        started = time.perf_counter()
        await self.restore(await self.store.load())
        self.log.info("state.restored", took_s=round(time.perf_counter() - started, 4))
        mine = self.policy_info()
        if previous is not None and (previous.policy, previous.params) != (
            mine.policy,
            mine.params,
        ):
            # A replacement with another policy: the stream shows the swap like a `policy set`.
            await self._policy_changed(previous.policy, mine, "took over")
        self._takeover_sub = await self.bus.nc.subscribe(
            self.bus.subjects.of(TAKEOVER, svc=self.token), cb=self._on_takeover
        )

    async def _take_over(self) -> PolicyInfo | None:
        """Have the running instance (if any) hand over, and take the lease from it: the policy it
        ran. A standby that took the lease meanwhile is asked in turn."""
        assert self.lease is not None and isinstance(self.store, KvStore)
        for _ in range(TAKEOVER_TRIES):
            previous: PolicyInfo | None = None
            try:
                previous = await self.bus.call(TAKEOVER, Empty(), within_s=60.0, svc=self.token)
                self.log.info("service.took_over")
            except RemoteError as exc:
                if exc.reply.error != "no service is listening":
                    raise
            if await self.store.while_unavailable(self.lease.seize):
                return previous
        raise StoreError(f"could not take the {self.name}'s leader lease: other instances kept it")

    async def _on_takeover(self, msg: Msg) -> None:
        refused = self._takeover_refused(msg)
        if refused is not None:  # not a replacement's request: one line, and keep serving
            self.log.warning(
                "takeover.refused", subject=msg.subject, error=refused.error, field=refused.field
            )
            if msg.reply:
                error = ErrorReply(error=refused.error, field=refused.field, subject=msg.subject)
                with contextlib.suppress(Exception):
                    await self.bus.nc.publish(msg.reply, encode(error), headers=_ERROR_HEADERS)
            return
        self.log.info("service.handing_over")
        await self._stand_down()
        if self.lease is not None:  # (the replacement writes it over our last revision)
            await self.lease.stop_renewing()
        await msg.respond(encode(self.policy_info()))
        self.handed_over.set()

    async def _stand_down(self) -> None:
        """Serve no more: stop background tasks, finish the requests in hand (those queued get
        `NOT_LEADING` once the lease is gone: their callers ask again, and find the next leader)."""
        await self.hand_over()
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.drain()
        self._subs.clear()
        self._serving.clear()

    async def _stand_down_when_lost(self, lease: Lease) -> None:
        """The lease is lost (taken, or not renewed for long): stop serving."""
        await lease.lost.wait()
        if self._takeover_sub is not None:
            with contextlib.suppress(Exception):
                await self._takeover_sub.unsubscribe()
        await self._stand_down()
        await lease.stop_renewing()
        self.stood_down.set()

    def _takeover_refused(self, msg: Msg) -> BadRequest | None:
        """Why `msg` is no takeover request (None: it is one). A replacement asks through
        `Bus.call`: an `Empty` body and a reply subject, where it waits for our state."""
        if self.handed_over.is_set():
            return BadRequest("this instance has handed over already")
        if msg.subject != self.bus.subjects.of(TAKEOVER, svc=self.token):
            return BadRequest(f"{msg.subject!r} is not this service's takeover subject")
        if not msg.reply:
            return BadRequest("a takeover needs a reply subject to answer on")
        if (unsupported := _version_refused(msg)) is not None:
            return unsupported
        try:
            decoder(TAKEOVER.request).decode(msg.data or b"{}")
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return error_from_validation(exc)
        return None

    # ------------------------------------------------------------------ serving

    async def start(self) -> None:
        await self.prepare()
        common: dict[Endpoint[Any, Any], Handler] = {PING: self.ping, STATS: self.stats}
        if self.policies is not None:
            common |= {POLICY: self.get_policy, POLICY_SET: self.set_policy}
        await self.listen(self.prefix, {**common, **self.routes()})
        await self._serve_discovery()
        self.log.info("service.started", prefix=self.prefix)

    async def listen(self, prefix: str, routes: dict[Endpoint[Any, Any], Handler]) -> None:
        """Serve `routes` on one subscription to `<prefix>.>`, routed by the subject after
        `prefix`: the requests are handled one at a time, in arrival order. An endpoint that names
        its caller (`adm.submit.{caller}`) is routed by the subject without the caller's tokens."""
        table: dict[str, _Route] = {}
        for endpoint, handler in routes.items():
            subject = self.bus.subjects.every(endpoint, **self.subject_params())
            if not subject.startswith(prefix + "."):
                raise ValueError(f"{endpoint.pattern} is not under {prefix}")
            table[subject[len(prefix) + 1 :].removesuffix(".*.*")] = self._route(
                subject, endpoint, handler
            )

        routed: dict[str, _Route | None] = {}  # suffix -> route, as found the first time

        def find(suffix: str) -> _Route | None:
            route = table.get(suffix)
            if route is None or route.endpoint.sender == "caller":
                route = table.get(suffix.rsplit(".", 2)[0])
                if route is not None and route.endpoint.sender != "caller":
                    route = None
            if len(routed) >= SENDERS_KEPT:
                routed.clear()
            routed[suffix] = route
            return route

        head = prefix + "."

        async def dispatch(msg: Msg) -> None:
            if not msg.subject.startswith(head):
                self._misdelivered(msg, f"{prefix}.>")
                return
            suffix = msg.subject[len(head) :]
            route = routed[suffix] if suffix in routed else find(suffix)
            await self._dispatch(msg, route, table, suffix)

        await self._subscribe(f"{prefix}.>", dispatch)

    async def serve(self, endpoint: Endpoint[Any, Any], handler: Handler, **params: str) -> None:
        """Serve one endpoint on a subscription of its own; placeholders not given in `params` are
        wildcards (the simclock answers every node's `node.*.cmd`, placement hears every `hb`)."""
        subject = self.bus.subjects.every(endpoint, **{**self.subject_params(), **params})
        route = self._route(subject, endpoint, handler)
        table = {endpoint.name: route}

        async def dispatch(msg: Msg) -> None:
            if not subject_matches(subject, msg.subject):
                self._misdelivered(msg, subject)
                return
            await self._dispatch(msg, route, table, endpoint.name)

        await self._subscribe(subject, dispatch)

    def _misdelivered(self, msg: Msg, subscribed: str) -> None:
        """A message on our subscription with a subject it does not match: a stream consumer
        someone pointed at our subject delivers the stream's messages with their own subjects.
        Nobody sent it to us: one line, and it is dropped."""
        self.log.warning("message.misdelivered", subject=msg.subject, subscribed=subscribed)

    async def _subscribe(self, subject: str, dispatch: Callable[[Msg], Awaitable[None]]) -> None:
        sub = await self.bus.nc.subscribe(subject, queue=self.name, cb=dispatch)
        self._subs.append(sub)
        self._serving.append(sub)

    def queued(self) -> int:
        """Requests received and not yet handled (the load: they wait behind the one in hand)."""
        return sum(sub.pending_msgs for sub in self._serving)

    def _route(self, subject: str, endpoint: Endpoint[Any, Any], handler: Handler) -> _Route:
        request = self.decoded_as.get(endpoint, endpoint.request)
        route = self._routes[subject] = _Route(endpoint, handler, decoder(request))
        return route

    async def _dispatch(
        self, msg: Msg, route: _Route | None, table: dict[str, _Route], suffix: str
    ) -> None:
        """Handle one request; then write the state and answer, unless this service commits in
        groups and requests wait behind it (the last of them answers them all)."""
        started = time.perf_counter()
        try:
            answer = await self._handle(msg, route, table, suffix)
            if answer is not None:
                self._unanswered.append(answer)
            if not (self.commits_in_groups and self.queued() and len(self._unanswered) < GROUP_MAX):
                await self._commit()
        finally:
            took = time.perf_counter() - started
            self.handled += 1
            self.handler_s += took
            if route is not None:
                route.requests += 1
                route.seconds += took

    async def _handle(
        self, msg: Msg, route: _Route | None, table: dict[str, _Route], suffix: str
    ) -> _Answer | None:
        """Run the request's handler: its answer (None: a publish, which gets none)."""
        try:
            if self.lease is not None and not self.lease.holds():
                await self.lease.confirm()
            if route is None:
                if not msg.reply or suffix in self.answered_elsewhere:
                    return None  # a publish this service does not serve, or not ours to answer
                raise BadRequest(f"unknown request {suffix!r}; known: {', '.join(sorted(table))}")
            if (unsupported := _version_refused(msg)) is not None:
                raise unsupported
            try:
                request = route.decoder.decode(msg.data or b"{}")
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                raise error_from_validation(exc) from None
            now = getattr(request, "now", None)
            if now is not None:
                structlog.contextvars.bind_contextvars(now=now)
            if route.endpoint.sender is not None:
                caller = self.bus.subjects.sender(route.endpoint, msg.subject)
                if caller is None:
                    raise BadRequest(f"subject {msg.subject!r} names no valid identity")
                reply = await route.handler(request, caller=caller)
            else:
                reply = await route.handler(request)
        except NotLeading:
            if not msg.reply:
                return None
            return self._failed(msg, route, ErrorReply(error=NOT_LEADING, subject=msg.subject))
        except BadRequest as exc:
            self.log.warning(
                "request.rejected", subject=msg.subject, error=exc.error, field=exc.field
            )
            error = ErrorReply(error=exc.error, field=exc.field, subject=msg.subject)
            return self._failed(msg, route, error)
        except Exception as exc:  # a bug or a failed downstream call: answer, log, keep serving
            message, located = self._failure(exc)
            self.log.exception("request.failed", subject=msg.subject, **located)
            return self._failed(msg, route, ErrorReply(error=message, subject=msg.subject))
        if msg.reply and route.endpoint.reply is not None:
            if isinstance(reply, Later):
                return _Answer(msg, route, b"", later=reply.reply)
            return _Answer(msg, route, encode(reply))
        return None

    async def _commit(self) -> None:
        """Write what the requests handled changed, then answer them: a reply means durable."""
        answers, self._unanswered = self._unanswered, []
        try:
            if self.lease is not None and not self.lease.holds():
                await self.lease.confirm()  # (a write after another took over would undo its own)
            await self.before_commit()
            await self.persist()
        except NotLeading:
            answers = [
                a if a.error else self._failed(a.msg, a.route, ErrorReply(
                    error=NOT_LEADING, subject=a.msg.subject))
                for a in answers
            ]  # fmt: skip
        except Exception as exc:  # not written: the callers must not take it as done
            error, located = self._failure(exc)  # (the policy's snapshot may have raised)
            self.log.exception("state.not_written", requests=len(answers), **located)
            answers = [
                a if a.error else self._failed(a.msg, a.route, ErrorReply(
                    error=error, subject=a.msg.subject))
                for a in answers
            ]  # fmt: skip
        for answer in answers:
            if answer.msg.reply:
                headers = _ERROR_HEADERS if answer.error else None
                data = (
                    encode(answer.later)
                    if answer.later is not None and not answer.error
                    else answer.data
                )
                await self.bus.nc.publish(answer.msg.reply, data, headers=headers)

    async def before_commit(self) -> None:
        """What a service finishes for the requests of a group before their state is written and
        they are answered (`Later` replies); raising fails them all."""

    def _failure(self, exc: Exception) -> tuple[str, dict[str, str]]:
        """What the caller is told of an exception that is not a BadRequest, and what the log line
        adds: the service, the policy and the line of the policy's own code it was raised from,
        when it came from there (`errors.policy_failure`)."""
        frame = policy_frame(exc, self.policy)
        if frame is None:
            return _describe(exc), {}
        kind = self.policies.kind if self.policies is not None else "its"
        error = policy_failure(exc, frame, self.name, kind, self.policy_name)
        at = f"{frame.filename}:{frame.lineno}"
        return error, {"error": error, "policy": str(self.policy_name), "at": at, "in": frame.name}

    @staticmethod
    def _failed(msg: Msg, route: _Route | None, error: ErrorReply) -> _Answer:
        if route is not None:
            route.errors += 1
            route.last_error = error.error
        return _Answer(msg, route, encode(error), error=True)

    # ------------------------------------------------------------------ NATS micro discovery

    @property
    def micro_name(self) -> str:
        return f"gpuyard-{self.name}"

    def _micro_identity(self) -> dict[str, Any]:
        return {
            "id": self.instance_id,
            "name": self.micro_name,
            "version": __version__,
            "metadata": {
                "cluster": self.bus.subjects.cluster,
                "contract": str(CONTRACT_VERSION),
                **({"policy": self.policy_name} if self.policy_name else {}),
            },
        }

    def micro_info(self) -> dict[str, Any]:
        endpoints = [
            EndpointInfo(
                name=r.endpoint.pattern.replace("{svc}.", "").replace("{node}", "*"),
                subject=subject,
                queue_group=self.name,
                metadata={
                    "request": r.endpoint.request.__name__,
                    "reply": r.endpoint.reply.__name__ if r.endpoint.reply else "",
                },
            )
            for subject, r in self._routes.items()
        ]
        return ServiceInfo(
            **self._micro_identity(), description=(type(self).__doc__ or "").split("\n")[0],
            endpoints=endpoints,
        ).to_dict()  # fmt: skip

    def micro_stats(self) -> dict[str, Any]:
        endpoints = [
            EndpointStats(
                name=r.endpoint.pattern.replace("{svc}.", "").replace("{node}", "*"),
                subject=subject, queue_group=self.name, num_requests=r.requests,
                num_errors=r.errors, processing_time=int(r.seconds * 1e9),
                average_processing_time=int(r.seconds * 1e9 / r.requests) if r.requests else 0,
                last_error=r.last_error or None,
            )
            for subject, r in self._routes.items()
        ]  # fmt: skip
        return MicroStats(
            **self._micro_identity(), started=self.started_at.replace(tzinfo=None),
            endpoints=endpoints,
        ).to_dict()  # fmt: skip

    async def _serve_discovery(self) -> None:
        """`$SRV.<VERB>`, `$SRV.<VERB>.<name>` and `$SRV.<VERB>.<name>.<id>` on one subscription
        (no queue group: every instance answers)."""
        answers = {
            "PING": lambda: ServicePing(**self._micro_identity()).to_dict(),
            "INFO": self.micro_info,
            "STATS": self.micro_stats,
        }

        async def answer(msg: Msg) -> None:
            _, verb, *rest = msg.subject.split(".")
            if verb not in answers or not msg.reply:
                return
            if rest[:1] not in ([], [self.micro_name]) or rest[1:2] not in ([], [self.instance_id]):
                return
            await self.bus.nc.publish(msg.reply, msgspec.json.encode(answers[verb]()))

        self._subs.append(await self.bus.nc.subscribe("$SRV.>", cb=answer))

    async def stop(self) -> None:
        """Stop taking new messages, finish those in hand, and close the connection. A leader
        hands over first: it releases its lease for a standby to take at once."""
        if self._lease_watch is not None:
            self._lease_watch.cancel()
        if self.lease is not None and self.lease.revision and not self.handed_over.is_set():
            await self._stand_down()
            await self.lease.release()
        await self.bus.close()
        self.log.info("service.stopped")


def _version_refused(msg: Msg) -> BadRequest | None:
    """Why `msg`'s contract version is not ours (None: it is, or it names none)."""
    version = msg.headers.get(VERSION_HEADER) if msg.headers else None
    if version is None or version == str(CONTRACT_VERSION):
        return None
    return BadRequest(
        f"contract version {version} is not supported (this service speaks {CONTRACT_VERSION})"
    )


class ServiceClass(Protocol):
    """A service's class: its name, and made from a bus and its configuration."""

    name: str

    def __call__(self, bus: Bus, config: Any) -> Service: ...


COLLECTOR_THRESHOLDS = (50_000, 20, 100)
"""Allocations between collections of the youngest generation, and collections of each between
those of the next (Python's defaults: 700, 10, 10)."""


def collect_cycles_rarely() -> None:
    """For a process that runs services: they keep many long-lived objects (job records, specs,
    views) and make few reference cycles, so the cyclic collector's default pace (the young
    objects every 700 allocations, the whole heap every hundredth time) mostly walks live
    objects: 6% of a 100,000-job simulation's time, 0.1% at this pace (`COLLECTOR_THRESHOLDS`)."""
    import gc

    gc.set_threshold(*COLLECTOR_THRESHOLDS)


def run_service(
    service_cls: ServiceClass, config_cls: type[Any], argv: list[str] | None = None
) -> None:
    """The entry point of a service run on its own: `--nats URL --cluster NAME --config FILE.json`."""
    import signal

    collect_cycles_rarely()

    from .logs import configure_logging

    parser = argparse.ArgumentParser(prog=f"gpuyard-{service_cls.name}")
    add_nats_arguments(parser, url_default="nats://127.0.0.1:4222", cluster_default="default")
    parser.add_argument("--config", help="JSON file with the service's configuration")
    if "replicas" in config_cls.__struct_fields__:
        parser.add_argument(
            "--replicas", type=int, default=None, metavar="N",
            help="copies of its durable state on a NATS cluster (1-5; 3 on three servers): the "
            "config's `replicas`, for one config file on a cluster of any size",
        )  # fmt: skip
    if "durable" in config_cls.__struct_fields__:
        parser.add_argument(
            "--standby", action="store_true",
            help="connect and wait: take over (load the stored state and serve) when the running "
            "instance's leader lease lapses or it stops; durable services only",
        )  # fmt: skip
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    try:
        resolve_connection(args)
        raw = Path(args.config).read_bytes() if args.config else b"{}"
        config = msgspec.json.decode(raw, type=config_cls)
        if getattr(args, "replicas", None) is not None:
            config = msgspec.convert(
                {**msgspec.to_builtins(config), "replicas": args.replicas}, config_cls
            )
        subjects = Subjects(args.cluster)
        if getattr(args, "standby", False) and not config.durable:
            raise ValueError(
                '--standby needs a durable service (`"durable": true` in its config): a '
                "standby takes over the state the running instance stored"
            )
    except (OSError, ValueError, msgspec.ValidationError) as exc:
        parser.error(f"bad configuration: {exc}")

    async def main() -> None:
        try:
            nc = await connect(
                args.nats, name=f"gpuyard-{service_cls.name}-{args.cluster}",
                auth=NatsAuth.from_args(args),
            )  # fmt: skip
        except TlsFailure as exc:  # (it would not pass by trying again)
            parser.exit(1, f"gpuyard-{service_cls.name}: cannot connect to NATS: {exc}\n")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        stopping = asyncio.ensure_future(stop.wait())
        standby = bool(getattr(args, "standby", False))
        while True:  # one instance a term as leader: one that lost its lease stands by afresh
            try:
                service = service_cls(Bus(nc, subjects), config)
            except (PolicyError, ValueError) as exc:
                await nc.close()
                parser.exit(2, f"gpuyard-{service_cls.name}: bad configuration: {exc}\n")
            service.standby = standby
            starting = asyncio.ensure_future(service.start())
            await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
            if not starting.done():  # stopped while standing by
                starting.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await starting
                break
            try:
                starting.result()
            except StoreError as exc:
                await nc.close()
                parser.exit(1, f"gpuyard-{service_cls.name}: {exc}\n")
            ending = [
                stopping, asyncio.ensure_future(service.handed_over.wait()),
                asyncio.ensure_future(service.stood_down.wait()),
            ]  # fmt: skip
            await asyncio.wait(ending, return_when=asyncio.FIRST_COMPLETED)
            for waiting in ending[1:]:
                waiting.cancel()
            if not service.stood_down.is_set() or stop.is_set():
                break
            standby = True
        await service.stop()

    import uvloop

    uvloop.run(main())
