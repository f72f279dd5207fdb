"""A simulation with queues (Kueue's): each job's queue in `jobs.csv`, each queue's figures in
`summary.json` and the printed summary, the GPUs each queue holds over time (the clock counts
them as jobs start and stop: `queues.csv`) and `queues.png`; the grouping the users' and the
queues' figures share; the clock's per-queue counts and their pages."""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import structlog

from gpuyard.cli import main
from gpuyard.report import QueueLayout, by_group, by_user, queue_gpu_seconds, write_results
from gpuyard.results import Table, TimelineRows, job_rows
from gpuyard.services.simclock import timeline as timeline_module
from gpuyard.services.simclock.agents import SimJob, SimNodes
from gpuyard.services.simclock.config import QueueMap
from gpuyard.services.simclock.costs import PreemptionCost
from gpuyard.services.simclock.timeline import QueueChanges, Timeline
from gpuyard.shared.contract import Launch, NodeCommand, QueueGpus, TimelinePoint
from gpuyard.shared.model import ClusterSpec, JobRecord, JobSpec

# Two cohorts and a queue of none, on 10 GPUs: alice's five 1-GPU jobs (1,000 s) take team-a's
# quota of 3 and borrow 2 of team-b's, which bob leaves unused but one; carol (team-c) and dave
# (solo) stay within their quotas; eve is in no queue (the file has no default): declined.
QUEUES = """
[[queue]]
name = "team-a"
users = ["alice"]
cohort = "lab"
quota = { gpu = 3 }

[[queue]]
name = "team-b"
users = ["bob"]
cohort = "lab"
quota = { gpu = 3 }

[[queue]]
name = "team-c"
users = ["carol"]
cohort = "ops"
quota = { gpu = 2 }

[[queue]]
name = "solo"
users = ["dave"]
quota = { gpu = 2 }
"""
TRACE = """job_id,user,num_gpus,duration,submit_time
a0,alice,1,1000,0
a1,alice,1,1000,0
a2,alice,1,1000,0
a3,alice,1,1000,0
a4,alice,1,1000,0
c0,carol,1,300,0
c1,carol,1,300,0
d0,dave,2,200,5
b0,bob,1,500,10
e0,eve,1,100,20
"""
CLUSTER_GPUS = 10
QUEUE_OF = {"alice": "team-a", "bob": "team-b", "carol": "team-c", "dave": "solo", "eve": ""}


def held_at(rows: list[dict[str, str]], queue: str, t: float) -> int:
    """The GPUs `queue` holds at `t` by `queues.csv` (its last row at or before `t`; none: 0)."""
    before = [int(r["gpus"]) for r in rows if r["queue"] == queue and float(r["time"]) <= t]
    return before[-1] if before else 0


@pytest.mark.slow
def test_a_run_with_queues_gives_each_queues_jobs_figures_and_gpus_over_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "queues.toml").write_text(QUEUES)
    (tmp_path / "jobs.csv").write_text(TRACE)
    out = tmp_path / "out"
    try:
        code = main(["sim", "--trace", str(tmp_path / "jobs.csv"), "--policy", "kueue",
                     "--queues", str(tmp_path / "queues.toml"),
                     "--cluster-spec", f"1x{CLUSTER_GPUS}", "--out", str(out)])  # fmt: skip
    finally:
        structlog.reset_defaults()
    printed = capsys.readouterr().out
    assert code == 0

    # jobs.csv: each job's queue by its user, after the user; blank for none.
    with open(out / "jobs.csv", newline="") as f:
        jobs = list(csv.DictReader(f))
    assert list(jobs[0])[6:8] == ["user", "queue"]
    assert {r["job_id"]: r["queue"] for r in jobs} == {
        r["job_id"]: QUEUE_OF[r["user"]] for r in jobs
    }
    assert [r["state"] for r in jobs if r["user"] == "eve"] == ["declined"]
    assert all(r["preemptions"] == "0" for r in jobs)  # (so a job holds its GPUs start to end)

    # summary.json: each queue's figures, in the file's order.
    summary = json.loads((out / "summary.json").read_text())
    queues = summary["queues"]
    assert list(queues) == ["team-a", "team-b", "team-c", "solo"]
    assert {q: (f["jobs"], f["completed"], f["quota"], f["cohort"]) for q, f in queues.items()} == {
        "team-a": (5, 5, 3, "lab"), "team-b": (1, 1, 3, "lab"), "team-c": (2, 2, 2, "ops"),
        "solo": (1, 1, 2, ""),
    }  # fmt: skip
    total_gpu_hours = sum(float(r["gpu_seconds"]) for r in jobs) / 3600
    assert sum(f["gpu_hours"] for f in queues.values()) == pytest.approx(total_gpu_hours)
    assert sum(f["gpu_share"] for f in queues.values()) == pytest.approx(1.0)
    assert queues["team-a"]["gpu_hours"] == pytest.approx(5 * 1000 / 3600)
    # team-a holds 5 of its quota's 3 for the 1,000 s its jobs run: 2,000 GPU-seconds borrowed.
    assert queues["team-a"]["borrowed_gpu_hours"] == pytest.approx(2 * 1000 / 3600)
    for lender in ("team-b", "team-c", "solo"):
        assert queues[lender]["borrowed_gpu_hours"] == 0.0, lender
    assert queues["team-a"]["mean_jct"] == 1000.0 and queues["team-b"]["mean_jct"] == 500.0
    # Every job ran as long as it waited for nothing: every queue's mean slowdown is 1.
    assert summary["queues_jain_slowdown"] == pytest.approx(1.0)
    # The queues' mean GPUs held, together, are the utilisation's busy GPUs.
    mean_gpus = sum(f["mean_usage"] for f in queues.values())
    assert mean_gpus == pytest.approx(summary["utilization"] * CLUSTER_GPUS)
    assert queues["team-a"]["mean_usage"] == pytest.approx(5.0)  # (the run is its jobs' 1,000 s)

    # queues.csv: where each queue's GPUs changed; never more than the cluster's together, and
    # at any time what its jobs' intervals say.
    with open(out / "queues.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["time", "queue", "gpus"]
    assert [float(r["time"]) for r in rows] == sorted(float(r["time"]) for r in rows)
    times = sorted({float(r["time"]) for r in rows})
    for t in times:
        assert sum(held_at(rows, q, t) for q in queues) <= CLUSTER_GPUS
    ran = [r for r in jobs if r["start"]]
    edges = sorted({float(r[k]) for r in ran for k in ("start", "end")})
    samples = edges + [(a + b) / 2 for a, b in itertools.pairwise(edges)]
    for t in samples:
        for q in queues:
            expected = sum(int(r["num_gpus"]) for r in ran if r["queue"] == q
                           and float(r["start"]) <= t < float(r["end"]))  # fmt: skip
            assert held_at(rows, q, t) == expected, (q, t)
    assert held_at(rows, "team-a", 0.0) == 5 and held_at(rows, "team-a", 1000.0) == 0

    # The printed summary: a row per queue, with what it borrowed.
    table = printed[printed.index("queues       4 in 2 cohorts") :].splitlines()
    assert table[1].split()[:4] == ["queue", "cohort", "quota", "jobs"]
    assert table[2].split()[:4] == ["team-a", "lab", "3", "5"] and table[2].endswith("0.56")
    assert table[5].split()[:2] == ["solo", "-"]

    # queues.png: drawn, titled with the policy, the workload and the queues file.
    from PIL import Image

    with Image.open(out / "queues.png") as png:
        title = png.info["Title"]
    assert "kueue with queues.toml" in title and "trace jobs.csv" in title


def ten_seconds(i: int, user: str) -> JobRecord:
    """A 1-GPU job of `user` that ran from 0 to 10 s."""
    spec = JobSpec(job_id=f"j{i}", num_gpus=1, user=user)
    return JobRecord(job_id=f"j{i}", seq=i, spec=spec, state="completed", submit_time=0.0,
                     admit_time=0.0, first_start=0.0, end_time=10.0, gpu_seconds=10.0,
                     executed_time=10.0)  # fmt: skip


def test_results_without_queues_are_as_before_and_with_them_gain_a_queue_column(
    tmp_path: Path,
) -> None:
    """Written from the same rows: no `queue` column, no `queues` figures, no `queues.csv`
    without queues; with them, the column (after `user`) and the figures, the rest the same."""
    records = [ten_seconds(i, user) for i, user in enumerate(["alice", "bob", "alice", "nobody"])]
    points = TimelineRows()
    points.extend([TimelinePoint(0.0, 4, 0, 4, 4), TimelinePoint(10.0, 0, 0, 0, 4)])
    points.extend_queues([QueueGpus(0.0, "a", 2), QueueGpus(0.0, "b", 1), QueueGpus(10.0, "a", 0),
                          QueueGpus(10.0, "b", 0)])  # fmt: skip
    layout = QueueLayout(
        queues=QueueMap(names=["a", "b"], users={"alice": "a", "bob": "b"}),
        cohorts=["c", "c"], quotas=[1, 1],
    )  # fmt: skip
    plain = write_results(job_rows(records), points, tmp_path / "plain", plots=False)
    queued = write_results(job_rows(records), points, tmp_path / "queued", plots=False,
                           queues=layout)  # fmt: skip
    assert "queues" not in plain and not (tmp_path / "plain" / "queues.csv").exists()
    assert {k: v for k, v in queued.items() if not k.startswith("queues")} == plain
    header = (tmp_path / "plain" / "jobs.csv").read_text().splitlines()[0].split(",")
    with_queue = (tmp_path / "queued" / "jobs.csv").read_text().splitlines()
    assert with_queue[0].split(",") == [*header[:7], "queue", *header[7:]]
    assert [line.split(",")[7] for line in with_queue[1:]] == ["a", "b", "a", ""]
    assert queued["queues"]["a"]["borrowed_gpu_hours"] == pytest.approx(10 / 3600)
    assert queued["queues"]["b"]["borrowed_gpu_hours"] == 0.0
    assert (tmp_path / "queued" / "queues.csv").read_text() == (
        "time,queue,gpus\n0.0,a,2\n0.0,b,1\n10.0,a,0\n10.0,b,0\n"
    )


# ------------------------------------------------------------------ the grouping


def jobs_table(users: list[str], queues: list[str], states: list[str],
               jct: list[float], gpu_seconds: list[float]) -> Table:  # fmt: skip
    n = len(users)
    column = np.empty(n, dtype=object)
    texts: dict[str, np.ndarray] = {}
    for name, values in (("user", users), ("queue", queues), ("state", states)):
        texts[name] = column.copy()
        texts[name][:] = values
    jct_ = np.array(jct, dtype=float)
    return Table({
        **texts, "jct": jct_, "queueing_delay": jct_ / 2, "slowdown": jct_ / 10,
        "gpu_seconds": np.array(gpu_seconds, dtype=float),
    })  # fmt: skip


def test_jobs_grouped_by_a_column_give_each_groups_figures_once() -> None:
    jobs = jobs_table(
        users=["bob", "alice", "bob", "", "carol"],
        queues=["q2", "q1", "q2", "q1", "elsewhere"],
        states=["completed", "completed", "failed", "completed", "completed"],
        jct=[100.0, 20.0, np.nan, 40.0, 10.0],
        gpu_seconds=[3600.0, 1800.0, 1800.0, 0.0, 0.0],
    )
    # Named by the jobs: sorted, a blank name in none.
    users, jain = by_group(jobs, "user")
    assert list(users) == ["alice", "bob", "carol"]
    assert users["bob"] == {
        "jobs": 2, "completed": 1, "mean_jct": 100.0, "mean_queueing_delay": 50.0,
        "gpu_hours": 1.5, "gpu_share": 1.5 / 2.0,
    }  # fmt: skip
    slowdowns = np.array([2.0, 10.0, 1.0])  # (alice, bob, carol: their mean JCT over 10)
    assert jain == pytest.approx(slowdowns.sum() ** 2 / (3 * (slowdowns**2).sum()))
    assert by_user(jobs) == {"users": users, "users_jain_slowdown": jain}
    # Given groups: in their order, each whether it has jobs or not; a job of none left out.
    queues, jain = by_group(jobs, "queue", ["q2", "empty", "q1"])
    assert list(queues) == ["q2", "empty", "q1"]
    assert queues["q1"]["jobs"] == 2 and queues["q1"]["mean_jct"] == 30.0
    assert queues["empty"] == {
        "jobs": 0, "completed": 0, "mean_jct": None, "mean_queueing_delay": None,
        "gpu_hours": 0.0, "gpu_share": 0.0,
    }  # fmt: skip
    assert queues["q2"]["gpu_share"] + queues["q1"]["gpu_share"] == pytest.approx(1.0)
    assert jain == pytest.approx((10.0 + 3.0) ** 2 / (2 * (10.0**2 + 3.0**2)))
    assert by_user(jobs.where(np.array([True, False, True, False, False]))) == {}  # one user


def test_a_queues_gpu_seconds_above_its_quota_are_borrowed() -> None:
    layout = QueueLayout(queues=QueueMap(names=["a", "b"]), cohorts=["", ""], quotas=[2, 4])
    names = np.empty(5, dtype=object)
    names[:] = ["a", "b", "a", "a", "b"]
    rows = Table({"time": np.array([0.0, 0.0, 10.0, 30.0, 40.0]), "queue": names,
                  "gpus": np.array([5, 3, 1, 6, 0])})  # fmt: skip
    held, borrowed = queue_gpu_seconds(rows, layout, 5.0, 50.0)  # (from 5 s to 50 s)
    # a: 5 GPUs 5-10 s, 1 GPU 10-30 s, 6 GPUs 30-50 s; b: 3 GPUs 5-40 s.
    assert held.tolist() == [5 * 5 + 1 * 20 + 6 * 20, 3 * 35]
    assert borrowed.tolist() == [3 * 5 + 4 * 20, 0.0]


# ------------------------------------------------------------------ the clock's counts


def test_the_clock_counts_each_queues_gpus_as_parts_start_and_stop() -> None:
    """A launch adds a part's GPUs to its job's queue, a stop takes them away; a job that moves
    at an instant changes nothing then; changes told out of time order are served in it."""
    changes = QueueChanges(QueueMap(names=["a", "b"], users={"u": "a"}, default_queue="b"))
    assert (changes.index_of("u"), changes.index_of("other")) == (0, 1)
    nodes = SimNodes(ClusterSpec.parse("2x4"), PreemptionCost(), changes)
    for job, user in (("j", "u"), ("k", "v")):
        spec = JobSpec(job_id=job, num_gpus=2, duration=100.0, user=user)
        nodes.jobs[job] = SimJob(spec, 100.0, nodes.queue_of(user))

    def launch(job: str, gpus: list[int]) -> Launch:
        return Launch(job_id=job, gpus=gpus, world_size=len(gpus), rank_offset=0, node_rank=0,
                      num_nodes=1, master_addr="", master_port=0)  # fmt: skip

    node0, node1 = sorted(nodes.node_specs)
    nodes.command(NodeCommand(now=0.0, node_id=node0, launch=[launch("j", [0, 1])]))
    nodes.command(NodeCommand(now=0.0, node_id=node0, launch=[launch("k", [2, 3])]))
    nodes.command(NodeCommand(now=5.0, node_id=node0, preempt=["j"]))  # j moves at 5 s
    nodes.command(NodeCommand(now=5.0, node_id=node1, launch=[launch("j", [0, 1])]))
    nodes.command(NodeCommand(now=8.0, node_id=node1, launch=[launch("j", [0, 1, 2])]))  # grows
    nodes.detach("k", node0, 9.0)  # k exits at 9 s ...
    nodes.command(NodeCommand(now=12.0, node_id=node1, preempt=["j"]))
    nodes.detach("k", node0, 9.0)  # (... and a part already gone changes nothing)
    changes.change(7.0, 1, 4)  # told after 12 s: a change at 7 s
    time, queue, gpus = (c.tolist() for c in changes.series())
    assert list(zip(time, queue, gpus, strict=True)) == [
        (0.0, 0, 2), (0.0, 1, 2), (7.0, 1, 6), (8.0, 0, 3), (9.0, 1, 4), (12.0, 0, 0),
    ]  # fmt: skip


def test_the_timelines_pages_give_every_queue_row_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each page has the rows from its first point's time to the next page's; a page whose
    rows would be too many has fewer points."""
    changes = QueueChanges(QueueMap(names=["a", "b"]))
    timeline = Timeline(changes)
    for t in range(10):
        timeline.put(TimelinePoint(float(t), 0, 0, 0, 8))
        changes.change(float(t), 0, 1)
        changes.change(float(t) + 0.5, 1, 1)
    changes.change(-1.0, 1, 1)  # (before the first point: on the first page)
    every = changes.rows(0, len(changes.series()[0]))
    assert len(every) == 21 and timeline.queue_page(0, 100) == (100, every)  # (a page: all)
    assert Timeline().queue_page(3, 100) == (100, [])  # (a run without queues: none)
    monkeypatch.setattr(timeline_module, "QUEUE_ROWS_PER_PAGE", 5)
    seen: list[QueueGpus] = []
    offset = 0
    while offset < len(timeline):
        points, rows = timeline.queue_page(offset, 4)
        assert points >= 1 and (len(rows) <= 5 or points == 1)
        assert all(timeline.page(offset, 1)[0].time <= r.time for r in rows) or offset == 0
        seen += rows
        offset += points
    assert seen == every
