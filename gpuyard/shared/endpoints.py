"""The endpoint table: every subject gpuyard uses, with its message and reply types.

One `Endpoint` per subject pattern under `gpuyard.<cluster>.`; callers send through it
(`bus.call(SUBMIT, request)` returns a `SubmitReply`), services route by it (`routes()` maps
endpoints to handlers), and docs/architecture.md's subject table is generated from it (`subject_table()`,
checked by a test). Placeholders in a pattern: `{svc}` (the serving service's token: `adm`,
`sched`, `place`, `clock`, or `node.<id>` for a node agent), `{node}`, `{job}`, `{type}`, and
`{caller}`: the identity the request acts for (`user.alice`, `node.n1`; see `identity.py`), always
last, filled in by `Bus` from its connection's identity. The server lets each identity publish only
its own `{caller}` (and a node only its own `{node}` of a `sender="node"` endpoint), and the
serving handler gets it as `caller=` to check the request's body against.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import msgspec

from .contract import (
    Ack,
    ApplyReply,
    ApplyRequest,
    ApplyStages,
    ApplyStagesReply,
    CancelReply,
    CancelRequest,
    ClusterChanged,
    ClusterInfo,
    DoneReply,
    DrainRequest,
    Empty,
    EnqueueRequest,
    Event,
    ExitReport,
    FinishedPage,
    FinishedQuery,
    Heartbeat,
    HeartbeatsPage,
    HoldRequest,
    JobQuery,
    JobsPage,
    LogLine,
    LogsReply,
    LogsRequest,
    NodeCommand,
    NodeCommandReply,
    NodeCommands,
    NodesChanged,
    NodesChangedReply,
    PageQuery,
    Ping,
    PolicyInfo,
    Pong,
    Progress,
    RegisterNode,
    RequeueRequest,
    RunRequest,
    SchedulerStatus,
    ServiceStats,
    SetPolicy,
    StepsUpdate,
    SubmitReply,
    SubmitRequest,
    TickRequest,
    TimelinePage,
)
from .identity import Caller
from .model import Name
from .roster import CONTROL_PLANE, SERVICE_TOKENS

Req = TypeVar("Req")
Rep = TypeVar("Rep")


@dataclass(frozen=True)
class Endpoint(Generic[Req, Rep]):
    """One subject pattern: who serves it, what it carries, what comes back (None: a publish)."""

    pattern: str
    request: type[Req]
    reply: type[Rep] | None
    route: str
    """Who sends it and who receives it, for people: `client, simclock -> admission`."""
    serves: tuple[str, ...] = ()
    """Services that answer it (their `routes()`, `nodeagent` for node agents; `*`: every one);
    empty for publishes."""
    sender: Literal["caller", "node"] | None = None
    """Which placeholder names who sent it: `caller` (an identity token), or `node` (a node's own
    subject); None when the subject names nobody."""
    callers: tuple[str, ...] = ()
    """Who may send it: roles (`op`, `user`, `node`) and services (`admission`, ..., `simclock`:
    in a simulation, its driver too). The server's permissions are made from this
    (gpuyard/natsauth.py): a node only ever names itself (`{node}`, `{svc}`), every identity its
    own `{caller}`, and a service names itself where it serves the endpoint (a takeover)."""
    listeners: tuple[str, ...] = ()
    """Besides `serves`: who may subscribe to a publish (heartbeats, events, log lines)."""

    @property
    def name(self) -> str:
        """The endpoint's name: its last token before any `{caller}` (`enqueue`, `cmd`,
        `policy.set` -> `set`, `sched.cancel.{caller}` -> `cancel`)."""
        return self.pattern.removesuffix(".{caller}").rsplit(".", 1)[-1]

    @property
    def kind(self) -> Literal["request", "publish"]:
        return "request" if self.reply is not None else "publish"


# --------------------------------------------------------------------------- who calls

PEOPLE = ("op", "user")
"""Operators and submitters: both read the cluster's state."""
DRIVER = "simclock"
"""A simulation's identity: its clock and its driver (`gpuyard sim`, which reads results)."""

# --------------------------------------------------------------------------- every service

PING = Endpoint(
    "{svc}.ping", Ping, Pong, "anyone -> every service", ("*",),
    callers=(*PEOPLE, "node", DRIVER),  # (a node agent's health check pings itself)
)  # fmt: skip
STATS = Endpoint("{svc}.stats", Empty, ServiceStats, "anyone -> every service", ("*",), callers=(*PEOPLE, DRIVER))  # fmt: skip
POLICY = Endpoint(
    "{svc}.policy", Empty, PolicyInfo, "operators -> admission, scheduler, placement",
    CONTROL_PLANE, callers=(*PEOPLE, DRIVER),
)  # fmt: skip
POLICY_SET = Endpoint(
    "{svc}.policy.set", SetPolicy, PolicyInfo, "operators -> admission, scheduler, placement",
    CONTROL_PLANE, callers=("op",),
)  # fmt: skip
TAKEOVER = Endpoint(
    "ctl.{svc}.takeover", Empty, PolicyInfo, "a starting durable service -> the running one",
    CONTROL_PLANE, callers=("op", *CONTROL_PLANE),
)  # fmt: skip

# --------------------------------------------------------------------------- admission

SUBMIT = Endpoint(
    "adm.submit.{caller}",
    SubmitRequest,
    SubmitReply,
    "client, simclock -> admission",
    ("admission",),
    "caller",
    callers=(*PEOPLE, "admission", DRIVER),
)  # fmt: skip  (admission: held jobs are decided again through its own subject)

# --------------------------------------------------------------------------- scheduler

ENQUEUE = Endpoint("sched.enqueue", EnqueueRequest, SchedulerStatus, "admission -> scheduler", ("scheduler",), callers=("admission",))  # fmt: skip
TICK = Endpoint("sched.tick", TickRequest, SchedulerStatus, "clock -> scheduler", ("scheduler",), callers=("scheduler", DRIVER))  # fmt: skip
EXITED = Endpoint("sched.exited.{caller}", ExitReport, SchedulerStatus, "node agents, simclock -> scheduler", ("scheduler",), "caller", callers=("node", DRIVER))  # fmt: skip
STEPS = Endpoint("sched.steps", StepsUpdate, SchedulerStatus, "simclock -> scheduler", ("scheduler",), callers=(DRIVER,))  # fmt: skip
CLUSTER_CHANGED = Endpoint("sched.cluster_changed", ClusterChanged, SchedulerStatus, "simclock -> scheduler", ("scheduler",), callers=(DRIVER,))  # fmt: skip
JOBS = Endpoint("sched.jobs.{caller}", PageQuery, JobsPage, "anyone -> scheduler", ("scheduler",), "caller", callers=(*PEOPLE, DRIVER))  # fmt: skip
FINISHED = Endpoint("sched.finished", FinishedQuery, FinishedPage, "driver -> scheduler", ("scheduler",), callers=(DRIVER,))  # fmt: skip
STATUS = Endpoint("sched.status", Empty, SchedulerStatus, "anyone -> scheduler", ("scheduler",), callers=(*PEOPLE, DRIVER))  # fmt: skip
QUERY = Endpoint("sched.query.{caller}", JobQuery, JobsPage, "anyone, admission -> scheduler", ("scheduler",), "caller", callers=(*PEOPLE, "admission", DRIVER))  # fmt: skip
CANCEL = Endpoint("sched.cancel.{caller}", CancelRequest, CancelReply, "users -> scheduler", ("scheduler",), "caller", callers=PEOPLE)  # fmt: skip
HOLD = Endpoint("sched.hold.{caller}", HoldRequest, DoneReply, "users -> scheduler", ("scheduler",), "caller", callers=PEOPLE)  # fmt: skip
REQUEUE = Endpoint("sched.requeue.{caller}", RequeueRequest, DoneReply, "users -> scheduler", ("scheduler",), "caller", callers=PEOPLE)  # fmt: skip

# --------------------------------------------------------------------------- placement

REGISTER = Endpoint("place.register.{caller}", RegisterNode, ClusterInfo, "node agents -> placement", ("placement",), "caller", callers=("node",))  # fmt: skip
NODES = Endpoint("place.nodes.{caller}", NodesChanged, NodesChangedReply, "simclock, node agents, placement -> placement", ("placement",), "caller", callers=("op", "node", "placement", DRIVER))  # fmt: skip
APPLY = Endpoint("place.apply", ApplyRequest, ApplyReply, "scheduler -> placement", ("placement",), callers=("scheduler",))  # fmt: skip
APPLY_STAGES = Endpoint("place.stages", ApplyStages, ApplyStagesReply, "scheduler -> placement (a simulation's applies of several instants)", ("placement",), callers=("scheduler",))  # fmt: skip
CLUSTER = Endpoint("place.cluster", Empty, ClusterInfo, "anyone -> placement", ("placement",), callers=(*PEOPLE, "admission", "scheduler", DRIVER))  # fmt: skip
HEARTBEATS = Endpoint("place.heartbeats", Empty, HeartbeatsPage, "anyone -> placement", ("placement",), callers=(*PEOPLE, DRIVER))  # fmt: skip
DRAIN = Endpoint("place.drain.{caller}", DrainRequest, DoneReply, "operators -> placement", ("placement",), "caller", callers=("op",))  # fmt: skip

# --------------------------------------------------------------------------- node agents

NODE_COMMAND = Endpoint("node.{node}.cmd", NodeCommand, NodeCommandReply, "placement -> node agent (simclock)", ("nodeagent", "simclock"), callers=("placement",))  # fmt: skip
NODE_LOGS = Endpoint("node.{node}.logs", LogsRequest, LogsReply, "CLI -> node agent", ("nodeagent",), callers=(*PEOPLE, DRIVER))  # fmt: skip
HEARTBEAT = Endpoint("node.{node}.hb", Heartbeat, Ack, "node agent -> placement (its answer renews the agent's lease)", ("placement",), "node", callers=("node",))  # fmt: skip
REREGISTER: Endpoint[Empty, None] = Endpoint("node.{node}.register", Empty, None, "placement -> node agent (register again)", callers=("placement",), listeners=("node",))  # fmt: skip
LOG_LINE: Endpoint[LogLine, None] = Endpoint("logs.{job}.{node}", LogLine, None, "node agents -> `gpuyard logs -f`", (), "node", callers=("node",), listeners=PEOPLE)  # fmt: skip

# --------------------------------------------------------------------------- simulation clock

NODE_COMMANDS: Endpoint[NodeCommands, None] = Endpoint("clock.cmds", NodeCommands, None, "placement -> simclock (simulated nodes, one publish per apply)", ("simclock",), callers=("placement",))  # fmt: skip
RUN = Endpoint("clock.run", RunRequest, Ack, "driver -> simclock", ("simclock",), callers=(DRIVER,))
TIMELINE = Endpoint("clock.timeline", PageQuery, TimelinePage, "driver -> simclock", ("simclock",), callers=(DRIVER,))  # fmt: skip
PROGRESS: Endpoint[Progress, None] = Endpoint("progress", Progress, None, "simclock -> drivers", callers=(DRIVER,), listeners=(*PEOPLE, DRIVER))  # fmt: skip

# --------------------------------------------------------------------------- events

EVENT: Endpoint[Event, None] = Endpoint(
    "evt.{type}", Event, None, "services -> JetStream stream `GPUYARD_<c>_EVENTS` (stored)",
    callers=CONTROL_PLANE, listeners=(*PEOPLE, "scheduler", "admission", DRIVER),
)  # fmt: skip

ENDPOINTS: tuple[Endpoint[Any, Any], ...] = (
    SUBMIT, ENQUEUE, TICK, EXITED, STEPS, CLUSTER_CHANGED, JOBS, FINISHED, STATUS, QUERY, CANCEL,
    HOLD, REQUEUE, REGISTER, NODES, APPLY, APPLY_STAGES, CLUSTER, HEARTBEATS, DRAIN,
    NODE_COMMAND, NODE_LOGS, HEARTBEAT, REREGISTER, LOG_LINE,
    NODE_COMMANDS, RUN, TIMELINE, PROGRESS,
    PING, STATS, POLICY, POLICY_SET, TAKEOVER, EVENT,
)  # fmt: skip


SENDERS_KEPT = 4096
"""Subjects whose sender (`Subjects.sender`) or route (a service's) is remembered: all are
forgotten beyond (identities that come and go on a real cluster)."""


class Subjects:
    """One cluster's namespace, `gpuyard.<cluster>.`: the concrete subjects of the endpoints."""

    def __init__(self, cluster: str) -> None:
        msgspec.convert(cluster, Name)  # raises ValidationError for names unusable in a subject
        if "." in cluster:
            raise ValueError(f"cluster name {cluster!r} must not contain '.'")
        self.cluster = cluster
        self.root = f"gpuyard.{cluster}"
        self._senders: dict[tuple[str, str], Caller | None] = {}

    def of(self, endpoint: Endpoint[Any, Any], **params: str) -> str:
        """The subject of `endpoint` with its placeholders filled in (`node="n1"`, `svc="sched"`)."""
        return f"{self.root}.{endpoint.pattern.format(**params)}"

    def every(self, endpoint: Endpoint[Any, Any], **params: str) -> str:
        """A wildcard subject matching `endpoint` for every value of the placeholders not given."""
        names = re.findall(r"{(\w+)}", endpoint.pattern)
        wild = {n: "*.*" if n == "caller" else "*" for n in names}
        return self.of(endpoint, **{**wild, **params})

    def sender(self, endpoint: Endpoint[Any, Any], subject: str) -> Caller | None:
        """Who `subject` (of `endpoint`) says sent it; None when it names nobody, or badly."""
        if endpoint.sender is None:
            return None
        key = (endpoint.pattern, subject)
        if key in self._senders:  # (a service hears the same few callers at every request)
            return self._senders[key]
        if len(self._senders) >= SENDERS_KEPT:
            self._senders.clear()
        caller = self._senders[key] = self._parse_sender(endpoint, subject)
        return caller

    def _parse_sender(self, endpoint: Endpoint[Any, Any], subject: str) -> Caller | None:
        tokens = subject.split(".")
        try:
            if endpoint.sender == "caller":  # always the last two tokens
                return Caller.parse(".".join(tokens[-2:]))
            at = endpoint.pattern.split(".").index("{node}") + len(self.root.split("."))
            return Caller("node", tokens[at])
        except (ValueError, IndexError):
            return None

    def service(self, name: str) -> str:
        """The prefix a control-plane service listens on (`gpuyard.<c>.sched`)."""
        return f"{self.root}.{SERVICE_TOKENS[name]}"

    def node(self, node_id: str) -> str:
        """The prefix a node agent listens on (`gpuyard.<c>.node.<id>`)."""
        return f"{self.root}.node.{node_id}"

    @property
    def events(self) -> str:
        return f"{self.root}.evt"

    @property
    def stream_name(self) -> str:
        return f"GPUYARD_{self.cluster.replace('-', '_')}_EVENTS"


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` is one token, a last `>` one token or more."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or token not in ("*", have[i]):
            return False
    return len(want) == len(have)


def subject_table() -> str:
    """docs/architecture.md's subject table (Markdown), generated from `ENDPOINTS`."""
    rows = [
        "| subject | kind | from → to | message → reply |",
        "|---|---|---|---|",
    ]
    for e in ENDPOINTS:
        pattern = re.sub(r"{(\w+)}", r"<\1>", e.pattern)
        types = f"`{e.request.__name__}`" + (
            f" → `{e.reply.__name__}`" if e.reply is not None else ""
        )
        rows.append(
            f"| `gpuyard.<c>.{pattern}` | {e.kind} | {e.route.replace('->', '→')} | {types} |"
        )
    return "\n".join(rows)
