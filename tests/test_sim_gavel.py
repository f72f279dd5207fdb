"""Gavel's simulator semantics (`gpuyard sim --gavel`) and Gavel's policies, end to end over NATS."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from gpuyard.run.simulate import SimOptions, simulate
from gpuyard.shared.model import ClusterSpec, JobSpec
from gpuyard.shared.policy import scheduling_policies

GAVEL_POLICIES = [
    "gavel_fifo", "fifo_perf", "max_min_fairness", "max_min_fairness_perf",
    "max_min_fairness_packed", "max_min_fairness_water_filling",
    "max_min_fairness_water_filling_perf", "max_min_fairness_water_filling_packed",
    "finish_time_fairness", "finish_time_fairness_perf", "finish_time_fairness_packed",
    "min_total_duration", "min_total_duration_perf", "min_total_duration_packed",
    "max_sum_throughput_perf", "max_sum_throughput_normalized_by_cost_perf",
    "max_sum_throughput_normalized_by_cost_perf_SLOs", "isolated", "allox", "gandiva",
]  # fmt: skip


def toy_table(path: Path) -> str:
    """Gavel's format: A does 1 step/s on a v100 and 0.5 on a k80, B 0.77 and 0.25; together on
    one GPU each runs at 60% of its speed."""
    alone = {"v100": {"A": 1.0, "B": 0.77}, "k80": {"A": 0.5, "B": 0.25}}
    table = {
        t: {
            f"('{job}', 1)": {
                "null": rate,
                **{f"('{other}', 1)": [0.6 * rate, 0.6 * speeds[other]] for other in speeds},
            }
            for job, rate in speeds.items()
        }
        for t, speeds in alone.items()
    }
    path.write_text(json.dumps(table))
    return str(path)


def job(job_id: str, job_type: str, steps: float, arrival: float) -> JobSpec:
    return JobSpec(
        job_id=job_id, num_gpus=1, job_type=job_type, total_steps=steps, submit_time=arrival
    )


async def test_rounds_micro_tasks_idle_gpus_and_arrivals_at_round_ends(
    tmp_path: Path, nats_url: str
) -> None:
    """Two v100s, 360 s rounds. B runs int(0.77 x 360) = 277 steps a round, so a round lasts
    277 / 0.77 = 359.74 s; A (100 steps) is done after 100 s, its JCT counts to then (as Gavel's),
    but its GPU waits for the round's end; C arrives at 50 s and is admitted then."""
    options = SimOptions(
        cluster=ClusterSpec.parse("2x1:v100"), policy="fifo_perf", preset="gavel", round_s=360.0,
        throughputs=toy_table(tmp_path / "t.json"),
    )  # fmt: skip
    jobs = [job("a", "A", 100.0, 0.0), job("b", "B", 1000.0, 0.0), job("c", "A", 50.0, 50.0)]
    result = await simulate(options, jobs, tmp_path / "out", nats_url=nats_url)
    by_id = {r.job_id: r for r in result.jobs}
    first_round = 277 / 0.77
    assert by_id["a"].end_time == pytest.approx(100.0)
    assert by_id["c"].first_start == pytest.approx(first_round)  # admitted at the round's end
    assert by_id["c"].end_time == pytest.approx(first_round + 50.0)  # 50 s of work
    # B: three full rounds (831 steps), then 169 steps that end the last round early.
    assert by_id["b"].end_time == pytest.approx(3 * first_round + 169 / 0.77)
    # Utilisation counts compute time only: A's 100 s, C's 50 s and B's 1000 / 0.77 s.
    busy = 100 + 50 + 1000 / 0.77
    assert result.summary["utilization"] == pytest.approx(busy / (2 * by_id["b"].end_time))


async def test_rounds_refuse_time_limits_in_one_line(tmp_path: Path, nats_url: str) -> None:
    """Gavel's rounds do not simulate time limits: a job with one fails the run at its start,
    naming it, rather than running past its limit."""
    options = SimOptions(
        cluster=ClusterSpec.parse("1x1:v100"), policy="fifo_perf", preset="gavel", round_s=360.0,
        throughputs=toy_table(tmp_path / "t.json"),
    )  # fmt: skip
    limited = msgspec.structs.replace(job("a", "A", 100.0, 0.0), time_limit_s=60.0)
    with pytest.raises(RuntimeError, match="job 'a' has a time limit: Gavel's rounds"):
        await simulate(options, [limited], tmp_path / "out", nats_url=nats_url)


async def test_the_scheduler_hears_the_steps_the_simulated_nodes_did(
    tmp_path: Path, nats_url: str
) -> None:
    """Two v100s, three jobs time-sharing them (agnostic LAS). A round with A (360 steps: 360 s)
    and B lasts 360 s, but B's micro-task is int(0.77 x 360) = 277 steps: it idles the last 0.26
    s. The simulated nodes publish nothing back to placement: the steps of the jobs a round stops
    reach the scheduler with the clock's next request, so B's record holds exactly 277 steps a
    round it ran (not the 277.2 its rate and the round's length make)."""
    options = SimOptions(
        cluster=ClusterSpec.parse("2x1:v100"), policy="max_min_fairness", preset="gavel",
        round_s=360.0, throughputs=toy_table(tmp_path / "t.json"), window=(0, 1),
    )  # fmt: skip
    jobs = [job("a", "A", 1800.0, 0.0), job("b", "B", 10_000.0, 0.0), job("c", "A", 10_000.0, 0.0)]
    result = await simulate(options, jobs, tmp_path / "out", nats_url=nats_url)
    by_id = {r.job_id: r for r in result.jobs}
    assert by_id["a"].state == "completed" and by_id["b"].preemptions > 0
    assert by_id["b"].steps_done > 0 and by_id["b"].steps_done % 277 == 0
    assert by_id["c"].steps_done > 0 and by_id["c"].steps_done % 360 == 0


@pytest.mark.slow
@pytest.mark.parametrize("policy", GAVEL_POLICIES)
async def test_every_gavel_policy_runs_a_heterogeneous_workload(
    tmp_path: Path, nats_url: str, policy: str
) -> None:
    assert policy in scheduling_policies.names()
    jobs = [job(f"j{i}", "AB"[i % 2], 400.0 + 150 * i, 40.0 * i) for i in range(10)]
    options = SimOptions(
        cluster=ClusterSpec.parse("2x1:v100,2x1:k80"), policy=policy, preset="gavel",
        round_s=120.0, throughputs=toy_table(tmp_path / "t.json"),
    )  # fmt: skip
    result = await simulate(options, jobs, tmp_path / "out", nats_url=nats_url)
    assert result.summary["completed"] == len(jobs), result.summary
    await simulate(options, jobs, tmp_path / "again", nats_url=nats_url, cluster_name="b")
    assert (tmp_path / "out" / "jobs.csv").read_bytes() == (
        tmp_path / "again" / "jobs.csv"
    ).read_bytes()


@pytest.mark.slow
async def test_heterogeneity_aware_las_beats_agnostic_las(tmp_path: Path, nats_url: str) -> None:
    """A's jobs are twice as fast on a v100, B's three times: the aware policy gives each type to
    the jobs that gain most from it, and the mean JCT falls (Gavel's headline effect)."""
    table = toy_table(tmp_path / "t.json")
    jobs = [job(f"j{i}", "AB"[i % 2], 1500.0, 30.0 * i) for i in range(16)]
    mean: dict[str, float] = {}
    for policy in ("max_min_fairness", "max_min_fairness_perf"):
        options = SimOptions(
            cluster=ClusterSpec.parse("2x1:v100,2x1:k80"), policy=policy, preset="gavel",
            round_s=120.0, throughputs=table,
        )  # fmt: skip
        result = await simulate(
            options,
            jobs,
            tmp_path / policy,
            nats_url=nats_url,
            cluster_name=policy.replace("_", "-"),
        )
        mean[policy] = result.summary["mean_jct"]
    assert mean["max_min_fairness_perf"] < 0.95 * mean["max_min_fairness"], mean


async def test_a_measurement_window_ends_the_run_and_measures_its_jobs(
    tmp_path: Path, nats_url: str
) -> None:
    """Gavel's `jobs_to_complete`: one v100, FIFO, jobs 1 and 2 (in arrival order) are the window.
    The run ends when both have ended (job 3 still waits: it is not run to its end), and the JCT
    figures are theirs only."""
    options = SimOptions(
        cluster=ClusterSpec.parse("1x1:v100"), policy="fifo_perf", preset="gavel", round_s=360.0,
        throughputs=toy_table(tmp_path / "t.json"), window=(1, 3),
    )  # fmt: skip
    jobs = [job(f"j{i}", "A", 360.0 * (i + 1), 10.0 * i) for i in range(5)]
    result = await simulate(options, jobs, tmp_path / "out", nats_url=nats_url)
    states = {r.job_id: r.state for r in result.jobs}
    assert states["j1"] == states["j2"] == "completed"
    assert states["j3"] != "completed" and states["j4"] != "completed"
    windowed = [r.end_time - r.submit_time for r in result.jobs if r.job_id in ("j1", "j2")]
    assert result.summary["mean_jct"] == pytest.approx(sum(windowed) / 2)
    assert result.summary["measured_jobs"] == 2 and result.summary["window"] == [1, 3]
    # The run stopped at j2's end: nothing simulated past it.
    assert result.summary["simulated_s"] == max(r.end_time for r in result.jobs if r.end_time)
