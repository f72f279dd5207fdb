"""gpuyard's credentials: one NKey per identity, permissions per role, kept in a state directory.

Every identity (gpuyard/shared/identity.py: `op.<name>`, `user.<name>`, `node.<id>`, `svc.<service>`) has
an NKey pair. Its seed (the secret) lives only in its profile, `profiles/<identity>.json` (mode
600, `--nats-config FILE`); the server knows only the public keys, in `auth/users.conf`, each with
the permissions of its role (`permissions()`), generated from the endpoint table:

- a node agent publishes only subjects that name it (its registration, exits, departure,
  heartbeats and log lines) and receives only its own node's subjects;
- a submitter submits and cancels as itself, reads jobs, nodes, logs and events;
- an operator does that, swaps policies, drains nodes and stops services, but sends no node
  command and publishes no event;
- each service serves its own prefix and calls only what it calls, with its own key-value bucket;
  only services publish events;
- every identity reads replies only under its own inbox prefix, `_INBOX.<role>.<name>`.

The directory (`gpuyard up --state-dir`, default `$XDG_DATA_HOME/gpuyard/<cluster>`) is mode 700:

    auth/identities.json   every identity's public key (no secrets)
    auth/users.conf        the server's `authorization {}` block, made from it
    profiles/*.json        one profile per identity: URL, cluster, identity, seed, CA
    server.json            how clients reach the server (URL, CA), written by `gpuyard up`
    nats/, nats.conf, nats.pid   the embedded server's JetStream store, config and pid
"""

from __future__ import annotations

import json
import os
import secrets
import signal
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from gpuyard.shared.connection import ConnectionProfile
from gpuyard.shared.endpoints import ENDPOINTS, EVENT, Endpoint, Subjects
from gpuyard.shared.identity import Caller
from gpuyard.shared.roster import CONTROL_PLANE, SERVICE_TOKENS

DISCOVERY = "$SRV.>"
"""The NATS micro discovery subjects every service answers (`nats micro ls`)."""
OPERATOR = Caller("op", "admin")
"""The operator `gpuyard up` creates."""
SIMCLOCK = Caller("svc", "simclock")
"""A simulation's clock and driver: no real cluster has it."""
T = TypeVar("T")


def default_state_dir(cluster: str) -> Path:
    """`$XDG_DATA_HOME/gpuyard/<cluster>` (default `~/.local/share/gpuyard/<cluster>`)."""
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "gpuyard" / cluster


SYSTEM_STATE_DIR = Path("/etc/gpuyard/cluster")
"""Where a machine's services keep the credentials under systemd and docker-compose (deploy/)."""


def _decoded(path: Path, kind: type[T]) -> T:
    """`path`'s JSON as a `kind`; ValueError naming the file where it is damaged, and how to mend
    it."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        mend = "restore it from a backup"
        if kind is ConnectionProfile:  # (an identity's: its key can be issued again)
            mend += (
                f", or issue it again: `gpuyard auth remove {path.stem}`, then `gpuyard auth "
                "init` (a service's), `add-node` or `add-user`"
            )
        raise ValueError(f"{path}: damaged ({exc}): {mend}") from None


def local_profile(cluster: str) -> Path | None:
    """The operator profile of `cluster` on this machine that we may read: `gpuyard up`'s (in
    the default state directory), else the system's (`/etc/gpuyard/cluster`, deploy/)."""
    for root in (default_state_dir(cluster), SYSTEM_STATE_DIR):
        path = root / "profiles" / f"{OPERATOR.token}.json"
        if os.access(path, os.R_OK):
            try:
                profile = json.loads(path.read_text())
            except OSError:
                continue
            except ValueError:  # (damaged: reading it says so, naming it, rather than going
                return path  # on to the default server as if there were none)
            if not isinstance(profile, dict) or profile.get("cluster") == cluster:
                return path
    return None


# --------------------------------------------------------------------------- permissions


def _kv(bucket: str) -> list[str]:
    """A service's own key-value bucket (JetStream API on its stream, its keys, flow control)."""
    stream = f"KV_{bucket}"
    return [
        "$JS.API.INFO",
        *(f"$JS.API.STREAM.{op}.{stream}" for op in ("INFO", "CREATE", "UPDATE", "MSG.GET")),
        f"$JS.API.CONSUMER.CREATE.{stream}", f"$JS.API.CONSUMER.CREATE.{stream}.>",
        f"$JS.API.CONSUMER.DELETE.{stream}.>", f"$JS.API.CONSUMER.INFO.{stream}.>",
        f"$JS.API.DIRECT.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}.>",
        f"$KV.{bucket}.>", f"$JS.FC.{stream}.>",
    ]  # fmt: skip


def _read_events(stream: str) -> list[str]:
    """Read the event stream (`gpuyard tail`): ephemeral (ordered) consumers only, created on the
    subject the server refuses a durable name on (`CONSUMER.CREATE.<stream>`, no name token), and
    nothing that changes the stream or another reader's consumer; the stream bounds how many, and
    how long each outlives its reader (gpuyard/shared/connection.py, `ensure_event_stream`)."""
    return [
        "$JS.API.INFO", f"$JS.API.STREAM.INFO.{stream}", f"$JS.API.CONSUMER.CREATE.{stream}",
        f"$JS.API.CONSUMER.INFO.{stream}.>", f"$JS.FC.{stream}.>",
    ]  # fmt: skip


def _perms(
    publish: list[str], subscribe: list[str], caller: Caller, *, responds: bool
) -> dict[str, Any]:
    if responds and caller.role == "svc":
        # Services answer on any inbox: the server forgets the reply subjects it allowed (below)
        # when it reloads its users (`gpuyard auth add-node` on a running cluster), and a
        # service's request in hand must still be answered then. Inboxes are unguessable.
        publish, responds = [*publish, "_INBOX.>"], False
    perms: dict[str, Any] = {
        "publish": {"allow": sorted(set(publish))},
        "subscribe": {"allow": sorted({*subscribe, f"{caller.inbox_prefix}.>"})},
    }
    if responds:  # answer requests it received, on their reply subject only
        perms["allow_responses"] = {"max": 1, "expires": "10m"}
    return perms


def principal(caller: Caller) -> str:
    """What the endpoint table calls `caller` (its `callers`, `serves`, `listeners`): its role,
    or the service it is."""
    return caller.name if caller.role == "svc" else caller.role


def service_token(name: str, node: str = "*") -> str:
    """The `{svc}` of a service in the endpoint table's terms (`nodeagent`: a node's)."""
    return f"node.{node}" if name == "nodeagent" else SERVICE_TOKENS[name]


def _servers(endpoint: Endpoint[Any, Any]) -> list[str]:
    names = [*SERVICE_TOKENS, "nodeagent"] if "*" in endpoint.serves else endpoint.serves
    return [service_token(name) for name in names]


def sends(caller: Caller, cluster: str, endpoint: Endpoint[Any, Any]) -> list[str]:
    """The subjects (with wildcards) `caller` may send `endpoint` on: none unless the table lists
    it among the endpoint's callers; then as itself (`{caller}`), a node for itself only (`{node}`,
    `{svc}`), a service to itself where it serves the endpoint (a takeover), else to its servers."""
    who = principal(caller)
    if who not in endpoint.callers:
        return []
    s = Subjects(cluster)
    params = {"type": ">"}  # (an event's type is one token or more)
    if endpoint.sender == "caller":
        params["caller"] = caller.token
    if caller.role == "node":
        params |= {"node": caller.name, "svc": f"node.{caller.name}"}
    if "{svc}" not in endpoint.pattern:
        return [s.every(endpoint, **params)]
    if who in endpoint.serves:
        return [s.every(endpoint, **params, svc=service_token(who))]
    tokens = [params["svc"]] if "svc" in params else _servers(endpoint)
    return [s.every(endpoint, **{**params, "svc": svc}) for svc in tokens]


def hears(caller: Caller, cluster: str, endpoint: Endpoint[Any, Any]) -> list[str]:
    """The subjects `caller` may subscribe to for `endpoint`: what it serves (a service on its
    own prefix, a node on its own subjects), and the publishes the table lets it listen to."""
    who = principal(caller)
    if who not in (*endpoint.serves, *endpoint.listeners) and not (
        "*" in endpoint.serves and caller.role in ("svc", "node")
    ):
        return []
    s = Subjects(cluster)
    params = {"type": ">"}
    if caller.role == "node":
        params |= {"node": caller.name, "svc": f"node.{caller.name}"}
    elif "{svc}" in endpoint.pattern:
        params["svc"] = service_token(who)
    return [s.every(endpoint, **params)]


def _collapsed(subjects: list[str], prefix: str) -> list[str]:
    """`subjects`, those under `prefix` as the one wildcard `<prefix>.>` (a service, a node
    agent, subscribes to its prefix once and routes by the rest)."""
    under = [x for x in subjects if x.startswith(prefix + ".")]
    return [*(x for x in subjects if x not in under), *([f"{prefix}.>"] if under else [])]


def permissions(caller: Caller, cluster: str) -> dict[str, Any]:
    """The `permissions` block of `caller` in `cluster`'s namespace, made from the endpoint table
    (`sends`, `hears`), plus what the table does not carry: JetStream (a service's own key-value
    bucket, the scheduler's event stream, readers' ephemeral consumers), replies (an identity's own
    inbox; services answer on any, nodes on the requests they got) and NATS micro discovery."""
    s = Subjects(cluster)
    publish = sorted({x for e in ENDPOINTS for x in sends(caller, cluster, e)})
    subscribe = sorted({x for e in ENDPOINTS for x in hears(caller, cluster, e)})
    who = principal(caller)
    if who in EVENT.listeners and who not in CONTROL_PLANE:  # (the scheduler makes the stream)
        publish += _read_events(s.stream_name)
    if caller.role == "op":
        publish.append(DISCOVERY)  # (`nats micro ls`)
    if caller.role == "node":
        subscribe = [*_collapsed(subscribe, s.node(caller.name)), DISCOVERY]
        return _perms(publish, subscribe, caller, responds=True)
    if caller.role != "svc":
        return _perms(publish, subscribe, caller, responds=False)
    name = caller.name
    subscribe = [*_collapsed(subscribe, s.service(name)), DISCOVERY]
    if name in CONTROL_PLANE:
        publish += _kv(f"gpuyard_{cluster}_{name}".replace(".", "_"))
    if name == "scheduler":  # (it makes the event stream)
        stream = s.stream_name
        publish += [f"$JS.API.STREAM.{op}.{stream}" for op in ("INFO", "CREATE", "UPDATE")]
    return _perms(publish, subscribe, caller, responds=True)


# --------------------------------------------------------------------------- the credential store


class Identity(msgspec.Struct, kw_only=True):
    identity: str
    public_key: str


class Identities(msgspec.Struct, kw_only=True):
    cluster: str
    identities: list[Identity] = []


class ServerInfo(msgspec.Struct, kw_only=True):
    """How clients reach the server (written by `gpuyard up`, copied into new profiles)."""

    url: str | None = None
    tls_ca: str | None = None


def new_seed() -> tuple[str, str]:
    """A new user NKey: (seed, public key)."""
    import nkeys

    seed = nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER)
    return seed.decode(), nkeys.from_seed(bytearray(seed)).public_key.decode()


def _write_private(path: Path, data: bytes) -> None:
    """Write a file only its owner can read (created so, never readable by others on the way)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


class Credentials:
    """The credential store of one cluster in a state directory (see the module's docstring)."""

    def __init__(self, state_dir: Path, cluster: str) -> None:
        Subjects(cluster)  # a usable cluster name
        self.root = state_dir
        self.cluster = cluster
        self.auth_dir = state_dir / "auth"
        self.profiles = state_dir / "profiles"
        self.index_path = self.auth_dir / "identities.json"
        self.users_conf = self.auth_dir / "users.conf"
        self.server_path = state_dir / "server.json"
        self.pid_file = state_dir / "nats.pid"

    # ------------------------------------------------------------------ reading

    @property
    def exists(self) -> bool:
        return self.index_path.exists()

    def index(self) -> Identities:
        if not self.exists:
            raise ValueError(
                f"no credentials in {self.root}: run `gpuyard up` (or `gpuyard auth init`) first"
            )
        index = _decoded(self.index_path, Identities)
        if index.cluster != self.cluster:
            raise ValueError(
                f"{self.root} holds the credentials of cluster {index.cluster!r}, not {self.cluster!r}"
            )
        return index

    def server(self) -> ServerInfo:
        if not self.server_path.exists():
            return ServerInfo()
        return _decoded(self.server_path, ServerInfo)

    def profile_path(self, caller: Caller) -> Path:
        return self.profiles / f"{caller.token}.json"

    def profile(self, caller: Caller) -> ConnectionProfile:
        return _decoded(self.profile_path(caller), ConnectionProfile)

    # ------------------------------------------------------------------ changing

    def init(self, more: list[Caller] | None = None, *, simulation: bool = False) -> bool:
        """Create the store with the operator's and the control plane's identities, and `more`,
        those of them that it lacks (so it can run again: nobody's key changes); True if it was
        new. The simclock's identity, which drives a simulation and may call nearly everything,
        only with `simulation`: a real cluster has none (one left from before is removed)."""
        for folder in (self.root, self.auth_dir, self.profiles):
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(folder, 0o700)
        new = not self.exists
        if new:
            self._save(Identities(cluster=self.cluster))
        index = self.index()
        # (the server's users, made again from the keys: a damaged file mends itself)
        _write_private(self.users_conf, self.server_config(index).encode())
        have = {i.identity for i in index.identities}
        services = [*CONTROL_PLANE, *(["simclock"] if simulation else [])]
        for caller in (OPERATOR, *(Caller("svc", name) for name in services), *(more or [])):
            if caller.token not in have:
                self.add(caller)
        if not simulation and SIMCLOCK.token in have:
            self.remove(SIMCLOCK)
        return new

    def add(self, caller: Caller) -> Path:
        """A new identity (a new key if it existed: the old one stops working); its profile."""
        index = self.index()
        seed, public = new_seed()
        rest = [i for i in index.identities if i.identity != caller.token]
        self._save(Identities(cluster=self.cluster, identities=[*rest, Identity(identity=caller.token, public_key=public)]))  # fmt: skip
        server = self.server()
        profile = ConnectionProfile(
            url=server.url, cluster=self.cluster, identity=caller.token, seed=seed,
            tls_ca=server.tls_ca,
        )  # fmt: skip
        path = self.profile_path(caller)
        _write_private(path, _pretty(profile))
        return path

    def remove(self, caller: Caller) -> None:
        index = self.index()
        left = [i for i in index.identities if i.identity != caller.token]
        if len(left) == len(index.identities):
            raise ValueError(f"no identity {caller.token} in {self.root}")
        self._save(Identities(cluster=self.cluster, identities=left))
        self.profile_path(caller).unlink(missing_ok=True)

    def set_server(self, url: str, tls_ca: str | None) -> None:
        """Where the server is now: recorded, and written into the profiles here."""
        info = ServerInfo(url=url, tls_ca=tls_ca)
        _write_private(self.server_path, _pretty(info))
        for path in sorted(self.profiles.glob("*.json")):
            profile = _decoded(path, ConnectionProfile)
            if (profile.url, profile.tls_ca) != (url, tls_ca):
                _write_private(
                    path, _pretty(msgspec.structs.replace(profile, url=url, tls_ca=tls_ca))
                )

    def _save(self, index: Identities) -> None:
        _write_private(self.index_path, _pretty(index))
        _write_private(self.users_conf, self.server_config(index).encode())

    # ------------------------------------------------------------------ the server's side

    def server_config(self, index: Identities | None = None) -> str:
        """`authorization { users: [...] }` for nats-server: public keys and permissions."""
        index = index or self.index()
        users = [
            {
                "nkey": i.public_key,
                "permissions": permissions(Caller.parse(i.identity), self.cluster),
            }
            for i in index.identities
        ]
        body = json.dumps({"users": users}, indent=2)
        return (
            f"# gpuyard identities of cluster {self.cluster!r}: NKey public keys and their\n"
            f"# permissions (generated by gpuyard from {self.index_path.name}; do not edit)\n"
            f"authorization: {body}\n"
        )

    def reload_server(self) -> bool:
        """Have the embedded server running on this store read its users again (SIGHUP): True
        when one was told. A server of its own (systemd) is reloaded by whoever runs it."""
        try:
            pid = int(self.pid_file.read_text().strip())
            os.kill(pid, signal.SIGHUP)
        except (OSError, ValueError):
            return False
        return True


def _pretty(value: Any) -> bytes:
    return msgspec.json.format(msgspec.json.encode(value), indent=2) + b"\n"
