"""Supervision of a real cluster, with real processes: `gpuyard up` starts its embedded broker
again when it is killed (or gives up, within a bound, for systemd), `tail --follow` resumes after a
broker restart with no event twice and none lost, `logs -f` goes on after one, each saying so in
one line, and a second `up` on a state directory in use is refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.polling import alive, free_port, run_gpuyard, stop_processes, until

from .jobaccount import AGENT_ARGS, JOB_PYTHON

pytestmark = pytest.mark.slow  # (integration: `pytest -m "not slow"` leaves it out)

CLUSTER = "sup"
RESTARTED = "the services answer again"


class Cluster:
    """`gpuyard up` on a state directory of its own, its stderr in `up.log`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.state = root / "state"
        self.port = free_port()
        self.op = str(self.state / "profiles" / "op.admin.json")
        self.procs: list[subprocess.Popen[str]] = []
        self.up: subprocess.Popen[str] | None = None

    def popen(self, *args: str, log: str, err: str | None = None) -> subprocess.Popen[str]:
        """`gpuyard ARGS`, its stdout in `log`, its stderr there too or in `err`."""
        out = (self.root / log).open("a")
        errors = (self.root / err).open("a") if err else out
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuyard.cli", *args], stdout=out, stderr=errors, text=True,
            cwd=self.root,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def gpuyard(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:  # fmt: skip
        return run_gpuyard(*args, cwd=self.root, check=check, timeout=timeout)

    def up_args(self, *extra: str) -> list[str]:
        return ["up", "--cluster", CLUSTER, "--state-dir", str(self.state), "--listen",
                f"127.0.0.1:{self.port}", "--round", "0.5", *extra]  # fmt: skip

    def start_up(self, *extra: str) -> None:
        before = self.log().count("control plane up")
        self.up = self.popen(*self.up_args(*extra), log="up.log")
        until(lambda: self.log().count("control plane up") > before, "up started", within_s=60)

    def log(self, name: str = "up.log") -> str:
        path = self.root / name
        return path.read_text() if path.exists() else ""

    def broker_pid(self) -> int:
        return int((self.state / "nats.pid").read_text())

    def kill_broker(self) -> None:
        pid = self.broker_pid()
        os.kill(pid, signal.SIGKILL)
        until(lambda: self.broker_pid() != pid and self.log().count(RESTARTED), "a new broker")

    def agent(self, node: str) -> None:
        profile = str(self.root / f"{node}.json")
        self.gpuyard("auth", "add-node", node, "--cluster", CLUSTER, "--state-dir",
                     str(self.state), "--out", profile)  # fmt: skip
        self.popen("nodeagent", "--nats-config", profile, "--gpus", "1", "--gpu-type", "t4",
                   "--no-nvml", "--heartbeat", "0.2", "--state-dir", str(self.root / node),
                   "--checkpoint-root", str(self.root / "ckpt"), *AGENT_ARGS, log=f"{node}.log")  # fmt: skip

    def job_state(self, job: str) -> str | None:
        out = self.gpuyard("jobs", "--json", "--nats-config", self.op, check=False).stdout
        jobs = {j["job_id"]: j for j in json.loads(out or '{"jobs": []}')["jobs"]}
        return jobs[job]["state"] if job in jobs else None

    def close(self) -> None:
        stop_processes(reversed(self.procs))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


def test_up_starts_its_killed_broker_again_and_the_cluster_goes_on(cluster: Cluster) -> None:
    cluster.start_up()
    cluster.agent("n1")
    first = cluster.gpuyard("submit", "--nats-config", cluster.op, "--", *JOB_PYTHON, "-c",
                            "pass").stdout.split()[-1]  # fmt: skip
    until(lambda: cluster.job_state(first) == "completed", f"{first} completed")

    cluster.kill_broker()
    # A job submitted after is scheduled and runs: the services and the agent reconnected, and
    # the store (with the first job) is the same.
    job = cluster.gpuyard("submit", "--nats-config", cluster.op, "--", *JOB_PYTHON, "-c",
                          "pass").stdout.split()[-1]  # fmt: skip
    until(lambda: cluster.job_state(job) == "completed", f"{job} completed after the restart")
    assert cluster.job_state(first) == "completed"
    assert cluster.up is not None and cluster.up.poll() is None
    log = cluster.log()
    assert log.count(RESTARTED) == 1, log
    assert "was killed (SIGKILL)" in log
    assert "Traceback" not in log


def test_up_exits_when_its_broker_dies_more_often_than_allowed(cluster: Cluster) -> None:
    cluster.start_up("--broker-restarts", "1")
    cluster.kill_broker()
    os.kill(cluster.broker_pid(), signal.SIGKILL)  # the second death within the window
    assert cluster.up is not None
    assert cluster.up.wait(timeout=30) == 1
    said = [line for line in cluster.log().splitlines() if line.startswith("gpuyard up:")]
    assert said[-1].endswith("(--broker-restarts 1): exiting"), said
    assert sum("the embedded NATS server" in line for line in said) == 2  # a restart, an exit
    assert "Traceback" not in cluster.log()


def test_tail_follow_resumes_after_a_broker_restart_with_no_event_twice(cluster: Cluster) -> None:
    """Two followers, one of every event and one of those after it started (`--new`): across a
    broker restart, each prints every event once, in order, none missing, and says once on
    stderr that it lost the connection (not the client's errors as well)."""
    cluster.start_up()
    tail = cluster.popen("tail", "--follow", "--json", "--nats-config", cluster.op, log="tail.log",
                         err="tail.err")  # fmt: skip
    published: list[str] = []

    def swap() -> None:  # one `policy.changed` event
        policy = "las" if len(published) % 2 == 0 else "fifo"
        cluster.gpuyard("policy", "set", "scheduler", policy, "--nats-config", cluster.op)
        published.append(policy)

    def events(log: str = "tail.log") -> list[dict[str, object]]:
        return [json.loads(line) for line in cluster.log(log).splitlines()
                if line.startswith("{")]  # fmt: skip

    swap()
    until(lambda: events(), "the first event printed")
    new = cluster.popen("tail", "--follow", "--new", "--json", "--nats-config", cluster.op,
                        log="new.log", err="new.err")  # fmt: skip
    until(lambda: swap() or events("new.log"), "tail --new printing what comes")
    before = len(published)
    until(lambda: events()[-1]["seq"] == events("new.log")[-1]["seq"] == before,
          "both printed the last event before the outage")  # fmt: skip
    cluster.kill_broker()
    swap()
    swap()
    until(lambda: len(events()) == len(published), "every event printed")
    until(lambda: len(events("new.log")) >= 2 and events("new.log")[-1]["seq"] == len(published),
          "tail --new caught up")  # fmt: skip
    assert tail.poll() is None and new.poll() is None
    seqs = [e["seq"] for e in events()]
    assert seqs == list(range(1, len(published) + 1))  # each once, in order, none missing
    assert [str(e["reason"]).split(" ->")[0] for e in events()] == [
        "fifo" if p == "las" else "las" for p in published
    ]
    later = [e["seq"] for e in events("new.log")]
    assert later == list(range(later[0], len(published) + 1)) and later[0] > 1
    for err in ("tail.err", "new.err"):
        assert cluster.log(err).splitlines() == [
            f"gpuyard tail: lost the connection to NATS; resuming after #{before} once it is back"
        ]


def _numbers(output: str) -> list[int]:
    """The numbers the counting job printed, from `gpuyard logs` lines (`[n1 rank0] 17`)."""
    return [int(line.split()[-1]) for line in output.splitlines()
            if line.startswith("[") and line.split()[-1].isdigit()]  # fmt: skip


@pytest.mark.parametrize("outage", ["broker", "up"])
def test_logs_follow_goes_on_after_a_broker_restart_saying_once_what_it_missed(
    cluster: Cluster, outage: str
) -> None:
    """`logs -f` of a job that prints a line every 0.1 s: the broker is killed and started again
    (by `up`, at once: the client gets its connection back itself), or `up` and its broker are
    killed and `up` started again (seconds: the client gives up, `logs -f` connects anew); it
    prints the lines written after that (live ones, not only the files'), with one line on stderr
    about those it missed, and ends when the job does."""
    cluster.start_up()
    cluster.agent("n1")
    count = (
        "import itertools, time\nfor i in itertools.count(): print(i, flush=True); time.sleep(0.1)"
    )
    job = cluster.gpuyard("submit", "--nats-config", cluster.op, "--", *JOB_PYTHON, "-c",
                          count).stdout.split()[-1]  # fmt: skip
    until(lambda: cluster.job_state(job) == "running", f"{job} running")
    logs = cluster.popen("logs", "-f", job, "--nats-config", cluster.op, log="logs.out",
                         err="logs.err")  # fmt: skip
    until(lambda: _numbers(cluster.log("logs.out")), "live lines printed")
    if outage == "broker":
        cluster.kill_broker()
    else:
        assert cluster.up is not None
        broker = cluster.broker_pid()
        cluster.up.send_signal(signal.SIGKILL)
        cluster.up.wait(timeout=15)
        until(lambda: not alive(broker), "the broker gone with its up")
        cluster.start_up()

    def in_files() -> list[int]:
        return _numbers(cluster.gpuyard("logs", job, "--nats-config", cluster.op,
                                        check=False).stdout)  # fmt: skip

    # What the job had written once the broker was back (the agent answering again): what
    # `logs -f` prints beyond it came live, over a connection made after the restart.
    written = until(in_files, "the agent answering again")[-1]
    until(lambda: _numbers(cluster.log("logs.out"))[-1] > written, "live lines after the restart")
    assert logs.poll() is None
    cluster.gpuyard("cancel", job, "--nats-config", cluster.op)
    assert logs.wait(timeout=30) == 0  # it saw the job end, asking on its new connection
    assert cluster.log("logs.err").splitlines() == [
        "gpuyard logs: lost the connection to NATS; lines written meanwhile are in the job's log "
        f"files (gpuyard logs {job})"
    ]


def test_a_second_up_on_a_state_directory_in_use_is_refused(cluster: Cluster) -> None:
    cluster.start_up()
    url = json.loads(Path(cluster.op).read_text())["url"]
    other = free_port()
    second = cluster.gpuyard("up", "--cluster", CLUSTER, "--state-dir", str(cluster.state),
                             "--listen", f"127.0.0.1:{other}", check=False)  # fmt: skip
    assert second.returncode == 1
    assert cluster.up is not None
    assert second.stderr.strip().splitlines() == [
        f"gpuyard up: {cluster.state} is in use by another gpuyard up (pid {cluster.up.pid}, {url})"
    ]
    # The first goes on, and the profiles still point at it.
    assert json.loads(Path(cluster.op).read_text())["url"] == url
    assert (
        "scheduler  fifo" in cluster.gpuyard("policy", "show", "--nats-config", cluster.op).stdout
    )
    # Once the first has gone, however it went, the directory is free again.
    cluster.up.send_signal(signal.SIGKILL)
    cluster.up.wait(timeout=15)
    until(lambda: not alive(cluster.broker_pid()), "the broker gone with its up")
    cluster.start_up()
    assert (
        "scheduler  fifo" in cluster.gpuyard("policy", "show", "--nats-config", cluster.op).stdout
    )


async def test_a_simulation_whose_scheduler_dies_for_good_ends_partial_naming_it(
    nats_url: str, tmp_path: Path
) -> None:
    """The scheduler's process is SIGKILLed mid-run and nobody starts it again: the run ends with
    one error naming it (not a stalled clock blaming the call that timed out), and writes what it
    reached, as Ctrl-C does: the timeline, the jobs ended by then, a summary with `partial`."""
    from gpuyard.run.launcher import ServiceSet
    from gpuyard.run.simulate import ServiceLost, SimOptions, simulate
    from gpuyard.shared.contract import Progress
    from gpuyard.shared.model import ClusterSpec
    from gpuyard.workloads import blox

    holder: list[ServiceSet] = []
    killed: list[int] = []

    def on_progress(p: Progress) -> None:
        if not killed and not p.done and p.finished > 0 and p.submitted * 3 >= p.total:
            killed.append(p.finished)
            os.kill(holder[0].process("scheduler").pid, signal.SIGKILL)

    jobs = list(blox(80, jobs_per_hour=8.0, seed=1).jobs)
    options = SimOptions(cluster=ClusterSpec.parse("2x4"), policy="fifo", durable=True,
                         call_timeout_s=0.5)  # fmt: skip
    with pytest.raises(ServiceLost) as lost:
        await simulate(
            options, jobs, tmp_path, nats_url=nats_url, cluster_name="lost", processes=True,
            on_progress=on_progress, on_services=holder.append, lost_after_s=0.5, plots=False,
        )  # fmt: skip
    assert killed, "the run ended before the kill"
    said = str(lost.value)
    assert said.startswith("the scheduler service was killed (signal 9) and was not started again")
    assert "\n" not in said and "adm.submit" not in said
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["partial"] is True
    assert summary["stopped_by"].startswith("the scheduler service was killed")
    assert summary["simulated_s"] > 0
    assert len((tmp_path / "timeline.csv").read_text().splitlines()) > 1
    # The jobs that had ended, from the scheduler's bucket (it cannot answer), as far as the
    # clock got: at least those it had reported finished before the kill.
    ended = (tmp_path / "jobs.csv").read_text().splitlines()[1:]
    assert len(ended) >= killed[0]
    assert summary["completed"] == len(ended) < len(jobs)


def _children_running(parent: int, module: str) -> list[int]:
    """The processes `parent` started that run `python -m module`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and module.encode() in argv:
            found.append(int(entry.name))
    return found


def test_gpuyard_sim_whose_scheduler_is_killed_exits_with_one_line_naming_it(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    log = (tmp_path / "sim.err").open("w")
    sim = subprocess.Popen(
        [sys.executable, "-m", "gpuyard.cli", "sim", "--processes", "--lost-after", "0.5",
         "--jobs", "1000", "--cluster-spec", "2x4", "--out", str(out)],
        stdout=subprocess.DEVNULL, stderr=log, text=True,
    )  # fmt: skip
    try:
        # The run has begun (its first progress line): kill its scheduler for good.
        until(lambda: "jobs  t=" in (tmp_path / "sim.err").read_text(), "the run started")
        (scheduler,) = _children_running(sim.pid, "gpuyard.services.scheduler")
        os.kill(scheduler, signal.SIGKILL)
        code = sim.wait(timeout=120)
    finally:
        if sim.poll() is None:
            sim.kill()
    assert code == 1
    lines = (tmp_path / "sim.err").read_text().splitlines()
    named = [line for line in lines if "scheduler" in line]
    # (This run is in memory: a call to the dead scheduler fails at once, before --lost-after.)
    assert len(named) == 1 and named[0].startswith(
        "gpuyard sim: the scheduler service was killed (signal 9)"
    ), lines
    assert "adm.submit" not in named[0]
    assert "Traceback" not in "\n".join(lines)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["partial"] is True and summary["jobs_in_workload"] == 1000
