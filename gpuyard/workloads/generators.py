"""Seeded synthetic workloads reproducing the reference systems' generators.

All draws come from one `numpy.random.default_rng(seed)`, vectorised, so the same arguments give
the same jobs (not the same numbers as the references' `random.Random` streams: the
*distributions* are reproduced, which is what the tests check).

- `blox`: Blox's synthetic workload (`workload/workload.py`, `get_gavel_like_iter`): Poisson
  arrivals at `jobs_per_hour` (first job one gap after 0), durations 80% 60*10^U(1.5,3) s and 20%
  60*10^U(3,4) s, GPU demand from `gpu_demand` (default one GPU each).
- `gavel`: Gavel's `generate_job` (stanford-futuredata/gavel `scheduler/utils.py`): same duration
  mix; with `multi_gpu` scale factor 1/2/4/8 at 70/10/15/5% (r = U(0,1): [0.7,0.8] -> 2,
  (0.8,0.95] -> 4, above -> 8); template uniform over the 26 `GAVEL_TEMPLATES`, redrawn among the
  19 distributed ones when the scale factor is > 1; `multi_priority`: 20% of jobs get priority
  weight 5 (-> JobSpec.weight); `slo`: SLO factor 1.2/2/10 at 33/34/33% and deadline = arrival +
  SLO x duration (Gavel's scheduler); arrivals: all at 0 when `jobs_per_hour` is None (static),
  else the first at 0 and exponential gaps of mean 3600/jobs_per_hour. `duration` is the run time
  on the reference type (v100) at the scale factor; with a throughput model, total_steps =
  duration x throughput(v100, scale factor), Gavel's formula.
- `elasticflow`: ElasticFlow's `trace_generator/generate_trace.py`: first arrival 0 then
  exponential gaps of mean `mean_gap_s` ("lam"); durations 80% 60*10^U(1,2.5) s, 20%
  60*10^U(2.5,4) s; GPU count from the ITP CDF 1/2/4/8/16 at 83/3/3/10/1% (capped at
  `max_gpus`); model@batch uniform over `ELASTICFLOW_TEMPLATES`; deadline = arrival +
  int(U(lo,hi) x duration) (the reference draws this factor from an unseeded RNG; here it is
  seeded); best-effort with probability `best_effort_share`; iterations = duration x
  throughput(model@batch, GPUs) when a throughput model is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import numpy as np

from gpuyard.shared.model import JobSpec
from gpuyard.shared.throughput import ThroughputModel

from .core import ELASTIC_MAX_GPUS, Workload, build_jobs

GAVEL_TEMPLATES: tuple[str, ...] = (
    "ResNet-18 (batch size 16)",
    "ResNet-18 (batch size 32)",
    "ResNet-18 (batch size 64)",
    "ResNet-18 (batch size 128)",
    "ResNet-18 (batch size 256)",
    "ResNet-50 (batch size 16)",
    "ResNet-50 (batch size 32)",
    "ResNet-50 (batch size 64)",
    "ResNet-50 (batch size 128)",
    "Transformer (batch size 16)",
    "Transformer (batch size 32)",
    "Transformer (batch size 64)",
    "Transformer (batch size 128)",
    "Transformer (batch size 256)",
    "LM (batch size 5)",
    "LM (batch size 10)",
    "LM (batch size 20)",
    "LM (batch size 40)",
    "LM (batch size 80)",
    "Recommendation (batch size 512)",
    "Recommendation (batch size 1024)",
    "Recommendation (batch size 2048)",
    "Recommendation (batch size 4096)",
    "Recommendation (batch size 8192)",
    "A3C",
    "CycleGAN",
)
"""Gavel's 26 job templates (the job types of `simulation_throughputs.json`)."""

GAVEL_DISTRIBUTED: tuple[str, ...] = GAVEL_TEMPLATES[:19]
"""Templates with multi-GPU throughputs (scale factors 2/4/8): all but Recommendation, A3C and
CycleGAN."""

ELASTICFLOW_TEMPLATES: tuple[tuple[str, int], ...] = (
    ("bert", 64),
    ("bert", 128),
    ("deepspeech2", 32),
    ("deepspeech2", 64),
    ("gpt2", 128),
    ("gpt2", 256),
    ("inception3", 64),
    ("inception3", 128),
    ("resnet50", 64),
    ("resnet50", 128),
    ("resnet50", 256),
    ("vgg16", 64),
    ("vgg16", 128),
    ("vgg16", 256),
)
"""(model, global batch size) pairs of ElasticFlow's A100 tables, as its generated traces use
them."""

ELASTICFLOW_DEADLINE_FACTOR = (0.5, 1.5)
"""ElasticFlow's generator's default deadline factor range (`--min_ddl`, `--max_ddl`)."""

SHORT_EXP = (1.5, 3.0)
LONG_EXP = (3.0, 4.0)
LONG_SHARE = 0.2


def philly_durations(
    rng: np.random.Generator,
    n: int,
    short: tuple[float, float] = SHORT_EXP,
    long: tuple[float, float] = LONG_EXP,
    long_share: float = LONG_SHARE,
) -> np.ndarray:
    """Seconds: with probability `long_share` 60*10^U(long), else 60*10^U(short)."""
    is_long = rng.random(n) < long_share
    lo = np.where(is_long, long[0], short[0])
    hi = np.where(is_long, long[1], short[1])
    # (libm's pow, one by one: numpy's vectorised power rounds differently on CPUs with AVX-512,
    # and a seed's workload must be the same on every machine)
    return 60.0 * np.array([10.0**u for u in rng.uniform(lo, hi).tolist()], dtype=float)


def poisson_gaps(rng: np.random.Generator, n: int, mean_gap_s: float) -> np.ndarray:
    """Exponential inter-arrival gaps of mean `mean_gap_s`."""
    if mean_gap_s <= 0:
        raise ValueError(f"mean inter-arrival gap must be > 0, not {mean_gap_s}")
    return rng.exponential(mean_gap_s, n)


def _ids(n: int) -> list[str]:
    return [str(i) for i in range(n)]


def blox(
    n_jobs: int,
    jobs_per_hour: float,
    seed: int = 0,
    gpu_demand: Mapping[int, float] | None = None,
) -> Workload:
    """Blox's synthetic workload (module docstring). `gpu_demand`: {GPUs: probability}."""
    rng = np.random.default_rng(seed)
    demand = dict(gpu_demand or {1: 1.0})
    sizes = np.array(list(demand), dtype=np.int64)
    probs = np.array(list(demand.values()), dtype=float)
    if (probs < 0).any() or probs.sum() <= 0:
        raise ValueError(f"gpu_demand probabilities must be >= 0 and not all 0: {demand}")
    arrival = np.cumsum(poisson_gaps(rng, n_jobs, 3600.0 / jobs_per_hour))
    duration = philly_durations(rng, n_jobs)
    gpus = rng.choice(sizes, size=n_jobs, p=probs / probs.sum())
    columns = {
        "job_id": _ids(n_jobs),
        "num_gpus": gpus.tolist(),
        "duration": duration.tolist(),
        "submit_time": arrival.tolist(),
    }
    w = build_jobs(columns, n_jobs, path=None, fmt="blox")
    return _named(w, f"blox(n_jobs={n_jobs}, jobs_per_hour={jobs_per_hour}, seed={seed})")


def _named(workload: Workload, source: str) -> Workload:
    workload.source = source
    return workload


def gavel_scale_factors(rng: np.random.Generator, n: int) -> np.ndarray:
    """Gavel's `_generate_scale_factor`: 1/2/4/8 at 70/10/15/5%."""
    r = rng.uniform(0, 1, n)
    return np.select([r < 0.7, r <= 0.8, r <= 0.95], [1, 2, 4], 8).astype(np.int64)


def gavel(
    n_jobs: int,
    jobs_per_hour: float | None,
    seed: int = 0,
    multi_gpu: bool = False,
    *,
    multi_priority: bool = False,
    slo: bool = False,
    throughputs: ThroughputModel | None = None,
    fixed_duration: float | None = None,
) -> Workload:
    """Gavel's job generator (module docstring). extras: SLO (NaN when none)."""
    rng = np.random.default_rng(seed)
    sf = gavel_scale_factors(rng, n_jobs) if multi_gpu else np.ones(n_jobs, dtype=np.int64)
    any_idx = rng.integers(0, len(GAVEL_TEMPLATES), n_jobs)
    dist_idx = rng.integers(0, len(GAVEL_DISTRIBUTED), n_jobs)
    idx = np.where(sf > 1, dist_idx, any_idx)
    duration = (
        np.full(n_jobs, float(fixed_duration)) if fixed_duration else philly_durations(rng, n_jobs)
    )
    if jobs_per_hour is None:
        arrival = np.zeros(n_jobs)
    else:
        gaps = poisson_gaps(rng, n_jobs, 3600.0 / jobs_per_hour)
        arrival = np.concatenate([[0.0], np.cumsum(gaps[:-1])]) if n_jobs else np.zeros(0)
    weight = np.where(rng.uniform(0, 1, n_jobs) <= 0.2, 5.0, 1.0) if multi_priority else None
    slo_factor = np.full(n_jobs, np.nan)
    if slo:
        r = rng.uniform(0, 1, n_jobs)
        slo_factor = np.select([r < 0.33, r < 0.67], [1.2, 2.0], 10.0)
    job_types = np.array(GAVEL_TEMPLATES, dtype=object)[idx]
    columns: dict[str, Any] = {
        "job_id": _ids(n_jobs),
        "job_type": job_types.tolist(),
        "num_gpus": sf.tolist(),
        "duration": duration.tolist(),
        "submit_time": arrival.tolist(),
    }
    if weight is not None:
        columns["weight"] = weight.tolist()
    if slo:
        columns["deadline"] = (arrival + slo_factor * duration).tolist()
    if throughputs is not None:
        columns["total_steps"] = _steps(throughputs, job_types, sf, duration)
    import pandas as pd

    extras = pd.DataFrame({"SLO": slo_factor})
    w = build_jobs(columns, n_jobs, path=None, extras=extras, fmt="gavel")
    return _named(
        w,
        f"gavel(n_jobs={n_jobs}, jobs_per_hour={jobs_per_hour}, seed={seed}, "
        f"multi_gpu={multi_gpu})",
    )


def _steps(
    model: ThroughputModel,
    job_types: Sequence[str] | np.ndarray,  # (or an object array of str)
    gpus: np.ndarray,
    duration: np.ndarray,
) -> list[float | None]:
    """duration x throughput on the reference type, one lookup per distinct (type, GPUs)."""
    ref = model.reference_gpu_type
    cache: dict[tuple[str, int], float] = {}
    out: list[float | None] = []
    for jt, g, d in zip(job_types, gpus.tolist(), duration.tolist(), strict=True):
        key = (jt, g)
        if key not in cache:
            cache[key] = model.throughput(jt, ref, g)
        rate = cache[key]
        out.append(d * rate if rate > 0 else None)
    return out


def elasticflow_gpu_counts(rng: np.random.Generator, n: int, max_gpus: int = 16) -> np.ndarray:
    """ElasticFlow's ITP scale-factor CDF: 1/2/4/8/16 at 83/3/3/10/1%, capped at `max_gpus`."""
    r = rng.uniform(0, 1, n)
    sf = np.select([r < 0.83, r <= 0.86, r <= 0.89, r <= 0.99], [1, 2, 4, 8], 16).astype(np.int64)
    return np.minimum(sf, max_gpus)


def elasticflow(
    n_jobs: int,
    mean_gap_s: float,
    seed: int = 0,
    deadline_factor: tuple[float, float] = ELASTICFLOW_DEADLINE_FACTOR,
    *,
    best_effort_share: float = 0.0,
    max_gpus: int = 16,
    elastic: bool = False,
    throughputs: ThroughputModel | None = None,
    templates: Sequence[tuple[str, int]] = ELASTICFLOW_TEMPLATES,
) -> Workload:
    """ElasticFlow's trace generator (module docstring). extras: model_name, batch_size.
    `elastic`: each job may run on 1 to max(its GPUs, 64), as ElasticFlow reads the generated
    trace (`load_elasticflow(elastic=True)`), choosing the GPU counts itself."""
    lo, hi = deadline_factor
    if not 0 < lo <= hi:
        raise ValueError(f"deadline_factor must be 0 < min <= max, not {deadline_factor}")
    rng = np.random.default_rng(seed)
    tmpl = rng.integers(0, len(templates), n_jobs)
    gaps = poisson_gaps(rng, n_jobs, mean_gap_s)
    arrival = np.floor(np.concatenate([[0.0], np.cumsum(gaps[:-1])])) if n_jobs else np.zeros(0)
    duration = np.floor(philly_durations(rng, n_jobs, (1.0, 2.5), (2.5, 4.0)))
    gpus = elasticflow_gpu_counts(rng, n_jobs, max_gpus)
    deadline = arrival + np.floor(rng.uniform(lo, hi, n_jobs) * duration)
    best_effort = rng.uniform(0, 1, n_jobs) < best_effort_share
    models = [templates[i][0] for i in tmpl.tolist()]
    batches = [templates[i][1] for i in tmpl.tolist()]
    job_types = [f"{m}@{b}" for m, b in zip(models, batches, strict=True)]
    columns: dict[str, Any] = {
        "job_id": _ids(n_jobs),
        "job_type": job_types,
        "num_gpus": gpus.tolist(),
        "duration": duration.tolist(),
        "submit_time": arrival.tolist(),
        "deadline": deadline.tolist(),
        "best_effort": best_effort.tolist(),
    }
    if throughputs is not None:
        columns["total_steps"] = _steps(throughputs, job_types, gpus, duration)
    if elastic:
        columns["min_gpus"] = [1] * n_jobs
        columns["max_gpus"] = [max(g, ELASTIC_MAX_GPUS) for g in gpus.tolist()]
    import pandas as pd

    extras = pd.DataFrame({"model_name": models, "batch_size": batches})
    w = build_jobs(columns, n_jobs, path=None, extras=extras, fmt="elasticflow")
    return _named(w, f"elasticflow(n_jobs={n_jobs}, mean_gap_s={mean_gap_s}, seed={seed})")


def poisson_arrivals(
    jobs: Workload | Sequence[JobSpec], n_jobs: int, jobs_per_hour: float, seed: int = 0
) -> Workload:
    """Replay a job list the way Blox replays the Philly trace: job k is a copy of
    `jobs[k % len(jobs)]` with id `str(k)` and a Poisson arrival (first one gap after 0)."""
    import msgspec

    base = list(jobs)
    if not base:
        raise ValueError("no jobs to replay")
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(poisson_gaps(rng, n_jobs, 3600.0 / jobs_per_hour)).tolist()
    out = [
        msgspec.structs.replace(base[k % len(base)], job_id=str(k), submit_time=arrival[k])
        for k in range(n_jobs)
    ]
    return Workload(
        jobs=out,
        source=f"poisson_arrivals(n_jobs={n_jobs}, jobs_per_hour={jobs_per_hour}, seed={seed})",
        format="gpuyard",
    )


def spread_over_users(jobs: list[JobSpec], users: int, seed: int) -> list[JobSpec]:
    """The jobs, each given one of `users` users (`user0`, ...) uniformly at random: a stream
    of its own, so the generator's draws, and so the jobs, stay those of `seed`."""
    rng = np.random.default_rng([seed, USERS_STREAM])
    drawn = rng.integers(users, size=len(jobs))
    return [msgspec.structs.replace(j, user=f"user{u}") for j, u in zip(jobs, drawn, strict=True)]


USERS_STREAM = 0x75736572
"""The seed sequence's second word for `spread_over_users` ("user")."""
