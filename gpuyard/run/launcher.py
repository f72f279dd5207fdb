"""Start a set of services against one NATS server: in this process (one connection each) or as
one OS process each. Either way they only talk over NATS."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import nats.errors
import structlog

from gpuyard.run.embedded import dying_with_this_process
from gpuyard.shared.connection import Bus, NatsAuth, connect
from gpuyard.shared.contract import CONTRACT_VERSION, Ping
from gpuyard.shared.endpoints import PING, Subjects
from gpuyard.shared.errors import RemoteError
from gpuyard.shared.identity import ANONYMOUS
from gpuyard.shared.roster import BY_NAME, SERVICE_TOKENS
from gpuyard.shared.service import Service


class ConnectionLog:
    """A service's connection, as a few log lines: one when it is lost, one when the server is out
    of reach, one when it is back; a working connection's errors one line each. Without these,
    nats-py logs a traceback at every failed attempt to reconnect (two a second per service)."""

    def __init__(self, service: str) -> None:
        self.log = structlog.get_logger().bind(service=service)
        self.connected = True
        self.unreachable = False

    def callbacks(self) -> dict[str, Any]:
        return {"error_cb": self.error, "disconnected_cb": self.disconnected,
                "reconnected_cb": self.reconnected}  # fmt: skip

    async def error(self, exc: Exception) -> None:
        text = str(exc) or type(exc).__name__
        if self.connected:
            self.log.warning("nats.error", error=text)
        elif not self.unreachable:
            self.unreachable = True
            self.log.warning("nats.unreachable", error=text)

    async def disconnected(self) -> None:
        if self.connected:
            self.log.warning("nats.disconnected")
        self.connected = False

    async def reconnected(self) -> None:
        self.log.info("nats.reconnected")
        self.connected, self.unreachable = True, False


def service_class(name: str) -> Callable[[Bus, Any], Service]:
    """A service's class: made of a bus and its config (of the class `BY_NAME[name].config`)."""
    cls: Callable[[Bus, Any], Service] = BY_NAME[name].service_class()
    return cls


class ServiceSet:
    """`async with ServiceSet(url, cluster, {"scheduler": cfg, ...}, processes=False):`"""

    def __init__(
        self, url: str, cluster: str, configs: dict[str, Any], *, processes: bool = False,
        log_file: Path | None = None, log_level: str = "info", expect: frozenset[str] = frozenset(),
        auth: NatsAuth | None = None, service_auth: dict[str, NatsAuth] | None = None,
    ) -> None:  # fmt: skip
        self.auth = auth
        """Who the launcher is (it pings every service), and each service unless `service_auth`
        gives it an identity of its own."""
        self.service_auth = service_auth or {}
        self.url = url
        self.subjects = Subjects(cluster)
        self.configs = configs
        self.processes = processes
        self.log_file = log_file
        self.log_level = log_level
        self.expect = expect  # services started elsewhere that must answer too
        self._services: list[Service] = []
        self._procs: list[asyncio.subprocess.Process] = []
        self.extra: list[str] = []  # services started again by `replace`, in order
        self.standbys: dict[str, list[asyncio.subprocess.Process]] = {}
        """(processes=True) Standby processes started by `add_standby`, per service."""
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._spawned = itertools.count()  # (each process's config file)

    async def start(self) -> None:
        if self.processes:
            await self._start_processes()
        else:
            for name, config in self.configs.items():
                nc = await connect(
                    self.url, name=f"gpuyard-{name}-{self.subjects.cluster}",
                    auth=self.auth_of(name), **ConnectionLog(name).callbacks(),
                )  # fmt: skip
                service = service_class(name)(Bus(nc, self.subjects), config)
                await service.start()
                self._services.append(service)
        await self.wait_ready()

    def auth_of(self, name: str) -> NatsAuth | None:
        return self.service_auth.get(name, self.auth)

    async def _start_processes(self) -> None:
        for name, config in self.configs.items():
            self._procs.append(await self.spawn(name, config))

    async def spawn(
        self, name: str, config: Any, *, standby: bool = False
    ) -> asyncio.subprocess.Process:
        """Start one service process (again, or a replacement with another config); a durable
        service takes over from a running instance and loads the state it left (a `standby`
        waits until that one's leader lease lapses or it stops)."""
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="gpuyard-svc-")
        # The children write their logs straight into the run's log file.
        log = self.log_file.open("ab") if self.log_file else None
        path = Path(self._tmp.name) / f"{name}-{next(self._spawned)}.json"
        path.write_bytes(msgspec.json.encode(config))
        auth = self.auth_of(name)
        try:
            return await asyncio.create_subprocess_exec(
                sys.executable, "-m", f"gpuyard.services.{name}", "--nats", self.url,
                "--cluster", self.subjects.cluster, "--config", str(path),
                "--log-level", self.log_level, *(auth.argv() if auth else []),
                *(["--standby"] if standby else []), stdout=log or asyncio.subprocess.DEVNULL, stderr=log or None,
                preexec_fn=dying_with_this_process(),
                env={**os.environ, **(auth.env() if auth else {})},
            )  # fmt: skip
        finally:
            if log:
                log.close()

    def process(self, name: str) -> asyncio.subprocess.Process:
        """The newest process of service `name` (processes=True)."""
        names = [*self.configs, *self.extra]
        return [p for n, p in zip(names, self._procs, strict=True) if n == name][-1]

    async def replace(self, name: str, config: Any | None = None) -> asyncio.subprocess.Process:
        """Start service `name` again (after a crash, or to take over with another config)."""
        proc = await self.spawn(name, config if config is not None else self.configs[name])
        self._procs.append(proc)
        self.extra.append(name)
        return proc

    async def add_standby(self, name: str) -> asyncio.subprocess.Process:
        """(processes=True) Start a standby of durable service `name`: it takes over when the
        active instance's lease lapses (killed, paused, cut off) or it stops."""
        proc = await self.spawn(name, self.configs[name], standby=True)
        self.standbys.setdefault(name, []).append(proc)
        return proc

    async def lost(self, grace_s: float, every_s: float = 0.1) -> tuple[str, int]:
        """(processes=True) Wait for a service whose newest process ended and that was not
        started again (`replace`) within `grace_s` seconds; its name and its process's exit code
        (-N: killed by signal N). One started again in time is not lost."""
        import time

        down: dict[str, float] = {}
        while True:
            now = time.monotonic()
            ended = dict(self.ended())
            for name in list(down):
                if name not in ended:  # started again
                    del down[name]
            for name, code in ended.items():
                if now - down.setdefault(name, now) >= grace_s:
                    return name, code
            await asyncio.sleep(every_s)

    def ended(self) -> list[tuple[str, int]]:
        """(processes=True) The services whose newest process has ended, with its exit code."""
        codes = [(name, self.process(name).returncode) for name in self.configs]
        return [(name, code) for name, code in codes if code is not None]

    async def wait_ready(self, within_s: float = 30.0) -> None:
        """Until every service answers a ping."""
        nc = await connect(self.url, name="gpuyard-launcher", auth=self.auth)
        bus = Bus(nc, self.subjects, caller=self.auth.caller if self.auth else ANONYMOUS)
        name, last = "", ""
        try:
            async with asyncio.timeout(within_s):
                for name in [*self.configs, *sorted(self.expect)]:
                    last = ""
                    while True:
                        try:
                            pong = await bus.call(
                                PING, Ping(), within_s=1.0, svc=SERVICE_TOKENS[name]
                            )
                        except RemoteError as exc:
                            last = str(exc)
                        else:
                            if pong.contract != CONTRACT_VERSION:
                                raise RuntimeError(
                                    f"{name} speaks contract v{pong.contract}, we speak "
                                    f"v{CONTRACT_VERSION}"
                                )
                            break
                        for proc in self._procs[: len(self.configs)]:
                            if proc.returncode is not None:
                                raise RuntimeError(f"a service process exited ({proc.returncode})")
                        await asyncio.sleep(0.05)
        except TimeoutError:  # (one line saying which, and why: a bare TimeoutError says nothing)
            why = f": {last}" if last else ""
            raise RuntimeError(
                f"the {name} service did not answer within {within_s:g} s{why}"
            ) from None
        finally:
            await bus.close()

    async def stop(self) -> None:
        for service in reversed(self._services):
            try:
                if not service.bus.nc.is_connected:  # the server is gone: nothing to drain
                    await service.bus.nc.close()
                await service.stop()
            except (nats.errors.Error, OSError, RuntimeError) as exc:  # (it went meanwhile)
                structlog.get_logger().warning(
                    "service.stopped_without_draining", service=service.name, error=str(exc)
                )
                with contextlib.suppress(Exception):
                    await service.bus.nc.close()
        procs = [*self._procs, *(p for ps in self.standbys.values() for p in ps)]
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
        for proc in procs:
            try:
                async with asyncio.timeout(10):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._tmp is not None:
            self._tmp.cleanup()
        self._services = []  # (their state, every job's record, goes with them: a run's results
        # are written after its services stop)

    async def __aenter__(self) -> ServiceSet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
