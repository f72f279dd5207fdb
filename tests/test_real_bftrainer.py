"""BFTrainer on a real cluster, with real processes: `gpuyard up --policy bftrainer` on an
embedded nats-server under credentials, node agents of one GPU each (BFTrainer's node: the
policy's unit is a GPU slot, so a one-GPU agent is one node), and an elastic job of
examples/train.py submitted with its bounds and rescale costs. An agent started is a node turning
idle: the MILP grows the job onto it. The agent stopped (SIGTERM) is the node taken back: the
job's part there checkpoints and the job goes on at the smaller size. Each change restarts the
job at its new world size from rank 0's checkpoint, through the job client."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.polling import until
from tests.test_real_elastic import CLUSTER, ElasticCluster, runs, train

pytestmark = pytest.mark.slow  # (integration: `pytest -m "not slow"` leaves it out)


def steps_on(cluster: ElasticCluster, job: str, rank: int, node: str) -> int:
    """The step a rank has reported, from its progress file (the scheduler's `steps_done`
    follows it only at decisions)."""
    path = cluster.root / node / "logs" / CLUSTER / job / "run" / f"progress.rank{rank}.json"
    try:
        return int(json.loads(path.read_text())["iterations"])
    except (OSError, ValueError, KeyError):
        return 0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ElasticCluster]:
    c = ElasticCluster(tmp_path, nodes=("a", "b"))
    try:
        # Decisions follow events (arrivals, exits, nodes joining and leaving), never the
        # round: a long one shows that none waits for it.
        c.up("--policy", "bftrainer", "--param", "tfwd=10", "--param", "time_limit_s=2",
             "--round", "30")  # fmt: skip
        c.agent("a", gpus=1)
        yield c
    finally:
        c.close()


def test_bftrainer_grows_a_job_onto_a_node_that_joins_and_shrinks_it_when_the_node_leaves(
    cluster: ElasticCluster,
) -> None:
    steps = 1000
    submitted = cluster.submit("--min-gpus", "1", "--max-gpus", "2", "--steps", str(steps),
                               "--rescale-up-s", "1", "--rescale-down-s", "2", "--",
                               *train(steps))  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.split()[-1]
    until(lambda: runs(cluster.log(job)) == [(1, 0)], f"{job} on node a alone")

    # Node b turns idle. With no throughput table the policy assumes linear scaling (the
    # scheduler refines it from the job's reports): a second node is worth Tfwd x one node's
    # rate (10 s of it), growing costs Tcup x the rate before (1 s of it), so the job grows onto
    # b, its rank 0 staying on a.
    cluster.agent("b", gpus=1)
    until(lambda: len(runs(cluster.log(job))) == 2, f"{job} grown", 30)
    until(lambda: "start_step" in cluster.log(job, 1, node="b"), f"{job}'s rank 1 on b")
    grown = runs(cluster.log(job))[1][1]
    until(lambda: steps_on(cluster, job, 1, "b") > grown + 100, f"{job} training on 2")

    # Node b is taken back: its part checkpoints, the job goes on on a alone.
    cluster.stop_agent("b")
    until(lambda: f"done at step {steps}" in cluster.log(job), f"{job} done", 40)
    record = until(lambda: (r := cluster.jobs()[job])["state"] == "completed" and r, "its exit")

    # Grown without a stay in the queue; shrunk through a preemption (the node's part is
    # gone), relaunched on what is left at once.
    events = [json.loads(line) for line in cluster.gpuyard(
        "tail", "--nats-config", str(cluster.profiles / "op.admin.json"), "--job", job, "--json",
        "--type", "job.started", "--type", "job.resized", "--type", "job.preempted",
        "--type", "job.completed",
    ).stdout.splitlines()]  # fmt: skip
    assert [(e["type"], e.get("gpus"), e.get("reason")) for e in events] == [
        ("job.started", [["a", 0]], None),
        ("job.resized", [["a", 0], ["b", 0]], None),
        ("job.preempted", None, "node b gone: agent stopped"),
        ("job.started", [["a", 0]], None),
        ("job.completed", None, None),
    ], events
    assert events[3]["now"] - events[2]["now"] < 5, events  # not a round (30 s) later
    assert record["preemptions"] == 1

    rank0, rank1 = cluster.log(job), cluster.log(job, 1, node="b")
    seen = runs(rank0)
    assert [w for w, _ in seen] == [1, 2, 1], seen
    assert "resized: world size 1 -> 2" in rank0 and "resized: world size 2 -> 1" in rank0
    firsts = [s for _, s in seen]
    assert firsts[0] == 0 and firsts[0] < firsts[1] < firsts[2] < steps, seen  # progress kept
    # Every stop was a checkpoint at the step the next run started from.
    stopped = [int(s) for s in re.findall(r"preempted at step (\d+): checkpointed", rank0)]
    assert stopped == firsts[1:], (stopped, firsts)
    # Rank 1 started from rank 0's checkpoint, and checkpointed when its node was taken back.
    assert runs(rank1) == [(2, firsts[1])], rank1
    assert re.search(r"preempted at step \d+: checkpointed", rank1), rank1
    assert f"done at step {steps}" in rank0 and "done at step" not in rank1

    assert record["attempt"] == len(seen) == 3
    assert sorted(record["ran_on"]) == ["a", "b"]
    assert record["steps_done"] == steps and record["total_steps"] == steps
    spec = record["spec"]
    assert (spec["min_gpus"], spec["max_gpus"]) == (1, 2)
    assert (spec["rescale_up_s"], spec["rescale_down_s"]) == (1.0, 2.0)
