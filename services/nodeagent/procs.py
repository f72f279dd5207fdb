"""One job's part on this node: its processes (each its own process group), their environment,
logs and progress files, and stopping them (SIGTERM, a grace period, SIGKILL)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from gpuyard.shared.contract import JobProgress, Launch
from gpuyard.shared.model import Name

NAME_RULE = "1-128 letters, digits, '_', '.', ':' or '-', not starting with '.', ':' or '-'"
LineSink = Callable[[str, int, str], Awaitable[None]]
"""(job_id, rank, line) -> publish it."""

_PR_SET_PDEATHSIG = 1


def _die_with_agent() -> None:
    """In the child before exec (Linux): SIGKILL it when the agent dies, so a crashed agent leaves
    no orphans running beside the job's next run elsewhere (systemd's cgroup kill does the same)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass(frozen=True)
class Places:
    """Where a job's files go on this node: in a folder of its cluster's, so clusters sharing a
    machine (or a checkpoint root) never find each other's jobs of the same id."""

    log_dir: Path
    checkpoint_root: Path
    cluster: str

    def job_logs(self, job_id: str) -> Path:
        return self.log_dir / self.cluster / job_folder(job_id)

    def checkpoint_dir(self, job_id: str) -> Path:
        """Keyed by cluster and job id only, so a resumed job finds it on any node sharing the
        root."""
        return self.checkpoint_root / self.cluster / job_folder(job_id)


def job_folder(job_id: str) -> str:
    """`job_id` as the name of one folder; ValueError for one that is not a job id (a path, `..`,
    too long): a request never names a place outside the job's own."""
    try:
        return msgspec.convert(job_id, Name)
    except msgspec.ValidationError:
        raise ValueError(f"job id {job_id[:140]!r} is not a job id ({NAME_RULE})") from None


def process_envs(
    launch: Launch, node_id: str, places: Places, base: dict[str, str], grace_s: float = 30.0,
    gpu_type: str = "",
) -> list[dict[str, str]]:  # fmt: skip
    """The environment of each process of this part: Blox's names, torchrun's, and gpuyard's
    (`gpu_type`: the node's GPU type, as `GPUYARD_GPU_TYPE` when known)."""
    spec = launch.spec
    assert spec is not None  # (the agent refuses a launch without one)
    gpus = [str(g) for g in launch.gpus]
    per_gpu = spec.processes == "per_gpu"
    count = len(launch.gpus) if per_gpu else 1
    envs = []
    for local in range(count):
        rank = launch.rank_offset + local
        visible = gpus[local] if per_gpu else ",".join(gpus)
        logs = places.job_logs(launch.job_id)
        env = {
            **base,
            **spec.env,
            # Blox
            "job_id": launch.job_id,
            "local_gpu_id": visible,
            "world_size": str(launch.world_size),
            "dist_rank": str(rank),
            "master_ip_address": launch.master_addr,
            "local_accessible_gpu": ",".join(gpus),
            # CUDA and torchrun. CUDA numbers GPUs fastest first unless told otherwise; NVML, and
            # so the node's GPU indexes, in PCI bus order: the same order makes index 1 the same GPU.
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": visible,
            "MASTER_ADDR": launch.master_addr,
            "MASTER_PORT": str(launch.master_port),
            "RANK": str(rank),
            "WORLD_SIZE": str(launch.world_size),
            "LOCAL_RANK": str(local),
            "LOCAL_WORLD_SIZE": str(count),
            "NODE_RANK": str(launch.node_rank),
            "NNODES": str(launch.num_nodes),
            # gpuyard.jobclient
            "GPUYARD_JOB_ID": launch.job_id,
            "GPUYARD_NODE_ID": node_id,
            "GPUYARD_ATTEMPT": str(launch.attempt),
            "GPUYARD_CHECKPOINT_DIR": str(places.checkpoint_dir(launch.job_id)),
            "GPUYARD_PROGRESS_FILE": str(logs / f"progress.rank{rank}.json"),
            "GPUYARD_GRACE_S": f"{grace_s:g}",
        }
        if gpu_type:
            env["GPUYARD_GPU_TYPE"] = gpu_type
        envs.append(env)
    return envs


class JobPart:
    """This node's processes of one job."""

    def __init__(
        self, launch: Launch, node_id: str, places: Places, on_line: LineSink, grace_s: float,
        gpu_type: str = "",
    ) -> None:  # fmt: skip
        self.launch = launch
        self.gpu_type = gpu_type
        self.job_id = launch.job_id
        self.node_id = node_id
        self.places = places
        self.on_line = on_line
        self.grace_s = grace_s
        self.created = time.monotonic()
        self.stopping = False
        """Preempted or cancelled: its exit is not the job's end and is not reported."""
        self.procs: list[asyncio.subprocess.Process] = []
        self.ranks: list[int] = []
        self.progress_files: list[Path] = []
        self._first: dict[int, JobProgress] = {}
        """Per rank: its first report of this run (the baseline of the run's rate)."""
        self.done = asyncio.Event()
        """Set when every process has exited (its GPUs are free again)."""
        self._stopper: asyncio.Task[None] | None = None
        self._spawning = False

    async def spawn(self, base_env: dict[str, str]) -> None:
        spec = self.launch.spec
        assert spec is not None  # (the agent refuses a launch without one)
        command = spec.command
        if not command:
            raise ValueError("the job has no command")
        workdir = spec.workdir or None  # None: the agent's own
        if workdir is not None and not await asyncio.to_thread(os.path.isdir, workdir):
            raise ValueError(f"working directory {workdir} is not a directory on {self.node_id}")
        logs = self.places.job_logs(self.job_id)
        logs.mkdir(parents=True, exist_ok=True)
        self.places.checkpoint_dir(self.job_id).mkdir(parents=True, exist_ok=True)
        self._spawning = True
        try:
            envs = process_envs(
                self.launch, self.node_id, self.places, base_env, self.grace_s, self.gpu_type
            )
            for env in envs:
                rank = int(env["RANK"])
                proc = await asyncio.create_subprocess_exec(
                    *command, env=env, cwd=workdir, stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True, preexec_fn=_die_with_agent,
                )  # fmt: skip
                self.procs.append(proc)
                self.ranks.append(rank)
                self.progress_files.append(Path(env["GPUYARD_PROGRESS_FILE"]))
        finally:
            self._spawning = False
            if self.stopping:  # stopped while its processes were starting: stop them now
                self._terminate_soon()

    async def wait(self) -> tuple[int, int]:
        """Until every process has exited: (rank, exit code) of the first failure, or (-1, 0).

        A failing process takes the others of the part down with it (they cannot go on alone).
        """
        waits = {
            asyncio.create_task(self._run_one(proc, rank)): rank
            for proc, rank in zip(self.procs, self.ranks, strict=True)
        }
        failure = (-1, 0)
        pending = set(waits)
        while pending:
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                code = task.result()
                if code != 0 and failure[0] < 0:
                    failure = (waits[task], code)
                    if pending:
                        self._terminate_soon()
        self.done.set()
        return failure

    async def _run_one(self, proc: asyncio.subprocess.Process, rank: int) -> int:
        assert proc.stdout is not None
        path = self.places.job_logs(self.job_id) / f"rank{rank}.log"
        with path.open("ab", buffering=0) as log:
            while line := await proc.stdout.readline():
                log.write(line)
                await self.on_line(self.job_id, rank, line.decode(errors="replace").rstrip("\n"))
        return await proc.wait()

    def stop(self) -> None:
        """Preempt: SIGTERM now, SIGKILL after the grace period (in the background). While its
        processes are being started, once they all have (a signal now would miss the later ones)."""
        self.stopping = True
        if not self._spawning:
            self._terminate_soon()

    def _terminate_soon(self) -> None:
        if self._stopper is None:
            self._stopper = asyncio.create_task(self._terminate())

    async def _terminate(self) -> None:
        self._signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(self.grace_s):
                await asyncio.gather(*(p.wait() for p in self.procs))
        except TimeoutError:
            self._signal(signal.SIGKILL)

    def _signal(self, sig: signal.Signals) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)  # the process group: the job's children too

    def steps_done(self) -> float | None:
        """The steps rank 0 of this run last reported (None: rank 0 is not here, or it reported
        none): the job's progress at its exit, which the heartbeats may not have carried yet."""
        return next(
            (float(p.iterations) for p in self.progress()
             if p.rank == 0 and p.attempt == self.launch.attempt and p.iterations),
            None,
        )  # fmt: skip

    def progress(self) -> list[JobProgress]:
        """What the processes last wrote through gpuyard.jobclient, each with the rate of this
        run so far (`JobProgress.rate`): steps per second of the job's own clock between the
        rank's first report of this run and this one. A report of an earlier run (the file a
        previous run on this node left, until this run writes) has no rate."""
        out = []
        for rank, path in zip(self.ranks, self.progress_files, strict=True):
            try:
                p = msgspec.json.decode(path.read_bytes(), type=JobProgress)
            except (OSError, msgspec.DecodeError, msgspec.ValidationError):
                continue
            p.rate = 0.0  # ours to measure, not the job's to claim
            if p.attempt == self.launch.attempt and p.time > 0:
                first = self._first.setdefault(rank, p)
                if p.time > first.time and p.iterations >= first.iterations:
                    p.rate = (p.iterations - first.iterations) / (p.time - first.time)
            out.append(p)
        return out
