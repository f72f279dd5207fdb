"""Synthetic workloads calibrated on the published statistics of five GPU clusters.

`calibrated(name, n_jobs, jobs_per_hour=None, seed=0)` draws GPU jobs whose GPUs per job (mean,
median, max), run times (mean, median, max), jobs per day and outcome shares reproduce one row of
AcmeTrace's `data/cluster_summary.csv` (InternLM/AcmeTrace 6d6ac9c, CC BY 4.0): Seren and Kalos
(Acme, NSDI '24), Helios (SC '21), Philly (ATC '19) and Alibaba PAI 2020 (NSDI '22). The
published numbers are copied into `CLUSTERS` (a test checks them against the file where
`../shared/data` is present), so a million-job workload needs neither that file nor the traces.
CPU-only jobs are not generated: every job asks for GPUs.

The laws (all draws from one `numpy.random.default_rng(seed)`, vectorised):

- GPUs per job: sizes median x 2^k up to the published max (1, 2, 4, ... 1024; PAI's 0.5, 1,
  ... 8), each doubling `ratio` times as common as the size below (a geometric law in log2
  size), `ratio` solved so that the mean is the published one. Where that law would put fewer
  than `MEDIAN_SIZE_SHARE` of the jobs at the median size (Seren, Kalos), that share is set to
  `MEDIAN_SIZE_SHARE` and the doublings above it share the rest, again geometric with the mean
  solved. The summary holds no other point of the distribution, so this is a choice, not a fit.
- Run time: log-normal with the published median, its spread solved so that the mean of the
  law capped at the published max is the published mean; capped, then rounded up to whole
  seconds. GPUs and run time are drawn independently (the traces' GPU time, which favours long
  large jobs, is not reproduced).
- Arrivals: a Poisson process whose rate follows `DAILY_AMPLITUDE` x a 24-hour cosine peaking at
  `PEAK_HOUR` (time 0 is midnight), with the trace's mean rate: its GPU jobs over its span
  (`CLUSTERS[...].span_days`, from the publishers), unless `jobs_per_hour` is given.
- Outcome: each job's end (completed, cancelled, failed) at the published shares (PAI's summary
  has none: its jobs complete): a job drawn failed or cancelled runs its run time and then ends
  so (`JobSpec.outcome`), as a replayed Helios or Acme job does.
- PAI's GPU requests are fractions of a GPU (median 0.5): a request below one GPU is a share of
  one (`JobSpec.gpu_milli`), one above is rounded up to whole GPUs (as the PAI 2020 loader reads
  `plan_gpu`); the drawn request is in the extras (`gpu_request`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .core import Workload, build_jobs


@dataclass(frozen=True)
class ClusterStatistics:
    """One row of `cluster_summary.csv` (its column in brackets), for its GPU jobs, plus the
    trace's span (not in the file)."""

    csv_id: str
    """The row's `id`."""
    jobs: int  # job_num (GPU and CPU jobs)
    gpu_jobs: int  # gpu_job_num
    mean_run_s: float  # avg_run_time_gpu
    median_run_s: float  # med_run_time_gpu
    max_run_s: float  # max_run_time_gpu
    mean_gpus: float  # avg_gpu_num
    median_gpus: float  # med_gpu_num
    max_gpus: float  # max_gpu
    outcome_shares: tuple[float, float, float] | None
    """(complete_rate_gpu, cancel_rate_gpu, fail_rate_gpu); None where the file has none (PAI)."""
    span_days: float
    """Days the trace's jobs were submitted over: jobs per day = gpu_jobs / span_days."""
    span_source: str

    @property
    def jobs_per_day(self) -> float:
        return self.gpu_jobs / self.span_days


OUTCOMES = ("completed", "cancelled", "failed")

# The published numbers: InternLM/AcmeTrace data/cluster_summary.csv (6d6ac9c), CC BY 4.0. The
# spans are not in that file; each names its source. The generated jobs per day depend on them.
CLUSTERS: dict[str, ClusterStatistics] = {
    "seren": ClusterStatistics(
        "Seren", 1031550, 663813, 1414.335, 122.0, 1209604.0, 5.68, 1.0, 1024.0,
        (0.497, 0.075, 0.429),
        184, "Acme (Hu et al., NSDI '24): March to August 2023",
    ),
    "kalos": ClusterStatistics(
        "Kalos", 62413, 19907, 1259.689, 124.0, 625740.0, 26.77, 1.0, 1024.0,
        (0.541, 0.062, 0.397),
        184, "Acme (Hu et al., NSDI '24): March to August 2023, as for Seren",
    ),
    "philly": ClusterStatistics(
        "Philly", 112956, 112956, 18006.055, 874.0, 4240676.0, 1.928, 1.0, 128.0,
        (0.604, 0.09, 0.305),
        89, "Philly's log (Jeon et al., ATC '19, ~75 days of Oct-Dec 2017 named): its jobs' "
        "submissions, as Pollux's Philly-derived arrivals show them, run 24 Sep to 22 Dec 2017",
    ),
    "helios": ClusterStatistics(
        "Helios", 3362981, 1580464, 6651.681, 206.0, 4320009.0, 3.716, 1.0, 2048.0,
        (0.624, 0.221, 0.155),
        183, "Helios (Hu et al., SC '21): April to September 2020",
    ),
    "pai": ClusterStatistics(
        "PAI", 1260920, 1037085, 4787.109, 480.667, 626371.0, 0.683, 0.5, 8.0,
        None,
        62, "Alibaba PAI 2020 (Weng et al., NSDI '22): July and August 2020",
    ),
}  # fmt: skip
"""The calibrations, by generator name (`--generator helios` ...)."""

MEDIAN_SIZE_SHARE = 0.55
"""The least share of jobs at the median size: above one half, so that a sample's median is the
published one (at exactly one half it would flip between two sizes)."""
DAILY_AMPLITUDE = 0.5
"""Relative swing of the arrival rate over a day: the peak is 1.5x the mean rate, the trough
0.5x (3:1). The summary has no hourly profile; this is of the order of the Philly-derived
arrivals in Pollux's `traces/philly.csv` (busiest hour 2.1x the mean, quietest 0.64x), and a
working day's cycle is what the papers' arrival figures show."""
PEAK_HOUR = 15.0
"""Hour of the day (time 0 is midnight) at which arrivals peak: mid-afternoon, the trough at 3 am."""
DAY_S = 86400.0
_PROFILE_STEP_S = 60.0  # the daily profile's rate is constant within each minute


def gpu_size_law(stats: ClusterStatistics) -> tuple[np.ndarray, np.ndarray]:
    """(sizes, probabilities) of GPUs per job (module docstring)."""
    doublings = round(math.log2(stats.max_gpus / stats.median_gpus))
    sizes = stats.median_gpus * 2.0 ** np.arange(doublings + 1)
    probs = _geometric(sizes, stats.mean_gpus)
    if probs[0] < MEDIAN_SIZE_SHARE:
        rest_mean = (stats.mean_gpus - MEDIAN_SIZE_SHARE * sizes[0]) / (1 - MEDIAN_SIZE_SHARE)
        tail = _geometric(sizes[1:], rest_mean)
        probs = np.concatenate([[MEDIAN_SIZE_SHARE], (1 - MEDIAN_SIZE_SHARE) * tail])
    return sizes, probs


def _geometric(sizes: np.ndarray, mean: float) -> np.ndarray:
    """Probabilities proportional to ratio^k over `sizes` (k = 0, 1, ...), mean `mean`."""
    if not sizes[0] < mean < sizes[-1]:
        raise ValueError(f"no size law over {sizes[0]:g} to {sizes[-1]:g} has mean {mean:g}")
    powers = np.arange(len(sizes))
    low, high = 1e-6, 1e6
    for _ in range(200):  # bisection on log(ratio): the mean grows with the ratio
        ratio = math.sqrt(low * high)
        weights = ratio**powers
        if (weights * sizes).sum() / weights.sum() < mean:
            low = ratio
        else:
            high = ratio
    weights = math.sqrt(low * high) ** powers
    return weights / weights.sum()


def run_time_sigma(stats: ClusterStatistics) -> float:
    """The log-normal's sigma whose mean, capped at the published max, is the published mean."""
    mu = math.log(stats.median_run_s)
    cap = math.log(stats.max_run_s)

    def capped_mean(sigma: float) -> float:
        below = _normal_cdf((cap - mu - sigma**2) / sigma)
        above = 1 - _normal_cdf((cap - mu) / sigma)
        return math.exp(mu + sigma**2 / 2) * below + stats.max_run_s * above

    low, high = 1e-3, 10.0
    if not capped_mean(low) < stats.mean_run_s < capped_mean(high):
        raise ValueError(f"no capped log-normal has mean {stats.mean_run_s:g}")
    for _ in range(200):  # the capped mean grows with sigma
        mid = (low + high) / 2
        low, high = (mid, high) if capped_mean(mid) < stats.mean_run_s else (low, mid)
    return (low + high) / 2


def _normal_cdf(z: float) -> float:
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def daily_arrivals(rng: np.random.Generator, n: int, jobs_per_day: float) -> np.ndarray:
    """`n` sorted arrival times (s) of a Poisson process of mean rate `jobs_per_day` whose rate
    follows the daily cosine (`DAILY_AMPLITUDE`, `PEAK_HOUR`), constant within each minute.

    Time rescaling: unit-rate arrivals E_k (cumulated exponential gaps) map to the times t_k at
    which the cumulated rate reaches E_k, inverted exactly by interpolation over the minutes."""
    if jobs_per_day <= 0:
        raise ValueError(f"jobs per day must be > 0, not {jobs_per_day}")
    steps = int(DAY_S / _PROFILE_STEP_S)
    # math.cos, not numpy's vectorised one, so that every CPU gives the same bits
    hours = [(i + 0.5) * _PROFILE_STEP_S / 3600.0 for i in range(steps)]
    rate = np.array(
        [1 + DAILY_AMPLITUDE * math.cos(2 * math.pi * (h - PEAK_HOUR) / 24) for h in hours]
    )
    rate *= steps / rate.sum()  # mean 1 over the day
    knots_s = np.arange(steps + 1) * _PROFILE_STEP_S
    cumulated = np.concatenate([[0.0], np.cumsum(rate * _PROFILE_STEP_S)])  # 0 .. DAY_S
    unit = np.cumsum(rng.exponential(1.0, n)) * (DAY_S / jobs_per_day)  # expected seconds
    day = np.floor(unit / DAY_S)
    within = np.interp(unit - day * DAY_S, cumulated, knots_s)
    return day * DAY_S + within


def calibrated(
    name: str, n_jobs: int, jobs_per_hour: float | None = None, seed: int = 0
) -> Workload:
    """`n_jobs` GPU jobs drawn as `CLUSTERS[name]` says (module docstring); `jobs_per_hour`:
    the mean arrival rate (default: the trace's, its GPU jobs over its span)."""
    import pandas as pd

    stats = CLUSTERS[name]
    per_day = stats.jobs_per_day if jobs_per_hour is None else 24 * jobs_per_hour
    rng = np.random.default_rng(seed)
    arrival = daily_arrivals(rng, n_jobs, per_day)
    sizes, size_probs = gpu_size_law(stats)
    request = sizes[rng.choice(len(sizes), size=n_jobs, p=size_probs)]
    # rng.lognormal exponentiates with the C library, the same on every CPU
    run_s = rng.lognormal(math.log(stats.median_run_s), run_time_sigma(stats), n_jobs)
    run_s = np.ceil(np.minimum(run_s, stats.max_run_s))
    extras: dict[str, object] = {}
    outcome: list[str | None] = [None] * n_jobs
    if stats.outcome_shares is not None:
        shares = np.array(stats.outcome_shares) / sum(stats.outcome_shares)  # (they sum to ~1)
        ends: list[str | None] = [None, *OUTCOMES[1:]]  # (a completed job has no outcome)
        outcome = [ends[k] for k in rng.choice(len(OUTCOMES), size=n_jobs, p=shares).tolist()]
    columns: dict[str, Any] = {
        "job_id": [str(i) for i in range(n_jobs)],
        "num_gpus": np.ceil(request).astype(np.int64).tolist(),
        "duration": run_s.tolist(),
        "submit_time": arrival.tolist(),
        "outcome": outcome,
    }
    if stats.median_gpus < 1:  # PAI: fractions of a GPU, a share of one below one
        extras["gpu_request"] = request
        columns["gpu_milli"] = [min(max(round(1000 * r), 1), 999) if r < 1 else None
                                for r in request.tolist()]  # fmt: skip
    frame = pd.DataFrame(extras) if extras else None
    workload = build_jobs(columns, n_jobs, path=None, extras=frame, fmt="gpuyard")
    rate = "" if jobs_per_hour is None else f", jobs_per_hour={jobs_per_hour}"
    workload.source = f"{name}(n_jobs={n_jobs}{rate}, seed={seed})"
    return workload
