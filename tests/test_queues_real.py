"""Queues on a real cluster, applied at runtime (real agents, the CLI as the operator): `gpuyard
policy set scheduler kueue --queues FILE` puts the scheduler under Kueue's quotas, and a new file
changes them without a restart; a bad file changes nothing."""

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
[[queue]]
name = "team-a"
users = ["alice"]
quota = {{ t4 = {quota} }}
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
    # Two GPUs free, a quota of one: the second waits.
    assert (await views.rows(second))[second]["job_state"] == "PENDING"
    code, out, err = await views.gpuyard("user.alice", "queues", "--json")
    assert code == 0, err
    (row,) = json.loads(next(line for line in said(out) if line.startswith("{")))["queues"]
    assert row == {"queue": "team-a", "cohort": "", "quota": {"t4": 1}, "held": {"t4": 1},
                   "borrowed": {}, "running": 1, "waiting": 1}  # fmt: skip
    code, out, _ = await views.gpuyard("user.alice", "queues")
    assert said(out)[0].split() == ["QUEUE", "COHORT", "QUOTA", "HELD", "BORROWED", "RUNNING",
                                    "WAITING"]  # fmt: skip

    (tmp_path / "bad.toml").write_text('[[queue]]\nname = "x"\nquota = { t4 = -1 }\n')
    code, _, err = await policy_set(views, "kueue", "--queues", str(tmp_path / "bad.toml"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "bad.toml" in err
    code, _, err = await policy_set(views, "kueue", "--queues", str(two))
    assert code == 0, err
    await views.until_row(second, "RUNNING")
    for job_id in (first, second):
        code, _, err = await views.gpuyard("user.alice", "cancel", job_id)
        assert code == 0, err
