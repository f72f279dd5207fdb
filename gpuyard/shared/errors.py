"""Errors that cross the bus: a bad request names its field; a failed call says what failed.

A handler raises `BadRequest` (the request is wrong: its `field` is a JSON path such as
`$.jobs[0].num_gpus`); the service answers it with an `ErrorReply` and the header
`Gpuyard-Status: error`. The caller's side raises `RemoteError` with that reply. msgspec's
validation messages are turned into the same paths by `error_from_validation`. An exception a
policy raised is told by `policy_failure`: the service, the policy, the exception and the line of
the policy's own code it came from.
"""

from __future__ import annotations

import os
import re
import sys
import traceback

import msgspec

from .contract import ErrorReply

NOT_LEADING = "this instance is standing down: another takes over"
"""The error of a request that a durable service's instance got as it lost its leader lease."""

TIMED_OUT = "timed out"
"""The error of a request that got no answer in time (the caller's own)."""

TRANSIENT_ERRORS = frozenset({"no service is listening", TIMED_OUT, NOT_LEADING})
"""Errors a caller may retry: the service is restarting or changing leader, or busy beyond the
timeout."""


class NotLeading(Exception):
    """This instance of a durable service does not hold its leader lease (any more): it must not
    act (`shared.leader`)."""


class RemoteError(Exception):
    """The other side answered with an ErrorReply (or nobody answered in time)."""

    def __init__(self, reply: ErrorReply) -> None:
        where = f" (field {reply.field})" if reply.field else ""
        super().__init__(f"{reply.subject}: {reply.error}{where}")
        self.reply = reply

    @property
    def transient(self) -> bool:
        return self.reply.error in TRANSIENT_ERRORS


class BadRequest(Exception):
    """Raised by a handler: the request is wrong. Becomes an ErrorReply naming `field`."""

    def __init__(self, error: str, field: str | None = None) -> None:
        super().__init__(error)
        self.error = error
        self.field = field


_AT = re.compile(r"^(?P<msg>.*) - at `(?P<path>\$[^`]*)`$", re.S)
_MISSING = re.compile(r"(?:missing required field|unknown field) `(?P<name>[^`]*)`")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_POST_INIT = re.compile(r"^(?P<name>[a-z_][a-z0-9_]*) \(")


def child_path(path: str, name: str) -> str:
    """`$.a` + `b` -> `$.a.b`; names that are not identifiers in brackets: `$.a[""]`."""
    return (
        f"{path}.{name}"
        if _IDENTIFIER.match(name)
        else f"{path}[{msgspec.json.encode(name).decode()}]"
    )


def policy_error_field(text: str) -> str:
    """The field a PolicyError is about: `$.policy` (unknown name) or `$.params[.name]`."""
    if text.startswith("unknown "):
        return "$.policy"
    at = re.search(r"- at `\$(?P<path>[^`]*)`", text)
    named = _MISSING.search(text)
    path = "$.params" + (at["path"] if at else "")
    return child_path(path, named["name"]) if named else path


def error_from_validation(exc: msgspec.ValidationError | msgspec.DecodeError) -> BadRequest:
    """Turn msgspec's message (`... - at `$.jobs[0].num_gpus``) into an error with a field path."""
    text = str(exc)
    m = _AT.match(text)
    if not m:
        top = _MISSING.search(text) or _POST_INIT.match(text)  # (top level: msgspec gives no path)
        return BadRequest(text, field=child_path("$", top["name"]) if top else None)
    msg, path = m["msg"], m["path"]
    named = _MISSING.search(msg) or _POST_INIT.match(msg)
    if named:
        path = child_path(path, named["name"])
    return BadRequest(msg, field=path)


def policy_frame(exc: BaseException, policy: object) -> traceback.FrameSummary | None:
    """The innermost frame of `exc`'s traceback in the policy's own code: the module of its class
    or of a class it derives from, outside gpuyard.shared (the policy API's base classes). None:
    the policy's code is not in the traceback (the service's own error)."""
    if policy is None or exc.__traceback__ is None:
        return None
    files: set[str] = set()
    for cls in type(policy).__mro__:
        module = sys.modules.get(cls.__module__)
        file = getattr(module, "__file__", None)
        if file and not cls.__module__.startswith(("gpuyard.shared.", "builtins")):
            files |= {file, os.path.realpath(file)}
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename in files or os.path.realpath(frame.filename) in files:
            found = frame
    return found


def policy_failure(
    exc: BaseException, frame: traceback.FrameSummary, service: str, kind: str, policy: str | None
) -> str:
    """One line: `scheduling policy 'x' in the scheduler service raised ZeroDivisionError:
    division by zero at /path/x.py:12, in ratio (traceback in the scheduler service's log)`."""
    text = " ".join(str(exc).split())  # (one line, whatever the message)
    what = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return (
        f"{kind} policy {policy!r} in the {service} service raised {what} at "
        f"{frame.filename}:{frame.lineno}, in {frame.name} (traceback in the {service} service's "
        "log)"
    )
