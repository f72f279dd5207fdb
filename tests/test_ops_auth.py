"""The whole real-cluster flow under auth and TLS, through the CLI as an operator runs it:
`gpuyard up` (credentials made on first start, TLS), `gpuyard auth add-node` for two agents and
`add-user` for a submitter, then submit, jobs, logs, cancel, tail and policy set, each with its
own profile; and `up` restarted on its state directory keeps every job."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuyard.pki import make_pki
from gpuyard.run.embedded import EmbeddedNats, ServerTls
from tests.polling import free_port, run_gpuyard, stop_processes, until

from .jobaccount import AGENT_ARGS, JOB_PYTHON

pytestmark = pytest.mark.slow  # (integration: `pytest -m "not slow"` leaves it out)

CLUSTER = "flow"


class Flow:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.state = root / "state"
        self.ca, self.cert, self.key = make_pki(root)
        self.port = free_port()
        self.procs: list[subprocess.Popen[str]] = []
        self.up: subprocess.Popen[str] | None = None

    def gpuyard(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:  # fmt: skip
        return run_gpuyard(*args, cwd=self.root, check=check, timeout=timeout)

    def start_up(self) -> str:
        log = (self.root / "up.log").open("a")
        self.up = subprocess.Popen(
            [sys.executable, "-m", "gpuyard.cli", "up", "--cluster", CLUSTER, "--state-dir",
             str(self.state), "--listen", f"127.0.0.1:{self.port}", "--tls-cert", str(self.cert),
             "--tls-key", str(self.key), "--tls-ca", str(self.ca), "--round", "0.5",
             "--heartbeat-timeout", "3"],
            stdout=subprocess.PIPE, stderr=log, text=True,
        )  # fmt: skip
        assert self.up.stdout is not None
        lines = [self.up.stdout.readline() for _ in range(2)]
        assert lines[0].startswith("gpuyard control plane up: --nats tls://127.0.0.1:"), lines
        return lines[1]

    def stop_up(self) -> None:
        assert self.up is not None
        self.up.send_signal(signal.SIGTERM)
        assert self.up.wait(timeout=30) == 0

    def agent(self, node: str) -> None:
        log = (self.root / f"{node}.log").open("a")
        self.procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpuyard.cli",
                    "nodeagent",
                    "--nats-config",
                    str(self.root / f"{node}.json"),
                    "--gpus",
                    "2",
                    "--gpu-type",
                    "t4",
                    "--no-nvml",
                    "--heartbeat",
                    "0.2",
                    "--grace",
                    "5",
                    "--address",
                    "127.0.0.1",
                    "--state-dir",
                    str(self.root / node),
                    "--checkpoint-root",
                    str(self.root / "ckpt"),
                    *AGENT_ARGS,
                ],
                stdout=log,
                stderr=log,
                text=True,
            )
        )

    def jobs(self, profile: str) -> dict[str, dict[str, Any]]:
        out = self.gpuyard("jobs", "--json", "--nats-config", profile).stdout
        return {j["job_id"]: j for j in json.loads(out)["jobs"]}

    def close(self) -> None:
        stop_processes([*self.procs, *([self.up] if self.up else [])])


@pytest.fixture
def flow(tmp_path: Path) -> Iterator[Flow]:
    f = Flow(tmp_path)
    try:
        yield f
    finally:
        f.close()


def test_the_real_cluster_flow_under_auth_and_tls(flow: Flow) -> None:
    said = flow.start_up()
    op = str(flow.state / "profiles" / "op.admin.json")
    assert op in said
    # The state directory is private; the server knows public keys only.
    assert stat.S_IMODE(flow.state.stat().st_mode) == 0o700
    for path in [*flow.state.glob("profiles/*.json"), flow.state / "auth" / "users.conf"]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert '"seed"' not in (flow.state / "auth" / "users.conf").read_text()

    # An operator issues the nodes' and a submitter's credentials while `up` runs.
    for node in ("a", "b"):
        flow.gpuyard("auth", "add-node", node, "--cluster", CLUSTER, "--state-dir",
                     str(flow.state), "--out", str(flow.root / f"{node}.json"))  # fmt: skip
        flow.agent(node)
    flow.gpuyard("auth", "add-user", "alice", "--cluster", CLUSTER, "--state-dir",
                 str(flow.state), "--out", str(flow.root / "alice.json"))  # fmt: skip
    alice = str(flow.root / "alice.json")
    assert json.loads(Path(alice).read_text())["url"].startswith("tls://")

    def two_nodes() -> bool:
        out = flow.gpuyard("nodes", "--json", "--nats-config", op).stdout
        return sorted(n["node_id"] for n in json.loads(out)["cluster"]["nodes"]) == ["a", "b"]

    until(two_nodes, "two agents registered")

    # Without credentials (but with TLS), nothing.
    anonymous = flow.gpuyard("jobs", "--nats", f"tls://127.0.0.1:{flow.port}", "--nats-tls-ca",
                             str(flow.ca), "--cluster", CLUSTER, check=False)  # fmt: skip
    assert anonymous.returncode == 1 and "authorization" in anonymous.stderr.lower()

    script = "import time; print('hello from rank', flush=True); time.sleep(1.0)"
    short = flow.gpuyard("submit", "--nats-config", alice, "--gpus", "3", "--", *JOB_PYTHON,
                         "-c", script).stdout.split()[-1]  # fmt: skip
    long = flow.gpuyard("submit", "--nats-config", alice, "--", *JOB_PYTHON, "-c",
                        "import time; time.sleep(600)").stdout.split()[-1]  # fmt: skip
    until(lambda: flow.jobs(alice)[short]["state"] == "completed", f"{short} completed")
    assert flow.jobs(alice)[short]["spec"]["user"] == "alice"
    logs = flow.gpuyard("logs", "--nats-config", alice, short).stdout
    assert logs.count("hello from rank") == 3  # ranks on both nodes
    until(lambda: flow.jobs(alice)[long]["state"] == "running", f"{long} running")
    assert (
        flow.gpuyard("cancel", "--nats-config", alice, long).stdout.strip() == f"cancelled {long}"
    )
    tail = flow.gpuyard("tail", "--nats-config", alice, "--json", "--job", short).stdout
    kinds = [json.loads(line)["type"] for line in tail.splitlines()]
    assert kinds[0] == "job.submitted" and "job.started" in kinds and kinds[-1] == "job.completed"

    # Control belongs to operators: alice is refused at once, the operator swaps the policy.
    refused = flow.gpuyard("policy", "set", "scheduler", "las", "--nats-config", alice,
                           check=False, timeout=8)  # fmt: skip
    assert refused.returncode == 1 and "refused" in refused.stderr, refused.stderr
    swap = flow.gpuyard("policy", "set", "scheduler", "las", "--nats-config", op)
    assert "fifo -> las" in swap.stdout

    # `up` stopped and started again on its state directory: same credentials, same jobs,
    # the swapped policy, and the agents come back.
    flow.stop_up()
    flow.start_up()
    after = flow.jobs(alice)
    assert (after[short]["state"], after[long]["state"]) == ("completed", "cancelled")
    assert "scheduler  las" in flow.gpuyard("policy", "show", "--nats-config", op).stdout
    until(two_nodes, "the agents registered again")
    again = flow.gpuyard("submit", "--nats-config", alice, "--", *JOB_PYTHON, "-c", "pass")
    job = again.stdout.split()[-1]
    until(lambda: flow.jobs(alice)[job]["state"] == "completed", f"{job} completed")
    assert os.path.exists(flow.root / "a.json")


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[int, Path, Path]]:
    """A server requiring TLS with a certificate for 127.0.0.1: (port, its CA, another CA)."""
    (tmp_path / "ours").mkdir()
    (tmp_path / "theirs").mkdir()
    ca, cert, key = make_pki(tmp_path / "ours")
    other_ca, _, _ = make_pki(tmp_path / "theirs")
    async with EmbeddedNats(tls=ServerTls(cert, key)) as url:
        yield int(url.rsplit(":", 1)[1]), ca, other_ca


async def test_a_tls_failure_is_one_line_and_exit_1(
    tls_server: tuple[int, Path, Path], tmp_path: Path
) -> None:
    """A certificate that cannot be verified (another CA, no CA, another host name) or a server
    without TLS where TLS was asked for: the command says so in one line and exits 1, rather than
    hang; a node agent likewise."""
    port, ca, other_ca = tls_server
    cases = {
        "another CA": [f"tls://127.0.0.1:{port}", "--nats-tls-ca", str(other_ca)],
        "no CA": [f"tls://127.0.0.1:{port}"],
        "a nats:// URL, no CA": [f"nats://127.0.0.1:{port}"],
        "another host name": [f"tls://localhost:{port}", "--nats-tls-ca", str(ca)],
        "--nats-tls-hostname": [
            f"tls://127.0.0.1:{port}", "--nats-tls-ca", str(ca), "--nats-tls-hostname", "example.com"
        ],
    }  # fmt: skip
    async with EmbeddedNats() as plain:
        cases["a server without TLS"] = [
            plain.replace("nats://", "tls://"),
            "--nats-tls-ca",
            str(ca),
        ]
        for case, options in cases.items():
            done = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "gpuyard.cli", "jobs", "--cluster", CLUSTER,
                                 "--nats", *options],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            lines = done.stderr.strip().splitlines()
            assert done.returncode == 1 and len(lines) == 1, (case, done.stderr)
            assert "cannot connect to NATS" in lines[0] and "TLS" in lines[0], (case, lines)
            assert "Traceback" not in done.stderr
    agent = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "gpuyard.cli", "nodeagent", "--nats",
                         f"tls://127.0.0.1:{port}", "--nats-tls-ca", str(other_ca), "--gpus", "1",
                         "--no-nvml", "--node-id", "n1", "--cluster", CLUSTER,
                         "--state-dir", str(tmp_path / "agent")],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert agent.returncode == 1, agent.stderr
    assert (
        agent.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "gpuyard nodeagent: cannot connect to NATS: TLS: the server's certificate is not trusted"
        )
    ), agent.stderr
    assert "Traceback" not in agent.stderr
