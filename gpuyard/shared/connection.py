"""Connecting to NATS and calling endpoints: identity and TLS options, `connect`, and `Bus`, the
typed client every service and command uses (`bus.call(SUBMIT, request)` -> `SubmitReply`).

Services are in `service.py`, errors in `errors.py`, subjects and their types in `endpoints.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar
from urllib.parse import urlsplit

import msgspec
import nats
import structlog
from nats.aio.client import NO_RESPONDERS_STATUS, Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import Header

from .contract import STATUS_HEADER, ErrorReply, Event
from .endpoints import EVENT, Endpoint, Subjects
from .errors import TIMED_OUT, RemoteError
from .identity import ANONYMOUS, Caller

T = TypeVar("T")
Rep = TypeVar("Rep")

_encoder = msgspec.json.Encoder()
_error_decoder = msgspec.json.Decoder(ErrorReply)
_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}


def encode(msg: Any) -> bytes:
    return _encoder.encode(msg)


def decoder(typ: type[T]) -> msgspec.json.Decoder[T]:
    """A cached JSON decoder for `typ`."""
    dec = _decoders.get(typ)
    if dec is None:
        dec = _decoders[typ] = msgspec.json.Decoder(typ)
    return dec


class Credentials(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Who we are to NATS and how the connection is protected; every field is optional.

    `identity` (`user.alice`) names who our requests act for and gives our replies a subject
    prefix no other identity may read (`_INBOX.user.alice`); `seed` is its NKey seed (gpuyard's
    own credentials, see gpuyard/natsauth.py). `user`/`password` or `token` for servers with users
    in their config, `creds` for a `.creds` file (JWT and NKey seed, decentralised auth),
    `nkey_seed` for a seed file; `tls_ca` to verify the server (with a `tls://` URL or a server
    that requires TLS), plus `tls_cert`/`tls_key` for mutual TLS.
    """

    identity: str | None = None
    """`<role>.<name>` (gpuyard/shared/identity.py): who the requests act for."""
    seed: str | None = None
    """The identity's NKey seed (`SU...`): the secret that proves it."""
    user: str | None = None
    password: str | None = None
    token: str | None = None
    creds: str | None = None
    nkey_seed: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_hostname: str | None = None


class ConnectionProfile(Credentials, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """A connection profile: one JSON file (mode 600) with everything one identity needs to join a
    cluster, written by `gpuyard up` and `gpuyard auth` and read with `--nats-config FILE`."""

    url: str | None = None
    cluster: str | None = None


def read_profile(path: str | Path, what: str = "--nats-config") -> ConnectionProfile:
    """A profile file; ValueError naming it (`what`, the file) and what is wrong with it."""
    try:
        return msgspec.json.decode(Path(path).read_bytes(), type=ConnectionProfile)
    except OSError as exc:
        raise ValueError(f"{what} {path}: {exc.strerror or exc}") from None
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ValueError(f"{what} {path}: not a connection profile (JSON): {exc}") from None


class NatsAuth(Credentials, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """How we connect (`Credentials`), with the inbox prefix our replies come to (default: the
    identity's)."""

    inbox_prefix: str | None = None

    SECRET_FIELDS: ClassVar[frozenset[str]] = frozenset({"password", "token", "seed"})

    @property
    def caller(self) -> Caller:
        """Who our requests act for (ANONYMOUS when we name nobody)."""
        return Caller.parse(self.identity) if self.identity else ANONYMOUS

    @property
    def secured(self) -> bool:
        """Whether it proves an identity to the server."""
        return any((self.seed, self.user, self.token, self.creds, self.nkey_seed))

    def ssl_context(self) -> ssl.SSLContext | None:
        if not (self.tls_ca or self.tls_cert):
            return None
        ca = self.tls_ca
        if ca is not None and ca.lstrip().startswith("-----BEGIN"):  # the PEM itself (a profile's)
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca)
        else:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
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
        if self.seed:
            options["nkeys_seed_str"] = self.seed
        context = self.ssl_context()
        if context is not None:
            options["tls"] = context
        if self.tls_hostname:
            options["tls_hostname"] = self.tls_hostname
        inbox = self.inbox_prefix or (self.caller.inbox_prefix if self.identity else None)
        if inbox:
            options["inbox_prefix"] = inbox
        return options

    def argv(self) -> list[str]:
        """The command-line options that give a child process this identity, secrets left out."""
        args: list[str] = []
        for f in msgspec.structs.fields(self):
            value = getattr(self, f.name)
            if value is not None and f.name not in self.SECRET_FIELDS:
                args.append(f"--nats-{f.name.replace('_', '-')}={value}")  # (a PEM starts with -)
        return args

    def env(self) -> dict[str, str]:
        """The secrets, as the environment variables `add_nats_arguments` reads."""
        return {
            f"GPUYARD_NATS_{name.upper()}": value
            for name in sorted(self.SECRET_FIELDS)
            if (value := getattr(self, name)) is not None
        }

    @classmethod
    def from_profile(cls, profile: ConnectionProfile) -> NatsAuth:
        return cls(**{f.name: getattr(profile, f.name, None) for f in msgspec.structs.fields(cls)})

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> NatsAuth:
        """From the options added by `add_nats_arguments` (after `resolve_connection`): a
        `--nats-config` profile, each field overridden by its own option when that is given."""
        profile = getattr(args, "nats_profile", None) or ConnectionProfile()
        values = {}
        for f in msgspec.structs.fields(cls):
            given = getattr(args, f"nats_{f.name}", None)
            values[f.name] = given if given is not None else getattr(profile, f.name, None)
        return cls(**values)


def add_nats_arguments(
    parser: argparse.ArgumentParser, *, url_default: str | None, cluster_default: str | None = None
) -> None:
    """`--nats URL`, `--nats-config FILE` and the `--nats-*` identity and TLS options, for services
    and the CLI alike; with `cluster_default`, `--cluster` too. Call `resolve_connection(args)`
    after parsing: a profile's URL and cluster apply where `--nats`/`--cluster` are not given.

    Secrets may come from the environment (`GPUYARD_NATS_PASSWORD`, `GPUYARD_NATS_TOKEN`,
    `GPUYARD_NATS_SEED`) so they do not show in the process list; the others too
    (`GPUYARD_NATS_USER`, `GPUYARD_NATS_CREDS`, ...).
    """
    env = os.environ.get
    g = parser.add_argument_group("NATS connection")
    g.add_argument(
        "--nats",
        default=env("GPUYARD_NATS"),
        help=f"NATS server URL(s), comma-separated (default: the profile's, else {url_default})",
    )
    g.add_argument(
        "--nats-config",
        default=env("GPUYARD_NATS_CONFIG"),
        metavar="FILE",
        help="a connection profile (JSON: url, cluster, identity, seed, tls_ca, ...) written by "
        "`gpuyard up` or `gpuyard auth`; the options below override its fields",
    )
    helps = {
        "identity": "who requests act for, ROLE.NAME (op.admin, user.alice, node.n1)",
        "seed": "the identity's NKey seed (better: a profile, or $GPUYARD_NATS_SEED)",
        "user": "user name (a server with users of its own)",
        "password": "password (better: $GPUYARD_NATS_PASSWORD)",
        "token": "authorization token (better: $GPUYARD_NATS_TOKEN)",
        "creds": "a .creds file (JWT + NKey seed)",
        "nkey_seed": "an NKey seed file",
        "tls_ca": "CA certificate(s) to verify the server (a PEM file, or the PEM itself)",
        "tls_cert": "client certificate for mutual TLS (PEM)",
        "tls_key": "the client certificate's private key (PEM)",
        "tls_hostname": "the server name to verify, when it differs from the URL's host",
        "inbox_prefix": "reply subjects' prefix (default: _INBOX.<identity>, or _INBOX)",
    }
    for name, text in helps.items():
        g.add_argument(
            f"--nats-{name.replace('_', '-')}",
            dest=f"nats_{name}",
            default=env(f"GPUYARD_NATS_{name.upper()}"),
            metavar=name.split("_")[-1].upper(),
            help=text,
        )
    parser.set_defaults(nats_url_default=url_default, nats_cluster_default=cluster_default)
    if cluster_default is not None:
        parser.add_argument(
            "--cluster",
            default=env("GPUYARD_CLUSTER"),
            help=f"cluster namespace (default: $GPUYARD_CLUSTER, the profile's, else {cluster_default!r})",
        )


def connection_given(args: argparse.Namespace) -> bool:
    """Whether any connection option (URL, profile, identity, TLS) was given."""
    names = ["nats", "nats_config", *(f"nats_{f.name}" for f in msgspec.structs.fields(NatsAuth))]
    return any(getattr(args, n, None) is not None for n in names)


def resolve_connection(args: argparse.Namespace, profile: str | Path | None = None) -> None:
    """After parsing: read `--nats-config` (or `profile`, when no option was given), and fill
    `args.nats` and `args.cluster` from it, else from their defaults. ValueError for a bad file."""
    path = args.nats_config or profile
    what = "--nats-config" if args.nats_config else "the cluster's profile"
    args.nats_profile = read_profile(path, what) if path else None
    p = args.nats_profile or ConnectionProfile()
    args.nats = args.nats or p.url or args.nats_url_default
    if getattr(args, "nats_cluster_default", None) is not None:
        args.cluster = args.cluster or p.cluster or args.nats_cluster_default


class TlsFailure(Exception):
    """The server's certificate could not be verified (unknown CA, no CA given, another host
    name), or TLS failed otherwise: trying again would not help. (No OSError: nats-py would take
    it for a connection error to try again on.)"""


def tls_failure_text(exc: ssl.SSLError) -> str:
    """One line for a TLS failure, with what to check."""
    reason = (getattr(exc, "verify_message", None) or exc.reason or str(exc)).rstrip(".")
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"TLS: the server's certificate is not trusted ({reason}): give the cluster's CA "
            "(--nats-tls-ca, a profile's tls_ca) and a URL with the host name the certificate "
            "names (or --nats-tls-hostname)"
        )
    return f"TLS failed: {reason}"


async def connect(url: str, *, name: str, auth: NatsAuth | None = None, **options: Any) -> Client:
    """Connect with reconnects that never give up (a restarted server is picked up again).

    `url` may list several servers, comma-separated; `options` override any default. An error on
    the connection (a server lost) is one log line, unless `error_cb` is given: nats-py's own is a
    traceback each. A TLS failure before the first connection raises TlsFailure at once (after
    `error_cb` has seen it): a certificate that cannot be verified will not become valid by trying
    again, and nats-py would wait forever closing the failed connection. `disconnected_cb` hears
    of a connection lost, not of one closed (nats-py calls it at every `close` and `drain` too).
    """

    async def log_error(exc: Exception) -> None:
        structlog.get_logger().warning(
            "nats.error", connection=name, error=str(exc) or type(exc).__name__
        )

    given_error_cb = options.pop("error_cb", None) or log_error
    tls_failed: list[TlsFailure] = []

    async def on_error(exc: Exception) -> None:
        await given_error_cb(exc)
        if isinstance(exc, ssl.SSLError) and client is None:
            tls_failed.append(TlsFailure(tls_failure_text(exc)))
            raise tls_failed[-1]

    client: Client | None = None
    given_disconnected_cb = options.pop("disconnected_cb", None)

    async def on_disconnected() -> None:
        if given_disconnected_cb is not None and not (client is not None and client.is_closed):
            await given_disconnected_cb()

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
        "error_cb": on_error,
        "disconnected_cb": on_disconnected,
    }
    wants_tls = settings.get("tls") is not None or "tls://" in url
    if wants_tls:
        _one_write_per_flush()
    nc = Client()
    try:
        await nc.connect(url.split(",") if "," in url else url, **settings)
    except TlsFailure:
        transport = getattr(nc, "_transport", None)  # (not closed by nats-py: it would hang)
        if transport is not None:
            with contextlib.suppress(Exception):
                transport.close()
        raise tls_failed[-1] from None
    if wants_tls and not getattr(nc, "_server_info", {}).get("tls_required"):
        # nats-py speaks TLS only to a server that requires it: never fall back to plain text.
        await nc.close()
        raise TlsFailure(
            f"TLS was asked for ({'a tls:// URL' if 'tls://' in url else 'a CA or certificate'}), "
            "but the server does not use it"
        )
    client = nc
    return nc


def _one_write_per_flush() -> None:
    """Have nats-py hand the socket one buffer per flush instead of one per message.

    Its flusher calls `writelines` with every pending message as a separate buffer, and a TLS
    transport encrypts each buffer as a TLS record of its own: under load most of a service's time
    went there (bench/bench_real.py, auth + TLS, 20 agents at 80 submissions/s: p99 submit ->
    running 790 ms, 114 ms with one buffer). Joining them first costs a copy of what is sent, and
    a call per flush: done for TLS connections only (from the first on, in that process).
    """
    from nats.aio import transport

    tcp = transport.TcpTransport
    if getattr(tcp, "_gpuyard_joined", False) or not hasattr(tcp, "writelines"):
        return
    writelines: Callable[..., Any] = tcp.writelines  # (nats-py does not annotate it)

    def joined(self: Any, payload: list[bytes]) -> Any:
        return writelines(self, [b"".join(payload)] if len(payload) > 1 else payload)

    tcp.writelines = joined  # type: ignore[method-assign]
    tcp._gpuyard_joined = True  # type: ignore[attr-defined]


class Fence(Protocol):
    """What a service that may be replaced by a standby checks before it acts (`shared.leader`)."""

    def holds(self) -> bool: ...

    async def confirm(self) -> None:
        """Return if we may act (confirming the lease if need be); else raise NotLeading."""


def redact(url: str) -> str:
    """The URL without a password in it (`nats://user:***@host:4222`)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def describe_error(exc: BaseException) -> str:
    """A connection error in a few words: `connection refused`, `name or service not known`, ..."""
    if isinstance(exc, socket.gaierror):
        return str(exc.strerror).lower()
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno).lower()
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    return str(exc) or type(exc).__name__


def raise_dropped_cancellation() -> None:
    """Raises a cancellation that nats-py dropped. Its JetStream calls (stream and consumer info,
    `fetch`, subscribing) wait with `asyncio.wait_for`, which on Python 3.11 swallows a
    cancellation that comes as the reply does; the task still counts it. Loops that make such
    calls check at each turn, or a Ctrl-C or a stop could leave them running for good."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class Bus:
    """One NATS connection in one cluster's namespace: typed calls through the endpoint table."""

    def __init__(
        self, nc: Client, subjects: Subjects, *, request_timeout: float = 120.0,
        caller: Caller = ANONYMOUS,
    ) -> None:  # fmt: skip
        self.nc = nc
        self.subjects = subjects
        self.request_timeout = request_timeout
        self.caller = caller
        """Who this connection's requests act for: the `{caller}` of the subjects it sends on."""
        self.request_stats: dict[str, list[float]] = {}
        """Per endpoint pattern: [count, seconds waited for the reply], for benchmarks."""
        self._subjects: dict[tuple[str, Caller], str] = {}
        """Subjects with no placeholder to fill, by pattern and caller: a request costs a lookup
        rather than a format."""
        self._event_subjects: dict[str, str] = {}
        """Events' subjects, by type (a simulation emits several events per job)."""
        self._inbox: str | None = None
        """Where our requests' replies come: `<inbox>.<token>` (one subscription for them all)."""
        self._inbox_opening = asyncio.Lock()
        self._awaited: dict[str, asyncio.Future[Msg]] = {}
        """Requests waiting for their reply, by token."""
        self._tokens = itertools.count()
        self.fence: Fence | None = None
        """A durable service's leader lease: no call, publish or event goes out without it."""

    async def call(
        self, endpoint: Endpoint[Any, Rep], msg: Any, *, within_s: float | None = None,
        retry_for_s: float = 0.0, **params: str,
    ) -> Rep:  # fmt: skip
        """Send a request on `endpoint` (placeholders from `params`) and decode its typed reply;
        raise RemoteError on an error reply, on no reply within `within_s`, or when nobody listens.

        `retry_for_s`: for requests that are safe to repeat (idempotent), keep trying for this long
        while nobody listens or a reply does not come (the service is restarting), with backoff.
        """
        assert endpoint.reply is not None, f"{endpoint.pattern} is a publish"
        subject = self.subject(endpoint, **params)
        deadline = time.monotonic() + retry_for_s
        pause = 0.05
        while True:
            if self.fence is not None and not self.fence.holds():
                await self.fence.confirm()
            try:
                return await self._request_once(endpoint, subject, msg, within_s)
            except RemoteError as exc:
                if not exc.transient or time.monotonic() + pause > deadline:
                    raise
                structlog.get_logger().warning(
                    "request.retrying", subject=subject, error=exc.reply.error, pause_s=pause
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)

    async def _request_once(
        self, endpoint: Endpoint[Any, Rep], subject: str, msg: Any, within_s: float | None
    ) -> Rep:
        started = time.perf_counter()
        inbox = self._inbox or await self._open_inbox()
        token = str(next(self._tokens))
        loop = asyncio.get_running_loop()
        awaited = self._awaited[token] = loop.create_future()
        expiry = loop.call_later(within_s or self.request_timeout, _time_out, awaited)
        try:
            await self.nc.publish(subject, encode(msg), reply=inbox + token)
            reply = await awaited
        except NoRespondersError:
            raise RemoteError(
                ErrorReply(error="no service is listening", subject=subject)
            ) from None
        except NatsTimeoutError:
            raise RemoteError(ErrorReply(error=TIMED_OUT, subject=subject)) from None
        finally:
            expiry.cancel()
            self._awaited.pop(token, None)
        stat = self.request_stats.get(endpoint.pattern)
        if stat is None:
            stat = self.request_stats[endpoint.pattern] = [0, 0.0]
        stat[0] += 1
        stat[1] += time.perf_counter() - started
        if reply.headers and reply.headers.get(STATUS_HEADER) == "error":
            raise RemoteError(_error_decoder.decode(reply.data))
        return decoder(endpoint.reply).decode(reply.data)  # type: ignore[arg-type]

    async def _open_inbox(self) -> str:
        """Subscribe to our requests' replies (once). Our own rather than `nc.request`'s: that
        costs a random token, a `wait_for` and more per request, a tenth of a request's CPU."""
        async with self._inbox_opening:
            if self._inbox is None:
                inbox = f"{self.nc.new_inbox()}."
                start = len(inbox)

                async def on_reply(msg: Msg) -> None:
                    awaited = self._awaited.pop(msg.subject[start:], None)
                    if awaited is None or awaited.done():
                        return  # (too late: the request timed out or was cancelled)
                    if msg.headers and msg.headers.get(Header.STATUS) == NO_RESPONDERS_STATUS:
                        awaited.set_exception(NoRespondersError())
                    else:
                        awaited.set_result(msg)

                await self.nc.subscribe(f"{inbox}*", cb=on_reply)
                self._inbox = inbox
        return self._inbox

    def subject(self, endpoint: Endpoint[Any, Any], **params: str) -> str:
        """The subject of `endpoint`, acting for `self.caller` where it names the caller."""
        if not params:
            key = (endpoint.pattern, self.caller)
            subject = self._subjects.get(key)
            if subject is None:
                subject = self._subjects[key] = self._filled(endpoint, {})
            return subject
        return self._filled(endpoint, params)

    def _filled(self, endpoint: Endpoint[Any, Any], params: dict[str, str]) -> str:
        if endpoint.sender == "caller" and "caller" not in params:
            params["caller"] = self.caller.token
        return self.subjects.of(endpoint, **params)

    async def publish(self, endpoint: Endpoint[Any, Any], msg: Any, **params: str) -> None:
        """Publish on an endpoint (placeholders from `params`)."""
        if self.fence is not None and not self.fence.holds():
            await self.fence.confirm()
        await self.nc.publish(self.subject(endpoint, **params), encode(msg))

    async def emit(self, event: Event) -> None:
        subject = self._event_subjects.get(event.type)
        if subject is None:
            subject = self._event_subjects[event.type] = self.subject(EVENT, type=event.type)
        if self.fence is not None and not self.fence.holds():
            await self.fence.confirm()
        await self.nc.publish(subject, encode(event))

    async def close(self) -> None:
        if not self.nc.is_closed:
            await self.nc.drain()


def _time_out(awaited: asyncio.Future[Msg]) -> None:
    if not awaited.done():
        awaited.set_exception(NatsTimeoutError())


EVENT_READERS_MAX = 256
"""The most consumers (`gpuyard tail`s, each its own) the event stream has at once."""
EVENT_READER_IDLE_MAX_S = 60.0
"""The longest a consumer of the event stream outlives its reader (as long as any may ask)."""


async def ensure_event_stream(
    nc: Client, subjects: Subjects, *, max_age_s: float, storage: str = "file", replicas: int = 1
) -> str | None:
    """Create (or update) the cluster's JetStream stream capturing `gpuyard.<cluster>.evt.>`.

    Its readers (submitters, operators) may create only ephemeral consumers (gpuyard/natsauth.py),
    and at most `EVENT_READERS_MAX` at once, each gone `EVENT_READER_IDLE_MAX_S` at the most
    after its reader left: nobody keeps server resources for good.

    Returns why the events cannot be stored (the server has no JetStream, or refuses the stream:
    e.g. replicas on one server), None when they are: otherwise they are published, not stored.
    """
    from nats.js.api import RetentionPolicy, StorageType, StreamConfig, StreamConsumerLimits
    from nats.js.errors import Error as JetStreamError

    config = StreamConfig(
        name=subjects.stream_name,
        subjects=[subjects.of(EVENT, type=">")],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType(storage),
        max_age=max_age_s,
        num_replicas=replicas,
        max_consumers=EVENT_READERS_MAX,
        consumer_limits=StreamConsumerLimits(inactive_threshold=EVENT_READER_IDLE_MAX_S),
    )
    js = nc.jetstream()
    try:
        try:
            await js.update_stream(config)
        except nats.js.errors.NotFoundError:
            await js.add_stream(config)
    except nats.js.errors.APIError as exc:
        if exc.code != 503:  # (503: JetStream is not enabled)
            return f"the server refused the event stream: {exc.description or exc}"
        return "the NATS server has no JetStream"
    except (JetStreamError, NatsTimeoutError, NoRespondersError):
        return "the NATS server has no JetStream"
    return None
