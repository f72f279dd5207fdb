"""Adaptive batch sizes on a real cluster, piece by piece (no cluster): the job client's
measurements and environment, the agent's reading of them and the job's environment, the fit
and the batch choice, and the scheduler's fits (tests/test_real_goodput.py runs them together)."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuyard.jobclient import PROFILE_MAX_CONFIGS, JobClient
from gpuyard.services.nodeagent.procs import JobPart, Places, Starter, process_envs
from gpuyard.services.scheduler.batches import AdaptiveBatches
from gpuyard.services.scheduler.jobs import JobTable
from gpuyard.shared.contract import BatchChoice, ClusterInfo, JobProgress, Launch
from gpuyard.shared.goodput import (
    GoodputFunction,
    GradParams,
    PerfParams,
    choose_batch,
    fit_goodput_hints,
    split_batch,
)
from gpuyard.shared.model import (
    Allocation,
    BatchLimits,
    GoodputProfile,
    JobSpec,
    NodeSpec,
    StepTimes,
)

TRUE = PerfParams(0.01, 0.0005, 0.05, 0.002, 0.02, 0.001, 1.5)
"""A step-time model the measurements below follow."""


def _times(nodes: int, replicas: int, bsz: int, accum_steps: int = 0) -> StepTimes:
    """Step times at one configuration, as `TRUE` predicts them."""
    fn = GoodputFunction(TRUE, GradParams(1.0, 1.0), 64)
    accum = TRUE.alpha_c + TRUE.beta_c * bsz
    samples_per_s = fn.throughput(nodes, replicas, bsz, 0)
    optim = replicas * bsz / samples_per_s
    return StepTimes(nodes, replicas, bsz, optim, optim - accum, 10, accum if accum_steps else 0.0,
                     10 * accum_steps)  # fmt: skip


PROFILE = GoodputProfile(
    times=[_times(1, 1, 32), _times(1, 2, 64, 1), _times(1, 4, 16), _times(2, 8, 32)],
    grad_sqr=2.0, grad_var=30.0, batch_size=128,
)  # fmt: skip


# -- the fit and the choice ----------------------------------------------------------------------


def test_the_fit_predicts_the_measured_step_times_and_rescales_the_gradient_variance() -> None:
    hints, problems = fit_goodput_hints(PROFILE, init_batch_size=64)
    assert problems == [] and hints is not None
    fitted = PerfParams(*hints.perf)
    for t in PROFILE.times:
        predicted = GoodputFunction(fitted, GradParams(1.0, 1.0), 64).throughput(
            t.num_nodes, t.num_replicas, t.local_bsz, 0
        )
        measured = t.num_replicas * t.local_bsz / t.optim_s
        assert predicted == pytest.approx(measured, rel=0.1)
    # grad_var was measured at the job's batch (128): at the initial one (64) it is twice that.
    assert (hints.grad_sqr, hints.grad_var) == (2.0, 60.0)
    assert hints.max_profiled_replicas == 8 and hints.batch_size == 128


def test_measurements_that_do_not_hold_are_left_out_with_the_reason() -> None:
    bad = GoodputProfile(
        times=[StepTimes(3, 2, 32, 0.1, 0.0, 5), StepTimes(1, 1, 32, 0.1, 0.2, 5),
               _times(1, 1, 32)],
        grad_sqr=1.0, grad_var=4.0, batch_size=64,
    )  # fmt: skip
    hints, problems = fit_goodput_hints(bad, 64)
    assert hints is not None and hints.max_profiled_replicas == 1
    assert len(problems) == 2 and "more nodes than replicas" in problems[0]
    assert "sync_s >= optim_s" in problems[1]
    for grads in [(None, 1.0), (0.0, 1.0), (1.0, -1.0), (math.nan, 1.0), (1.0, math.inf)]:
        profile = msgspec.structs.replace(PROFILE, grad_sqr=grads[0], grad_var=grads[1])
        hints, problems = fit_goodput_hints(profile, 64)
        assert hints is None and len(problems) == (grads[0] is not None)
    no_batch = msgspec.structs.replace(PROFILE, batch_size=0)
    assert fit_goodput_hints(no_batch, 64)[0] is None


def test_the_prior_stands_in_where_the_job_measured_nothing() -> None:
    """A job that ran on one GPU alone: without a prior nothing tells its all-reduce (its network
    terms stay at their floor); with its model's profiled step times as the prior, the fit
    predicts its multi-GPU steps. What it ran on stays its own (Pollux lets it grow to twice
    that), and its own measurement replaces the prior's at the same configuration."""
    alone = msgspec.structs.replace(PROFILE, times=[_times(1, 1, 32)])
    prior = [_times(1, 2, 64), _times(1, 4, 16), _times(2, 8, 32),
             msgspec.structs.replace(_times(1, 1, 32), optim_s=99.0)]  # fmt: skip

    def predicted(hints: Any, nodes: int, replicas: int, bsz: int) -> float:
        fn = GoodputFunction(PerfParams(*hints.perf), GradParams(1.0, 1.0), 64)
        return replicas * bsz / fn.throughput(nodes, replicas, bsz, 0)

    without, _ = fit_goodput_hints(alone, 64)
    with_prior, problems = fit_goodput_hints(alone, 64, prior)
    assert without is not None and with_prior is not None and problems == []
    multi = _times(2, 8, 32)
    assert predicted(with_prior, 2, 8, 32) == pytest.approx(multi.optim_s, rel=0.1)
    assert predicted(without, 2, 8, 32) < 0.8 * multi.optim_s  # (no all-reduce known)
    assert with_prior.max_profiled_replicas == without.max_profiled_replicas == 1
    # (the prior's 99 s at the job's own configuration gave way to its measurement)
    assert predicted(with_prior, 1, 1, 32) == pytest.approx(_times(1, 1, 32).optim_s, rel=0.1)
    assert fit_goodput_hints(msgspec.structs.replace(alone, times=[]), 64, prior)[0] is None


def test_a_models_profiled_times_are_its_placements_means(shared_data: Path) -> None:
    from gpuyard.shared.goodput import load_applications

    app = load_applications(shared_data / "pollux" / "traces")["cifar10"]
    times = {(t.num_nodes, t.num_replicas, t.local_bsz): t for t in app.profiled_times()}
    assert len(times) > 10 and all(0 <= t.sync_s < t.optim_s for t in times.values())
    one = [t for k, t in times.items() if k[:2] == (1, 1)]
    assert one and all(t.optim_steps == 1 for t in one)
    step, sync = app.throughput((1,), one[0].local_bsz)
    assert (one[0].optim_s, one[0].sync_s) == pytest.approx((step, sync))


def test_the_batch_chosen_is_the_goodput_optimum_within_the_limits() -> None:
    hints, _ = fit_goodput_hints(PROFILE, 64)
    assert hints is not None
    fn = GoodputFunction(PerfParams(*hints.perf), GradParams(hints.grad_sqr, hints.grad_var), 64)
    for nodes, replicas in [(1, 1), (1, 4), (2, 8)]:
        batch, local, accum = choose_batch(hints, 64, 4096, (8, 128), nodes, replicas)
        _, best_local, best_accum = fn.optimize(nodes, replicas, 4096, (8, 128), accumulation=True)
        assert (local, accum) == (best_local, best_accum)
        assert batch == replicas * local * (accum + 1) and 8 <= local <= 128
        assert batch > 64  # (noisy gradients: larger batches pay)
    # Without hints, or where no batch fits the limits: the initial one, split.
    assert choose_batch(None, 64, 4096, (8, 128), 1, 4) == (64, 16, 0)
    assert choose_batch(hints, 64, 256, (8, 128), 8, 64) == split_batch(64, 64, 128, 256)


def test_a_fixed_batch_is_split_into_accumulation_steps_where_a_gpu_holds_less() -> None:
    assert split_batch(64, 2, 128, 1024) == (64, 32, 0)
    assert split_batch(512, 2, 64, 1024) == (512, 64, 3)
    assert split_batch(100, 3, 16, 1024) == (108, 12, 2)  # (rounded up to whole samples)


def test_an_adaptive_spec_needs_its_initial_batch_and_consistent_limits() -> None:
    limits = BatchLimits(max_batch_size=1024, min_local_bsz=8, max_local_bsz=128)
    assert JobSpec(num_gpus=1, batch_size=64, adaptive_batch=limits).adaptive_batch == limits
    assert BatchLimits(max_batch_size=512).atomic_range() == (1, 512)
    for spec, error in [
        ({"adaptive_batch": {"max_batch_size": 1024}}, "needs batch_size"),
        ({"batch_size": 64, "adaptive_batch": {"max_batch_size": 32}}, "must be >= batch_size"),
        ({"batch_size": 64, "adaptive_batch": {"max_batch_size": 512, "min_local_bsz": 64,
                                               "max_local_bsz": 32}}, "min_local_bsz"),
    ]:  # fmt: skip
        with pytest.raises(msgspec.ValidationError, match=error):
            msgspec.convert({"num_gpus": 1, **spec}, JobSpec)


# -- the job's side ------------------------------------------------------------------------------


def _job(tmp_path: Path, **env: str) -> JobClient:
    base = {
        "GPUYARD_JOB_ID": "j1",
        "GPUYARD_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "GPUYARD_PROGRESS_FILE": str(tmp_path / "progress.json"),
        "WORLD_SIZE": "4",
    }
    return JobClient.from_env({**base, **env}, handle_sigterm=False)  # fmt: skip


def test_the_job_is_told_its_batch_and_reports_its_measurements_per_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    told = {"GPUYARD_BATCH_SIZE": "256", "GPUYARD_LOCAL_BATCH_SIZE": "32",
            "GPUYARD_ACCUM_STEPS": "1", "NNODES": "2"}  # fmt: skip
    job = _job(tmp_path, **told)
    assert (job.batch_size, job.local_batch_size, job.accum_steps, job.num_nodes) == (256, 32, 1, 2)
    untold = _job(tmp_path, GPUYARD_BATCH_SIZE="x", GPUYARD_ACCUM_STEPS="-1")
    assert (untold.batch_size, untold.local_batch_size, untold.accum_steps) == (None, None, 0)
    for seconds in (0.1, 0.3):
        job.profile_step(seconds / 2, accumulation=True)
        job.profile_step(seconds, sync_s=0.05)
    job.profile_step(math.nan)  # (left out, said once on stderr)
    job.profile_step(0.1, sync_s=0.2)
    for sqr, var in [(1.0, 10.0), (3.0, 30.0), (math.inf, 1.0)]:
        job.report_gradients(sqr, var)
    job.report(iterations=7, force=True)
    assert capsys.readouterr().err.count("gpuyard.jobclient") == 1
    progress = msgspec.json.decode((tmp_path / "progress.json").read_bytes(), type=JobProgress)
    assert progress.goodput is not None
    (times,) = progress.goodput.times
    assert (times.num_nodes, times.num_replicas, times.local_bsz) == (2, 4, 32)
    assert times.optim_s == pytest.approx(0.2) and times.sync_s == pytest.approx(0.05)
    assert times.accum_s == pytest.approx(0.1) and (times.optim_steps, times.accum_steps) == (2, 2)
    # Moving averages, corrected for their start at 0: between the two estimates, nearer the last.
    assert 1.0 < progress.goodput.grad_sqr < 3.0 and 10.0 < progress.goodput.grad_var < 30.0
    assert progress.goodput.batch_size == 256
    with pytest.raises(ValueError, match="local_bsz"):
        untold.profile_step(0.1)
    with pytest.raises(ValueError, match="batch_size"):
        untold.report_gradients(1.0, 1.0)


def test_the_job_keeps_its_latest_configurations_and_only_rank_0_reports_them(
    tmp_path: Path,
) -> None:
    job = _job(tmp_path)
    for bsz in range(1, PROFILE_MAX_CONFIGS + 6):
        job.profile_step(0.1, local_bsz=bsz)
    job.report(iterations=1, force=True)
    record = json.loads((tmp_path / "progress.json").read_text())
    assert [t[2] for t in record["goodput"]["times"]] == list(range(6, PROFILE_MAX_CONFIGS + 6))
    other = JobClient.from_env(
        {"RANK": "1", "GPUYARD_PROGRESS_FILE": str(tmp_path / "p1.json"),
         "GPUYARD_CHECKPOINT_DIR": str(tmp_path / "ckpt")}, handle_sigterm=False,
    )  # fmt: skip
    other.profile_step(0.1, local_bsz=8)
    other.report(iterations=1, force=True)
    assert "goodput" not in json.loads((tmp_path / "p1.json").read_text())


# -- the agent's side ----------------------------------------------------------------------------


def _launch(batch: BatchChoice | None = None, attempt: int = 0) -> Launch:
    spec = JobSpec(num_gpus=2, command=["true"])
    return Launch(
        job_id="j1", spec=spec, gpus=[0, 1], world_size=2, rank_offset=0, node_rank=0,
        num_nodes=1, master_addr="127.0.0.1", master_port=23456, attempt=attempt, batch=batch,
    )  # fmt: skip


def test_the_agent_tells_an_adaptive_launch_its_batch_and_no_other(tmp_path: Path) -> None:
    places = Places(tmp_path / "logs", tmp_path / "ckpt", "t")
    envs = process_envs(_launch(BatchChoice(256, 32, 3)), "n1", places, {})
    assert {(e["GPUYARD_BATCH_SIZE"], e["GPUYARD_LOCAL_BATCH_SIZE"], e["GPUYARD_ACCUM_STEPS"])
            for e in envs} == {("256", "32", "3")}  # fmt: skip
    (plain, _) = process_envs(_launch(), "n1", places, {})
    assert not any(name in plain for name in ("GPUYARD_BATCH_SIZE", "GPUYARD_ACCUM_STEPS"))


def test_the_agent_leaves_out_measurements_that_do_not_hold_and_keeps_the_progress(
    tmp_path: Path,
) -> None:
    async def no_lines(job_id: str, rank: int, line: str) -> None:
        pass

    part = JobPart(
        _launch(attempt=1),
        "n1",
        Places(tmp_path / "logs", tmp_path / "ckpt", "t"),
        no_lines,
        5.0,
        Starter.find(),
    )
    path = tmp_path / "progress.json"
    part.ranks, part.progress_files = [0], [path]
    good = {"times": [[1, 2, 32, 0.2, 0.05, 10]], "grad_sqr": 1.0, "grad_var": 2.0,
            "batch_size": 64}  # fmt: skip
    report: dict[str, Any] = {"job_id": "j1", "iterations": 5, "attempt": 1, "time": 1.0,
                              "goodput": good}  # fmt: skip
    path.write_text(json.dumps(report))
    (progress,) = part.progress()
    assert progress.goodput is not None and progress.goodput.times[0].local_bsz == 32
    for bad in [{"times": [[1, 2, 32, -0.2, 0.0, 10]]}, {"grad_sqr": "many"}, [1, 2],
                {"times": [[1, 1, 1, 0.1, 0.0, 1]] * 40}]:  # fmt: skip
        path.write_text(json.dumps({**report, "goodput": bad}))
        (progress,) = part.progress()
        assert progress.iterations == 5 and progress.goodput is None
    assert part._bad_goodput == {0}  # (said once)
    path.write_text(json.dumps({**report, "attempt": 0}))  # an earlier run's, left in the file
    (progress,) = part.progress()
    assert progress.goodput is None


# -- the scheduler's side ------------------------------------------------------------------------


class _Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **kw: Any) -> None:
        self.lines.append((event, kw))

    warning = info


async def _fits_done(batches: AdaptiveBatches) -> None:
    """Until the fits under way (in worker threads) are over."""
    async with asyncio.timeout(10):
        await asyncio.gather(*batches.fits.values())


async def test_the_scheduler_fits_a_jobs_measurements_and_chooses_its_batches() -> None:
    table = JobTable()
    limits = BatchLimits(max_batch_size=4096, min_local_bsz=8, max_local_bsz=128)
    adaptive = table.admit(
        JobSpec(num_gpus=4, job_id="a", batch_size=64, adaptive_batch=limits), 0.0, None
    )
    plain = table.admit(JobSpec(num_gpus=4, job_id="p", batch_size=64), 0.0, None)
    log = _Log()
    batches = AdaptiveBatches(table, log)
    cluster = ClusterInfo(
        nodes=[NodeSpec(node_id=n, num_gpus=4) for n in ("x", "y")], capacity={}, busy={}
    )
    allocations = [Allocation("a", 4), Allocation("p", 4), Allocation("a2", 8)]
    assert batches.choose(allocations, table.active, cluster) == {"a": BatchChoice(64, 16, 0)}

    batches.observe(adaptive, GoodputProfile(times=PROFILE.times[:2]))  # (no gradients yet)
    await asyncio.sleep(0.05)
    assert adaptive.goodput is None and not batches.fits
    batches.observe(adaptive, msgspec.structs.replace(PROFILE, times=PROFILE.times[2:]))
    await _fits_done(batches)
    hints = adaptive.goodput
    assert hints is not None
    assert hints.max_profiled_replicas == 8  # (the four configurations, merged)
    assert "a" in table.touched and log.lines[-1][0] == "goodput.fitted"
    chosen = batches.choose([Allocation("a", 8, layout={"x": 4, "y": 4})], table.active, cluster)
    expected = choose_batch(hints, 64, 4096, (8, 128), num_nodes=2, num_replicas=8)
    assert chosen == {"a": BatchChoice(*expected)} and expected[0] != 64

    # The same step times with other gradient statistics: new hints, no fit.
    batches.observe(adaptive, msgspec.structs.replace(PROFILE, grad_var=60.0))
    assert not batches.fits and adaptive.goodput.grad_var == 120.0
    assert adaptive.goodput.perf == hints.perf

    # Measurements that do not hold: one log line, ignored.
    odd = GoodputProfile(times=[StepTimes(1, 1, 8, 0.1, 0.5, 3)], grad_sqr=1.0, grad_var=1.0,
                         batch_size=64)  # fmt: skip
    batches.observe(adaptive, odd)
    batches.observe(adaptive, odd)
    await _fits_done(batches)
    said = [kw for event, kw in log.lines if event == "goodput.observations_ignored"]
    assert len(said) == 1 and "sync_s >= optim_s" in said[0]["problems"][0]
    batches.observe(plain, PROFILE)
    assert plain.goodput is None and not batches.fits

    batches.forget([])
    assert not batches.times and not batches.fitted


async def test_the_scheduler_fits_a_profiled_models_jobs_on_its_prior() -> None:
    """`SchedulerConfig.goodput_profiles`: a job of a profiled model (its job type) is fitted to
    its model's step times where it measured none; a job of another model to its own alone."""
    table = JobTable()
    limits = BatchLimits(max_batch_size=4096, min_local_bsz=8, max_local_bsz=128)
    records = [
        table.admit(JobSpec(num_gpus=1, job_id=model, job_type=model, batch_size=64,
                            adaptive_batch=limits), 0.0, None)
        for model in ("profiled", "other")
    ]  # fmt: skip
    batches = AdaptiveBatches(table, _Log())
    batches.priors = {"profiled": [_times(1, 2, 64), _times(1, 4, 16), _times(2, 8, 32)]}
    for record in records:
        batches.observe(record, msgspec.structs.replace(PROFILE, times=[_times(1, 1, 32)]))
    await _fits_done(batches)
    profiled, other = (r.goodput for r in records)
    assert profiled is not None and other is not None
    expected, _ = fit_goodput_hints(
        msgspec.structs.replace(PROFILE, times=[_times(1, 1, 32)]), 64, batches.priors["profiled"]
    )
    assert profiled == expected and other.perf != profiled.perf
    assert profiled.max_profiled_replicas == other.max_profiled_replicas == 1
