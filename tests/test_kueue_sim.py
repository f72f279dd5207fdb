"""Kueue's queues in a simulation (a real nats-server, the services, the clock): a queue borrows
its cohort's unused quota and the lender takes it back when its own jobs come (reclaim); the
queues file's mistakes are one line each."""

from __future__ import annotations

from pathlib import Path

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
