"""Sia's policy (`gpuyard.policies.sia`) on its own: its configuration set, its program on
CP-SAT against brute force, its costs (normalisation, bootstrapping, restart factor) and its
decisions over hand-built jobs on made-up per-type profiles (no NATS, no artifact)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from gpuyard.policies.sia import (
    Sia,
    configurations,
    costs,
    docked,
    normalised_row,
    objective,
    restart_factor,
    solve,
)
from gpuyard.policies.sia.ilp import Configurations
from gpuyard.policies.sia.synthetic import write_profiles
from gpuyard.shared.goodput import GoodputFunction
from gpuyard.shared.model import Allocation, GoodputHints, JobSpec
from gpuyard.shared.policy import ClusterView, JobView, NodeStatus, SchedulingInput
from gpuyard.shared.typed_goodput import TypedGoodputJob, TypedProfiles

SPEEDS = {"fast": 1.0, "slow": 0.25}


def brute_force(
    a: np.ndarray, configs: Configurations, lambda_n: float, maximise: bool = False
) -> float:
    """The reference's program by enumeration: every job on one configuration or none."""
    best = -np.inf if maximise else np.inf
    for pick in itertools.product(range(-1, len(configs)), repeat=a.shape[0]):
        choice = np.asarray(pick)
        on = choice >= 0
        used = np.bincount(
            configs.type_index[choice[on]], weights=configs.gpus[choice[on]],
            minlength=len(configs.types),
        )  # fmt: skip
        if (used <= configs.capacity).all():
            value = objective(a, choice, lambda_n)
            best = max(best, value) if maximise else min(best, value)
    return best


def random_costs(
    rng: np.random.Generator, jobs: int, configs: Configurations, p: float
) -> np.ndarray:
    rows = []
    for _ in range(jobs):
        goodput = rng.uniform(0.5, 2.0, len(configs.types))[
            configs.type_index
        ] * configs.gpus ** rng.uniform(0.3, 1.0)
        goodput[configs.gpus > rng.choice([1, 2, 4, 8])] = np.nan
        unknown = rng.random(len(configs.types)) < 0.2
        row = normalised_row(goodput, unknown, configs)
        current = int(rng.integers(-1, len(configs)))
        row = docked(row, None if current < 0 else current, float(rng.uniform(0.3, 1.0)))
        rows.append(costs(row, p))
    return np.asarray(rows)


def test_configurations_follow_the_reference_tables() -> None:
    configs = configurations({"aws": (16, 4), "dgx": (8, 8), "rtx": (3, 8)})
    by_type = {
        t: configs.gpus[configs.type_index == i].tolist() for i, t in enumerate(configs.types)
    }
    assert by_type["aws"] == [1, 2, 4, *range(8, 65, 4)]
    assert by_type["dgx"] == [1, 2, 4, 8, *range(16, 65, 8)]
    assert by_type["rtx"] == [1, 2, 4, 8, 16, 24]
    assert configs.capacity.tolist() == [64, 64, 24]
    assert configs.nodes[configs.type_index == 0].tolist() == [1, 1, 1, *range(2, 17)]
    capped = configurations({"aws": (16, 4)}, max_nodes={"aws": 2})
    assert capped.gpus.tolist() == [1, 2, 4, 8] and capped.capacity.tolist() == [64]


@pytest.mark.parametrize("seed", range(12))
def test_program_optimum_equals_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    configs = configurations({"a": (1, 4), "b": (2, 2)})  # 1,2,4 and 1,2,4: 6 configurations
    a = random_costs(rng, 4, configs, -0.5)
    expected = brute_force(a, configs, 1.1)
    for fix_by_lp in (True, False):
        found = solve(a, configs, 1.1, relative_gap=0.0, fix_by_lp=fix_by_lp)
        assert found.optimal
        assert found.objective == pytest.approx(expected, abs=1e-9)
        assert found.bound is None or found.bound <= found.objective + 1e-9


@pytest.mark.parametrize("seed", range(4))
def test_program_maximises_for_positive_p(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    configs = configurations({"a": (1, 4), "b": (1, 2)})
    a = random_costs(rng, 4, configs, 0.5)
    found = solve(a, configs, -1.1, maximise=True, relative_gap=0.0)
    assert found.objective == pytest.approx(brute_force(a, configs, -1.1, maximise=True), abs=1e-9)


def test_held_jobs_keep_their_configuration_and_others_use_the_rest() -> None:
    configs = configurations({"a": (1, 4)})
    four = configs.index("a", 4)
    one = configs.index("a", 1)
    assert four is not None and one is not None
    a = np.full((2, len(configs)), 0.5)
    a[0, :] = 1.2  # job 0 would rather give its GPUs away (above lambda_n)...
    a[1, four] = 0.4
    held = solve(a, configs, 1.1, forced={0: one}, relative_gap=0.0)
    assert held.choice.tolist()[0] == one  # ...but it is restoring: it keeps them
    assert configs.gpus[held.choice[1]] <= 3
    free = solve(a, configs, 1.1, relative_gap=0.0)
    assert free.choice.tolist()[1] == four and free.choice[0] == -1


def test_rows_are_normalised_to_their_least_useful_configuration() -> None:
    configs = configurations({"a": (1, 4), "b": (1, 4)})
    goodput = np.array([10.0, 18.0, 30.0, 40.0, 70.0, 100.0])
    row = normalised_row(goodput, np.zeros(2, dtype=bool), configs)
    assert row.min() == 1.0 and row.tolist() == pytest.approx((goodput / 10.0).tolist())
    goodput[[2, 5]] = np.nan  # 4 GPUs not allowed
    row = normalised_row(goodput, np.zeros(2, dtype=bool), configs)
    assert row[2] == row[5] == pytest.approx(1e-4)
    assert costs(row, -0.5)[2] == 100.0  # 1e-4^-0.5: never worth it


def test_a_job_that_never_ran_is_offered_one_gpu_of_each_type() -> None:
    configs = configurations({"a": (1, 4), "b": (2, 8)})
    row = normalised_row(np.full(len(configs), np.nan), np.ones(2, dtype=bool), configs)
    assert row[configs.gpus == 1].tolist() == [1.0, 1.0]
    assert (row[configs.gpus > 1] == 1e-4).all()


def test_restart_factor_and_docking() -> None:
    assert restart_factor(20.0, 3, 30.0) == 1.0  # younger than the penalty
    assert restart_factor(600.0, 0, 30.0) == pytest.approx(600 / 630)
    assert restart_factor(600.0, 4, 120.0) == pytest.approx(120 / 720)
    assert restart_factor(600.0, 10, 120.0) == 0.0
    row = np.array([1.0, 2.0, 3.0])
    assert docked(row, 1, 0.5).tolist() == [0.5, 2.0, 1.5]
    assert docked(row, None, 0.5).tolist() == [1.0, 2.0, 3.0]
    assert costs(np.array([0.0, 4.0, 1.0 / 3.0]), -0.5).tolist() == [3000.0, 0.5, 1.73]


def test_program_is_deterministic() -> None:
    rng = np.random.default_rng(7)
    configs = configurations({"a": (6, 4), "b": (2, 8), "c": (3, 8)})
    a = random_costs(rng, 60, configs, -0.5)
    first = solve(a, configs, 1.1)
    for _ in range(2):
        again = solve(a, configs, 1.1)
        assert again.choice.tolist() == first.choice.tolist()
        assert again.objective == first.objective


# -- the policy ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_profiles(tmp_path_factory.mktemp("sia"), SPEEDS)


def cluster() -> ClusterView:
    nodes = [NodeStatus(node_id=f"f{i}", gpu_type="fast", num_gpus=8) for i in range(2)]
    nodes += [NodeStatus(node_id=f"s{i}", gpu_type="slow", num_gpus=4) for i in range(4)]
    return ClusterView(capacity={"fast": 16, "slow": 16}, round_s=60.0, nodes=nodes)


def hints(replicas: int, speed: float = 1.0) -> GoodputHints:
    """A job's report after running on `replicas` GPUs of a type `speed` times the fastest."""
    # alpha_c, beta_c: the synthetic profiles' compute time; the network terms small.
    return GoodputHints(
        perf=(0.01 / speed, 0.001 / speed, 0.02, 0.001, 0.005, 0.001, 1.0),
        grad_sqr=1.0, grad_var=2.0, max_profiled_replicas=replicas,
    )  # fmt: skip


def view(
    job_id: str, seq: int, *, gpu_type: str | None = None, gpus: int = 0,
    report: GoodputHints | None = None, submit: float = 0.0, attempt: int = 0,
    run_start: float = 0.0,
) -> JobView:  # fmt: skip
    spec = JobSpec(job_id=job_id, job_type="synth", num_gpus=1, batch_size=1024)
    if gpu_type is not None:
        return JobView(
            job_id=job_id, seq=seq, spec=spec, state="running", submit_time=submit, gpus=gpus,
            gpu_type=gpu_type, goodput=report, attempt=attempt, run_start=run_start,
        )  # fmt: skip
    return JobView(job_id=job_id, seq=seq, spec=spec, state="queued", submit_time=submit)


def decide(policy: Sia, now: float, jobs: list[JobView]) -> list[Allocation]:
    answer = policy.schedule(SchedulingInput(now=now, jobs=jobs, cluster=cluster()))
    assert isinstance(answer, list)
    return answer


def test_new_jobs_get_one_gpu(profiles: Path) -> None:
    policy = Sia(Sia.Params(profiles=str(profiles)))
    got = decide(policy, 60.0, [view("a", 0), view("b", 1)])
    assert sorted((a.job_id, a.num_gpus) for a in got) == [("a", 1), ("b", 1)]


def test_bootstrapping_projects_goodput_by_one_gpu_throughput(profiles: Path) -> None:
    policy = Sia(Sia.Params(profiles=str(profiles)))
    job = view("a", 0, gpu_type="fast", gpus=1, report=hints(1))
    policy.schedule(SchedulingInput(now=600.0, jobs=[job], cluster=cluster()))
    configs = configurations({"fast": (2, 8), "slow": (4, 4)})
    row, unknown = policy.goodput_row(job, configs, {"fast": (2, 8), "slow": (4, 4)})
    assert not unknown.any()
    fast, slow = configs.index("fast", 2), configs.index("slow", 2)
    assert fast is not None and slow is not None
    ratio = policy.profiles.one_gpu_rate("synth", "slow") / policy.profiles.one_gpu_rate(
        "synth", "fast"
    )
    assert ratio == pytest.approx(0.25, rel=0.05)
    assert row[slow] == pytest.approx(ratio * row[fast])
    # Most GPUs: twice what it ran on.
    assert np.isnan(row[configs.gpus > 2]).all()
    assert not policy.Params(profiles="x", project=False).project


def test_no_projection_offers_one_gpu_on_an_unprofiled_type(profiles: Path) -> None:
    policy = Sia(Sia.Params(profiles=str(profiles), project=False))
    job = view("a", 0, gpu_type="fast", gpus=1, report=hints(1))
    policy.schedule(SchedulingInput(now=600.0, jobs=[job], cluster=cluster()))
    configs = configurations({"fast": (2, 8), "slow": (4, 4)})
    _, unknown = policy.goodput_row(job, configs, {"fast": (2, 8), "slow": (4, 4)})
    assert unknown.tolist() == [False, True]


def test_restart_penalty_keeps_a_job_where_it_runs(profiles: Path) -> None:
    # Alone, a job that reported on 4 fast GPUs would grow to 8; docked by its restart factor
    # after many restarts, it stays on 4.
    young = view("a", 0, gpu_type="fast", gpus=4, report=hints(4), attempt=1, run_start=0.0)
    grown = decide(Sia(Sia.Params(profiles=str(profiles))), 600.0, [young])
    assert [(a.gpu_type, a.num_gpus) for a in grown] == [("fast", 8)]
    worn = view("a", 0, gpu_type="fast", gpus=4, report=hints(4), attempt=20, run_start=0.0)
    kept = decide(Sia(Sia.Params(profiles=str(profiles))), 600.0, [worn])
    assert [(a.gpu_type, a.num_gpus) for a in kept] == [("fast", 4)]


def test_a_restoring_job_is_held(profiles: Path) -> None:
    # Restarted 10 s ago (the synthetic model restores for the default 30 s): it keeps 1 GPU.
    job = view("a", 0, gpu_type="slow", gpus=1, report=hints(4, 0.25), attempt=1, run_start=590.0)
    held = decide(Sia(Sia.Params(profiles=str(profiles))), 600.0, [job])
    assert [(a.gpu_type, a.num_gpus) for a in held] == [("slow", 1)]
    free = decide(Sia(Sia.Params(profiles=str(profiles), hold_restoring=False)), 600.0, [job])
    assert [(a.gpu_type, a.num_gpus) for a in free] != [("slow", 1)]


def test_decisions_are_deterministic_and_within_capacity(profiles: Path) -> None:
    rng = np.random.default_rng(3)
    jobs = []
    for i in range(24):
        if i % 3 == 0:
            jobs.append(view(f"j{i}", i, submit=float(i)))
        else:
            gpu_type = "fast" if i % 2 else "slow"
            reps = int(rng.choice([1, 2, 4]))
            jobs.append(view(f"j{i}", i, gpu_type=gpu_type, gpus=reps, report=hints(reps),
                             submit=float(i), attempt=1))  # fmt: skip
    first = decide(Sia(Sia.Params(profiles=str(profiles))), 900.0, jobs)
    again = decide(Sia(Sia.Params(profiles=str(profiles))), 900.0, jobs)
    assert first == again
    for gpu_type, cap in cluster().capacity.items():
        assert sum(a.num_gpus for a in first if a.gpu_type == gpu_type) <= cap


def test_accepts_only_profiled_models(profiles: Path) -> None:
    policy = Sia(Sia.Params(profiles=str(profiles)))
    assert isinstance(policy.accepts(JobSpec(job_id="a", job_type="synth", num_gpus=2)), JobSpec)
    assert isinstance(policy.accepts(JobSpec(job_id="a", job_type="nope", num_gpus=2)), str)
    with pytest.raises(ValueError):
        Sia(Sia.Params())


def test_batched_goodput_equals_one_job_at_a_time(profiles: Path) -> None:
    policy = Sia(Sia.Params(profiles=str(profiles)))
    jobs = [
        view("a", 0, gpu_type="fast", gpus=2, report=hints(4)),
        view("b", 1, gpu_type="slow", gpus=1, report=hints(2, 0.25)),
    ]
    policy.schedule(SchedulingInput(now=600.0, jobs=jobs, cluster=cluster()))
    shape = {"fast": (2, 8), "slow": (4, 4)}
    configs = configurations(shape)
    rows, _ = policy.goodput_rows(jobs, configs, shape)
    for i, job in enumerate(jobs):
        assert job.goodput is not None and job.gpu_type is not None
        app = policy.profiles.app("synth", job.gpu_type)
        fn = GoodputFunction(job.goodput.perf, (1.0, 2.0), app.init_batch_size)
        on = configs.type_index == configs.types.index(job.gpu_type)
        usable = on & ~np.isnan(rows[i])
        expected = fn.optimize(
            configs.nodes[usable].astype(float), configs.gpus[usable].astype(float),
            max_batch_size=1024, atomic_bsz_range=(app.min_local_bsz, app.max_local_bsz),
            accumulation=True,
        )[0]  # fmt: skip
        assert rows[i][usable] == pytest.approx(expected, rel=1e-12)


# -- the job side: training on several GPU types ------------------------------------------


def test_typed_job_keeps_a_model_per_type_and_restarts_on_a_move(profiles: Path) -> None:
    typed = TypedProfiles(profiles)
    job = TypedGoodputJob(typed, "synth", ("fast", "slow"), restart_s=10.0)
    job.move("fast", (2,))
    assert job.num_restarts == 0 and job.rescale_time == 10.0
    job.step(60.0)
    fast = job.hints_on("fast")
    assert fast is not None and fast.max_profiled_replicas == 2
    assert job.hints_on("slow") is None
    job.move("fast", (2,))  # unchanged: no restart
    assert job.num_restarts == 0
    job.move("slow", (2,))  # another type: a restart even with the same shape
    assert job.num_restarts == 1 and job.rescale_time == 10.0
    job.step(60.0)
    kept, slow = job.hints_on("fast"), job.hints_on("slow")
    assert kept is not None and kept.perf == fast.perf  # its fast model is kept...
    assert kept.grad_sqr != fast.grad_sqr  # ...with the latest gradient statistics
    assert slow is not None and slow.perf != fast.perf


def test_typed_job_progresses_at_its_goodput_over_its_slowdown(profiles: Path) -> None:
    typed = TypedProfiles(profiles)
    quick = TypedGoodputJob(typed, "synth", ("fast",), restart_s=0.0, slowdown=1.0)
    slow = TypedGoodputJob(typed, "synth", ("fast",), restart_s=0.0, slowdown=2.0)
    for job in (quick, slow):
        job.move("fast", (1,))
        job.step(30.0)
    assert quick.progress == pytest.approx(2 * slow.progress)
