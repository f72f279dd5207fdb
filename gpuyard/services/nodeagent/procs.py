"""One job's part on this node: its processes (each its own process group, running as the job's
account), their environment, logs and progress files, and stopping them (SIGTERM, a grace period,
SIGKILL)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import msgspec
import structlog

from gpuyard.shared.contract import JobProgress, Launch
from gpuyard.shared.model import Name

from .accounts import Account

NAME_RULE = "1-128 letters, digits, '_', '.', ':' or '-', not starting with '.', ':' or '-'"
LineSink = Callable[[str, int, str], Awaitable[None]]
"""(job_id, rank, line) -> publish it."""

_LINE_LIMIT = 2**16
"""The longest line of a job's output the agent reads as one (asyncio's default)."""
_PROGRESS_MAX_BYTES = 64 * 1024

PASSED_ENV = ("PATH", "LANG", "LANGUAGE", "TZ", "TERM", "LD_LIBRARY_PATH")
PASSED_ENV_PREFIXES = ("LC_", "CUDA_", "NCCL_", "NVIDIA_")
"""What a job inherits of the agent's environment: the locale, the search paths and the GPU
libraries' settings. Nothing else: the agent's may hold its credentials (GPUYARD_NATS_SEED) or
name them (GPUYARD_NATS_CONFIG), and systemd's sockets."""


def job_environment(
    agent_env: dict[str, str], account: Account | None, home: str = ""
) -> dict[str, str]:
    """The environment a job's processes start from (the job's own `env` and gpuyard's names go
    over it): `PASSED_ENV` of the agent's, and the account's names and `home` (its own, or, for
    an account without one such as `nobody`'s `/nonexistent`, a folder of the job's: tools that
    keep caches under `~` need one)."""
    env = {
        k: v for k, v in agent_env.items() if k in PASSED_ENV or k.startswith(PASSED_ENV_PREFIXES)
    }
    if account is not None:
        env |= {"HOME": home or account.home, "USER": account.name, "LOGNAME": account.name}
    else:
        env |= {k: agent_env[k] for k in ("HOME", "USER", "LOGNAME") if k in agent_env}
    return env


@dataclass(frozen=True)
class Starter:
    """How the agent starts a job's process: through util-linux's `setpriv`, which takes the job's
    account (its groups, group and user, saved ids too: nothing of the agent's stays) and the
    parent-death signal (SIGKILL when the agent dies, so that a crashed agent leaves no orphan
    running beside the job's next run elsewhere; systemd's cgroup kill does the same), then
    executes the job's command (an agent killed in the instant between starting `setpriv` and
    that may leave that one process, as one killed while forking could before). The agent starts
    `setpriv` by vfork and exec, which copies nothing of its memory: a fork of the agent, with
    Python run in the child to change account, cost some 7 ms of CPU a process, the most of a
    job's cost to its node."""

    setpriv: str

    @classmethod
    def find(cls, path: str | None = None) -> Starter:
        """From `path` (the agent's PATH by default); ValueError (one line) where it is not."""
        found = shutil.which("setpriv", path=path)
        if found is None:
            raise ValueError(
                "setpriv (util-linux) is not on this machine's PATH: the agent starts jobs "
                "through it"
            )
        return cls(found)

    def argv(self, command: list[str], account: Account | None) -> list[str]:
        argv = [self.setpriv, "--pdeathsig", "KILL"]
        if account is not None:
            groups = ",".join(map(str, account.groups))
            argv += ["--reuid", str(account.uid), "--regid", str(account.gid)]
            argv += ["--groups", groups] if groups else ["--clear-groups"]
        return [*argv, "--", *command]


class JobProcess:
    """One started process of a job: its output as a stream, its exit from a pidfd (the agent
    reaps its own processes only: the event loop's child watching knows nothing of them)."""

    def __init__(
        self, popen: subprocess.Popen[bytes], stdout: asyncio.StreamReader, pidfd: int
    ) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.stdout = stdout
        loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = loop.create_future()
        self._pidfd = pidfd
        loop.add_reader(pidfd, self._reap)

    @classmethod
    async def start(cls, argv: list[str], env: dict[str, str], cwd: str | None) -> JobProcess:
        """OSError where it cannot start (or be watched: then it is killed). On the loop's
        thread (the thread a process's parent-death signal watches), which waits for its vfork
        and exec alone."""
        popen = subprocess.Popen(  # noqa: ASYNC220
            argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        assert popen.stdout is not None
        pidfd = -1
        try:
            pidfd = os.pidfd_open(popen.pid)
            reader = asyncio.StreamReader(limit=_LINE_LIMIT)
            await asyncio.get_running_loop().connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), popen.stdout
            )
        except BaseException:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(popen.pid, signal.SIGKILL)
            if pidfd >= 0:
                os.close(pidfd)
            popen.stdout.close()
            await asyncio.to_thread(popen.wait)
            raise
        return cls(popen, reader, pidfd)

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def _reap(self) -> None:
        asyncio.get_running_loop().remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._exited.set_result(self.popen.wait())  # (it has exited: no wait)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)


@dataclass(frozen=True)
class Places:
    """Where a job's files go on this node: in a folder of its cluster's, so clusters sharing a
    machine (or a checkpoint root) never find each other's jobs of the same id."""

    log_dir: Path
    checkpoint_root: Path
    cluster: str

    def job_logs(self, job_id: str) -> Path:
        """The agent's: each rank's output (the job's processes cannot write or read here)."""
        return self.log_dir / self.cluster / job_folder(job_id)

    def job_run(self, job_id: str) -> Path:
        """The job's own, inside its logs' folder: its processes' progress files."""
        return self.job_logs(job_id) / "run"

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
        run = places.job_run(launch.job_id)
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
            "GPUYARD_PROGRESS_FILE": str(run / f"progress.rank{rank}.json"),
            "GPUYARD_GRACE_S": f"{grace_s:g}",
        }
        if gpu_type:
            env["GPUYARD_GPU_TYPE"] = gpu_type
        if (batch := launch.batch) is not None:  # an adaptive job's, for this run
            env["GPUYARD_BATCH_SIZE"] = str(batch.batch_size)
            env["GPUYARD_LOCAL_BATCH_SIZE"] = str(batch.local_bsz)
            env["GPUYARD_ACCUM_STEPS"] = str(batch.accum_steps)
        if spec.gpu_milli is not None:  # its share of the GPU, as CUDA MPS takes a limit
            env["GPUYARD_GPU_MILLI"] = str(spec.gpu_milli)
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = f"{spec.gpu_milli / 10:g}"
        if (array := spec.array) is not None:  # (and Slurm's names, for scripts written for it)
            for prefix in ("GPUYARD", "SLURM"):
                env |= {
                    f"{prefix}_ARRAY_JOB_ID": array.array_id,
                    f"{prefix}_ARRAY_TASK_ID": str(array.task),
                    f"{prefix}_ARRAY_TASK_COUNT": str(array.count),
                    f"{prefix}_ARRAY_TASK_MIN": str(array.low),
                    f"{prefix}_ARRAY_TASK_MAX": str(array.high),
                }
        envs.append(env)
    return envs


class JobPart:
    """This node's processes of one job."""

    def __init__(
        self, launch: Launch, node_id: str, places: Places, on_line: LineSink, grace_s: float,
        starter: Starter, gpu_type: str = "", account: Account | None = None,
    ) -> None:  # fmt: skip
        self.launch = launch
        self.starter = starter
        self.account = account
        """Who its processes run as (None: the agent's own account)."""
        self.gpu_type = gpu_type
        self.job_id = launch.job_id
        self.node_id = node_id
        self.places = places
        self.on_line = on_line
        self.grace_s = grace_s
        self.created = time.monotonic()
        self.stopping = False
        """Preempted or cancelled: its exit is not the job's end and is not reported."""
        self.timed_out = False
        """Stopped at its time limit (`Launch.time_limit_s`): its exit is the job's end."""
        self.procs: list[JobProcess] = []
        self.ranks: list[int] = []
        self.progress_files: list[Path] = []
        self._first: dict[int, JobProgress] = {}
        """Per rank: its first report of this run (the baseline of the run's rate)."""
        self._bad_goodput: set[int] = set()
        """Ranks whose goodput measurements were left out (said once)."""
        self.log = structlog.get_logger().bind(
            service="nodeagent", node_id=node_id, job_id=self.job_id
        )
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
        account = self.account
        self._spawning = True
        try:
            path = spec.env.get("PATH", base_env.get("PATH", os.defpath))  # (the job's)
            home = await asyncio.to_thread(self._prepare, command[0], workdir, path)
            envs = process_envs(
                self.launch, self.node_id, self.places, job_environment(base_env, account, home),
                self.grace_s, self.gpu_type,
            )  # fmt: skip
            argv = self.starter.argv(command, account)
            for env in envs:
                rank = int(env["RANK"])
                self.procs.append(await JobProcess.start(argv, env, workdir))
                self.ranks.append(rank)
                self.progress_files.append(Path(env["GPUYARD_PROGRESS_FILE"]))
        finally:
            self._spawning = False
            if self.stopping:  # stopped while its processes were starting: stop them now
                self._terminate_soon()

    def _prepare(self, program: str, workdir: str | None, path: str) -> str:
        """What starting the processes needs of the file system (off the event loop): the
        working directory and the command checked (a launch that cannot start says why, as
        `setpriv` would only in the job's log), the folders made. Returns the job's home."""
        if workdir is not None and not os.path.isdir(workdir):
            raise ValueError(f"working directory {workdir} is not a directory on {self.node_id}")
        if os.sep in program:  # (a path: from the working directory)
            found = shutil.which(os.path.join(workdir or "", program))
        else:
            found = shutil.which(program, path=path)
        if not found:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
        return self._prepare_folders()

    def _prepare_folders(self) -> str:
        """The logs' folder is the agent's (others may only pass through, to the job's `run`);
        `run` and the checkpoints are the job account's alone. Returns the job's home: its
        account's, or `run` where the account has none."""
        logs = self.places.job_logs(self.job_id)
        logs.mkdir(parents=True, exist_ok=True)
        run = self.places.job_run(self.job_id)
        run.mkdir(exist_ok=True)
        checkpoints = self.places.checkpoint_dir(self.job_id)
        checkpoints.mkdir(parents=True, exist_ok=True)
        if self.account is None:
            return ""
        os.chmod(logs, 0o711)
        for folder in (run, checkpoints):
            _give(folder, self.account)
            os.chmod(folder, 0o700)
        return self.account.home if os.path.isdir(self.account.home) else str(run)

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

    async def _run_one(self, proc: JobProcess, rank: int) -> int:
        assert proc.stdout is not None
        path = self.places.job_logs(self.job_id) / f"rank{rank}.log"
        # The agent's alone: another job (of the same account too) may pass through its folder.
        with _open_private(path) as log:
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
                p = self._decode_progress(_read_progress(path), rank)
            except (OSError, msgspec.DecodeError, msgspec.ValidationError):
                continue
            p.rate = 0.0  # ours to measure, not the job's to claim
            if p.attempt != self.launch.attempt:
                p.goodput = None  # (an earlier run's, told while it ran: not this run's batch)
            if p.attempt == self.launch.attempt and p.time > 0:
                first = self._first.setdefault(rank, p)
                if p.time > first.time and p.iterations >= first.iterations:
                    p.rate = (p.iterations - first.iterations) / (p.time - first.time)
            out.append(p)
        return out

    def _decode_progress(self, data: bytes, rank: int) -> JobProgress:
        """A progress file's report. Its goodput measurements, when they do not hold (a value
        out of range, too many configurations), are left out, said once per rank (this part
        is one run): the progress itself still counts."""
        try:
            return msgspec.json.decode(data, type=JobProgress)
        except msgspec.ValidationError as exc:
            if not str(exc).endswith("`$.goodput`") and "`$.goodput." not in str(exc):
                raise
            report = msgspec.json.decode(data)
            if not isinstance(report, dict):
                raise
            report.pop("goodput", None)
            progress = msgspec.convert(report, JobProgress)
            if rank not in self._bad_goodput:
                self._bad_goodput.add(rank)
                self.log.warning("job.goodput_ignored", rank=rank, error=str(exc))
            return progress


def _read_progress(path: Path) -> bytes:
    """A progress file as the job wrote it, read so that the job cannot make the agent do more:
    not through a link (to a file only the agent may read), not from a pipe (that would block),
    and no more than `_PROGRESS_MAX_BYTES`. OSError for anything but a plain file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a plain file")
        return f.read(_PROGRESS_MAX_BYTES)


def _open_private(path: Path) -> BinaryIO:
    """`path` to append to, readable by the agent alone (one made before by an agent that left it
    open to others is closed now), never through a link."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab", buffering=0)


def _give(folder: Path, account: Account) -> None:
    """`folder` and what it holds to `account` (a job resumed by another account than the run
    before it, after the node's mapping changed, must still read its checkpoints). Links are
    given as links: never the files they point to."""
    if os.lstat(folder).st_uid == account.uid:
        return
    os.chown(folder, account.uid, account.gid, follow_symlinks=False)
    for base, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            os.chown(os.path.join(base, name), account.uid, account.gid, follow_symlinks=False)
