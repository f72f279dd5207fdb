"""Pollux's goodput job model (gpuyard.shared.goodput) on the artifact's profiles.

The profile tests need ../shared/data/pollux (the artifact's traces) and skip without it; the
model tests (efficiency, optimize, the fit) run on synthetic parameters.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpuyard.shared.goodput import (
    EPS,
    POLLUX_APPLICATIONS,
    Application,
    GoodputFunction,
    GoodputJob,
    PerfParams,
    SpeedupFunction,
    _accum_time,
    _fit_objective,
    _FitData,
    _log_optim_time,
    _network_time,
    fit_perf_params,
    load_applications,
)

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "pollux" / "traces"

PARAMS = PerfParams(0.02, 0.001, 0.15, 0.01, 0.05, 0.004, 1.8)


def _load(name: str) -> Application:
    if not (TRACES / name / "placements.csv").is_file():
        pytest.skip(f"Pollux traces {TRACES / name} absent")
    return Application.load(TRACES / name, **POLLUX_APPLICATIONS[name])


@pytest.fixture(scope="module")
def cifar10() -> Application:
    return _load("cifar10")


# -- Application: the profiles ----------------------------------------------------------------


def test_profiled_placement_is_its_csv_rows_linear_between(cifar10: Application) -> None:
    rows = pd.read_csv(TRACES / "cifar10" / "placements.csv")
    rows = rows[rows.placement == 12].sort_values("local_bsz")  # one node of 1 GPU, one of 2
    low, high = rows.iloc[2], rows.iloc[3]
    for row in (low, high):
        step, sync = cifar10.throughput((1, 2), int(row.local_bsz))
        assert step == pytest.approx(row.step_time, rel=1e-12)
        assert sync == pytest.approx(row.sync_time, rel=1e-12)
    quarter = low.local_bsz + (high.local_bsz - low.local_bsz) / 4
    step, _ = cifar10.throughput((1, 2), quarter)
    assert step == pytest.approx(0.75 * low.step_time + 0.25 * high.step_time, rel=1e-12)


def test_placements_normalise_to_their_smallest_rotation(cifar10: Application) -> None:
    expected = cifar10.throughput((1, 4, 2), 64)
    assert cifar10.throughput((2, 1, 4), 64) == expected
    assert cifar10.throughput((4, 2, 1), 64) == expected
    assert cifar10.throughput((0, 4, 2, 0, 1), 64) == expected  # empty nodes don't count
    assert cifar10.throughput((2, 4, 1), 64) != expected  # a reflection is another placement


def test_unprofiled_placements_interpolate_over_nodes_replicas_and_batch(
    cifar10: Application,
) -> None:
    scalability = pd.read_csv(TRACES / "cifar10" / "scalability.csv")
    six_nodes = scalability[(scalability.num_nodes == 6) & (scalability.num_replicas == 24)]
    row = six_nodes[six_nodes.local_bsz == 64].iloc[0]
    # A measured (nodes, replicas, batch) point is that measurement.
    assert cifar10.throughput((4,) * 6, 64) == pytest.approx(
        (row.step_time, row.sync_time), rel=1e-9
    )
    # 5 nodes (never profiled) lies between 4 nodes (placements.csv) and 6 (scalability.csv).
    four, _ = cifar10.throughput((4, 4, 4, 4), 64)
    five, five_sync = cifar10.throughput((4,) * 5, 64)
    assert math.isfinite(five) and min(four, row.step_time) < five < max(four, row.step_time)
    assert 0 < five_sync < five
    # Beyond 16 nodes: as if on 16 nodes with as many replicas.
    assert cifar10.throughput((2,) * 20, 64) == cifar10.throughput((4,) * 8 + (1,) * 8, 64)


def test_throughput_outside_the_profiles_is_a_clear_error(cifar10: Application) -> None:
    with pytest.raises(ValueError, match=r"cifar10.*\(1, 2\).*5000"):
        cifar10.throughput((1, 2), 5000)
    with pytest.raises(ValueError, match=r"cifar10.*\(4, 4, 4, 4, 4\).*5000"):
        cifar10.throughput((4,) * 5, 5000)


def test_epochs_progress_and_iterations(cifar10: Application) -> None:
    assert cifar10.max_epochs == 100 and cifar10.completion_epoch(512) == 99
    assert cifar10.progress_at(0) == 0.0
    progress = [cifar10.progress_at(epoch) for epoch in range(101)]
    assert all(a < b for a, b in itertools.pairwise(progress))
    assert cifar10.epoch_of(progress[10]) == 10
    assert cifar10.epoch_of(progress[10] - 1e-6) == 9
    assert cifar10.epoch_of(1e12) == 100
    # Between validated batch sizes (256 and 512): linear in the batch size.
    low, high = cifar10.iterations(256, 5), cifar10.iterations(512, 5)
    assert cifar10.iterations(320, 5) == pytest.approx(0.75 * low + 0.25 * high)
    sqr, var = cifar10.grad_stats(384, 5)
    assert sqr == pytest.approx(sum(cifar10.grad_stats(b, 5)[0] for b in (256, 512)) / 2)
    assert var > 0
    assert cifar10.best_metric(256, 0) is None
    with pytest.raises(ValueError, match="cifar10: batch size 8192"):
        cifar10.iterations(8192, 5)


def test_load_applications_reads_every_profiled_model() -> None:
    if not TRACES.is_dir():
        pytest.skip(f"Pollux traces {TRACES} absent")
    apps = load_applications(TRACES)
    assert set(POLLUX_APPLICATIONS) <= set(apps)
    assert apps["yolov3"].max_local_bsz == 8 and apps["bert"].max_epochs == 2


def _write_app(folder: Path) -> None:
    folder.mkdir()
    (folder / "placements.csv").write_text(
        "placement,local_bsz,step_time,sync_time\n1,8,0.1,0.001\n1,16,0.2,0.001\n"
    )
    (folder / "scalability.csv").write_text(
        "num_nodes,num_replicas,local_bsz,step_time,sync_time\n6,6,8,0.3,0.2\n"
    )
    (folder / "validation-16.csv").write_text(
        "progress,iteration,metric,grad_sqr,grad_var\n100,100,0.5,1.0,2.0\n200,200,0.6,1.0,2.0\n"
    )


def test_missing_or_malformed_files_name_the_file(tmp_path: Path) -> None:
    _write_app(tmp_path / "toy")
    assert load_applications(tmp_path)["toy"].max_epochs == 2
    (tmp_path / "toy" / "scalability.csv").write_text("num_nodes,num_replicas\n6,6\n")
    with pytest.raises(ValueError, match=r"scalability\.csv: missing column\(s\) local_bsz") as err:
        load_applications(tmp_path)
    assert "\n" not in str(err.value)
    (tmp_path / "toy" / "scalability.csv").unlink()
    with pytest.raises(ValueError, match=r"toy/scalability\.csv: file not found"):
        Application.load(tmp_path / "toy")
    _write_app(tmp_path / "bad")
    (tmp_path / "bad" / "validation-16.csv").write_text(
        "progress,iteration,metric,grad_sqr,grad_var\nx,100,0.5,1.0,2.0\n"
    )
    with pytest.raises(ValueError, match=r"validation-16\.csv: column progress"):
        Application.load(tmp_path / "bad")


# -- the performance model --------------------------------------------------------------------


def test_efficiency_is_one_at_the_initial_batch_and_falls_per_sample_above() -> None:
    goodput_fn = GoodputFunction(PARAMS, (1.0, 4.0), init_batch_size=128)
    assert goodput_fn.efficiency(128) == 1.0
    batch_sizes = np.array([128, 256, 512, 1024, 4096])
    efficiency = goodput_fn.efficiency(batch_sizes)
    assert np.all(np.diff(efficiency) < 0)
    assert np.all(efficiency >= 128 / batch_sizes)  # never worse than no gain at all
    # (PGNS + init) / (PGNS + batch), PGNS = var / sqr x init.
    assert efficiency[2] == pytest.approx((512 + 128) / (512 + 512))


def _candidates(
    goodput_fn: GoodputFunction, nodes: int, replicas: int, max_bsz: int, bsz_range: tuple[int, int]
) -> list[tuple[float, int, int]]:
    """The optimize grid, evaluated one candidate at a time."""
    init = goodput_fn.init_batch_size
    found = []
    for batch_size in np.geomspace(max(init, bsz_range[0] * replicas), max_bsz):
        local = batch_size / replicas
        accum = math.ceil(local / bsz_range[1] - EPS) - 1
        if replicas == 1 and local > init + EPS:
            accum = max(accum, 1)
        atomic = math.ceil(local / (accum + 1) - EPS)
        valid = bsz_range[0] <= atomic <= bsz_range[1]
        goodput = goodput_fn.evaluate(nodes, replicas, atomic, accum) if valid else 0.0
        found.append((goodput, atomic, accum))
    return found


def test_optimize_picks_the_best_candidate_vectorised() -> None:
    goodput_fn = GoodputFunction(PARAMS, (1.0, 40.0), init_batch_size=128)
    nodes, replicas = np.array([1, 1, 2, 4]), np.array([1, 4, 8, 16])
    goodput, atomic, accum = goodput_fn.optimize(nodes, replicas, 4096, (32, 256), True)
    for i, (n, r) in enumerate(zip(nodes, replicas, strict=True)):
        best = max(_candidates(goodput_fn, int(n), int(r), 4096, (32, 256)), key=lambda c: c[0])
        assert (goodput[i], atomic[i], accum[i]) == pytest.approx(best, rel=1e-12)
        assert goodput_fn.optimize(int(n), int(r), 4096, (32, 256), True) == (
            goodput[i],
            atomic[i],
            accum[i],
        )
    assert accum[0] >= 1  # one replica above the initial batch accumulates


def test_speedup_is_one_on_one_gpu_and_memoised() -> None:
    goodput_fn = GoodputFunction(PARAMS, (1.0, 40.0), init_batch_size=128)
    speedup_fn = SpeedupFunction(goodput_fn, 4096, (32, 256), accumulation=True)
    assert speedup_fn(1, 1) == pytest.approx(1.0)
    assert speedup_fn(0, 0) == 0.0
    speedups = speedup_fn(np.array([1, 1, 2]), np.array([2, 4, 8]))
    assert np.all(speedups > 1)
    best, _, _ = goodput_fn.optimize(2, 8, 4096, (32, 256), True)
    assert speedups[2] == pytest.approx(best / speedup_fn.base_goodput)
    speedup_fn.base_goodput *= 2  # Pollux's policy rebases it; memoised answers stand
    assert speedup_fn(2, 8) == speedups[2]
    with pytest.raises(ValueError):
        speedup_fn(2, 1)


def _step_times(
    params: PerfParams, nodes: np.ndarray, replicas: np.ndarray, bsz: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    accum = _accum_time(params, bsz)
    optim = np.exp(_log_optim_time(params, accum, _network_time(params, nodes, replicas)))
    return accum, optim


def test_fit_recovers_the_parameters_that_made_the_step_times() -> None:
    configs = [(1, 1), (1, 2), (1, 3), (1, 4), (2, 2), (2, 8), (3, 12), (4, 16), (8, 32)]
    nodes, replicas, bsz = (
        np.array(column)
        for column in zip(*[(n, r, b) for n, r in configs for b in (32, 128, 512)], strict=True)
    )
    accum, optim = _step_times(PARAMS, nodes, replicas, bsz)
    noise = np.arange(len(nodes))  # 1% measurement noise, deterministic
    accum, optim = accum * (1 + 0.01 * np.sin(noise)), optim * (1 + 0.01 * np.cos(noise))
    fitted = fit_perf_params(nodes, replicas, bsz, accum, optim)
    tolerance = PerfParams(0.01, 0.01, 0.03, 0.03, 0.06, 0.5, 0.02)
    for name, got, true, rel in zip(PerfParams._fields, fitted, PARAMS, tolerance, strict=True):
        assert got == pytest.approx(true, rel=rel), name
    _, predicted = _step_times(fitted, nodes, replicas, bsz)
    np.testing.assert_allclose(predicted, _step_times(PARAMS, nodes, replicas, bsz)[1], rtol=0.02)


def test_fit_gradient_is_the_objectives_derivative() -> None:
    nodes, replicas, bsz = (
        np.array([1, 1, 2, 4]),
        np.array([1, 2, 8, 16]),
        np.array([32, 64, 64, 128]),
    )
    accum, optim = _step_times(PARAMS, nodes, replicas, bsz)
    point = np.array([0.05, 0.002, 0.1, 0.02, 0.07, 0.003, 1.5])
    data = _FitData.of(nodes, replicas, bsz, accum * 1.1, optim * 0.9)
    _, gradient = _fit_objective(point, data)
    for i in range(7):
        h = 1e-6 * point[i]
        up, down = point.copy(), point.copy()
        up[i] += h
        down[i] -= h
        slope = (_fit_objective(up, data)[0] - _fit_objective(down, data)[0]) / (2 * h)
        assert gradient[i] == pytest.approx(slope, rel=1e-5), PerfParams._fields[i]


def test_fit_fixes_what_the_profile_cannot_tell() -> None:
    # One node, one replica, one batch size: no network terms, alpha_c at half the accum time.
    fitted = fit_perf_params([1], [1], [64], [0.2], [0.21])
    assert fitted.alpha_c == 0.1
    assert fitted.alpha_r == fitted.beta_r == 1e-8
    assert fitted.alpha_n == pytest.approx(1.1e-8) and fitted.beta_n == pytest.approx(1.1e-8)


# -- GoodputJob -------------------------------------------------------------------------------


def _run(job: GoodputJob, chunk: float, restart_at: float | None = None) -> float:
    """Step `job` in `chunk`s until it completes; its completion time."""
    now = 0.0
    while True:
        if restart_at is not None and now == restart_at:
            job.reallocate(job.placement)
        step = (
            min(chunk, restart_at - now) if restart_at is not None and now < restart_at else chunk
        )
        offset = job.step(step)
        if offset is not None:
            assert 0 <= offset <= step
            return now + offset
        now += step
        assert now < 10**7, "never finished"


def test_job_on_a_fixed_placement_finishes_at_its_last_epoch(cifar10: Application) -> None:
    job = GoodputJob(cifar10, target_batch_size=1024)
    job.reallocate((4, 4))
    assert job.batch_size == 1024 and job.num_restarts == 0 and job.rescale_time == 30.0
    completion = _run(job, 60)
    last = cifar10.completion_epoch(1024)
    assert job.finished and job.epoch == last + 1
    assert job.progress == cifar10.progress_at(last + 1)
    assert job.attained_service == pytest.approx(8 * completion)
    assert job.step(60) is None and job.progress == cifar10.progress_at(last + 1)
    assert job.remaining_iterations() == 1
    # The same in one long step, and in uneven chunks.
    once = GoodputJob(cifar10, target_batch_size=1024)
    once.reallocate((4, 4))
    assert once.step(10**7) == pytest.approx(completion, abs=1)
    uneven = GoodputJob(cifar10, target_batch_size=1024)
    uneven.reallocate((4, 4))
    assert _run(uneven, 37) == pytest.approx(completion, abs=1)


def test_a_restart_costs_restart_s(cifar10: Application) -> None:
    plain = GoodputJob(cifar10, target_batch_size=1024, restart_s=45)
    plain.reallocate((4, 4))
    restarted = GoodputJob(cifar10, target_batch_size=1024, restart_s=45)
    restarted.reallocate((4, 4))
    assert _run(restarted, 60, restart_at=300) == pytest.approx(_run(plain, 60) + 45, abs=1)
    assert restarted.num_restarts == 1


def test_a_released_job_stands_still(cifar10: Application) -> None:
    job = GoodputJob(cifar10, target_batch_size=1024)
    job.reallocate((4,))
    job.step(120)
    progress, epoch = job.progress, job.epoch
    iterations_left = job.remaining_iterations()
    job.reallocate(())
    assert job.step(600) is None and (job.progress, job.epoch) == (progress, epoch)
    assert job.batch_size == 0 and job.remaining_iterations() == iterations_left
    assert cifar10.iterations(1024, 99) - cifar10.iterations(1024, epoch) == iterations_left


def test_an_adaptive_job_fits_its_model_as_it_runs(cifar10: Application) -> None:
    job = GoodputJob(cifar10)
    assert job.speedup_fn() is None
    job.reallocate((4,))
    assert job.batch_size == max(cifar10.init_batch_size, 4 * cifar10.min_local_bsz)
    job.step(90)
    assert job.perf_params is not None and job.max_profiled_replicas == 4
    assert list(job.profile) == [(1, 4, 32)]
    speedup_fn = job.speedup_fn()
    assert speedup_fn is not None and speedup_fn(1, 1) == pytest.approx(1.0)
    # Its batch size is now the fitted model's best for 4 replicas.
    _, atomic, accum = job.goodput_fn().optimize(
        1, 4, cifar10.max_batch_size, (cifar10.min_local_bsz, cifar10.max_local_bsz), True
    )
    assert (job.atomic_bsz, job.accum_steps) == (
        min(atomic, cifar10.max_batch_size // (4 * (accum + 1))),
        accum,
    )
