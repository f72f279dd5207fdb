"""Every `gpuyard` command fails the same way: one line naming what is wrong, never a traceback,
a retry loop or a hang (the node agent alone keeps trying, one log line per attempt)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuyard.run.embedded import nats_server_binary
from tests.polling import free_port


def gpuyard(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", *args], capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


@pytest.mark.parametrize(
    "command",
    [
        ["jobs"],
        ["nodes"],
        ["cancel", "j1"],
        ["logs", "j1"],
        ["submit", "--", "true"],
        ["status"],
        ["tail"],
        ["policy", "show"],
        ["policy", "set", "scheduler", "las"],
        ["up"],
        ["sim"],
        ["sim", "--policy", "fifo,las"],
    ],
    ids=lambda c: " ".join(c[:3]),
)
@pytest.mark.slow
def test_absent_server_is_one_line(command: list[str]) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    name = command[:2] if command[0] == "policy" else command[:1]  # "gpuyard policy show: ..."
    argv = [*name, "--nats", url, *command[len(name) :]]
    result = gpuyard(*argv, timeout=30)  # they used to retry forever, printing tracebacks
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines() == [
        f"gpuyard {' '.join(name)}: cannot connect to NATS at {url}: connection refused"
    ]


@pytest.mark.parametrize(
    ("command", "url"),
    [(["jobs"], "notaurl"), (["jobs"], "http://127.0.0.1:4222"), (["jobs"], "nats://:4222"),
     (["jobs"], "nats://127.0.0.1:4222,notaurl"), (["submit"], "notaurl"),
     (["status"], "notaurl"), (["up"], "notaurl"), (["sim"], "notaurl")],
)  # fmt: skip
def test_bad_url_is_refused_not_retried(command: list[str], url: str) -> None:
    result = gpuyard(*command, "--nats", url, *(["--", "true"] if command == ["submit"] else []))
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert f"--nats '{url.split(',')[-1]}' is not a NATS server URL" in line


def test_nodeagent_refuses_a_bad_url() -> None:
    result = gpuyard("nodeagent", "--nats", "notaurl", "--gpus", "1")
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("gpuyard nodeagent: error: --nats 'notaurl' is not a NATS server URL")


def test_password_is_not_printed() -> None:
    result = gpuyard("jobs", "--nats", f"nats://me:hunter2@127.0.0.1:{free_port()}")
    assert result.returncode == 1 and "hunter2" not in result.stderr and "me:***@" in result.stderr


@pytest.mark.slow
def test_nodeagent_keeps_trying_with_backoff_then_connects(tmp_path: Path) -> None:
    """A systemd service: an absent server is retried, each attempt one JSON log line, the pause
    doubling; once the server is up the agent connects and runs until SIGTERM."""
    port = free_port()
    agent = subprocess.Popen(
        [sys.executable, "-m", "gpuyard.cli", "nodeagent", "--nats", f"nats://127.0.0.1:{port}",
         "--gpus", "1", "--no-nvml", "--node-id", "n1", "--state-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    server = None
    try:
        assert agent.stderr is not None
        attempts = []
        for line in agent.stderr:
            assert "Traceback" not in line
            entry = json.loads(line)
            if entry["event"] == "nats.unreachable":
                attempts.append(entry)
            if len(attempts) == 3:
                break
        assert [a["attempt"] for a in attempts] == [1, 2, 3]
        assert [a["retry_in_s"] for a in attempts] == [0.5, 1.0, 2.0]
        server = subprocess.Popen(
            [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for line in agent.stderr:
            entry = json.loads(line)
            if entry["event"] == "nats.connected":
                assert entry["attempts"] >= 4
                break
        agent.terminate()
        assert agent.wait(timeout=30) == 0
    finally:
        agent.kill()
        if server is not None:
            server.kill()
            server.wait()


@pytest.mark.slow
def test_tail_into_head_ends_quietly(tmp_path: Path, nats_url: str) -> None:
    """`gpuyard tail | head -1` exits 0 with nothing on stderr, as `grep` would."""
    result = gpuyard(
        "sim", "--nats", nats_url, "--cluster", "piped", "--jobs", "60", "--cluster-spec", "4x4",
        "--out", str(tmp_path / "run"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    # A quick reader; a slow one, gone after every stored event was written, while --follow
    # waits for more: it must notice without anything more to write.
    for follow, reader in (([], "head -1"), (["--follow"], "head -1"),
                           (["--follow"], "(sleep 1; head -1)")):  # fmt: skip
        piped = subprocess.run(
            ["bash", "-c", f'set -o pipefail; "$@" | {reader}', "bash", sys.executable, "-m",
             "gpuyard.cli", "tail", "--nats", nats_url, "--cluster", "piped", *follow],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert piped.returncode == 0, piped.stderr
        assert piped.stderr == ""
        assert len(piped.stdout.splitlines()) == 1 and "node.up" in piped.stdout


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_tail_follow_stops_on_a_signal_even_with_sigint_ignored(
    nats_url: str, sig: signal.Signals
) -> None:
    """A script that starts `gpuyard tail --follow &` leaves SIGINT ignored in it (POSIX): Ctrl-C
    sent to it, or `kill`, still ends it, with status 130 and nothing on stderr."""
    tail = subprocess.Popen(
        [sys.executable, "-m", "gpuyard.cli", "tail", "--nats", nats_url, "--follow"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    try:
        ignored = int(_status_field(tail.pid, "SigIgn"), 16)
        assert ignored & (1 << (signal.SIGINT - 1))  # (as the shell leaves it)
        time.sleep(2)  # (following: connected, waiting for events)
        assert tail.poll() is None
        tail.send_signal(sig)
        _, err = tail.communicate(timeout=20)
        assert tail.returncode == 130 and err == ""
    finally:
        tail.kill()


def _status_field(pid: int, name: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return line.split()[1]
    raise AssertionError(f"{name} not in /proc/{pid}/status")


def test_job_file_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('num_gpus = 1\ncommand = ["python", "t.py"\n')
    result = gpuyard("submit", "--file", str(job), "--nats", f"nats://127.0.0.1:{free_port()}")
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"gpuyard submit: {job}, line 2: not TOML: ")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["sim", "--polcy", "las"], "gpuyard sim: error: unrecognized arguments: --polcy las; did "
         "you mean --policy (not --polcy)? (see: gpuyard sim --help)"),
        (["sweep", "s.toml", "--parralel=2"], "did you mean --parallel (not --parralel)? (see: "
         "gpuyard sweep --help)"),
        (["sim", "--zzz"], "gpuyard sim: error: unrecognized arguments: --zzz (see: gpuyard sim --help)"),
    ],
)  # fmt: skip
def test_a_mistyped_option_is_named_with_the_nearest_one(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A subcommand's unknown option is refused in one line that names the subcommand whose help
    lists its options and, when one is near, the option meant."""
    from gpuyard.cli import build_parser

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1, err


def test_key_value_options_are_read_one_way() -> None:
    """`--label`, `--env`, `--map-user` and the policies' parameters: the same KEY=VALUE reading,
    an item without a key or an `=` refused in one line naming the option."""
    from gpuyard.shared.options import key_values
    from gpuyard.shared.policy import PolicyError, parse_params

    assert key_values("--env", ["A=1", "B=x=y", "A=2"]) == {"A": "2", "B": "x=y"}
    for bad in ("A", "=1"):
        with pytest.raises(ValueError, match=f"^--env '{bad}' is not KEY=VALUE$"):
            key_values("--env", [bad])
    assert parse_params([" k = v "]) == {"k": "v"}  # (a policy's parameters: spaces trimmed)
    with pytest.raises(PolicyError, match=r"^parameter 'k' is not KEY=VALUE$"):
        parse_params(["k"])


def test_an_output_folder_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", "sim", "--jobs", "5", "--out", str(blocker / "x")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith(f"gpuyard sim: --out {blocker / 'x'}: ")
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1


def test_a_submit_admission_does_not_answer_says_the_jobs_may_be_in(
    nats_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A submission whose answer does not come (a broker failing over for longer than the wait)
    may have been admitted: the command says so, in one line, rather than a bare time-out."""
    from gpuyard.cli import cluster, main

    listener = subprocess.Popen(  # someone listens on admission's subject, and never answers
        [sys.executable, "-c", SILENT_ADMISSION, nats_url], stdout=subprocess.PIPE, text=True
    )
    try:
        assert listener.stdout is not None and listener.stdout.readline() == "listening\n"
        monkeypatch.setattr(cluster, "SUBMIT_WAIT_S", 0.5)
        code = main(["submit", "--nats", nats_url, "--cluster", "quiet", "--", "true"])
    finally:
        listener.kill()
        listener.wait()
    assert code == 1
    assert capsys.readouterr().err.splitlines() == [
        "gpuyard submit: no answer from admission within 0.5 s: the jobs may have been admitted "
        "all the same (`gpuyard jobs` lists them)"
    ]


SILENT_ADMISSION = """
import asyncio, sys, nats
async def listen():
    nc = await nats.connect(sys.argv[1])
    await nc.subscribe("gpuyard.quiet.adm.submit.>")
    await nc.flush()
    print("listening", flush=True)
    await asyncio.sleep(60)
asyncio.run(listen())
"""


def test_event_type_patterns_match_as_nats_subjects() -> None:
    from gpuyard.ops import unknown_event_types

    known = ["job.started", "job.*", "node.>", ">", "*.lost", "policy.changed"]
    assert unknown_event_types(known) == []
    unknown = ["job", "job.started.x", "jobs.*", "node.*.*", "*", "node.>.x"]
    assert unknown_event_types(unknown) == unknown
