"""What every `gpuyard` command shares: its NATS options, one way to connect, one way to fail.

`add_nats_options(parser)` adds `--nats URL`, `--cluster NAME` and the `--nats-*` identity and TLS
options (user/password, token, creds file, NKey seed, CA/cert/key), defined once in
`gpuyard.shared.connection.add_nats_arguments`, which the services' own entry points use too.
`run_on_bus(command, args, body)` runs a command's body on a connection made with them, and
`run_command(command, coroutine)` runs any command's coroutine: a bad URL, an unreachable or
refusing server, an error reply, Ctrl-C or a closed pipe (`gpuyard tail | head -1`) each end the
command with one line on stderr (or none) and an exit status, never a traceback or a retry loop.
`OneLineParser` makes argparse's own errors one line too, and the number types below make every
numeric option name itself when its value is out of range.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import difflib
import os
import re
import select
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeAlias, TypeVar
from urllib.parse import urlsplit

import nats.errors

from gpuyard.run.spec import checked_number, parse_deadline_factor, parse_demand, parse_window
from gpuyard.shared.connection import (
    Bus,
    NatsAuth,
    TlsFailure,
    add_nats_arguments,
    connect,
    connection_given,
    describe_error,
    redact,
    resolve_connection,
)
from gpuyard.shared.durations import parse_time_limit
from gpuyard.shared.endpoints import Subjects
from gpuyard.shared.errors import RemoteError
from gpuyard.shared.policy import PolicyError

DEFAULT_URL = "nats://127.0.0.1:4222"
NATS_SCHEMES = ("nats", "tls", "ws", "wss")
LOG_LEVELS = ("debug", "info", "warning", "error")


T = TypeVar("T")


class CommandError(Exception):
    """A command's failure, told in one line; `code` is the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class OneLineParser(argparse.ArgumentParser):
    """argparse, with errors in one line (`gpuyard sim: error: argument --load: ...`) instead of
    the usage text first; `--help` still shows it. Subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """argparse's, noting where unknown arguments came (the innermost subcommand) and, for a
        mistyped option, the nearest one it has: the top-level parser, which refuses them, has
        not seen a subcommand's options."""
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and not hasattr(parsed, "_refused_in"):
            names = [token.split("=", 1)[0] for token in extras if token.startswith("--")]
            known = list(self._option_string_actions)
            nearest = [(n, close[0]) for n in names
                       for close in [difflib.get_close_matches(n, known, n=1)] if close]  # fmt: skip
            parsed._refused_in = (self.prog, nearest[0] if nearest else None)
        return parsed, extras

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        refused_in = vars(parsed).pop("_refused_in", None)
        if extras:
            prog, nearest = refused_in or (self.prog, None)
            hint = f"; did you mean {nearest[1]} (not {nearest[0]})?" if nearest else ""
            self.exit(2, f"{prog}: error: unrecognized arguments: {' '.join(extras)}{hint} "
                         f"(see: {prog} --help)\n")  # fmt: skip
        return parsed


Subcommands: TypeAlias = "argparse._SubParsersAction[OneLineParser]"
"""What `OneLineParser.add_subparsers` returns: each group of subcommands adds its parsers there."""


# --------------------------------------------------------------------------- numeric options


def _number(
    kind: type[int] | type[float],
    text: str,
    gt: float | None,
    ge: float | None,
    le: float | None = None,
) -> int | float:
    """`text` as an int or a finite float with the given bound; ArgumentTypeError otherwise, which
    argparse prints after the option's name."""
    try:
        return checked_number(kind, text, gt=gt, ge=ge, le=le)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def number(
    kind: type[int] | type[float],
    *,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
) -> Callable[[str], Any]:
    """An argparse `type`: `number(int, gt=0)` accepts 1, 2, ... and names the bound otherwise."""

    def parse(text: str) -> int | float:
        return _number(kind, text.strip(), gt, ge, le)

    parse.__name__ = kind.__name__
    return parse


def number_list(
    kind: type[int] | type[float], *, gt: float | None = None, ge: float | None = None
) -> Callable[[str], list[Any]]:
    """An argparse `type` for a comma list of numbers (`--load 10,20,40`), each checked."""

    def parse(text: str) -> list[int | float]:
        parts = [p.strip() for p in text.split(",")]
        if not all(parts):
            raise argparse.ArgumentTypeError(f"{text!r} has an empty item")
        values = []
        for part in parts:
            try:
                values.append(_number(kind, part, gt, ge))
            except argparse.ArgumentTypeError as exc:
                raise argparse.ArgumentTypeError(
                    f"{exc}" if len(parts) == 1 else f"{exc} (in {text!r})"
                ) from None
        if (twice := repeated(values)) is not None:  # (the same run twice, into one folder)
            raise argparse.ArgumentTypeError(f"{text!r} gives {twice:g} twice")
        return values

    parse.__name__ = f"{kind.__name__} list"
    return parse


def repeated(values: Sequence[T]) -> T | None:
    """The first of `values` given again (4 and 4.0 alike), None if none is."""
    return next((v for i, v in enumerate(values) if v in values[:i]), None)


def output_file(text: str) -> Path:
    """An argparse `type` for a file to write (a trace): its folder must be there, checked before
    the work that makes what goes in it."""
    path = Path(text)
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: no folder {str(path.parent)!r} to write in")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder: name a file")
    return path


def parsed(parse: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse `type` giving what `parse` makes of the option's text; `parse`'s ValueError
    is the one line argparse prints."""

    def check(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return check


def checked_text(parse: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse `type` that keeps the option's text (a `RunSpec` carries it) once `parse`
    accepts it; `parse`'s ValueError is the one line argparse prints."""

    def check(text: str) -> str:
        try:
            parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text

    return check


window_text = checked_text(parse_window)
"""`FIRST:END`, jobs FIRST to END - 1 (0 <= FIRST < END)."""
demand_text = checked_text(parse_demand)
"""The blox generator's `GPUS:WEIGHT,...`."""
deadline_factor_text = checked_text(parse_deadline_factor)
"""The elasticflow generator's `FACTOR` or `MIN:MAX`."""


def job_id_arg(text: str) -> str:
    """An argparse `type` for a job id, as jobs are named (no path, at most 128 characters)."""
    import msgspec

    from gpuyard.shared.model import Name

    try:
        return msgspec.convert(text, Name)
    except msgspec.ValidationError:
        raise argparse.ArgumentTypeError(
            f"{text[:140]!r} is not a job id (1-128 letters, digits, '_', '.', ':' or '-', "
            "starting with a letter, a digit or '_')"
        ) from None


def gpus_or_share(text: str) -> tuple[int, int | None]:
    """`--gpus`: whole GPUs (2), or a share of one GPU (0.25: 250 thousandths), as
    (GPUs, thousandths of the one GPU or None)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if value >= 1 and value == int(value):
        return int(value), None
    milli = round(value * 1000) if 0 < value < 1 else 0
    if not 1 <= milli <= 999 or abs(milli - value * 1000) > 1e-6:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a whole number of GPUs (1, 2, ...) nor a share of one GPU "
            "in thousandths (0.001 to 0.999)"
        )
    return 1, milli


positive_int = number(int, gt=0)
non_negative_int = number(int, ge=0)
positive_float = number(float, gt=0)
non_negative_float = number(float, ge=0)


# --------------------------------------------------------------------------- NATS URL and options


def _url_problem(part: str) -> str | None:
    if "://" not in part:
        return "no scheme"
    try:
        url = urlsplit(part)
        _ = url.port  # ValueError when not a number from 0 to 65535
    except ValueError as exc:
        return str(exc)
    if url.scheme not in NATS_SCHEMES:
        return f"scheme {url.scheme!r} is not one of {', '.join(NATS_SCHEMES)}"
    return None if url.hostname else "no host"


def check_nats_url(text: str) -> str:
    """`text` when every comma-separated server in it is `SCHEME://HOST[:PORT]` (SCHEME one of
    nats, tls, ws, wss); ValueError naming the first that is not. A bare word is refused rather
    than taken for a host name to be looked up again and again."""
    parts = [p.strip() for p in text.split(",")]
    for part in parts:
        problem = _url_problem(part)
        if problem:
            raise ValueError(
                f"--nats {redact(part)!r} is not a NATS server URL ({problem}): expected "
                f"nats://HOST[:PORT] (or tls://, ws://, wss://), comma-separated for several"
            )
    return ",".join(parts)


def add_nats_options(
    parser: argparse.ArgumentParser, *, url_default: str | None = DEFAULT_URL
) -> None:
    """`--nats`, `--nats-config`, `--nats-*` and `--cluster` (default $GPUYARD_CLUSTER, the
    profile's, or 'default'). With none of them given, a command uses the operator profile that
    `gpuyard up` wrote for the cluster on this machine, if there is one (see `resolve_options`)."""
    add_nats_arguments(parser, url_default=url_default, cluster_default="default")
    parser.set_defaults(nats_local_profile=True)


def resolve_options(args: argparse.Namespace) -> None:
    """After parsing a command's options: its connection (`resolve_connection`), with the local
    operator profile of `gpuyard up` when no connection option was given. CommandError (exit 2)
    for a profile that cannot be read."""
    if not hasattr(args, "nats_url_default"):
        return
    local = None
    if getattr(args, "nats_local_profile", False) and not connection_given(args):
        from gpuyard.natsauth import local_profile

        local = local_profile(args.cluster or os.environ.get("GPUYARD_CLUSTER") or "default")
    try:
        resolve_connection(args, local)
    except ValueError as exc:
        raise CommandError(str(exc), code=2) from None


def checked_url(text: str) -> str:
    """`check_nats_url`, failing as a command does (exit 2)."""
    try:
        return check_nats_url(text)
    except ValueError as exc:
        raise CommandError(str(exc), code=2) from None


def checked_subjects(cluster: str) -> Subjects:
    """The subjects of `--cluster`, failing as a command does (exit 2)."""
    try:
        return Subjects(cluster)
    except ValueError as exc:
        raise CommandError(f"--cluster {cluster!r}: {exc}", code=2) from None


def nats_auth(args: argparse.Namespace) -> NatsAuth:
    return NatsAuth.from_args(args)


def is_connection_loss(exc: BaseException) -> bool:
    """An error of losing the connection to the server, or of failing to get it back."""
    return isinstance(exc, (
        OSError, TimeoutError, nats.errors.StaleConnectionError, nats.errors.ConnectionClosedError,
        nats.errors.ConnectionReconnectingError, nats.errors.NoServersError,
    ))  # fmt: skip


async def open_bus(
    args: argparse.Namespace, name: str, *, request_timeout: float = 10.0,
    refused: asyncio.Future[str] | None = None, reports_loss: bool = False,
) -> Bus:  # fmt: skip
    """Connect to `args.nats` with the `--nats-*` options; a Bus for `args.cluster`.

    A bad URL raises CommandError (exit 2); a server that cannot be reached (or refuses us) raises
    CommandError naming it after two quick attempts. Once connected, each distinct error the
    client meets is one line on stderr; the server's first refusal of something our identity
    may not do goes to `refused` instead, when given. `reports_loss`: the caller says itself,
    in one line, that the connection was lost (it reconnects), so the client's errors of losing
    it are not printed (others still are).
    """
    url = checked_url(args.nats)
    subjects = checked_subjects(args.cluster)
    try:
        auth = nats_auth(args)
        auth.caller  # noqa: B018 (a bad --nats-identity fails here, as a bad option)
    except ValueError as exc:
        raise CommandError(f"--nats-identity: {exc}", code=2) from None
    failures: list[BaseException] = []
    connected = False
    reported: set[str] = set()

    async def on_error(exc: Exception) -> None:  # no tracebacks: collected, or one line each
        if not connected:
            failures.append(exc)
            return
        if reports_loss and is_connection_loss(exc):
            return
        text = describe_error(exc)
        if refused is not None and "permissions violation" in text.lower():
            if not refused.done():
                refused.set_result(text.removeprefix("nats: "))
            return
        if text not in reported:
            reported.add(text)
            print(f"{name}: {text}", file=sys.stderr)

    try:
        nc = await connect(
            url, name=name, auth=auth, connect_timeout=3, max_reconnect_attempts=1,
            reconnect_time_wait=0.2, error_cb=on_error,
        )  # fmt: skip
    except (OSError, TimeoutError, nats.errors.Error, TlsFailure) as exc:
        # The server's refusal says more than the broken pipe that may follow it.
        refusals = [f for f in failures if "authoriz" in str(f).lower()]
        why = describe_error((refusals or failures or [exc])[-1])
        if isinstance(exc, TlsFailure):
            why = str(exc)
        raise CommandError(f"cannot connect to NATS at {redact(url)}: {why}") from None
    connected = True
    return Bus(nc, subjects, request_timeout=request_timeout, caller=auth.caller)


async def reopen_bus(
    args: argparse.Namespace, name: str, *, first_s: float = 0.5, most_s: float = 5.0
) -> Bus:
    """A new connection for a command that outlives its first one (`tail --follow`, `logs -f`),
    trying with backoff until the server is back (or Ctrl-C). Its loss is the caller's to say."""
    pause = first_s
    while True:
        try:
            return await open_bus(args, name, reports_loss=True)
        except CommandError:  # (unreachable yet: a bad option would have failed the first time)
            await asyncio.sleep(pause)
            pause = min(2 * pause, most_s)


# --------------------------------------------------------------------------- running a command


def _quiet_stdout() -> None:
    """The reader of our stdout is gone (`| head -1`): drop what is still buffered, so that Python
    does not complain about it at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def run_command(command: str, main: Coroutine[Any, Any, int]) -> int:
    """Run a command's coroutine and turn its failures into one line on stderr and an exit status:
    CommandError its own code; an error reply, a bad value, an unreachable server 1; Ctrl-C or
    SIGTERM 130 (even where SIGINT was ignored, as in a job started with `&` by a script);
    a closed stdout 0 (as `grep` does)."""
    import uvloop

    from gpuyard.run.process import stop_on_signals

    try:
        return uvloop.run(stop_on_signals(main))
    except CommandError as exc:
        print(f"gpuyard {command}: {exc}", file=sys.stderr)
        return exc.code
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 130
    except BrokenPipeError:
        _quiet_stdout()
        return 0
    except (RemoteError, PolicyError, ValueError, OSError, RuntimeError, TimeoutError) as exc:
        print(f"gpuyard {command}: {exc}", file=sys.stderr)
        return 1
    except nats.errors.Error as exc:  # e.g. a permissions violation once connected
        print(f"gpuyard {command}: {describe_error(exc)}", file=sys.stderr)
        return 1


async def stdout_closed(every_s: float = 0.2) -> None:
    """Return once the reader of our stdout has gone (`gpuyard tail --follow | head -1`): a
    command that waits for more to print would otherwise only notice at its next line."""
    poller = select.poll()
    try:
        poller.register(sys.stdout.fileno(), 0)  # 0: errors and hang-ups only
    except (OSError, ValueError):  # no file descriptor (stdout captured in-process): it stays
        await asyncio.Event().wait()
    while True:
        if any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0)):
            return
        await asyncio.sleep(every_s)


async def unless_stdout_closes(work: Awaitable[int]) -> int:
    """`await work`, or BrokenPipeError as soon as nobody reads our stdout any more. Cancelled
    (Ctrl-C), it cancels `work` and waits for it first: a `tail --follow` stops reading before
    its connection is drained."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(stdout_closed())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():  # (nobody reads our stdout: the watch ended first)
        raise BrokenPipeError
    return task.result()


async def unless_refused(work: Awaitable[int], refused: asyncio.Future[str], bus: Bus) -> int:
    """`await work`, or CommandError as soon as the server refuses what we sent (rather than
    waiting for a reply that cannot come)."""
    task = asyncio.ensure_future(work)
    try:
        either: set[asyncio.Future[Any]] = {task, refused}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
    finally:
        if not task.done():  # refused, or we are cancelled (nobody reads our stdout)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    raise CommandError(f"the server refused: {refused.result()} (identity {bus.caller})")


def run_on_bus(
    command: str, args: argparse.Namespace, body: Callable[[Bus], Awaitable[int]], *,
    reports_loss: bool = False, request_timeout: float = 10.0,
) -> int:  # fmt: skip
    """Connect (see `open_bus`, its `reports_loss` and `request_timeout`), run `body(bus)`,
    close; failures as in `run_command`."""

    async def main() -> int:
        refused: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        bus = await open_bus(args, f"gpuyard-{command.replace(' ', '-')}", refused=refused,
                             reports_loss=reports_loss, request_timeout=request_timeout)  # fmt: skip
        try:
            return await unless_stdout_closes(unless_refused(body(bus), refused, bus))
        except BrokenPipeError:
            await bus.nc.close()  # nobody reads on: nothing is worth draining for
            raise
        finally:
            await bus.close()

    return run_command(command, main())


time_limit = parsed(parse_time_limit)
"""`--time-limit`'s value, in seconds (a usage error names the forms)."""

BEGIN_FORMS = (
    "now+N[s|min|h|d|w] (N seconds without a unit), HH:MM[:SS] (the next such time), "
    "YYYY-MM-DD[THH:MM[:SS]], midnight, noon, today, tomorrow"
)
_BEGIN_UNITS = {
    "": 1, "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1, "min": 60, "mins": 60,
    "minute": 60, "minutes": 60, "h": 3600, "hour": 3600, "hours": 3600, "d": 86400,
    "day": 86400, "days": 86400, "w": 604800, "week": 604800, "weeks": 604800,
}  # fmt: skip
_BEGIN_NOW = re.compile(r"now(?:\+(\d+)\s*([a-z]*))?")
_BEGIN_CLOCK = re.compile(r"(\d{1,2}):(\d\d)(?::(\d\d))?")


def parse_begin(text: str, now: float | None = None) -> float:
    """Slurm's `--begin` forms, as the epoch's seconds, in local time: `now`, `now+N[UNIT]`
    (seconds by default; min, h, d, w), `HH:MM[:SS]` (today, or tomorrow once past, as Slurm
    does), `YYYY-MM-DD[THH:MM[:SS]]`, `midnight`, `noon` (the next), `today`, `tomorrow`.
    ValueError in one line naming the forms."""
    import datetime as dt

    now = time.time() if now is None else now
    value = text.strip().lower()
    today = dt.datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0, microsecond=0)

    def next_at(hour: int, minute: int = 0, second: int = 0) -> float:
        at = today.replace(hour=hour, minute=minute, second=second)
        if at.timestamp() <= now:
            at += dt.timedelta(days=1)
        return at.timestamp()

    try:
        if (m := _BEGIN_NOW.fullmatch(value)) and (m[2] or "") in _BEGIN_UNITS:
            return now + int(m[1] or 0) * _BEGIN_UNITS[m[2] or ""]
        if m := _BEGIN_CLOCK.fullmatch(value):
            return next_at(int(m[1]), int(m[2]), int(m[3] or 0))
        if value in ("midnight", "noon"):
            return next_at(0 if value == "midnight" else 12)
        if value in ("today", "tomorrow"):
            return (today + dt.timedelta(days=1 if value == "tomorrow" else 0)).timestamp()
        if re.fullmatch(r"\d{4}-\d\d-\d\d(?:t\d\d:\d\d(?::\d\d)?)?", value):
            return dt.datetime.fromisoformat(value.upper()).timestamp()
    except ValueError:  # (an hour or a date out of range)
        pass
    raise ValueError(f"{text!r} is not a begin time; forms: {BEGIN_FORMS}")


begin_time = parsed(parse_begin)
"""`--begin`'s value, as the epoch's seconds (a usage error names the forms)."""


def add_time_limit_options(p: argparse.ArgumentParser) -> None:
    """A cluster's (or a simulated one's) default and maximum time limits, as Slurm's partition
    `DefaultTime` and `MaxTime`."""
    p.add_argument(
        "--default-time-limit", type=time_limit, metavar="TIME",
        help="the time limit of a job submitted without one (Slurm's DefaultTime; default: "
        "--max-time-limit)",
    )  # fmt: skip
    p.add_argument(
        "--max-time-limit", type=time_limit, metavar="TIME",
        help="the longest time limit a job may ask for: one asking for more is rejected at "
        "submission (Slurm's MaxTime; default: none)",
    )  # fmt: skip
