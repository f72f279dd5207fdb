"""A small typed layer over nats-py: requests with typed replies, error replies, services, events.

A `Service` listens on its subject prefix through one subscription: its requests are handled one at
a time, in arrival order, which keeps each service's state a simple sequential state machine and makes
simulations deterministic. Handlers must not call (directly or through others) back into their own
service, or the chain deadlocks; the call graph is admission -> scheduler -> placement -> node agents.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import msgspec
import nats
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from . import __version__
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
    Subjects,
)
from .policy import PolicyError
from .store import NullStore, open_store

T = TypeVar("T")

_encoder = msgspec.json.Encoder()
_error_decoder = msgspec.json.Decoder(ErrorReply)
# Normal traffic carries no headers (they cost ~10% per message); only error replies are marked.
# A client may still send `Gpuyard-Contract`, and services refuse a version they do not speak;
# our own clients check the version once, in the services' ping replies.
_ERROR_HEADERS = {VERSION_HEADER: str(CONTRACT_VERSION), STATUS_HEADER: "error"}
_TRANSIENT = frozenset({"no service is listening", "timed out"})


def encode(msg: Any) -> bytes:
    return _encoder.encode(msg)


class RemoteError(Exception):
    """The other side answered with an ErrorReply."""

    def __init__(self, reply: ErrorReply) -> None:
        where = f" (field {reply.field})" if reply.field else ""
        super().__init__(f"{reply.subject}: {reply.error}{where}")
        self.reply = reply


class BadRequest(Exception):
    """Raised by a handler: the request is wrong. Becomes an ErrorReply naming `field`."""

    def __init__(self, error: str, field: str | None = None) -> None:
        super().__init__(error)
        self.error = error
        self.field = field


_AT = re.compile(r"^(?P<msg>.*) - at `(?P<path>\$[^`]*)`$", re.S)
_MISSING = re.compile(r"(?:missing required field|unknown field) `(?P<name>[^`]*)`")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _child(path: str, name: str) -> str:
    """`$.a` + `b` -> `$.a.b`; names that are not identifiers in brackets: `$.a[""]`."""
    return (
        f"{path}.{name}"
        if _IDENTIFIER.match(name)
        else f"{path}[{msgspec.json.encode(name).decode()}]"
    )


_POST_INIT = re.compile(r"^(?P<name>[a-z_][a-z0-9_]*) \(")


def _policy_error_field(text: str) -> str:
    """The field a PolicyError is about: `$.policy` (unknown name) or `$.params[.name]`."""
    if text.startswith("unknown "):
        return "$.policy"
    at = re.search(r"- at `\$(?P<path>[^`]*)`", text)
    named = _MISSING.search(text)
    path = "$.params" + (at["path"] if at else "")
    return _child(path, named["name"]) if named else path


def error_from_validation(exc: msgspec.ValidationError | msgspec.DecodeError) -> BadRequest:
    """Turn msgspec's message (`... - at `$.jobs[0].num_gpus``) into an error with a field path."""
    text = str(exc)
    m = _AT.match(text)
    if not m:
        top = _MISSING.search(text)  # a top-level field: msgspec gives no path
        return BadRequest(text, field=_child("$", top["name"]) if top else None)
    msg, path = m["msg"], m["path"]
    named = _MISSING.search(msg) or _POST_INIT.match(msg)
    if named:
        path = _child(path, named["name"])
    return BadRequest(msg, field=path)


@dataclass(frozen=True)
class NatsAuth:
    """Who we are to NATS and how the connection is protected; every field is optional.

    `user`/`password` or `token` for servers with users in their config (deploy/nats/auth.conf),
    `creds` for a `.creds` file (JWT and NKey seed, decentralised auth), `nkey_seed` for a seed
    file; `tls_ca` to verify the server (with a `tls://` URL or a server that requires TLS), plus
    `tls_cert`/`tls_key` for mutual TLS. `inbox_prefix` keeps replies under a subject the user
    alone may read (default `_INBOX`).
    """

    user: str | None = None
    password: str | None = None
    token: str | None = None
    creds: str | None = None
    nkey_seed: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_hostname: str | None = None
    inbox_prefix: str | None = None

    SECRET_FIELDS: ClassVar[frozenset[str]] = frozenset({"password", "token"})

    def ssl_context(self) -> ssl.SSLContext | None:
        if not (self.tls_ca or self.tls_cert):
            return None
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca)
        if self.tls_cert:
            context.load_cert_chain(self.tls_cert, self.tls_key)
        return context

    def options(self) -> dict[str, Any]:
        """Keyword arguments for `nats.connect`."""
        options: dict[str, Any] = {}
        if self.user is not None:
            options["user"] = self.user
        if self.password is not None:
            options["password"] = self.password
        if self.token is not None:
            options["token"] = self.token
        if self.creds:
            options["user_credentials"] = self.creds
        if self.nkey_seed:
            options["nkeys_seed"] = self.nkey_seed
        context = self.ssl_context()
        if context is not None:
            options["tls"] = context
        if self.tls_hostname:
            options["tls_hostname"] = self.tls_hostname
        if self.inbox_prefix:
            options["inbox_prefix"] = self.inbox_prefix
        return options

    def argv(self) -> list[str]:
        """The command-line options that give a child process this identity, secrets left out."""
        args: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and f.name not in self.SECRET_FIELDS:
                args += [f"--nats-{f.name.replace('_', '-')}", str(value)]
        return args

    def env(self) -> dict[str, str]:
        """The secrets, as the environment variables `add_nats_arguments` reads."""
        return {
            f"GPUYARD_NATS_{name.upper()}": value
            for name in sorted(self.SECRET_FIELDS)
            if (value := getattr(self, name)) is not None
        }

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> NatsAuth:
        """From the options added by `add_nats_arguments`."""
        return cls(**{f.name: getattr(args, f"nats_{f.name}", None) for f in fields(cls)})


def add_nats_arguments(parser: argparse.ArgumentParser, *, url_default: str | None) -> None:
    """`--nats URL` and the `--nats-*` identity and TLS options, for services and the CLI alike.

    Secrets may come from the environment (`GPUYARD_NATS_PASSWORD`, `GPUYARD_NATS_TOKEN`) so they
    do not show in the process list; the others too (`GPUYARD_NATS_USER`, `GPUYARD_NATS_CREDS`, ...).
    """
    env = os.environ.get
    g = parser.add_argument_group("NATS connection")
    g.add_argument(
        "--nats",
        default=env("GPUYARD_NATS", url_default),
        help="NATS server URL(s), comma-separated",
    )
    helps = {
        "user": "user name (auth.conf users)",
        "password": "password (better: $GPUYARD_NATS_PASSWORD)",
        "token": "authorization token (better: $GPUYARD_NATS_TOKEN)",
        "creds": "a .creds file (JWT + NKey seed)",
        "nkey_seed": "an NKey seed file",
        "tls_ca": "CA certificate(s) to verify the server (PEM)",
        "tls_cert": "client certificate for mutual TLS (PEM)",
        "tls_key": "the client certificate's private key (PEM)",
        "tls_hostname": "the server name to verify, when it differs from the URL's host",
        "inbox_prefix": "reply subjects' prefix (default _INBOX)",
    }
    for name, text in helps.items():
        g.add_argument(
            f"--nats-{name.replace('_', '-')}",
            dest=f"nats_{name}",
            default=env(f"GPUYARD_NATS_{name.upper()}"),
            metavar=name.split("_")[-1].upper(),
            help=text,
        )


async def connect(url: str, *, name: str, auth: NatsAuth | None = None, **options: Any) -> Client:
    """Connect with reconnects that never give up (a restarted server is picked up again).

    `url` may list several servers, comma-separated; `options` override any default.
    """
    settings: dict[str, Any] = {
        "name": name,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.5,
        "allow_reconnect": True,
        # Stopping finishes the requests in hand, but never waits long on a chain whose far end
        # is already gone.
        "drain_timeout": 5,
        **(auth.options() if auth is not None else {}),
        **options,
    }
    return await nats.connect(url.split(",") if "," in url else url, **settings)


class Bus:
    """One NATS connection of one service in one cluster."""

    def __init__(self, nc: Client, subjects: Subjects, *, request_timeout: float = 120.0) -> None:
        self.nc = nc
        self.subjects = subjects
        self.request_timeout = request_timeout
        self._decoders: dict[type, msgspec.json.Decoder] = {}
        self.request_stats: dict[str, list[float]] = {}
        """Per request subject (cluster prefix dropped): [count, seconds waited], for benchmarks."""

    def decoder(self, typ: type[T]) -> msgspec.json.Decoder[T]:
        dec = self._decoders.get(typ)
        if dec is None:
            dec = self._decoders[typ] = msgspec.json.Decoder(typ)
        return dec

    async def request(
        self, subject: str, msg: Any, reply_type: type[T], *, within_s: float | None = None,
        retry_for_s: float = 0.0,
    ) -> T:  # fmt: skip
        """Send a request and decode the reply; raise RemoteError on an error reply.

        `retry_for_s`: for requests that are safe to repeat (idempotent), keep trying for this long
        while nobody listens or a reply does not come (the service is restarting), with backoff.
        """
        if retry_for_s <= 0:
            return await self._request_once(subject, msg, reply_type, within_s)
        deadline = time.monotonic() + retry_for_s
        pause = 0.05
        while True:
            try:
                return await self._request_once(subject, msg, reply_type, within_s)
            except RemoteError as exc:
                if exc.reply.error not in _TRANSIENT or time.monotonic() + pause > deadline:
                    raise
                structlog.get_logger().warning(
                    "request.retrying", subject=subject, error=exc.reply.error, pause_s=pause
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)

    async def _request_once(
        self, subject: str, msg: Any, reply_type: type[T], within_s: float | None
    ) -> T:
        started = time.perf_counter()
        try:
            reply = await self.nc.request(
                subject, encode(msg), timeout=within_s or self.request_timeout
            )
        except NoRespondersError:
            raise RemoteError(
                ErrorReply(error="no service is listening", subject=subject)
            ) from None
        except NatsTimeoutError:
            raise RemoteError(ErrorReply(error="timed out", subject=subject)) from None
        key = subject[len(self.subjects.root) + 1 :]
        stat = self.request_stats.get(key)
        if stat is None:
            stat = self.request_stats[key] = [0, 0.0]
        stat[0] += 1
        stat[1] += time.perf_counter() - started
        if reply.headers and reply.headers.get(STATUS_HEADER) == "error":
            raise RemoteError(_error_decoder.decode(reply.data))
        return self.decoder(reply_type).decode(reply.data)

    async def emit(self, event: Event) -> None:
        await self.nc.publish(self.subjects.event(event.type), encode(event))

    async def close(self) -> None:
        if not self.nc.is_closed:
            await self.nc.drain()


async def ensure_event_stream(
    nc: Client, subjects: Subjects, *, max_age_s: float, storage: str = "file"
) -> bool:
    """Create (or update) the cluster's JetStream stream capturing `gpuyard.<cluster>.evt.>`.

    Returns False when the server has no JetStream: events are then published but not stored.
    """
    from nats.js.api import RetentionPolicy, StorageType, StreamConfig
    from nats.js.errors import Error as JetStreamError

    config = StreamConfig(
        name=subjects.stream_name,
        subjects=[f"{subjects.events}.>"],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType(storage),
        max_age=max_age_s,
    )
    js = nc.jetstream()
    try:
        try:
            await js.update_stream(config)
        except nats.js.errors.NotFoundError:
            await js.add_stream(config)
    except (JetStreamError, NatsTimeoutError, NoRespondersError):
        return False
    return True


@dataclass(frozen=True)
class Route:
    handler: Callable[[Any], Awaitable[Any]]
    request_type: type


class Service:
    """Base of every service: one ordered subscription on its prefix, typed routes, error replies."""

    name: ClassVar[str] = ""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.log = structlog.get_logger().bind(service=self.name, cluster=bus.subjects.cluster)
        self._subs: list[Any] = []
        self.handled = 0
        self.handler_s = 0.0
        self.policy_s = 0.0
        """Subclasses add the time their policy takes here."""
        self.store: NullStore = NullStore()
        self.handed_over = asyncio.Event()
        """Set when a replacement process took over: the process may exit."""

    # Durable services (`durable` in their config) override these three.
    @property
    def durable(self) -> bool:
        return bool(getattr(getattr(self, "config", None), "durable", False))

    async def restore(self, values: dict[str, bytes]) -> None:
        """Take up the state loaded from the store (called before the first request)."""

    async def persist(self) -> None:
        """Write what the last request changed to `self.store` (called before its reply)."""

    async def hand_over(self) -> None:
        """A replacement takes over: stop background tasks (subscriptions are drained after)."""

    # Subclasses: the routes under their prefix, and optional extra listeners.
    def routes(self) -> dict[str, Route]:
        return {}

    @property
    def prefix(self) -> str:
        return self.bus.subjects.service(self.name)

    def describe_policy(self) -> str | None:
        return None

    def describe_policy_params(self) -> dict[str, Any]:
        """The active policy's parameters, defaults included (services with a policy override)."""
        return {}

    def swap_policy(self, policy: str, params: dict[str, Any]) -> None:
        """Install a new policy (services with a policy override): raise PolicyError when the name
        or the parameters are bad, leaving the old one in place. Called between two requests, so
        the new policy makes the next decision."""
        raise BadRequest(f"the {self.name} service has no policy", field="$.policy")

    def policy_info(self, previous: str | None = None) -> PolicyInfo:
        return PolicyInfo(
            service=self.name, policy=self.describe_policy(),
            params=self.describe_policy_params(), previous=previous,
        )  # fmt: skip

    async def get_policy(self, _: Empty) -> PolicyInfo:
        return self.policy_info()

    async def set_policy(self, req: SetPolicy) -> PolicyInfo:
        old = self.describe_policy()
        try:
            self.swap_policy(req.policy, dict(req.params))
        except PolicyError as exc:
            raise BadRequest(str(exc), field=_policy_error_field(str(exc))) from None
        info = self.policy_info(previous=old)
        self.log.info("policy.changed", old=old, new=info.policy, params=info.params)
        await self.bus.emit(
            Event(
                type="policy.changed", now=req.now if req.now is not None else time.time(),
                reason=f"{old} -> {info.policy} {encode(info.params).decode()}", service=self.name,
            )
        )  # fmt: skip
        return info

    async def ping(self, _: Ping) -> Pong:
        return Pong(
            service=self.name,
            cluster=self.bus.subjects.cluster,
            version=__version__,
            policy=self.describe_policy(),
        )

    async def stats(self, _: Empty) -> ServiceStats:
        return ServiceStats(
            service=self.name, handled=self.handled, handler_s=self.handler_s,
            policy_s=self.policy_s, requests=self.bus.request_stats,
        )  # fmt: skip

    @property
    def takeover_subject(self) -> str:
        return f"{self.bus.subjects.root}.ctl.{self.name}.takeover"

    async def prepare(self) -> None:
        """Durable services: have a running instance hand over, then load the state it left.

        The old instance stops taking requests and finishes those in hand before it answers; a
        request that arrives in between finds nobody listening and its caller retries.
        """
        if not self.durable:
            return
        try:
            await self.bus.request(self.takeover_subject, Empty(), Empty, within_s=60.0)
            self.log.info("service.took_over")
        except RemoteError as exc:
            if exc.reply.error != "no service is listening":
                raise
        self.store = await open_store(
            self.bus.nc, self.bus.subjects.cluster, self.name, durable=True
        )
        started = time.perf_counter()
        await self.restore(await self.store.load())
        self.log.info("state.restored", took_s=round(time.perf_counter() - started, 4))
        await self.bus.nc.subscribe(self.takeover_subject, cb=self._on_takeover)

    async def _on_takeover(self, msg: Msg) -> None:
        self.log.info("service.handing_over")
        await self.hand_over()
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.drain()
        self._subs.clear()
        await msg.respond(b"{}")
        self.handed_over.set()

    async def start(self) -> None:
        await self.prepare()
        routes = {
            "ping": Route(self.ping, Ping),
            "stats": Route(self.stats, Empty),
            "policy": Route(self.get_policy, Empty),
            "policy.set": Route(self.set_policy, SetPolicy),
            **self.routes(),
        }
        await self.listen(f"{self.prefix}.>", routes, prefix=self.prefix)
        self.log.info("service.started", prefix=self.prefix)

    async def listen(self, pattern: str, routes: dict[str, Route], *, prefix: str) -> None:
        """Serve `routes` (by subject suffix after `prefix`, or by the last token) on one subscription."""

        async def dispatch(msg: Msg) -> None:
            await self._dispatch(msg, routes, prefix)

        self._subs.append(await self.bus.nc.subscribe(pattern, queue=self.name, cb=dispatch))

    async def _dispatch(self, msg: Msg, routes: dict[str, Route], prefix: str) -> None:
        started = time.perf_counter()
        try:
            await self._handle(msg, routes, prefix)
        finally:
            self.handled += 1
            self.handler_s += time.perf_counter() - started

    async def _handle(self, msg: Msg, routes: dict[str, Route], prefix: str) -> None:
        suffix = msg.subject[len(prefix) + 1 :] if msg.subject.startswith(prefix + ".") else ""
        route = routes.get(suffix) or routes.get(msg.subject.rsplit(".", 1)[-1])
        try:
            if route is None:
                raise BadRequest(
                    f"unknown request {suffix or msg.subject!r}; known: {', '.join(sorted(routes))}"
                )
            version = msg.headers.get(VERSION_HEADER) if msg.headers else None
            if version is not None and version != str(CONTRACT_VERSION):
                raise BadRequest(
                    f"contract version {version} is not supported (this service speaks "
                    f"{CONTRACT_VERSION})"
                )
            try:
                request = self.bus.decoder(route.request_type).decode(msg.data or b"{}")
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                raise error_from_validation(exc) from None
            now = getattr(request, "now", None)
            if now is not None:
                structlog.contextvars.bind_contextvars(now=now)
            try:
                reply = await route.handler(request)
            finally:
                await self.persist()  # a reply means "durable"
        except BadRequest as exc:
            self.log.warning(
                "request.rejected", subject=msg.subject, error=exc.error, field=exc.field
            )
            await self._respond(
                msg, ErrorReply(error=exc.error, field=exc.field, subject=msg.subject)
            )
            return
        except Exception as exc:  # a bug or a failed downstream call: answer, log, keep serving
            self.log.exception("request.failed", subject=msg.subject)
            error = str(exc) if isinstance(exc, RemoteError) else f"{type(exc).__name__}: {exc}"
            await self._respond(msg, ErrorReply(error=error, subject=msg.subject))
            return
        if msg.reply:
            await self.bus.nc.publish(msg.reply, encode(reply))

    async def _respond(self, msg: Msg, error: ErrorReply) -> None:
        if msg.reply:
            await self.bus.nc.publish(msg.reply, encode(error), headers=_ERROR_HEADERS)

    async def stop(self) -> None:
        """Stop taking new messages, finish those in hand, and close the connection."""
        await self.bus.close()
        self.log.info("service.stopped")


def run_service(
    service_cls: type[Service], config_cls: type[Any], argv: list[str] | None = None
) -> None:
    """The entry point of a service run on its own: `--nats URL --cluster NAME --config FILE.json`."""
    import signal

    from .logs import configure_logging

    parser = argparse.ArgumentParser(prog=f"gpuyard-{service_cls.name}")
    add_nats_arguments(parser, url_default="nats://127.0.0.1:4222")
    parser.add_argument("--cluster", default="default", help="cluster namespace")
    parser.add_argument("--config", help="JSON file with the service's configuration")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    try:
        raw = Path(args.config).read_bytes() if args.config else b"{}"
        config = msgspec.json.decode(raw, type=config_cls)
        subjects = Subjects(args.cluster)
    except (OSError, ValueError, msgspec.ValidationError) as exc:
        parser.error(f"bad configuration: {exc}")

    async def main() -> None:
        nc = await connect(
            args.nats, name=f"gpuyard-{service_cls.name}-{args.cluster}",
            auth=NatsAuth.from_args(args),
        )  # fmt: skip
        service = service_cls(Bus(nc, subjects), config)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await service.start()
        handed_over = asyncio.ensure_future(service.handed_over.wait())
        await asyncio.wait(
            [asyncio.ensure_future(stop.wait()), handed_over], return_when=asyncio.FIRST_COMPLETED
        )
        await service.stop()

    import uvloop

    uvloop.run(main())
