"""Queues on a real cluster, applied at runtime (real agents, the CLI as the operator): `gpuyard
policy set scheduler kueue --queues FILE` puts the scheduler under Kueue's quotas, and a new file
changes them without a restart; a bad file changes nothing. A job the queues never run is refused
at submission in one line (no queue for its user, a priority class not defined, a time limit
over its queue's), and one waiting for quota says so."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gpuyard.cli import main

from .test_cluster_views import Views, counter, views  # noqa: F401 (the fixture)
from .test_hold import said

pytestmark = pytest.mark.slow

QUEUES = """
priority_classes = {{ high = 100 }}
[[queue]]
name = "team-a"
users = ["alice"]
quota = {{ t4 = {quota} }}
max_time_limit_s = 3600
"""


async def policy_set(cluster: Views, *args: str) -> tuple[int, str, str]:
    """`gpuyard policy set scheduler ARGS` as the operator: status, stdout, stderr."""
    argv = ["policy", "set", "scheduler", "--nats-config", cluster.profile("op.admin"), *args]

    def run() -> int:
        try:
            return main(argv)
        except SystemExit as exc:  # argparse
            return int(exc.code or 0)

    async with cluster.cli:
        code = await asyncio.to_thread(run)
        captured = cluster.capsys.readouterr()
    return code, captured.out, captured.err


async def test_queues_are_applied_at_runtime_and_a_bad_file_changes_nothing(
    views: Views,  # noqa: F811 (the fixture imported)
    tmp_path: Path,
) -> None:
    one, two = tmp_path / "one.toml", tmp_path / "two.toml"
    one.write_text(QUEUES.format(quota=1))
    two.write_text(QUEUES.format(quota=2))
    code, _, err = await views.gpuyard("user.alice", "queues")
    assert code == 1 and "the scheduler's policy is fifo, which has no queues" in err
    code, out, err = await policy_set(views, "kueue", "--queues", str(one))
    assert code == 0 and "scheduler: fifo -> kueue" in "\n".join(said(out)), err
    first = await views.submit("user.alice", *counter(100000))
    second = await views.submit("user.alice", *counter(100000))
    await views.until_row(first, "RUNNING")
    await asyncio.sleep(1.0)  # (decisions at each arrival: the second's is long made)
    # Two GPUs free, a quota of one: the second waits, and says for what.
    row = (await views.rows(second))[second]
    assert row["job_state"] == "PENDING"
    assert (
        row["state_reason"]
        == "QuotaExceeded (queue team-a holds 1 of its 1 t4 GPUs; it asks for 1)"
    )
    assert row["spec"]["time_limit_s"] == 3600  # (the queue's maximum, as no limit was asked for)
    for identity, args, why in [
        ("user.bob", (), "user 'bob' has no queue"),
        ("user.alice", ("--priority-class", "urgent"),
         "priority class 'urgent' is not defined (defined: high)"),
        ("user.alice", ("--time-limit", "2:00:00"),
         "time limit of 2:00:00 is over queue team-a's maximum of 1:00:00"),
    ]:  # fmt: skip
        code, _, err = await views.gpuyard(identity, "submit", *args, *counter(1))
        assert code == 1 and why in err and len(err.strip().splitlines()) == 1, err
    high = await views.submit("user.alice", "--priority-class", "high", *counter(1))
    assert (await views.rows(high))[high]["spec"]["priority"] == 100
    code, _, err = await views.gpuyard("user.alice", "cancel", high)
    assert code == 0, err
    code, out, err = await views.gpuyard("user.alice", "queues", "--json")
    assert code == 0, err
    (row,) = json.loads(next(line for line in said(out) if line.startswith("{")))["queues"]
    assert row == {"queue": "team-a", "cohort": "", "quota": {"t4": 1}, "held": {"t4": 1},
                   "borrowed": {}, "lent": {}, "running": 1, "waiting": 1,
                   "why": {"QuotaExceeded": 1}}  # fmt: skip
    code, out, _ = await views.gpuyard("user.alice", "queues")
    assert said(out)[0].split() == ["QUEUE", "COHORT", "QUOTA", "HELD", "BORROWED", "LENT",
                                    "RUNNING", "WAITING", "WHY"]  # fmt: skip

    (tmp_path / "bad.toml").write_text('[[queue]]\nname = "x"\nquota = { t4 = -1 }\n')
    code, _, err = await policy_set(views, "kueue", "--queues", str(tmp_path / "bad.toml"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "bad.toml" in err
    code, _, err = await policy_set(views, "kueue", "--queues", str(two))
    assert code == 0, err
    await views.until_row(second, "RUNNING")
    code, out, err = await views.gpuyard("user.alice", "acct", "--summary", "--json")
    assert code == 0, err
    summed = json.loads(next(line for line in said(out) if line.startswith("{")))
    assert summed["queues"]["team-a"]["jobs"] >= 2  # (its user's queue, not a tenant)
    for job_id in (first, second):
        code, _, err = await views.gpuyard("user.alice", "cancel", job_id)
        assert code == 0, err
