"""Gavel's heterogeneity-aware max-min fairness on a real cluster, through the CLI as an operator
runs it: `gpuyard up --policy max_min_fairness_perf` with a throughput table as the prior, two node
agents whose GPUs (from flags) are of two types, and examples/train.py jobs whose speed depends on
the GPU type they get (`--step-time-on`, from the `GPUYARD_GPU_TYPE` the agent sets).

The table says both job types run twice as fast on v100 as on k80, so the policy gives each half
of its time on each type and the round mechanism moves them every round. What the jobs report
says otherwise: one is 5x faster on v100, the other 2x faster on k80 (the opposite of the table).
The node agents measure each run's rate, the scheduler learns the job types' throughputs from
them, solves again, and each job then stays on the type it is faster on."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.polling import until
from tests.test_real_elastic import ElasticCluster

from .jobaccount import JOB_PYTHON

pytestmark = pytest.mark.slow  # (integration: `pytest -m "not slow"` leaves it out)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train.py"
ROUND_S = 2.0
STEPS = 1_000_000  # more than the test lasts: the jobs run until the agents stop
STEP_S = {  # seconds per step on each GPU type: what the jobs really do
    "fast-on-v100": {"v100": 0.01, "k80": 0.05},  # 100 vs 20 steps/s
    "fast-on-k80": {"v100": 0.04, "k80": 0.02},  # 25 vs 50 steps/s
}
PRIOR = {  # the table: v100 twice as fast as k80 for both (wrong for fast-on-k80)
    "v100": {"('fast-on-v100', 1)": {"null": 100.0}, "('fast-on-k80', 1)": {"null": 50.0}},
    "k80": {"('fast-on-v100', 1)": {"null": 50.0}, "('fast-on-k80', 1)": {"null": 25.0}},
}
NODES = {"a": "v100", "b": "k80"}


class GavelCluster(ElasticCluster):
    """The control plane under Gavel's policy with the table as its prior, and two agents of one
    GPU each, of two types."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, nodes=tuple(NODES))
        self.prior = root / "prior.json"
        self.prior.write_text(json.dumps(PRIOR))

    def start(self) -> None:
        self.up("--no-durable", "--policy", "max_min_fairness_perf", "--throughputs",
                str(self.prior), "--round", str(ROUND_S), "--min-resolve-s", str(2 * ROUND_S))  # fmt: skip
        for node, gpu_type in NODES.items():
            self.agent(node, 1, gpu_type)

    def submit_both(self) -> None:
        jobs = [
            {"job_id": job_type, "job_type": job_type, "num_gpus": 1, "total_steps": STEPS,
             "command": train(job_type)}
            for job_type in STEP_S
        ]  # fmt: skip
        path = self.root / "jobs.json"
        path.write_text(json.dumps({"jobs": jobs}))
        out = self.gpuyard("submit", "--nats-config", self.alice, "--file", str(path)).stdout
        assert out.split() == ["submitted", "fast-on-v100", "submitted", "fast-on-k80"], out

    def types_run_on(self, job_id: str) -> list[str]:
        """The GPU type of each run of the job, in order, from train.py's start lines."""
        runs = []
        for node in NODES:
            text = self.log(job_id, node=node)
            runs += [
                (int(m[1]), m[2]) for m in re.finditer(r"attempt=(\d+) .* gpu_type=(\w+)", text)
            ]
        return [gpu_type for _, gpu_type in sorted(runs)]


def train(job_type: str) -> list[str]:
    per_type = [f"--step-time-on={t}={s}" for t, s in STEP_S[job_type].items()]
    return [*JOB_PYTHON, str(EXAMPLE), "--steps", str(STEPS), *per_type,
            "--checkpoint-every", "100000"]  # fmt: skip


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[GavelCluster]:
    c = GavelCluster(tmp_path)
    try:
        c.start()
        yield c
    finally:
        c.close()


@pytest.mark.timeout(120)
def test_learned_throughputs_move_each_job_to_the_type_it_is_faster_on(
    cluster: GavelCluster,
) -> None:
    cluster.submit_both()
    # On the table's word both jobs are alike: each spends half its time on each type, and
    # every run on a type is measured there.
    for job_id in STEP_S:
        until(lambda j=job_id: {"v100", "k80"} <= set(cluster.types_run_on(j)),
              f"{job_id} run on both types", 45)  # fmt: skip

    # Then each settles on the type it is measured faster on, and stays there round after round.
    settled = {"fast-on-v100": "v100", "fast-on-k80": "k80"}

    def placed() -> dict[str, dict[str, Any]] | None:
        jobs = cluster.jobs()
        ok = all(
            jobs[j]["state"] == "running" and jobs[j]["gpu_type"] == t for j, t in settled.items()
        )
        return jobs if ok else None

    def stays() -> dict[str, dict[str, Any]] | None:
        before = placed()
        if before is None:
            return None
        time.sleep(3 * ROUND_S)  # three rounds: alternating jobs would have moved by then
        after = placed()
        if after is None or any(after[j]["attempt"] != before[j]["attempt"] for j in settled):
            return None
        runs.update({j: cluster.types_run_on(j) for j in settled})  # (as they were then)
        return after

    runs: dict[str, list[str]] = {}
    final = until(stays, "each job to stay on its faster type for 3 rounds", 60)
    # What the scheduler measured is what the jobs do there: at most their nominal 100 and 50
    # steps/s (a job that sleeps per step only slows on a loaded machine: 65 steps/s was seen
    # with the suite in three processes on two cores), and above the table's 25 for fast-on-k80.
    for job_id, nominal in (("fast-on-v100", 100.0), ("fast-on-k80", 50.0)):
        rate = final[job_id]["rate"]
        assert 0.55 * nominal <= rate <= 1.05 * nominal, final[job_id]
    # Both explored both types before (the table alone would keep them alternating).
    for job_id, gpu_type in settled.items():
        ran = runs[job_id]
        assert ran[-1] == gpu_type and {"v100", "k80"} <= set(ran), (job_id, ran)
