"""Kueue's queues in a simulation (a real nats-server, the services, the clock): a queue borrows
its cohort's unused quota and the lender takes it back when its own jobs come (reclaim); the
queues file's mistakes are one line each."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import structlog

from gpuyard.cli import main
from gpuyard.ops import read_events
from gpuyard.policies.kueue import queue_params
from gpuyard.run.simulate import SimOptions, simulate
from gpuyard.shared.connection import connect
from gpuyard.shared.endpoints import Subjects
from gpuyard.shared.model import ClusterSpec, JobSpec

QUEUES = """
[[queue]]
name = "team-a"
users = ["alice"]
cohort = "lab"
quota = { gpu = 4 }
reclaim_within_cohort = "any"

[[queue]]
name = "team-b"
users = ["bob"]
cohort = "lab"
quota = { gpu = 4 }
reclaim_within_cohort = "any"
"""


@pytest.mark.slow
async def test_a_queue_borrows_its_cohorts_quota_and_the_lender_takes_it_back(
    tmp_path: Path, nats_url: str
) -> None:
    """Alice's eight one-GPU jobs (1,000 s each) take all 8 GPUs at t=0, four of them borrowed
    from bob's queue; bob's four jobs come at t=100: four of alice's are preempted then, the
    newest first, and bob's start at once."""
    (tmp_path / "queues.toml").write_text(QUEUES)
    jobs = [JobSpec(job_id=f"a{i}", num_gpus=1, duration=1000.0, submit_time=float(i), user="alice")
            for i in range(8)]  # fmt: skip
    jobs += [JobSpec(job_id=f"b{i}", num_gpus=1, duration=100.0, submit_time=100.0, user="bob")
             for i in range(4)]  # fmt: skip
    options = SimOptions(
        cluster=ClusterSpec.parse("1x8"), policy="kueue",
        policy_params=queue_params(tmp_path / "queues.toml"),
    )  # fmt: skip
    result = await simulate(options, jobs, tmp_path / "out", nats_url=nats_url)
    by_id = {r.job_id: r for r in result.jobs}
    assert [by_id[f"b{i}"].first_start for i in range(4)] == [100.0] * 4
    assert [by_id[f"a{i}"].preemptions for i in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(by_id[f"a{i}"].first_start == float(i) for i in range(8))  # (all ran at first)
    assert by_id["a7"].reason == "" and by_id["a7"].end_time is not None
    assert all(r.state == "completed" for r in result.jobs)
    nc = await connect(nats_url, name="test")
    preempted = [e.event async for e in read_events(nc, Subjects("sim"), types=["job.preempted"])]
    await nc.drain()
    assert sorted((e.job_id, e.reason) for e in preempted if e is not None) == [
        (f"a{7 - i}", f"reclaimed by queue team-b for b{i}") for i in range(3, -1, -1)
    ]


def test_the_queues_option_says_what_is_wrong_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "bad.toml").write_text('[[queue]]\nname = "a"\nquota = { gpu = 4 }\nusers = ["x"]\n'
                                       '[[queue]]\nname = "b"\nquota = { gpu = 4 }\nusers = ["x"]\n')  # fmt: skip
    cases = [
        (["--queues", str(tmp_path / "bad.toml")], "add --policy kueue"),
        (["--policy", "kueue", "--queues", str(tmp_path / "bad.toml")],
         "user 'x' is in queues 'a' and 'b'"),
        (["--policy", "kueue", "--queues", str(tmp_path / "none.toml")],
         "none.toml: No such file or directory"),
    ]  # fmt: skip
    try:
        for args, said in cases:
            code = main(["sim", "--jobs", "5", "--out", str(tmp_path / "o"), *args])
            err = capsys.readouterr().err
            assert code == 2 and said in err and len(err.strip().splitlines()) == 1, (args, err)
    finally:
        structlog.reset_defaults()


FAIR = """
priority_classes = { urgent = 50 }
[fair_sharing]
[[queue]]
name = "lender"
users = ["carol"]
cohort = "lab"
quota = { gpu = 8 }
[[queue]]
name = "team-a"
users = ["alice"]
cohort = "lab"
quota = { gpu = 0 }
reclaim_within_cohort = "any"
[[queue]]
name = "team-b"
users = ["bob"]
cohort = "lab"
quota = { gpu = 0 }
reclaim_within_cohort = "any"
"""


@pytest.mark.slow
async def test_fair_sharing_evens_out_what_two_queues_borrow_and_classes_are_resolved(
    tmp_path: Path, nats_url: str
) -> None:
    """Both queues borrow the lender's 8 GPUs: alice's eight jobs take them all at t=0; bob's
    come at t=100 and, under fair sharing, take four back at once (equal shares of what is lent),
    or wait for alice's to end without it. A job naming a class the file does not define is
    declined; one naming `urgent` runs at its priority."""
    jobs = [JobSpec(job_id=f"a{i}", num_gpus=1, duration=1000.0, submit_time=float(i), user="alice")
            for i in range(8)]  # fmt: skip
    jobs += [JobSpec(job_id=f"b{i}", num_gpus=1, duration=100.0, submit_time=100.0, user="bob")
             for i in range(4)]  # fmt: skip
    jobs += [JobSpec(job_id="odd", num_gpus=1, duration=10.0, submit_time=5.0, user="bob",
                     priority_class="nope"),
             JobSpec(job_id="classy", num_gpus=1, duration=10.0, submit_time=2000.0, user="bob",
                     priority_class="urgent")]  # fmt: skip
    starts: dict[bool, dict[str, float | None]] = {}
    for fair in (True, False):
        text = FAIR if fair else FAIR.replace("[fair_sharing]\n", "")
        (tmp_path / "queues.toml").write_text(text)
        options = SimOptions(cluster=ClusterSpec.parse("1x8"), policy="kueue",
                             policy_params=queue_params(tmp_path / "queues.toml"))  # fmt: skip
        out = tmp_path / f"out{fair}"
        result = await simulate(options, jobs, out, nats_url=nats_url)
        by_id = {r.job_id: r for r in result.jobs}
        starts[fair] = {j: r.first_start for j, r in by_id.items()}
        assert by_id["classy"].spec.priority == 50 and by_id["classy"].state == "completed"
        table = pd.read_csv(out / "jobs.csv", dtype={"job_id": str}).set_index("job_id")
        assert "odd" not in by_id and table.loc["odd", "admission"] == "declined"
        assert (
            table.loc["odd", "reason"] == "priority class 'nope' is not defined (defined: urgent)"
        )
    assert [starts[True][f"b{i}"] for i in range(4)] == [100.0] * 4
    assert all((starts[False][f"b{i}"] or 0.0) >= 1000.0 for i in range(4))
