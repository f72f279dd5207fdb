"""Sweeps as a user runs them: `gpuyard sweep` on a private server with local workers, the same
sweep through a server's queue with four `gpuyard worker` processes (one killed mid-run),
`gpuyard report` rendered in a real headless Chromium."""

from __future__ import annotations

import asyncio
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest

from gpuyard.sweep.config import ConfigError, load_sweep
from gpuyard.sweep.engine import fairness
from gpuyard.sweep.queue import _unpack_input
from gpuyard.sweep.report import (
    BOUNDS,
    _by_series_load,
    ci95,
    spread,
    spread_note,
    summary_table,
    with_series,
)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

SWEEP = """
[sweep]
name = "twopol"

[base]
jobs = 80
load = 30
cluster_spec = "4x2"

[grid]
seed = [0, 1, 2]

[[runs]]
policy = "fifo"

[[runs]]
policy = "srtf"
"""
VARYING = ("wall_s", "worker", "attempt")
"""Columns that say how a run went, not what it gave."""


def gpuyard(
    *args: str, cwd: Path | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", *args], capture_output=True, text=True,
        timeout=timeout, cwd=cwd,
    )  # fmt: skip


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sweep run on one machine: a private server, two local workers."""
    folder = tmp_path_factory.mktemp("sweep")
    (folder / "twopol.toml").write_text(SWEEP)
    result = gpuyard("sweep", "twopol.toml", "--parallel", "2", "--out", "out", cwd=folder)
    assert result.returncode == 0, result.stderr
    assert "6/6 runs" in result.stderr  # the sweep's one progress bar, its last line
    assert sorted(os.listdir(folder / "out" / "workers")) == ["worker-0.log", "worker-1.log"]
    return folder / "out"


# --------------------------------------------------------------------------- the file


def write(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_bad_key_is_one_line_naming_file_and_key(tmp_path: Path) -> None:
    for text, expected in (
        ("[base]\npolcy = 'las'\n", "unknown key base.polcy"),
        ("[grid]\nload = [10, 'high']\n", "grid.load[1]: Expected `float | null`, got `str`"),
        ("[[runs]]\nseed = -1\n", "runs[0].seed: Expected `int` >= 0"),
        ("[sweep]\nparralel = 2\n", "unknown key sweep.parralel"),
        ("[grid]\nloads = [1]\n", "unknown key grid.loads"),
        (
            "[base]\npreset = 'elasticflow'\npolicy = 'edf'\npolicy_params = { leftovers = 'lazy' }\n",
            "base (edf): scheduling policy 'edf': bad parameter",
        ),
        ("[base]\npolicy = 'las'\nload = \n", "not TOML: Invalid value (at line 3, column 8)"),
        # The same run twice (a grid value again, a variant again): one folder, one result.
        ("[grid]\nseed = [0, 1, 0]\n", "grid.seed: 0 is there twice"),
        ("[grid]\nload = [10, 10.0]\n", "grid.load: 10.0 is there twice"),
        (
            "[grid]\nseed = [0, 1]\n[[runs]]\npolicy = 'las'\n[[runs]]\npolicy = 'las'\n",
            "runs[1] at seed = 0 is the same run as runs[0] at seed = 0: each run once",
        ),
        (
            "[[runs]]\npolicy = 'fifo'\n[[runs]]\npolicy = 'las'\n[[runs]]\npolicy = 'fifo'\n",
            "runs[2] is the same run as runs[0]: each run once",
        ),
    ):
        path = write(tmp_path, text)
        with pytest.raises(ConfigError) as err:
            load_sweep(path)
        assert str(err.value).startswith(f"{path}: {expected}"), err.value
        assert "\n" not in str(err.value)
    path = write(tmp_path, "[base]\npolicy = 'nosuch'\n")
    result = gpuyard("sweep", str(path), "--dry-run")
    assert result.returncode == 2
    assert result.stderr.startswith(f"gpuyard sweep: {path}: base (nosuch): unknown scheduling")
    assert len(result.stderr.splitlines()) == 1


def test_a_bad_report_table_is_one_line_naming_file_and_key(tmp_path: Path) -> None:
    grid = "[grid]\npolicy = ['fifo', 'las']\nseed = [0, 1]\n"
    for text, expected in (
        ("[report]\nxx = 'seed'\n", "unknown key report.xx"),
        ("[report]\nx = 'trace'\n", "report.x: 'trace' is no field the grid or the runs vary (policy, seed)"),
        ("[report]\nfigures = ['deadline']\n", "report.figures[0]: Invalid enum value 'deadline'"),
        ("[report]\nbaseline = 'srtf'\n", "report.baseline: 'srtf' is no run's scheme (fifo, las)"),
        ("[report]\nfigures = ['jct_improvement']\n", "report.figures: jct_improvement needs report.baseline"),
        ("[base]\npolicy_params = { 'lsa.key' = 'rounds' }\n", "policy_params: lsa.*: no run's policy is 'lsa'"),
    ):  # fmt: skip
        path = write(tmp_path, grid + text)
        with pytest.raises(ConfigError) as err:
            load_sweep(path)
        assert str(err.value).startswith(f"{path}: {expected}"), err.value
    path = write(tmp_path, grid + "[report]\nx = 'seed'\nbaseline = 'fifo'\n")
    assert len(load_sweep(path).runs) == 4


def test_a_policys_own_parameters_go_to_its_runs_alone(tmp_path: Path) -> None:
    """`las.key = ...` applies to las only, as `gpuyard sim --param las.key=...` does; a key
    without a policy's name to every run."""
    path = write(tmp_path, "[base]\npolicy_params = { 'las.key' = 'rounds' }\n"
                           "[grid]\npolicy = ['fifo', 'las']\n")  # fmt: skip
    runs = {run.spec.policy: run for run in load_sweep(path).runs}
    assert runs["las"].spec.policy_params == {"key": "rounds"}
    assert runs["fifo"].spec.policy_params == {}
    plain = write(tmp_path, "[grid]\npolicy = ['fifo']\n", "plain.toml")
    assert runs["fifo"].run_id == load_sweep(plain).runs[0].run_id  # the same run


def test_grid_and_runs_give_every_combination_named_and_hashed(tmp_path: Path) -> None:
    trace = write(tmp_path, "job_id,arrival_time_s,duration_s,num_gpus\n1,0,600,1\n", "t.csv")
    sweep = load_sweep(write(tmp_path, SWEEP))
    assert [r.name for r in sweep.runs] == [
        f"{p}-seed{s}" for p in ("fifo", "srtf") for s in range(3)
    ]
    assert len({r.run_id for r in sweep.runs}) == 6
    assert sweep.runs[4].spec.policy == "srtf" and sweep.runs[4].spec.jobs == 80
    again = load_sweep(write(tmp_path, SWEEP.replace('"twopol"', '"other"'), "o.toml"))
    assert [r.run_id for r in again.runs] == [r.run_id for r in sweep.runs]  # inputs, not names
    # A trace is identified by its content, not its path.
    text = "[base]\ntrace = 't.csv'\n[grid]\npolicy = ['fifo', 'las']\n"
    before = load_sweep(write(tmp_path, text))
    trace.write_text(trace.read_text() + "2,60,900,2\n")
    after = load_sweep(write(tmp_path, text))
    assert before.runs[0].inputs[0].path == str(trace.resolve())
    assert {r.run_id for r in before.runs}.isdisjoint(r.run_id for r in after.runs)
    # Variants are named by the options they change (a file by its stem), not by a hash.
    write(tmp_path, trace.read_text(), "u.csv")
    text = ("[grid]\npolicy = ['fifo', 'las']\n[[runs]]\ntrace = 't.csv'\ncluster_spec = '1x4'\n"
            "[[runs]]\ntrace = 'u.csv'\ncluster_spec = '2x4'\n")  # fmt: skip
    variants = load_sweep(write(tmp_path, text))
    assert [r.name for r in variants.runs] == [
        f"{p}-trace={t}-cluster_spec={c}"
        for t, c in (("t", "1x4"), ("u", "2x4"))
        for p in ("fifo", "las")
    ]
    # Labelled variants crossed with a grid of policies: the policy is in the name.
    labelled = load_sweep(
        write(tmp_path, text.replace("[[runs]]\n", "[[runs]]\nlabel = 'small'\n", 1))
    )
    assert [r.name for r in labelled.runs][:2] == ["small-policy=fifo", "small-policy=las"]


def test_a_run_is_run_again_once_its_policys_code_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run id covers the code that decides results: a third-party policy's module too."""
    from gpuyard.shared.policy import scheduling_policies
    from gpuyard.sweep import config

    source = """
from gpuyard.policies.blox import Fifo

class Mine(Fifo):
    pass  # VERSION
"""
    (tmp_path / "mypolicy.py").write_text(source.replace("VERSION", "1"))
    monkeypatch.syspath_prepend(str(tmp_path))
    import mypolicy  # type: ignore[import-not-found]

    monkeypatch.setitem(scheduling_policies._classes, "mine", mypolicy.Mine)
    text = "[base]\njobs = 5\n[[runs]]\npolicy = 'mine'\n[[runs]]\npolicy = 'fifo'\n"
    before = load_sweep(write(tmp_path, text))
    (tmp_path / "mypolicy.py").write_text(source.replace("VERSION", "2"))
    config._source_digest.cache_clear()  # a sweep reads the code once; this one changed since
    after = load_sweep(write(tmp_path, text))
    assert before.runs[0].run_id != after.runs[0].run_id  # the policy's module changed
    assert before.runs[1].run_id == after.runs[1].run_id  # fifo's did not


def test_the_run_id_covers_the_simulation_driver() -> None:
    """Every part of gpuyard the run id covers exists (a moved module is not silently left out of
    it), the simulation's driver and the presets among them."""
    from gpuyard.run import presets, simulate
    from gpuyard.sweep import config

    roots = [Path(p) for p in config._gpuyard_sources()]
    assert roots and all(p.exists() for p in roots)
    for module in (simulate, presets):
        assert any(Path(module.__file__).is_relative_to(root) for root in roots), module


# --------------------------------------------------------------------------- one machine


@pytest.mark.slow
def test_the_sweep_writes_one_table_in_parquet_and_csv(local_sweep: Path) -> None:
    table = pd.read_parquet(local_sweep / "results.parquet")
    assert list(table["name"]) == [f"{p}-seed{s}" for p in ("fifo", "srtf") for s in range(3)]
    assert (table["status"] == "ok").all() and (table["completed"] == 80).all()
    assert list(table["seed"]) == [0, 1, 2] * 2 and (table["cluster_spec"] == "4x2").all()
    for column in ("mean_jct", "p99_jct", "makespan", "utilization", "rho_max", "rho_jain"):
        assert table[column].notna().all(), column
    csv = pd.read_csv(local_sweep / "results.csv")
    assert csv["mean_jct"].tolist() == pytest.approx(table["mean_jct"].tolist())
    # Each row is that run's own summary; different seeds, different workloads.
    run = json.loads((local_sweep / "runs" / "srtf-seed1" / "summary.json").read_text())
    assert table.loc[4, "mean_jct"] == pytest.approx(run["mean_jct"])
    assert table.loc[0, "mean_jct"] != table.loc[1, "mean_jct"]


@pytest.mark.slow
def test_a_sweep_run_is_the_simulation_gpuyard_sim_runs(local_sweep: Path, tmp_path: Path) -> None:
    result = gpuyard("sim", "--policy", "srtf", "--jobs", "80", "--load", "30", "--seed", "1",
                     "--cluster-spec", "4x2", "--out", str(tmp_path / "sim"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    for name in ("jobs.csv", "timeline.csv"):
        ours = (local_sweep / "runs" / "srtf-seed1" / name).read_bytes()
        assert ours == (tmp_path / "sim" / name).read_bytes(), name


@pytest.mark.slow
def test_a_failed_run_is_recorded_and_a_sweep_resumes(tmp_path: Path) -> None:
    write(
        tmp_path, "job_id,arrival_time_s,duration_s,num_gpus\n1,0,600,1\n2,10,oops,1\n", "bad.csv"
    )
    write(tmp_path, "[base]\ncluster_spec = '2x2'\n[[runs]]\npolicy = 'fifo'\njobs = 10\n"
          "[[runs]]\ntrace = 'bad.csv'\ntrace_format = 'blox'\nlabel = 'broken'\n")  # fmt: skip
    result = gpuyard("sweep", "s.toml", "--out", "out", "--parallel", "1", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    table = pd.read_parquet(tmp_path / "out" / "results.parquet")
    assert list(table["status"]) == ["ok", "failed"]
    assert table.loc[1, "error"].startswith(f"{tmp_path / 'bad.csv'}, line 3, field 'duration_s'")
    assert "FAILED broken:" in result.stdout
    results = sorted((tmp_path / "out" / "runs").glob("*/result.json"))
    stamps = {p: p.stat().st_mtime_ns for p in results}
    # Again: nothing runs (a failed run is finished too) ...
    again = gpuyard("sweep", "s.toml", "--out", "out", cwd=tmp_path)
    assert again.returncode == 1
    assert {p: p.stat().st_mtime_ns for p in results} == stamps
    # ... unless asked; and a run whose results are gone runs again, alone.
    shutil.rmtree(tmp_path / "out" / "runs" / "fifo")
    third = gpuyard("sweep", "s.toml", "--out", "out", "--retry-failed", "--parallel", "1",
                    cwd=tmp_path)  # fmt: skip
    assert third.returncode == 1
    table = pd.read_parquet(tmp_path / "out" / "results.parquet")
    assert list(table["status"]) == ["ok", "failed"] and table.loc[0, "completed"] == 10
    broken = tmp_path / "out" / "runs" / "broken" / "result.json"
    assert broken.stat().st_mtime_ns != stamps[broken]


@pytest.mark.slow
def test_an_interrupted_sweep_keeps_what_came_back_and_goes_on(tmp_path: Path) -> None:
    write(tmp_path, "[base]\njobs = 60\ncluster_spec = '2x2'\n[grid]\nseed = [0, 1, 2, 3]\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuyard.cli", "sweep", "s.toml", "--out", "out", "--parallel", "1"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    first = tmp_path / "out" / "runs" / "fifo-seed0" / "result.json"
    deadline = time.monotonic() + 120
    while not first.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "run the same command again to go on" in err
    table = pd.read_parquet(tmp_path / "out" / "results.parquet")
    assert table.loc[0, "status"] == "ok" and (table["status"] == "missing").any()
    kept = first.stat().st_mtime_ns
    again = gpuyard("sweep", "s.toml", "--out", "out", "--parallel", "1", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert (pd.read_parquet(tmp_path / "out" / "results.parquet")["status"] == "ok").all()
    assert first.stat().st_mtime_ns == kept  # not run again


# --------------------------------------------------------------------------- many machines


@pytest.mark.slow
async def test_four_workers_one_killed_give_the_single_machine_results(
    local_sweep: Path, nats_url: str, tmp_path: Path
) -> None:
    (tmp_path / "twopol.toml").write_text(SWEEP)
    logs = [tmp_path / f"worker-{i}.log" for i in range(4)]
    workers = []
    for log in logs:
        with log.open("wb") as sink:
            workers.append(await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gpuyard.cli", "worker", "--nats", nats_url,
                stdout=sink, stderr=sink,
            ))  # fmt: skip
    sweep = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuyard.cli", "sweep", "twopol.toml", "--nats", nats_url,
        "--out", "out", "--redeliver-after", "3", cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        victim = None
        async with asyncio.timeout(120):  # kill the first worker seen starting a run, mid-run
            while victim is None:
                await asyncio.sleep(0.05)
                for worker, log in zip(workers, logs, strict=True):
                    if '"run.started"' in log.read_text():
                        os.kill(worker.pid, signal.SIGKILL)
                        victim = log
                        break
        killed_run = json.loads(next(line for line in victim.read_text().splitlines()
                                     if '"run.started"' in line))["run"]  # fmt: skip
        async with asyncio.timeout(180):
            _, err = await sweep.communicate()
        assert sweep.returncode == 0, err.decode()
    finally:
        for worker in workers:
            if worker.returncode is None:
                worker.terminate()
            await worker.wait()
    assert '"run.done"' not in victim.read_text()
    table = pd.read_parquet(tmp_path / "out" / "results.parquet")
    reference = pd.read_parquet(local_sweep / "results.parquet")
    assert (table["status"] == "ok").all()
    assert table.loc[table["name"] == killed_run, "attempt"].item() == 2  # delivered again
    assert table["worker"].nunique() > 1  # shared among the workers
    pd.testing.assert_frame_equal(table.drop(columns=list(VARYING)),
                                  reference.drop(columns=list(VARYING)))  # fmt: skip
    for run in table["name"]:
        for name in ("jobs.csv", "timeline.csv"):
            ours = (tmp_path / "out" / "runs" / run / name).read_bytes()
            assert ours == (local_sweep / "runs" / run / name).read_bytes(), (run, name)


@pytest.mark.slow
async def test_a_worker_does_not_run_again_a_run_whose_result_is_stored(nats_url: str) -> None:
    """At-least-once delivery can hand out a run twice: its stored result stands."""
    import msgspec
    import nats

    from gpuyard.sweep.config import RunSpec
    from gpuyard.sweep.queue import (
        RESULTS_STREAM,
        RUNS_STREAM,
        RunOrder,
        RunResult,
        ensure_queue,
        result_subject,
        run_subject,
    )  # fmt: skip
    from gpuyard.sweep.worker import Worker

    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await ensure_queue(js)
    done = RunResult(sweep="d", run_id="abc", name="fifo", ok=True, summary={"mean_jct": 1.0})
    await js.publish(result_subject("d", "abc"), msgspec.json.encode(done))
    order = RunOrder(sweep="d", run_id="abc", name="fifo", spec=RunSpec(jobs=5))
    await js.publish(run_subject("d"), msgspec.json.encode(order))
    worker = Worker(nats_url, idle_exit_s=0.5)
    assert await worker.serve() == 0
    assert worker.runs == 0  # acknowledged, not run
    assert (await js.stream_info(RUNS_STREAM)).state.messages == 0
    stored = await js.get_last_msg(RESULTS_STREAM, result_subject("d", "abc"))
    assert msgspec.json.decode(stored.data, type=RunResult) == done
    await nc.close()


@pytest.mark.slow
async def test_a_worker_waiting_for_runs_stops_at_once(nats_url: str, tmp_path: Path) -> None:
    """Stopped (SIGTERM, or its sweep ending) while it waits for a run, a sweep's local worker is
    gone at once, not after its connection's drain timeout (5 s) spent on the queue request it
    had open (uvloop, as the workers run, waits that long; asyncio's loop does not)."""
    from gpuyard.sweep.engine import LocalWorkers

    local = LocalWorkers(nats_url, 1, tmp_path / "workers")
    await local.__aenter__()
    log = tmp_path / "workers" / "worker-0.log"
    for _ in range(200):
        await asyncio.sleep(0.1)
        if log.exists() and "worker.ready" in log.read_text():
            break
    await asyncio.sleep(3)  # (its first request for a run timed out, the next one is open)
    async with asyncio.timeout(3):
        await local.__aexit__(None, None, None)
    assert local.procs[0].returncode == 0, log.read_text()


async def test_local_workers_simulate_on_servers_of_their_own_each_on_its_cpu(
    nats_url: str, tmp_path: Path
) -> None:
    """A sweep's local workers each run on a CPU of their own (the CPUs this process may use,
    in turn), and simulate each run on a private server started beside them, on that CPU: the
    queue's server carries none of a run's messages."""
    import msgspec
    import nats

    from gpuyard.run.forks import cpu_slots
    from gpuyard.sweep.config import RunSpec
    from gpuyard.sweep.engine import LocalWorkers
    from gpuyard.sweep.queue import RESULTS_STREAM, RunOrder, ensure_queue, run_subject

    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await ensure_queue(js)
    on_queue_server: list[str] = []  # a run's messages (`gpuyard.sweep-<run>-...`) seen here

    async def heard(msg: nats.aio.msg.Msg) -> None:
        if msg.subject.split(".")[1].startswith("sweep-"):
            on_queue_server.append(msg.subject)

    await nc.subscribe("gpuyard.>", cb=heard)
    for seed in (0, 1):  # long enough to be watched while they run
        spec = RunSpec(jobs=400, load=40, seed=seed, cluster_spec="8x2", policy="fifo")
        order = RunOrder(sweep="pin", run_id=f"r{seed}", name=f"fifo-{seed}", spec=spec)
        await js.publish(run_subject("pin"), msgspec.json.encode(order))
    local = LocalWorkers(nats_url, 2, tmp_path / "workers", pin=True)
    await local.__aenter__()
    try:
        pids = [proc.process.pid for proc in local.procs]
        logs = [tmp_path / "workers" / f"worker-{i}.log" for i in range(2)]
        for _ in range(3000):  # (pinned before they connect)
            if all(log.exists() and "worker.ready" in log.read_text() for log in logs):
                break
            await asyncio.sleep(0.02)
        assert [os.sched_getaffinity(pid) for pid in pids] == [{cpu} for cpu in cpu_slots(2)]
        servers: dict[int, set[int]] = {}  # worker pid -> the CPUs of its runs' servers
        for _ in range(6000):
            if len(servers) == 2 or (await js.stream_info(RESULTS_STREAM)).state.messages == 2:
                break
            for pid in pids:
                for cpus in _server_cpus(pid):
                    servers.setdefault(pid, set()).update(cpus)
            await asyncio.sleep(0.02)
        assert servers, "no run's server seen"
        for pid, cpus in servers.items():
            assert cpus == os.sched_getaffinity(pid)
        lines = "".join(log.read_text() for log in logs).splitlines()
        started = [json.loads(line) for line in lines if '"run.started"' in line]
        assert started and all(s["server"] != nats_url for s in started)
        assert on_queue_server == []
    finally:
        await local.__aexit__(None, None, None)
        await nc.close()


def _server_cpus(pid: int) -> list[set[int]]:
    """The CPUs of each nats-server process that `pid` started and that still runs."""
    found = []
    try:
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            if Path(f"/proc/{child}/comm").read_text().strip() == "nats-server":
                found.append(os.sched_getaffinity(int(child)))
    except OSError:  # (one that ended meanwhile: the next look sees the next)
        pass
    return found


@pytest.mark.slow
async def test_workers_started_by_the_sweep_connect_as_it_does(tmp_path: Path) -> None:
    """`sweep --nats URL --workers N` on a server with users: the workers it starts get its
    identity (the password through their environment, not their command line)."""
    from gpuyard.run.embedded import EmbeddedNats

    (tmp_path / "one.toml").write_text(
        '[sweep]\nname = "one"\n[base]\njobs = 10\ncluster_spec = "2x2"\n'
    )
    users = 'authorization { users = [ { user: "sweeper", password: "s3cret" } ] }'
    async with EmbeddedNats(extra_config=users) as url:
        sweep = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gpuyard.cli", "sweep", "one.toml", "--nats", url,
            "--nats-user", "sweeper", "--workers", "1", "--out", "out", cwd=tmp_path,
            env={**os.environ, "GPUYARD_NATS_PASSWORD": "s3cret"},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        async with asyncio.timeout(120):
            _, err = await sweep.communicate()
    log = (tmp_path / "out" / "workers" / "worker-0.log").read_text()
    assert sweep.returncode == 0, err.decode() + log
    assert "Authorization Violation" not in log
    assert pd.read_csv(tmp_path / "out" / "results.csv")["status"].tolist() == ["ok"]


@pytest.mark.slow
async def test_a_server_that_refuses_the_sweep_queue_is_one_line(tmp_path: Path) -> None:
    """An identity without JetStream (e.g. a cluster's, from `gpuyard auth`): the refusal, named."""
    from gpuyard.run.embedded import EmbeddedNats

    (tmp_path / "one.toml").write_text('[base]\njobs = 10\ncluster_spec = "2x2"\n')
    users = ('authorization { users = [ { user: "u", password: "p", '
             'permissions: { publish: { deny: "$JS.API.>" } } } ] }')  # fmt: skip
    async with EmbeddedNats(extra_config=users) as url:
        for command in (["sweep", "one.toml"], ["worker"]):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gpuyard.cli", *command, "--nats", url, "--nats-user", "u",
                cwd=tmp_path, env={**os.environ, "GPUYARD_NATS_PASSWORD": "p"},
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            async with asyncio.timeout(60):
                _, err = await proc.communicate()
            (line,) = err.decode().splitlines()
            assert proc.returncode == 1
            assert line.startswith(
                f"gpuyard {command[0]}: the server refused: permissions violation"
            )
            assert "$js.api.stream" in line.lower()


# --------------------------------------------------------------------------- the report


def test_workers_unpacking_one_input_at_once_each_get_it(tmp_path: Path) -> None:
    """Workers on one machine share the inputs' cache: those that fetch the same input at once
    each unpack it, and every one of them gets it whole (a folder input too, which a worker
    that comes second cannot move over the first one's)."""
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as tar:
        for name, text in (("a.csv", b"1,2\n"), ("b.csv", b"3,4\n")):
            info = tarfile.TarInfo(name)
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
    folder, file = tmp_path / "digest1" / "table", tmp_path / "digest2" / "trace.csv"
    with ThreadPoolExecutor(8) as pool:
        jobs = [pool.submit(_unpack_input, packed.getvalue(), folder, True) for _ in range(8)]
        jobs += [pool.submit(_unpack_input, b"x,y\n", file, False) for _ in range(8)]
        for job in jobs:
            job.result()
    _unpack_input(packed.getvalue(), folder, True)  # (one that finds it in place already)
    assert sorted(p.name for p in folder.iterdir()) == ["a.csv", "b.csv"]
    assert (folder / "b.csv").read_bytes() == b"3,4\n" and file.read_bytes() == b"x,y\n"
    assert sorted(p.name for p in tmp_path.glob("digest*/*")) == ["table", "trace.csv"]


def test_ci_and_fairness_figures() -> None:
    assert ci95(pd.Series([1.0, 2.0, 3.0])) == pytest.approx(4.303 / math.sqrt(3))
    assert ci95(pd.Series([5.0])) == 0.0
    jobs = pd.DataFrame({"state": ["completed", "completed", "running"], "jct": [10.0, 40.0, None],
                         "executed_time": [10.0, 10.0, 5.0]})  # fmt: skip
    found = fairness(jobs)  # rho 1 and 4: speeds 1 and 1/4
    assert found["rho_mean"] == 2.5 and found["rho_max"] == 4.0
    assert found["rho_jain"] == pytest.approx(1.25**2 / (2 * (1 + 1 / 16)))


def test_runs_without_loads_or_seeds_are_kept_apart_by_the_inputs_that_vary() -> None:
    """Ten clusters' traces under two schemes (no load, no seed): a row per cluster and scheme,
    not the clusters averaged as if they were seeds."""
    table = pd.DataFrame({
        "scheme": ["ef", "edf", "ef", "edf"], "load": [None] * 4, "seed": [None] * 4,
        "trace": ["c1.csv", "c1.csv", "c2.csv", "c2.csv"], "status": ["ok"] * 4,
        "deadline_satisfactory_ratio": [1.0, 0.5, 0.9, 0.25],
    })  # fmt: skip
    summary = summary_table(with_series(table))
    assert summary["series"].tolist() == [  # (in the sweep's order)
        "ef (trace=c1.csv)",
        "edf (trace=c1.csv)",
        "ef (trace=c2.csv)",
        "edf (trace=c2.csv)",
    ]
    assert summary["seeds"].tolist() == [1, 1, 1, 1]
    assert summary["deadlines met (%)"].tolist() == ["100", "50.0", "90.0", "25.0"]


def results(jct_s: dict[str, list[float]], **columns: list[float]) -> pd.DataFrame:
    """A sweep's results table: a run per scheme and seed (load 10), with these mean JCTs (s)
    and any other metric given for every run in the same order."""
    rows = [{"sweep": "stats", "name": f"{scheme}-{seed}", "run_id": f"{scheme}{seed}",
             "scheme": scheme, "load": 10.0, "seed": seed, "trace": None, "status": "ok",
             "error": None, "mean_jct": jct, "p95_jct": 2 * jct, "makespan": 10 * jct,
             "utilization": 0.5, "deadline_satisfactory_ratio": None, "rho_max": 2.0,
             "rho_jain": 0.9}
            for scheme, values in jct_s.items() for seed, jct in enumerate(values)]  # fmt: skip
    table = pd.DataFrame(rows)
    for column, values in columns.items():
        table[column] = values
    return table


def test_two_seeds_get_min_to_max_not_a_t_interval() -> None:
    """With 2 seeds a t interval (t = 12.7) spans far past the data: the table shows the lowest
    and the highest value instead, and says so."""
    summary = summary_table(with_series(results({"las": [3600.0, 7200.0]})))
    row = summary.iloc[0]
    assert row["seeds"] == 2 and row["spread"] == "min to max"
    assert row["mean JCT (h)"] == "1.5 (1 to 2)"  # not 1.5 ± 6.35
    assert row["makespan (h)"] == "15.0 (10.0 to 20.0)"
    assert row["utilisation (%)"] == "50.0 (50.0 to 50.0)"


def test_the_report_rows_follow_the_sweep_files_order() -> None:
    """The summary lists its series as the sweep file does (srtf before fifo before las here),
    not alphabetically, and each series' loads rising."""
    table = results({"srtf": [3600.0], "fifo": [3600.0], "las": [3600.0]})
    table = pd.concat([table, table.assign(load=5.0, run_id=table["run_id"] + "-5")])
    summary = summary_table(with_series(table))
    assert list(zip(summary["series"], summary["load"], strict=True)) == [
        ("srtf", 5.0),
        ("srtf", 10.0),
        ("fifo", 5.0),
        ("fifo", 10.0),
        ("las", 5.0),
        ("las", 10.0),
    ]


def test_a_t_interval_stops_where_the_metric_does() -> None:
    """3 seeds, one far out: the mean JCT's interval would reach below 0 h, the utilisation's
    above 100%; each is clipped there and says so. One that stays inside is mean ± half-width."""
    jct = [360.0, 720.0, 36000.0]
    summary = summary_table(with_series(results({"fifo": jct}, utilization=[0.5, 0.65, 0.8])))
    row = summary.iloc[0]
    assert row["seeds"] == 3 and row["spread"] == "95% CI (Student's t)"
    assert ci95(pd.Series(jct)) > sum(jct) / 3  # the plain interval would go below zero
    assert row["mean JCT (h)"] == "3.43 (0 to 17.6, clipped)"
    assert row["utilisation (%)"] == "65.0 (27.7 to 100, clipped)"
    assert row["worst rho"] == "2 ± 0"  # all alike: nothing to clip
    found = spread(pd.Series(jct), BOUNDS["mean_jct"])
    assert found.kind == "ci" and found.low == 0.0 and found.clipped_low and not found.clipped_high
    assert found.high == pytest.approx(found.mean + ci95(pd.Series(jct)))
    # a bound the data themselves pass is widened to them, never cut through the data
    beyond = spread(pd.Series([0.9, 0.95, 1.02]), (0, 1))
    assert beyond.high == 1.02 and beyond.low >= 0


def test_every_mean_names_its_n() -> None:
    """A row's seeds is the n of its means; a metric missing for a seed names its own n, and the
    caption of a plot gives the points' n and what each n's bars are."""
    table = results({"fifo": [360.0, 720.0, 36000.0], "las": [3600.0, 7200.0]},
                    rho_max=[2.0, None, 4.0, 1.5, 2.5])  # fmt: skip
    summary = summary_table(with_series(table)).set_index("series")
    assert summary["seeds"].to_dict() == {"fifo": 3, "las": 2}
    assert summary.loc["fifo", "worst rho"] == "3 (2 to 4) (n=2)"
    stats = _by_series_load(with_series(table), "mean_jct")
    assert stats["n"].tolist() == [3, 2]
    note = spread_note(stats, "mean_jct", 1 / 3600)
    assert note.startswith("points: mean over seeds, n=2 to 3 (each series' n beside its name)")
    assert "n≥3: bars 95% confidence interval (Student's t), 1 clipped at 0" in note
    assert "n=2: bars min to max" in note


@pytest.mark.slow
def test_the_report_says_what_its_bars_are(tmp_path: Path) -> None:
    """The page, the SVGs and summary.csv of a sweep with 2 seeds of one scheme and 3 of the
    other: each says its n, which bars are min to max and which interval was clipped."""
    from gpuyard.sweep.report import write_report

    results({"fifo": [360.0, 720.0, 36000.0], "las": [3600.0, 7200.0]}).to_parquet(
        tmp_path / "results.parquet"
    )
    write_report(tmp_path)
    report = tmp_path / "report"
    csv = pd.read_csv(report / "summary.csv").set_index("series")
    assert csv["seeds"].to_dict() == {"fifo": 3, "las": 2}
    assert csv["spread"].to_dict() == {"fifo": "95% CI (Student's t)", "las": "min to max"}
    assert csv.loc["fifo", "mean JCT (h)"] == "3.43 (0 to 17.6, clipped)"
    page = report.joinpath("report.html").read_text()
    assert "With 2 seeds, mean (min to max): too few for a t interval." in page
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", page, re.S)
    jct = next(c for c in captions if "mean_jct.png" in c)
    assert "n=2 to 3" in jct and "n=2: bars min to max" in jct
    assert "1 clipped at 0 (what the metric allows)" in jct
    svg = report.joinpath("mean_jct.svg").read_text()
    assert "fifo (n=3)" in svg and "las (n=2)" in svg  # the legend
    assert "n=2: bars min to max" in svg  # the caption under the plot


@pytest.mark.slow
def test_a_table_without_deadline_ratios_gets_no_deadline_figure(tmp_path: Path) -> None:
    """Results from before the column existed: no deadlines figure, and no failure (the report
    once took `pd.to_numeric(None)`, NaN, for the missing column)."""
    from gpuyard.sweep.report import write_report

    table = results({"fifo": [360.0, 720.0, 36000.0]}).drop(columns="deadline_satisfactory_ratio")
    table.to_parquet(tmp_path / "results.parquet")
    paths = write_report(tmp_path)
    assert tmp_path / "report" / "report.html" in paths
    assert tmp_path / "report" / "deadlines.png" not in paths


@pytest.mark.slow
def test_deadline_ratios_get_their_figure(local_sweep: Path, tmp_path: Path) -> None:
    from gpuyard.sweep.report import write_report

    table = pd.read_parquet(local_sweep / "results.parquet")
    table["deadline_satisfactory_ratio"] = [0.5, 0.6, 0.7, 0.9, 0.8, 1.0]
    shutil.copytree(local_sweep / "runs", tmp_path / "runs")
    table.to_parquet(tmp_path / "results.parquet")
    paths = write_report(tmp_path)
    assert tmp_path / "report" / "deadlines.png" in paths
    summary = pd.read_csv(tmp_path / "report" / "summary.csv")
    # 90 ± 24.8 would pass 100%: shown clipped there
    assert summary["deadlines met (%)"].tolist() == ["60.0 ± 24.8", "90.0 (65.2 to 100, clipped)"]


@pytest.mark.slow
@pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium (Debian package `chromium`) to render the report"
)
def test_the_html_report_renders_with_every_figure(local_sweep: Path, tmp_path: Path) -> None:
    result = gpuyard("report", str(local_sweep), "--out", str(tmp_path / "report"))
    assert result.returncode == 0, result.stderr
    page = Path(result.stdout.strip())
    assert page == tmp_path / "report" / "report.html"
    figures = ["mean_jct", "jct_cdfs", "makespan", "timelines", "fairness"]
    for name in figures:
        assert (tmp_path / "report" / f"{name}.png").stat().st_size > 0
        assert (tmp_path / "report" / f"{name}.svg").read_text().lstrip().startswith("<?xml")
    assert 'src="file:' not in page.read_text() and "href=" not in page.read_text()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'chromium'}"]  # fmt: skip
    assert CHROMIUM is not None
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", page.as_uri()], capture_output=True,
                         text=True, timeout=120).stdout  # fmt: skip
    for name in figures:  # each figure is in the page, and its image decoded
        assert f'<figure id="{name}">' in dom
    assert dom.count('data-loaded="yes"') == len(figures) and 'data-loaded="broken"' not in dom
    assert "fifo" in dom and "srtf" in dom and "6 of 6 runs succeeded" in dom
    shot = tmp_path / "page.png"
    subprocess.run([CHROMIUM, *flags, "--window-size=1200,2400", f"--screenshot={shot}",
                    page.as_uri()], capture_output=True, timeout=120)  # fmt: skip
    from PIL import Image

    colours = Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 200  # plots, not a blank page


# --------------------------------------------------------------------------- recipes

RECIPES = Path(__file__).resolve().parents[1] / "examples" / "sweeps"
RECIPE_RUNS = {
    "blox-fig6": 9, "gavel-jct-vs-load": 24, "gavel-traces": 14, "bftrainer-idle": 3,
    "elasticflow-fig8a": 6, "elasticflow-fig8b": 66, "elasticflow-fig9": 12,
    "elasticflow-fig10": 6, "elasticflow-fig11": 54, "pollux-fig8": 24, "sia-saturn": 20,
}  # fmt: skip
"""Every recipe of examples/sweeps and its runs."""
OUTSIDE_DATA = {
    "elasticflow-fig8a": "elasticVpollux_e.csv",
    "sia-saturn": "https://github.com/siasosp23/artifacts",
}
"""Recipes whose inputs are not in ../shared/data, and what their header names to get them."""


@pytest.mark.parametrize(
    ("recipe", "runs"),
    RECIPE_RUNS.items(),
)
def test_each_recipe_is_a_valid_sweep(recipe: str, runs: int, shared_data: Path) -> None:
    path = RECIPES / f"{recipe}.toml"
    missing = [p for p in re.findall(r'"(\.\./[^"]+)"', path.read_text())
               if not (path.parent / p).exists()]  # fmt: skip
    if missing:  # (inputs the data folder lacks: the recipe says where to get them)
        assert recipe in OUTSIDE_DATA, missing
        with pytest.raises(ConfigError) as err:
            load_sweep(path)
        named = [str((path.parent / m).resolve()) for m in missing]
        said = str(err.value)
        assert said.startswith(f"{path}: ") and said.endswith(" does not exist")
        assert any(f": {m} does not exist" in said for m in named), said
        assert OUTSIDE_DATA[recipe] in path.read_text().split("[base]")[0]  # the header says
        return
    sweep = load_sweep(path)
    assert len(sweep.runs) == runs and sweep.name == recipe
    for run in sweep.runs:  # its data files are read from ../shared/data, by content
        assert recipe in OUTSIDE_DATA or all(
            Path(i.path).is_relative_to(shared_data.resolve()) for i in run.inputs
        )


def test_every_recipe_is_checked() -> None:
    assert {p.stem for p in RECIPES.glob("*.toml")} == set(RECIPE_RUNS)


def test_the_fig8b_recipe_gives_ef_accessctrl_alone_its_lazy_walk(shared_data: Path) -> None:
    sweep = load_sweep(RECIPES / "elasticflow-fig8b.toml")
    params = {
        (r.spec.policy, Path(r.spec.trace or "").stem): r.spec.policy_params for r in sweep.runs
    }
    assert params["ef-accessctrl", "cluster04"] == {"leftovers": "lazy"}
    assert params["edf", "cluster04"] == {} and params["chronus", "philly_103959"] == {}
    sizes = {
        Path(r.spec.trace or "").stem: Path(r.spec.cluster_spec or "").stem for r in sweep.runs
    }
    assert sizes == {
        **dict.fromkeys(["cluster01", "cluster02", "cluster03", "cluster05", "cluster06"], "n64g8"),
        **dict.fromkeys(["cluster04", "cluster07", "cluster08", "cluster09"], "n128g8"),
        "cluster10": "n32g8", "philly_103959": "n32g8",
    }  # fmt: skip


def test_the_bftrainer_recipe_replays_the_reference_window(shared_data: Path) -> None:
    sweep = load_sweep(RECIPES / "bftrainer-idle.toml")
    assert [r.spec.policy for r in sweep.runs] == ["bftrainer", "bftrainer", "bftrainer-equal"]
    spec = sweep.runs[0].spec
    assert spec.preset == "bftrainer" and spec.start == "2021-02-10 20:21:15"
    assert spec.cluster_spec is None and Path(spec.nodes_from or "").name == "replay_nodes_64.txt"
    assert {i.field for i in sweep.runs[0].inputs} >= {"node_events", "nodes_from"}


def test_a_report_of_a_sweep_not_run_names_the_folder_given(tmp_path: Path) -> None:
    """`gpuyard report sweeps/x` before the sweep ran says that folder is missing (it named
    `sweeps/results.parquet`), a folder without results says it holds none, and a file that is
    not a sweep's results, or results that are no table, say so."""
    from gpuyard.sweep.report import ReportError, write_report

    with pytest.raises(ReportError, match=f"^{tmp_path / 'never-run'} does not exist"):
        write_report(tmp_path / "never-run")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match=f"^{tmp_path / 'empty'} holds no results.parquet"):
        write_report(tmp_path / "empty")
    # A file that is not the results, and results that are not a table: one line each.
    (tmp_path / "jobs.csv").write_text("job_id\n1\n")
    with pytest.raises(ReportError, match=f"^{tmp_path / 'jobs.csv'} is not a sweep's results"):
        write_report(tmp_path / "jobs.csv")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "results.parquet").write_bytes(b"not parquet at all")
    broken = tmp_path / "broken" / "results.parquet"
    with pytest.raises(ReportError, match=f"^{broken}: not a sweep's results table: "):
        write_report(tmp_path / "broken")


# --------------------------------------------------------------------------- the report's axis

EF_SWEEP = """
[sweep]
name = "efreport"

[base]
preset = "elasticflow"
generator = "elasticflow"
jobs = 12
load = 6
seed = 0
cluster_spec = "{data}/elasticflow/cluster_specs/n4g8.csv"
throughputs = "{data}/elasticflow/throughputs_A100"
round_s = 240

[grid]
best_effort_share = [0.2, 0.6]
policy = ["edf", "ef-accessctrl"]

[report]
x = "best_effort_share"
figures = ["deadlines", "jct_improvement", "cluster_efficiency"]
baseline = "edf"
"""


@pytest.mark.slow
def test_the_report_draws_what_the_sweep_file_asks_against_its_x(
    tmp_path: Path, shared_data: Path
) -> None:
    """A real sweep of ElasticFlow's generator at two best-effort shares: the report draws the
    three figures `[report]` names (and no other), each against the share, and the JCT
    improvement over the baseline is its mean JCT over each run's, per share."""
    from gpuyard.sweep.report import Axis, jct_improvement, write_report

    (tmp_path / "ef.toml").write_text(EF_SWEEP.format(data=shared_data.resolve()))
    result = gpuyard("sweep", "ef.toml", "--parallel", "2", "--out", "out", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    paths = write_report(out)
    report = out / "report"
    assert {p.name for p in paths} == {
        f"{name}.{ext}" for name in ("deadlines", "jct_improvement", "cluster_efficiency")
        for ext in ("png", "svg")
    } | {"summary.csv", "report.html"}  # fmt: skip
    assert all(p.stat().st_size > 0 for p in paths)
    mean_jct = {}
    for run in (out / "runs").iterdir():
        summary = json.loads((run / "summary.json").read_text())
        share = json.loads((run / "options.json").read_text())["workload"]["best_effort_share"]
        mean_jct[summary["scheme"], share] = summary["mean_jct"]
    expected = {
        share: mean_jct["edf", share] / mean_jct["ef-accessctrl", share] for share in (0.2, 0.6)
    }
    table = pd.read_parquet(out / "results.parquet")
    table = with_series(table, Axis("best_effort_share"))
    found = jct_improvement(table, "edf", Axis("best_effort_share"))
    for (_, run), value in zip(table.iterrows(), found, strict=True):
        share = run["best_effort_share"]
        assert value == pytest.approx(1.0 if run["scheme"] == "edf" else expected[share], rel=1e-12)
    summary = pd.read_csv(report / "summary.csv").set_index(["series", "best_effort_share"])
    for share, ratio in expected.items():
        shown = summary.loc[("ef-accessctrl", share), "JCT improvement over edf"]
        assert float(shown) == pytest.approx(ratio, rel=5e-3)
    svg = (report / "jct_improvement.svg").read_text()
    assert "share of best-effort jobs (%)" in svg and "240 s slots" in svg
    assert "edf's mean JCT / the scheme's" in svg
    efficiency = (report / "cluster_efficiency.svg").read_text()
    assert "cluster efficiency (ElasticFlow's)" in efficiency and "20% best-effort" in efficiency


@pytest.mark.slow
def test_an_x_of_traces_draws_a_group_of_bars_per_trace(tmp_path: Path) -> None:
    """`x = "trace"`: a row per trace and scheme, the traces not pooled as seeds, a group of bars
    per trace in the sweep file's order."""
    from gpuyard.sweep.report import write_report

    table = pd.DataFrame({
        "sweep": "traces", "name": [f"r{i}" for i in range(4)], "run_id": [f"r{i}" for i in range(4)],
        "scheme": ["ef", "edf", "ef", "edf"], "load": None, "seed": None, "status": "ok", "error": None,
        "trace": ["/d/c2.csv", "/d/c2.csv", "/d/c1.csv", "/d/c1.csv"],
        "mean_jct": 3600.0, "p95_jct": 7200.0, "makespan": 36000.0, "utilization": 0.5,
        "deadline_satisfactory_ratio": [1.0, 0.5, 0.9, 0.25], "rho_max": 2.0, "rho_jain": 0.9,
    })  # fmt: skip
    table.to_parquet(tmp_path / "results.parquet")
    (tmp_path / "sweep.toml").write_text('[report]\nx = "trace"\nfigures = ["deadlines"]\n')
    paths = write_report(tmp_path)
    assert [p.name for p in paths] == [
        "deadlines.png",
        "deadlines.svg",
        "summary.csv",
        "report.html",
    ]
    summary = pd.read_csv(tmp_path / "report" / "summary.csv", dtype=str)
    assert list(zip(summary["series"], summary["trace"], summary["deadlines met (%)"], strict=True)) == [
        ("ef", "/d/c2.csv", "100"), ("ef", "/d/c1.csv", "90.0"),
        ("edf", "/d/c2.csv", "50.0"), ("edf", "/d/c1.csv", "25.0"),
    ]  # fmt: skip
    svg = (tmp_path / "report" / "deadlines.svg").read_text()
    assert 0 < svg.index("<!-- c2 -->") < svg.index("<!-- c1 -->")  # the ticks, the file's order
    assert "deadline satisfactory ratio vs trace" in svg


def test_traces_of_one_name_in_several_folders_are_told_apart_by_their_folder() -> None:
    """A workload at several loads (`workloads-0.5/workload-1.csv`, `workloads/workload-1.csv`):
    ticks name the folder where the file names repeat, the file alone where they do not."""
    from gpuyard.sweep.report import Axis

    table = pd.DataFrame({"trace": ["/p/workloads/workload-1.csv", "/p/workloads-2.0/workload-1.csv",
                                    "/p/workloads/workload-2.csv"]})  # fmt: skip
    axis = Axis("trace")
    assert [axis.tick(table, v) for v in table["trace"]] == [
        "workloads/workload-1", "workloads-2.0/workload-1", "workload-2",
    ]  # fmt: skip


def test_one_load_is_no_axis_a_bar_per_scheme(tmp_path: Path) -> None:
    """A sweep at one load draws its metrics as a bar per scheme, not as points on a load axis
    that spans nothing; two loads are an axis."""
    from gpuyard.sweep.report import LOAD, write_report

    one = results({"fifo": [3600.0, 7200.0, 5400.0], "las": [1800.0, 3600.0, 2700.0]})
    assert not LOAD.present(one)
    assert LOAD.present(pd.concat([one, one.assign(load=5.0)]))
    one.to_parquet(tmp_path / "results.parquet")
    page = write_report(tmp_path)[-1].read_text()
    assert "mean JCT per scheme" in page and "vs load" not in page
    summary = pd.read_csv(tmp_path / "report" / "summary.csv")
    assert summary["load"].tolist() == [10.0, 10.0]  # (the table still says which)
