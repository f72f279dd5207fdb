"""BFTrainer end to end: node churn replayed through the real services, costs, metrics, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from gpuyard.run.simulate import SimOptions, simulate
from gpuyard.shared.model import ClusterSpec, JobSpec
from gpuyard.workloads.churn import load_node_events, load_node_list, replay_events

CURVE = "job,Ns,Ps,Os,Tsub\nA,0 1 2 4,0 10 20 40,0 10 20 40,2021-02-10 00:00:00\n"


@pytest.mark.parametrize(
    ("tfwd", "end", "rescale", "utilisation"),
    [
        # t=0: A takes the 4 idle nodes (40 samples/s). t=100: n4 is taken back: A pays Tcdw x 40
        # = 40 samples and keeps its 3 other nodes. t=200: n4 is idle again: growing 3 -> 4 gains
        # Tfwd x 10 and costs Tcup x 30 = 60: worth it at Tfwd 10 (10,900 samples: done at 300)...
        (10.0, 300.0, 60.0, 1.0),
        # ... not at Tfwd 5: A stays on 3 nodes, 3,940 samples left at 30/s after t=200.
        (
            5.0,
            200.0 + 3940.0 / 30.0,
            0.0,
            (400 + 300 + 3 * 3940 / 30) / (400 + 300 + 4 * 3940 / 30),
        ),
    ],
)
@pytest.mark.slow
async def test_a_node_taken_back_preempts_its_share_and_growth_pays_its_cost(
    tmp_path: Path, nats_url: str, tfwd: float, end: float, rescale: float, utilisation: float
) -> None:
    curve = tmp_path / "JNPs.csv"
    curve.write_text(CURVE)
    events = tmp_path / "node_events.csv"
    events.write_text("time,node,up\n0,n1,1\n0,n2,1\n0,n3,1\n0,n4,1\n100,n4,0\n200,n4,1\n")
    job = JobSpec(
        job_id="A", job_type="A", num_gpus=4, min_gpus=1, max_gpus=4, total_steps=10_900.0,
        submit_time=0.0, rescale_up_s=2.0, rescale_down_s=1.0,
    )  # fmt: skip
    options = SimOptions(
        cluster=ClusterSpec(groups=[]), policy="bftrainer", policy_params={"tfwd": tfwd},
        throughputs=str(curve), node_events=str(events),
    )  # fmt: skip
    result = await simulate(options, [job], tmp_path / "out", nats_url=nats_url)
    (record,) = result.jobs
    assert record.end_time == pytest.approx(end)
    assert record.preemptions == 1
    s = result.summary
    assert s["preemption_cost_samples"] == pytest.approx(40.0)
    assert s["rescale_cost_samples"] == pytest.approx(rescale)
    assert s["samples_trained"] == pytest.approx(10_900.0)
    assert s["idle_node_utilization"] == pytest.approx(utilisation)
    assert s["decisions"] >= 3 and s["decision_s_p99"] >= s["decision_s_p50"] > 0
    assert (tmp_path / "out" / "idle_nodes.png").stat().st_size > 0


@pytest.mark.slow
def test_replay_of_the_reference_window_matches_its_replayer(data: Callable[[str], Path]) -> None:
    """BFTrainer's replayer (github.com/BFTrainer/Replayer): 64 nodes from 2021-02-10 20:21:15
    give 3,707 instants (row 0 and 3,706 events), the last at 22:16:58 two weeks on, with 4 nodes
    idle at the start."""
    nodes = load_node_list(data("bftrainer/replay_nodes_64.txt"))
    start = pd.Timestamp("2021-02-10 20:21:15")
    events = replay_events(
        load_node_events(data("bftrainer/node_events.csv.gz"), origin=start.to_pydatetime()), nodes
    )
    assert events["time"].nunique() == 3707
    assert start + pd.Timedelta(seconds=events["time"].max()) == pd.Timestamp("2021-02-24 22:16:58")
    assert sorted(events.loc[events["time"] == 0, "node"]) == sorted(
        ["g13n14", "e29n02", "f03n15", "f03n11"]
    )
    # every kept event changes its node's state
    flips = events.groupby("node")["up"].apply(
        lambda s: bool((s.to_numpy()[1:] != s.to_numpy()[:-1]).all())
    )
    assert flips.all()


@pytest.mark.slow
def test_cli_replays_a_node_subset_from_a_start_time(tmp_path: Path, nats_url: str) -> None:
    """`--nodes-from` keeps the listed nodes, `--start` sets their state then (n2 went idle before
    it; n1 was idle and busy again), repeated states are dropped, other nodes are ignored, and the
    jobs' times count from the start."""
    (tmp_path / "Jbnd.csv").write_text(
        "job,Tcup,Tcdw,Jmin,Jmax,Pmax,Tsub\n"
        "A,2.0,1.0,1,4,6000.0,2021-02-10 00:00:00\n"
        "B,2.0,1.0,1,4,3000.0,2021-02-10 01:00:50\n"
    )
    (tmp_path / "JNPs.csv").write_text(CURVE + CURVE.splitlines()[1].replace("A,", "B,", 1) + "\n")
    (tmp_path / "events.csv").write_text(
        "time,node,idle\n"
        "2021-02-10 00:10:00,n1,1\n2021-02-10 00:20:00,n1,0\n2021-02-10 00:30:00,n2,1\n"
        "2021-02-10 01:00:00,n9,1\n"  # not in the list
        "2021-02-10 01:00:10,n3,1\n2021-02-10 01:00:20,n3,1\n"  # the same state again
        "2021-02-10 01:02:00,n1,1\n2021-02-10 02:00:00,n2,0\n"
    )
    (tmp_path / "nodes.txt").write_text("n1\nn2\nn3\n")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", "sim", "--nats", nats_url, "--cluster", "bft",
         "--policy", "bftrainer", "--param", "tfwd=10", "--trace", str(tmp_path / "Jbnd.csv"),
         "--throughputs", str(tmp_path / "JNPs.csv"), "--node-events", str(tmp_path / "events.csv"),
         "--nodes-from", str(tmp_path / "nodes.txt"), "--start", "2021-02-10 01:00:00",
         "--cluster-spec", "none", "--out", str(out), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    replayed = pd.read_csv(out / "node_events.csv")
    assert replayed.values.tolist() == [
        [0.0, "n2", True],
        [10.0, "n3", True],
        [120.0, "n1", True],
        [3600.0, "n2", False],
    ]
    jobs = pd.read_csv(out / "jobs.csv").set_index("job_id")
    assert jobs.loc["A", "arrival"] == 0.0  # submitted before the start: there at the start
    assert jobs.loc["B", "arrival"] == 50.0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 2
    assert 0 < summary["idle_node_utilization"] <= 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes-from", "nodes.txt"], "apply to --node-events"),
        (["--node-events", "nodes.txt", "--policy", "bftrainer,bftrainer-equal"],
         "--node-events: one run at a time, not a comparison"),
    ],
)  # fmt: skip
def test_cli_refuses_node_options_it_would_ignore(
    tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "nodes.txt").write_text("n1\n")
    proc = subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", "sim", *args, "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_a_node_log_that_is_not_text_is_one_error_naming_it(tmp_path: Path) -> None:
    from gpuyard.workloads.churn import load_node_events
    from gpuyard.workloads.core import WorkloadError

    (tmp_path / "events.csv").write_bytes(b"\x95\x00\xff" * 10)
    with pytest.raises(WorkloadError, match=r"events\.csv: not a node log \(not UTF-8 text\)$"):
        load_node_events(tmp_path / "events.csv")


@pytest.mark.parametrize(
    ("log", "message"),
    [
        ("time,node,idle\n0,n1,1\n5,n2,0,9\n", "events.csv: Expected 3 fields in line 3, saw 4"),
        ("time,node,idle\n2021-02-10 00:48:48,n1,1\nsoon,n2,0\n",
         "events.csv, line 3, field 'time': 'soon' is not a time"),
        ("time,node\n0,n1\n", "need a column 'idle' (BFTrainer) or 'up' (normalised)"),
    ],
)  # fmt: skip
@pytest.mark.slow
def test_a_broken_node_log_is_one_line_naming_the_file(
    tmp_path: Path, log: str, message: str
) -> None:
    (tmp_path / "events.csv").write_text(log)
    (tmp_path / "JNPs.csv").write_text(CURVE)
    (tmp_path / "Jbnd.csv").write_text(
        "job,Tcup,Tcdw,Jmin,Jmax,Pmax,Tsub\nA,2,1,1,2,1000,2021-02-10 00:00:00\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", "sim", "--policy", "bftrainer", "--trace",
         "Jbnd.csv", "--throughputs", "JNPs.csv", "--node-events", "events.csv", "--out", "out"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("gpuyard sim: ") and message in line
    assert not (tmp_path / "out" / "summary.json").exists()


async def test_replayer_semantics_admit_and_end_jobs_at_node_events(
    tmp_path: Path, nats_url: str
) -> None:
    """`preset="bftrainer"` (`--bftrainer`): A arrives at 50 but is admitted at the next node event,
    100, where it takes both idle nodes (20 samples/s); its 1,000 samples are done at 150, which
    the replayer sees at the next node event, 400: A holds its nodes until then."""
    curve = tmp_path / "JNPs.csv"
    curve.write_text(CURVE)
    events = tmp_path / "node_events.csv"
    events.write_text("time,node,up\n0,n1,1\n100,n2,1\n400,n2,0\n")
    job = JobSpec(
        job_id="A", job_type="A", num_gpus=2, min_gpus=1, max_gpus=2, total_steps=1000.0,
        submit_time=50.0, rescale_up_s=2.0, rescale_down_s=1.0,
    )  # fmt: skip
    options = SimOptions(
        cluster=ClusterSpec(groups=[]), policy="bftrainer", throughputs=str(curve),
        node_events=str(events), preset="bftrainer",
    )  # fmt: skip
    result = await simulate(options, [job], tmp_path / "out", nats_url=nats_url)
    (record,) = result.jobs
    assert (record.submit_time, record.first_start, record.end_time) == (50.0, 100.0, 400.0)
    assert result.summary["idle_node_utilization"] == pytest.approx(600 / 700)
