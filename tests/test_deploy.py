"""deploy/ run for real with Docker, as docs/operations.md says: the compose simulation (its jobs.csv is the
one-process run's), a compose real cluster (two node agents running real jobs, a scheduler replaced
by one with another policy mid-run, the broker's JetStream on its volume), and the systemd units in
a container booted with systemd (READY, a kill -9, a graceful stop, a watchdog timeout).

Marked `deploy`. Skipped, with one message, where Docker cannot start; `.ci/run` installs Docker,
starts it and builds the images. The image is built here from the current sources (deploy/
build-images.sh: cached layers, seconds when nothing changed), under a tag of this checkout's own.
Containers talk on networks the tests create (compose projects) or none at all (systemd); the
broker is published on a free loopback port.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.polling import free_port, until

# A first run builds the base image and the wheelhouse (about two minutes) within the first test.
# One test process runs them all (`--dist loadgroup`): the image builds and Docker are shared.
pytestmark = [
    pytest.mark.deploy,
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.xdist_group("deploy"),
]

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
OPERATIONS = ROOT / "docs" / "operations.md"
IMAGE = f"gpuyard:test-{hashlib.sha1(str(ROOT).encode()).hexdigest()[:10]}"
CLUSTER = "demo"  # the compose files' cluster
UNITS_CLUSTER = "default"  # the systemd units' (deploy/config/*.env)


# --------------------------------------------------------------------------- plumbing


def run(*cmd: str, timeout: float = 120, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """Run a command; with `check`, a failure (or a timeout) fails the test with its output."""
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        result = subprocess.CompletedProcess(cmd, 124, out, f"timed out after {timeout} s")
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result


def docker_problem() -> str | None:
    """Why Docker cannot be used here, or None."""
    if shutil.which("docker") is None:
        return "the docker command is not installed"
    try:
        info = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
            timeout=30,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return "the Docker daemon did not answer within 30 s"
    if info.returncode != 0:
        return (info.stderr.strip().splitlines() or ["`docker info` failed"])[-1]
    return None


def compose_tool() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return None


@pytest.fixture(scope="session")
def image() -> str:
    """The gpuyard image, built from this checkout (deploy/build-images.sh, no registry needed)."""
    problem = docker_problem() or (None if compose_tool() else "docker-compose is not installed")
    if problem:
        pytest.skip(f"Docker cannot start here ({problem}); .ci/run installs and starts it")
    run(str(DEPLOY / "build-images.sh"), IMAGE, timeout=900)
    return IMAGE


def gpuyard(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """The gpuyard CLI, on this host."""
    return run(sys.executable, "-m", "gpuyard.cli", *args, timeout=timeout, check=check)


def states(jobs_json: str) -> dict[str, str]:
    return {job["job_id"]: job["state"] for job in json.loads(jobs_json)["jobs"]}


class Compose:
    """One docker-compose project from a deploy/ file, on its own network and loopback port."""

    def __init__(self, file: str, image: str, *overrides: str) -> None:
        tool = compose_tool()
        assert tool is not None
        self.port = free_port()
        self.project = f"gytest{uuid.uuid4().hex[:8]}"
        files = [arg for f in (file, *overrides) for arg in ("-f", str(DEPLOY / f))]
        self.base = [*tool, "--no-ansi", "-p", self.project, *files]
        if tool == ["docker", "compose"]:
            self.base.remove("--no-ansi")
        self.env = {**os.environ, "GPUYARD_IMAGE": image, "GPUYARD_NATS_PORT": str(self.port)}
        self.nats = ["--nats", f"nats://127.0.0.1:{self.port}", "--cluster", CLUSTER]
        self.nodes: dict[str, Any] = {}

    def __call__(self, *args: str, timeout: float = 180, check: bool = True) -> subprocess.CompletedProcess[str]:  # fmt: skip
        return run(*self.base, *args, timeout=timeout, check=check, env=self.env)

    def operator(self) -> None:
        """Act as the cluster's operator from this host: its profile, out of the credentials
        volume (as docs/operations.md says), is added to `self.nats`."""
        profile = self(
            "run", "--rm", "--no-deps", "--entrypoint", "cat", "auth",
            "/etc/gpuyard/cluster/profiles/op.admin.json",
        ).stdout  # fmt: skip
        fd, path = tempfile.mkstemp(prefix="gpuyard-op-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(profile)
        self.nats += ["--nats-config", path]

    def container(self, service: str) -> str:
        return self("ps", "-a", "-q", service).stdout.strip()

    def inspect(self, service: str, template: str) -> str:
        return run(
            "docker", "inspect", "--format", template, self.container(service)
        ).stdout.strip()

    def down(self) -> None:
        self("--profile", "swap", "down", "--volumes", "--remove-orphans", "--timeout", "20",
             timeout=120, check=False)  # fmt: skip


# --------------------------------------------------------------------------- compose: simulation


def test_the_compose_simulation_gives_the_one_process_results(image: str, tmp_path: Path) -> None:
    compose = Compose("docker-compose.yml", image)
    try:
        up = compose("up", "--abort-on-container-exit", "--exit-code-from", "sim", timeout=400)
        assert up.returncode == 0
        run("docker", "cp", f"{compose.container('sim')}:/results", str(tmp_path / "compose"))
        services = ("nats", "placement", "scheduler", "admission", "sim")
        users = {s: compose.inspect(s, "{{.Config.User}}") for s in services}
        health = {s: compose.inspect(s, "{{json .State.Health}}") for s in services[:4]}
        mounts = compose.inspect("nats", "{{json .Mounts}}")
    finally:
        compose.down()
    assert set(users.values()) == {"gpuyard"}  # no container runs as root
    for service, text in health.items():  # each passed its health check before `sim` started
        assert any(probe["ExitCode"] == 0 for probe in json.loads(text)["Log"]), service
    assert any(m["Type"] == "volume" and m["Destination"] == "/data" for m in json.loads(mounts))

    local = gpuyard("sim", "--jobs", "400", "--out", str(tmp_path / "local"), timeout=300)
    assert local.returncode == 0
    for name in ("options.json", "workload.jsonl", "jobs.csv", "timeline.csv"):
        ours, theirs = (tmp_path / "compose" / name), (tmp_path / "local" / name)
        assert ours.read_bytes() == theirs.read_bytes(), f"{name} differs"
    summary = json.loads((tmp_path / "compose" / "summary.json").read_text())
    assert (summary["jobs"], summary["completed"]) == (400, 400)


# --------------------------------------------------------------------------- compose: real cluster


@pytest.fixture(scope="module")
def cluster(image: str) -> Iterator[Compose]:
    compose = Compose("docker-compose.cluster.yml", image)
    try:
        compose("up", "-d", timeout=300)
        compose.operator()

        def two_nodes() -> dict[str, Any] | None:
            result = gpuyard("nodes", "--json", *compose.nats, check=False, timeout=30)
            if result.returncode != 0:
                return None
            nodes = {n["node_id"]: n for n in json.loads(result.stdout)["cluster"]["nodes"]}
            return nodes if set(nodes) == {"n1", "n2"} else None

        compose.nodes = until(two_nodes, "two registered node agents", 120)
        yield compose
    finally:
        compose.down()


def wait_ended(compose: Compose, job_ids: list[str], within_s: float) -> dict[str, str]:
    def ended() -> dict[str, str] | None:
        result = gpuyard("jobs", "--json", *compose.nats, *job_ids, check=False, timeout=30)
        if result.returncode != 0:
            return None
        found = states(result.stdout)
        done = all(found.get(j) in ("completed", "failed", "cancelled") for j in job_ids)
        return found if done else None

    return until(ended, f"end of jobs {', '.join(job_ids)}", within_s)


def submit(nats: list[str], *args: str) -> str:
    """Submitted from the host into the agents' containers: jobs start in the image's folder."""
    out = gpuyard("submit", *nats, "--chdir", "/opt/gpuyard", *args).stdout
    return re.fullmatch(r"submitted (\S+)\n", out)[1]  # type: ignore[index]


def test_two_compose_node_agents_run_real_jobs(cluster: Compose) -> None:
    assert {n["num_gpus"] for n in cluster.nodes.values()} == {2}
    assert {n["labels"]["gpu_source"] for n in cluster.nodes.values()} == {"flags"}
    train = ["python", "examples/train.py", "--steps", "40", "--step-time", "0.05"]
    wide = submit(cluster.nats, "--gpus", "4", "--", *train)  # 2 GPUs on each node
    pair = submit(cluster.nats, "--gpus", "2", "--", *train)
    whoami = submit(cluster.nats, "--", "python", "-c", "import os; print('uid', os.getuid())")
    assert set(wait_ended(cluster, [wide, pair, whoami], 120).values()) == {"completed"}

    outputs: list[str] = []

    def every_rank_done() -> list[tuple[str, str]] | None:
        # `gpuyard logs` leaves out, silently, a node that does not answer within 5 s (a loaded
        # machine): ask again rather than fail on that.
        outputs.append(gpuyard("logs", *cluster.nats, wide).stdout)
        done = re.findall(r"^\[(n\d) rank(\d)\] done at step 40 \(attempt 0\)$", outputs[-1], re.M)
        return done if sorted(rank for _, rank in done) == ["0", "1", "2", "3"] else None

    try:
        done = until(every_rank_done, "4 ranks' last lines in `gpuyard logs`", 60, every_s=2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{outputs[-1]}") from None
    assert {node for node, _ in done} == {"n1", "n2"}  # one job over both machines
    # Jobs run as the job account (gpuyard-job, 10002): neither root nor the agent (root here)
    assert "uid 10002" in gpuyard("logs", *cluster.nats, whoami).stdout
    ups = gpuyard("tail", *cluster.nats, "--type", "node.up", "--json").stdout.splitlines()
    assert {json.loads(line)["node_id"] for line in ups} == {"n1", "n2"}  # stored: stream was up


class Tail:
    """`gpuyard tail --follow --json` from the host, read in a thread. Its stderr goes to a file
    (a pipe nobody reads could block it), with Python's stacks when it is aborted."""

    def __init__(self, nats: list[str]) -> None:
        self.stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115 (open while it runs)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuyard.cli", "tail", *nats, "--follow", "--new", "--json"],
            stdout=subprocess.PIPE, stderr=self.stderr, text=True,
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},
        )  # fmt: skip
        self.events: list[dict[str, Any]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.append(json.loads(line))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in list(self.events) if e["type"] == kind]

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        try:
            rc = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            # Whether SIGINT was blocked, ignored or caught (bit 2 of each mask), then its stacks.
            status = Path(f"/proc/{self.proc.pid}/status").read_text().splitlines()
            masks = " ".join(
                line for line in status if line.startswith(("SigBlk", "SigIgn", "SigCgt"))
            )
            self.proc.send_signal(signal.SIGABRT)
            self.proc.wait(timeout=10)
            raise AssertionError(
                f"`gpuyard tail` went on 20 s after Ctrl-C ({masks}):\n{self.said()}"
            ) from None
        self.reader.join(timeout=5)
        return rc

    def said(self) -> str:
        """What it wrote on stderr (the last 8,000 characters)."""
        self.stderr.seek(0)
        return self.stderr.read()[-8000:]


def test_a_scheduler_with_another_policy_takes_over_mid_run(cluster: Compose) -> None:
    tail = Tail(cluster.nats)
    try:
        time.sleep(2)  # the tail's consumer is in place (--new: events from then on)
        # 10 s jobs: the window with jobs running and others queued lasts two waves (~20 s), long
        # enough to be seen by `gpuyard jobs` calls on a busy machine.
        train = ["python", "examples/train.py", "--steps", "200", "--step-time", "0.05"]
        jobs = [submit(cluster.nats, "--gpus", "2", "--", *train) for _ in range(8)]

        def mid_run() -> bool:  # some jobs ran, most wait: 4 GPUs for 8 two-GPU jobs
            found = states(gpuyard("jobs", "--json", *cluster.nats, *jobs).stdout)
            return list(found.values()).count("queued") >= 4 and "running" in found.values()

        until(mid_run, "jobs running with others queued", 30, every_s=0.2)
        cluster("--profile", "swap", "up", "-d", "--no-deps", "scheduler-las")

        def old_scheduler_left() -> str | None:
            state = cluster.inspect("scheduler", "{{.State.Status}} {{.State.ExitCode}}")
            return state if state.startswith("exited") else None

        # It handed over and left with status 0, so `restart: on-failure` leaves it down.
        assert until(old_scheduler_left, "the old scheduler's exit", 60) == "exited 0"
        policies = json.loads(gpuyard("policy", "show", "--json", *cluster.nats).stdout)
        assert policies["scheduler"]["policy"] == "las"

        assert set(wait_ended(cluster, jobs, 180).values()) == {"completed"}
        until(lambda: {e["job_id"] for e in tail.of("job.completed")} >= set(jobs),
              "every completion in the tail", 30)  # fmt: skip
    finally:
        rc = tail.stop()
    assert rc in (0, 130), tail.said()
    completed = [e["job_id"] for e in tail.of("job.completed") if e["job_id"] in jobs]
    assert sorted(completed) == sorted(jobs)  # each exactly once, none lost
    assert not [e for e in tail.of("job.failed") if e["job_id"] in jobs]
    handed = cluster("logs", "--no-color", "scheduler").stdout
    took = cluster("logs", "--no-color", "scheduler-las").stdout
    assert '"service.handing_over"' in handed and '"service.took_over"' in took
    swaps = [e["reason"] for e in tail.of("policy.changed")]
    assert len(swaps) == 1 and swaps[0].startswith("fifo -> las") and "took over" in swaps[0]


def test_the_three_broker_control_plane_loses_nothing_when_a_broker_and_the_scheduler_die(
    image: str,
) -> None:
    compose = Compose("docker-compose.cluster.yml", image, "docker-compose.ha.yml")
    ports = [compose.port, free_port(), free_port()]
    compose.env |= {"GPUYARD_NATS_PORT2": str(ports[1]), "GPUYARD_NATS_PORT3": str(ports[2])}
    compose.nats[1] = ",".join(f"nats://127.0.0.1:{p}" for p in ports)
    try:
        compose("up", "-d", timeout=300)
        compose.operator()

        def both_nodes() -> bool:
            result = gpuyard("nodes", "--json", *compose.nats, check=False, timeout=30)
            return (
                result.returncode == 0 and len(json.loads(result.stdout)["cluster"]["nodes"]) == 2
            )

        until(both_nodes, "two registered node agents", 120)
        train = ["python", "examples/train.py", "--steps", "200", "--step-time", "0.05"]
        jobs = [submit(compose.nats, "--", *train) for _ in range(4)]
        leader = compose_stream_leader(compose, f"KV_gpuyard_{CLUSTER}_scheduler")
        run("docker", "kill", compose.container(leader))  # the server leading its bucket
        jobs += [submit(compose.nats, "--", *train) for _ in range(2)]
        scheduler = compose.container("scheduler")
        run("docker", "exec", scheduler, "sh", "-c", "kill -9 -1", check=False)  # (a crash)
        jobs += [submit(compose.nats, "--", *train) for _ in range(2)]
        assert set(wait_ended(compose, jobs, 180).values()) == {"completed"}
        found = json.loads(gpuyard("jobs", "--json", *compose.nats, *jobs).stdout)["jobs"]
        assert [j["preemptions"] for j in found] == [0] * len(jobs)  # the outage requeued none
        restarts = compose.inspect("scheduler", "{{.RestartCount}}")
        assert int(restarts) == 1  # it came back by itself, with its jobs
        assert compose_stream_leader(compose, f"KV_gpuyard_{CLUSTER}_scheduler") != leader
        journal = compose("logs", "--no-color", "scheduler").stdout
        assert '"state.jobs_restored"' in journal and "Traceback" not in journal
    finally:
        compose.down()


def compose_stream_leader(compose: Compose, stream: str) -> str:
    """The compose service of the server leading `stream`'s copies (from a live server's /jsz)."""
    ask = (
        "import json, urllib.request as u; d = json.load(u.urlopen("
        "'http://127.0.0.1:8222/jsz?streams=true', timeout=5)); print([s['cluster']['leader'] "
        f"for a in d['account_details'] for s in a['stream_detail'] if s['name'] == '{stream}'][0])"
    )
    for server in ("nats", "nats2", "nats3"):
        result = run("docker", "exec", compose.container(server), "python", "-c", ask, check=False)
        if result.returncode == 0:
            return result.stdout.strip()
    raise AssertionError(f"no live server knows {stream}'s leader")


def test_the_broker_keeps_the_event_stream_on_its_volume(cluster: Compose) -> None:
    def stored() -> list[dict[str, Any]]:
        out = gpuyard("tail", *cluster.nats, "--json", timeout=60).stdout
        return [json.loads(line) for line in out.splitlines()]

    before = stored()
    assert before
    cluster("up", "-d", "--no-deps", "--force-recreate", "nats")  # a new broker container

    def after() -> list[dict[str, Any]] | None:
        with contextlib.suppress(AssertionError):
            return stored()
        return None

    events = until(after, "the stored events from the new broker", 60)
    assert events[: len(before)] == before
    # The durable services reconnect to it and go on: a job submitted now runs.
    submission = [
        "submit",
        *cluster.nats,
        "--chdir",
        "/opt/gpuyard",
        "--",
        "python",
        "-c",
        "print(1)",
    ]
    job = until(lambda: gpuyard(*submission, check=False).stdout.split()[-1:], "a submission", 60)[
        0
    ]
    assert wait_ended(cluster, [job], 60) == {job: "completed"}


# --------------------------------------------------------------------------- systemd


def doc_block(containing: str) -> str:
    """docs/operations.md's shell block that contains `containing`: the test runs exactly that."""
    blocks = re.findall(r"```sh\n(.*?)```", OPERATIONS.read_text(), re.S)
    (block,) = [b for b in blocks if containing in b]
    return block


class Machine:
    """A container booted with systemd as PID 1 (unprivileged), with gpuyard in /opt/gpuyard and
    the user gpuyard (the image), and this checkout's deploy/ in /src/deploy. No network."""

    def __init__(self, image: str) -> None:
        self.name = f"gytest-systemd-{uuid.uuid4().hex[:8]}"
        run(
            "docker", "run", "-d", "--name", self.name, "--hostname", "gpu1", "--network", "none",
            "--cgroupns=host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs", "/run",
            "--tmpfs", "/run/lock", "-v", f"{DEPLOY}:/src/deploy:ro", "--user", "root",
            "--entrypoint", "/sbin/init", image,
        )  # fmt: skip

    def sh(self, script: str, *, user: str = "root", timeout: float = 120, check: bool = True) -> str:  # fmt: skip
        return run("docker", "exec", "-u", user, "-w", "/src", self.name, "sh", "-euc", script,
                   timeout=timeout, check=check).stdout  # fmt: skip

    def gpuyard(self, *args: str, check: bool = True) -> str:
        return run("docker", "exec", "-u", "gpuyard", self.name, "gpuyard", *args,
                   timeout=60, check=check).stdout  # fmt: skip

    def show(self, unit: str) -> dict[str, str]:
        out = self.sh(f"systemctl show {unit}")
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, unit: str) -> str:
        return self.sh(f"journalctl -u {unit} --no-pager -o cat")

    def submit(self, steps: int, gpus: int = 1) -> str:
        out = self.gpuyard("submit", "--gpus", str(gpus), "--", "/opt/gpuyard/bin/python",
                           "/opt/gpuyard/examples/train.py", "--steps", str(steps),
                           "--step-time", "0.05")  # fmt: skip
        return re.fullmatch(r"submitted (\S+)\n", out)[1]  # type: ignore[index]

    def jobs(self, *job_ids: str) -> dict[str, dict[str, Any]]:
        text = self.gpuyard("jobs", "--json", *job_ids, check=False)
        return {j["job_id"]: j for j in json.loads(text)["jobs"]} if text else {}

    def until_state(self, job_ids: list[str], state: str, within_s: float) -> None:
        def reached() -> bool:
            found = self.jobs(*job_ids)
            return all(found.get(j, {}).get("state") == state for j in job_ids)

        until(reached, f"{state} jobs {', '.join(job_ids)}", within_s)

    def restarted(self, unit: str, before: dict[str, str], within_s: float) -> dict[str, str]:
        """The unit's state once systemd restarted it once more than in `before`, and it is up."""

        def again() -> dict[str, str] | None:
            now = self.show(unit)
            count = int(now["NRestarts"]) == int(before["NRestarts"]) + 1
            return now if count and now["ActiveState"] == "active" else None

        return until(again, f"a restart of {unit}", within_s, every_s=1)

    def checkpointed(self, job_id: str) -> bool:
        return bool(self.sh(f"find /shared/gpuyard/checkpoints/{UNITS_CLUSTER}/{job_id} -name '*.json' 2>/dev/null"
                            " || true").strip())  # fmt: skip

    def log(self, job_id: str) -> str:
        return self.sh(f"cat /var/lib/gpuyard/logs/{UNITS_CLUSTER}/{job_id}/rank0.log")

    def completions(self, job_id: str) -> int:
        out = self.gpuyard("tail", "--job", job_id, "--type", "job.completed", "--json")
        return len(out.splitlines())

    def remove(self) -> None:
        run("docker", "rm", "-f", self.name, check=False)


AGENT = "gpuyard-nodeagent"
CONTROL_PLANE = [f"gpuyard-control-plane@{s}" for s in ("placement", "scheduler", "admission")]


@pytest.fixture(scope="module")
def machine(image: str) -> Iterator[Machine]:
    node = Machine(image)
    try:
        until(lambda: node.sh("systemctl is-system-running || true").strip()
              in ("running", "degraded"), "systemd up", 60)  # fmt: skip
        node.sh(doc_block("systemctl enable --now nats-server"), timeout=180)
        yield node
    finally:
        node.remove()


def test_the_systemd_units_run_with_their_shipped_configs(machine: Machine) -> None:
    agent = machine.show(AGENT)
    # Type=notify: active only once the agent said READY=1 (after registering).
    assert (agent["ActiveState"], agent["SubState"]) == ("active", "running")
    assert agent["StatusText"] == "registered 2 GPUs"
    assert agent["Type"] == "notify" and agent["Restart"] == "on-failure"
    assert agent["WatchdogUSec"] == "30s"
    for unit in ["nats-server", *CONTROL_PLANE]:
        assert machine.show(unit)["ActiveState"] == "active", unit
    for name in ("admission", "placement", "scheduler"):  # the shipped configs, as installed
        installed = machine.sh(f"cat /etc/gpuyard/{name}.json")
        assert installed == (DEPLOY / "config" / f"{name}.json").read_text()
    pids = [machine.show(unit)["MainPID"] for unit in [AGENT, "nats-server", *CONTROL_PLANE]]
    users = machine.sh(" ".join(["stat -c %U", *(f"/proc/{pid}" for pid in pids)])).split()
    # Each its own account: the agent root, to start each job as the job account (which can read
    # no secret), the broker one that cannot read the control plane's keys.
    assert users == ["root", "gpuyard-nats", *["gpuyard"] * len(CONTROL_PLANE)]
    assert machine.sh("runuser -u gpuyard-nats -- cat /etc/gpuyard/cluster/auth/users.conf "
                      "2>&1 || true").strip().endswith("Permission denied")  # fmt: skip
    # A new identity gets in after a reload (systemd copies the broker its public keys again).
    machine.sh("runuser -u gpuyard -- /opt/gpuyard/bin/gpuyard auth add-user carol --state-dir "
               "/etc/gpuyard/cluster --out /tmp/carol.json && systemctl reload nats-server")  # fmt: skip
    until(lambda: machine.gpuyard("jobs", "--nats-config", "/tmp/carol.json", check=False)
          .startswith("JOB"), "carol let in", 20)  # fmt: skip
    assert machine.show("nats-server")["NRestarts"] == "0"
    out = machine.gpuyard("submit", "--", "sh", "-c", "id -un; cat /etc/gpuyard/node.json; "
                          "ls /etc/gpuyard/cluster; echo GPUYARD_NATS_CONFIG=$GPUYARD_NATS_CONFIG")  # fmt: skip
    probe = re.fullmatch(r"submitted (\S+)\n", out)[1]  # type: ignore[index]
    machine.until_state([probe], "completed", 60)
    lines = machine.log(probe).splitlines()
    assert lines[0] == "gpuyard-job" and lines[-1] == "GPUYARD_NATS_CONFIG=", lines
    assert "Permission denied" in machine.log(probe) and '"seed"' not in machine.log(probe)
    # Wall clock: no simclock here, yet a submitted job is scheduled, runs and completes.
    job = machine.submit(steps=20)
    machine.until_state([job], "completed", 60)
    # Durable: each service's key-value bucket lives in the broker's store on disk.
    streams = set(machine.sh("ls /var/lib/gpuyard-nats/jetstream/'$G'/streams").split())
    assert {f"KV_gpuyard_default_{s}" for s in ("admission", "placement", "scheduler")} <= streams


def test_a_killed_scheduler_unit_comes_back_with_its_jobs(machine: Machine) -> None:
    jobs = [machine.submit(steps=120) for _ in range(3)]  # 2 GPUs: one waits
    until(lambda: sum(j["state"] == "running" for j in machine.jobs(*jobs).values()) == 2,
          "two running jobs", 30)  # fmt: skip
    unit = "gpuyard-control-plane@scheduler"
    before = machine.show(unit)
    machine.sh(f"systemctl kill --signal=KILL {unit}")
    machine.restarted(unit, before, 30)
    machine.until_state(jobs, "completed", 90)
    assert [machine.completions(j) for j in jobs] == [1, 1, 1]
    assert '"state.jobs_restored"' in machine.journal(unit)


def test_systemd_restarts_a_killed_agent_and_its_jobs_recover(machine: Machine) -> None:
    jobs = [machine.submit(steps=150) for _ in range(2)]
    until(lambda: all(machine.checkpointed(j) for j in jobs), "checkpoints", 60)
    before = machine.show(AGENT)
    machine.sh(f"kill -9 {before['MainPID']}")
    machine.restarted(AGENT, before, 30)
    assert "Main process exited, code=killed, status=9/KILL" in machine.journal(AGENT)
    machine.until_state(jobs, "completed", 90)
    for job in jobs:
        log = machine.log(job)
        resumed = re.search(r"attempt=1 resumed=True start_step=(\d+)", log)
        assert resumed and int(resumed[1]) >= 50, log  # from its checkpoint, not from scratch
        assert "done at step 150 (attempt 1)" in log
        assert machine.completions(job) == 1


def test_systemctl_stop_checkpoints_the_jobs_and_start_resumes_them(machine: Machine) -> None:
    # 20 s jobs: `gpuyard jobs` through docker exec may see them running late on a busy machine
    jobs = [machine.submit(steps=400) for _ in range(2)]
    machine.until_state(jobs, "running", 30)
    time.sleep(2)
    machine.sh(f"systemctl stop {AGENT}")
    stopped = machine.show(AGENT)
    assert (stopped["ActiveState"], stopped["Result"], stopped["ExecMainStatus"]) == (
        "inactive", "success", "0")  # fmt: skip
    assert "SIGKILL" not in machine.journal(AGENT).split("Stopping gpuyard-nodeagent")[-1]
    points = {}
    for job in jobs:
        preempted = re.search(r"preempted at step (\d+): checkpointed", machine.log(job))
        assert preempted, machine.log(job)
        points[job] = int(preempted[1])
    machine.until_state(jobs, "queued", 30)  # requeued, not lost
    machine.sh(f"systemctl start {AGENT}")
    machine.until_state(jobs, "completed", 90)
    for job in jobs:
        assert f"attempt=1 resumed=True start_step={points[job]}" in machine.log(job)
        assert machine.completions(job) == 1


def test_the_watchdog_restarts_a_hung_agent(machine: Machine) -> None:
    job = machine.submit(steps=800)  # 40 s: still running when the watchdog fires
    until(lambda: machine.checkpointed(job), "a checkpoint", 60)
    before = machine.show(AGENT)
    machine.sh(f"kill -STOP {before['MainPID']}")  # hung: no more WATCHDOG=1
    machine.restarted(AGENT, before, 75)
    journal = machine.journal(AGENT)
    assert "Watchdog timeout (limit 30s)!" in journal
    assert "Failed with result 'watchdog'" in journal
    assert machine.show(AGENT)["MainPID"] != before["MainPID"]
    machine.until_state([job], "completed", 90)
    assert "attempt=1 resumed=True" in machine.log(job)
    assert machine.completions(job) == 1
