"""Time Gavel's allocation programs (gpuyard.policies.gavel.programs): model build vs solver.

Run: python bench/bench_gavel_programs.py [--throughputs PATH] [--repeat N] [--seed S]

Jobs are drawn the way Gavel's workload generator draws them: a job template uniformly from
Gavel's `simulation_throughputs.json`, scale factor 1/2/4/8 with probability 0.70/0.10/0.15/0.05
(a template missing that scale factor falls back to 1), on 36 V100 + 36 P100 + 36 K80. Targets
(build + solve): max_min_fairness_perf 2,048 jobs <= 60 ms; max_min_fairness_packed 500 jobs
<= 2 s; finish_time_fairness_perf 500 jobs <= 0.3 s; water-filling 500 jobs <= 1 s.

"build" is everything outside the solver (arrays, model proto, reading and expanding results);
"solve" is the time inside OR-Tools (an interior point's iterations count as build). The policy
`finish_time_fairness_perf` takes ECOS's point (as Gavel's cvxpy gets it) up to
`interior.DENSE_UP_TO` variables (249 jobs on three types), the program's central point beyond:
500 jobs are solved as the second; the 200-job line shows the first. Each line is the median of
--repeat runs. The "distinct" lines perturb every job's isolated throughputs by a random factor in
[0.95, 1.05] so that no two jobs are interchangeable: the programs then cannot merge identical
jobs into one LP column (the worst case, as when throughputs are learned per job; not a target).
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gpuyard.policies.gavel import programs

GPU_TYPES = ("v100", "p100", "k80")
SCALE_FACTORS = (1, 2, 4, 8)
SCALE_PROBABILITIES = (0.70, 0.10, 0.15, 0.05)
DEFAULT_THROUGHPUTS = (
    Path(__file__).resolve().parents[2] / "shared/data/gavel/simulation_throughputs.json"
)


def load_table(path: Path) -> tuple[list[tuple[str, int]], np.ndarray, np.ndarray]:
    """Job types (template, scale factor), isolated throughputs [A, K], pair table [A, A, K]."""
    raw = json.loads(path.read_text())
    keys = sorted({ast.literal_eval(key) for key in raw[GPU_TYPES[0]]})
    index = {key: i for i, key in enumerate(keys)}
    alone = np.zeros((len(keys), len(GPU_TYPES)))
    pairs = np.zeros((len(keys), len(keys), len(GPU_TYPES)))
    for k, gpu in enumerate(GPU_TYPES):
        for key_text, entry in raw[gpu].items():
            a = index[ast.literal_eval(key_text)]
            alone[a, k] = entry.get("null", 0.0)
            for other_text, value in entry.items():
                if other_text != "null" and isinstance(value, list):
                    pairs[a, index[ast.literal_eval(other_text)], k] = value[0]
    return keys, alone, pairs


def draw_jobs(
    keys: list[tuple[str, int]], n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Job type index and scale factor of n jobs."""
    templates = sorted({name for name, _ in keys})
    index = {key: i for i, key in enumerate(keys)}
    names = rng.integers(0, len(templates), n)
    scale = rng.choice(SCALE_FACTORS, n, p=SCALE_PROBABILITIES)
    types = np.array(
        [
            index.get((templates[t], int(s)), index[(templates[t], 1)])
            for t, s in zip(names, scale, strict=True)
        ]
    )
    return types, np.array([keys[t][1] for t in types], dtype=np.float64)


def measure(label: str, run: Callable[[], programs.Allocation], repeat: int, target: str) -> None:
    builds, solves, totals, solves_n = [], [], [], 0
    allocation = None
    for _ in range(repeat):
        started = time.perf_counter()
        allocation = run()
        totals.append(time.perf_counter() - started)
        builds.append(allocation.stats.build_seconds)
        solves.append(allocation.stats.solve_seconds)
        solves_n = allocation.stats.num_solves
    assert allocation is not None
    print(
        f"{label:<52}{statistics.median(builds) * 1e3:>9.1f}{statistics.median(solves) * 1e3:>9.1f}"
        f"{statistics.median(totals) * 1e3:>9.1f}{solves_n:>7}  {target}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--throughputs", type=Path, default=DEFAULT_THROUGHPUTS)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    keys, alone, pair_table = load_table(args.throughputs)
    gpus = np.array([36.0, 36.0, 36.0])
    rng = np.random.default_rng(args.seed)
    print(
        f"{len(keys)} job types from {args.throughputs}; cluster 36 V100 + 36 P100 + 36 K80; "
        f"median of {args.repeat}"
    )
    print(f"{'program':<52}{'build ms':>9}{'solve ms':>9}{'total ms':>9}{'solves':>7}  target")

    def case(n: int, distinct: bool) -> dict[str, object]:
        types, sf = draw_jobs(keys, n, rng)
        tput = alone[types] * (rng.uniform(0.95, 1.05, (n, len(GPU_TYPES))) if distinct else 1.0)
        remaining = tput[:, 0] * 60 * 10 ** rng.uniform(1.5, 4, n)
        return {
            "throughputs": tput,
            "scale_factors": sf,
            "weights": np.ones(n),
            "remaining": remaining,
            "since_start": rng.uniform(0, 3600 * 10, n),
            "packing": programs.Packing(types, pair_table),
        }

    for distinct in (False, True):
        suffix = " (distinct)" if distinct else ""
        big, mid, small = case(2048, distinct), case(500, distinct), case(200, distinct)
        measure(
            f"max_min_fairness_perf, 2048 jobs{suffix}",
            lambda c=big: programs.max_min_fairness(
                c["throughputs"], c["scale_factors"], c["weights"], gpus
            ),
            args.repeat,
            "" if distinct else "<= 60 ms",
        )
        measure(
            f"max_min_fairness (agnostic), 2048 jobs{suffix}",
            lambda c=big: programs.max_min_fairness(
                programs.agnostic_throughputs(c["throughputs"]),
                c["scale_factors"],
                c["weights"],
                gpus,
            ),
            args.repeat,
            "",
        )
        measure(
            f"max_min_fairness_packed, 500 jobs{suffix}",
            lambda c=mid: programs.max_min_fairness(
                c["throughputs"], c["scale_factors"], c["weights"], gpus, packing=c["packing"]
            ),
            args.repeat,
            "" if distinct else "<= 2000 ms",
        )
        measure(
            f"finish_time_fairness_perf, 500 jobs{suffix}",
            lambda c=mid: programs.finish_time_fairness(
                c["throughputs"],
                c["scale_factors"],
                c["weights"],
                gpus,
                c["remaining"],
                c["since_start"],
            ),
            args.repeat,
            "" if distinct else "<= 300 ms",
        )
        measure(
            f"finish_time_fairness_perf (ECOS's point), 200 jobs{suffix}",
            lambda c=small: programs.finish_time_fairness(
                c["throughputs"],
                c["scale_factors"],
                c["weights"],
                gpus,
                c["remaining"],
                c["since_start"],
                tie_break="interior",
            ),
            args.repeat,
            "",
        )
        measure(
            f"water_filling_perf, 500 jobs{suffix}",
            lambda c=mid: programs.max_min_fairness_water_filling(
                c["throughputs"], c["scale_factors"], c["weights"], gpus
            ),
            args.repeat,
            "" if distinct else "<= 1000 ms",
        )
        measure(
            f"water_filling_perf (exact test), 500 jobs{suffix}",
            lambda c=mid: programs.max_min_fairness_water_filling(
                c["throughputs"], c["scale_factors"], c["weights"], gpus, bottleneck_test="exact"
            ),
            args.repeat,
            "",
        )
        measure(
            f"min_total_duration_perf, 500 jobs{suffix}",
            lambda c=mid: programs.min_total_duration(
                c["throughputs"], c["scale_factors"], gpus, c["remaining"]
            ),
            args.repeat,
            "",
        )
        measure(
            f"max_sum_throughput_perf, 500 jobs{suffix}",
            lambda c=mid: programs.max_sum_throughput(c["throughputs"], c["scale_factors"], gpus),
            args.repeat,
            "",
        )


if __name__ == "__main__":
    main()
