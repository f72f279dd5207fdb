"""Made-up per-GPU-type profiles in the artifact's layout, for tests and benchmarks (the real
ones are the artifact's, which gpuyard may not ship)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd


def write_profiles(folder: Path, speeds: Mapping[str, float], model: str = "synth") -> Path:
    """A model whose step time on each GPU type is its time on the fastest divided by
    `speeds[type]` (1: fastest); returns `folder`."""
    root = Path(folder) / model
    root.mkdir(parents=True, exist_ok=True)
    for batch in (128, 1024):
        epochs = range(1, 11)
        pd.DataFrame(
            {
                "progress": [100.0 * e for e in epochs],
                "iteration": [100 * e * 128 // batch for e in epochs],
                "metric": [0.1 * e for e in epochs],
                "grad_sqr": [1.0 / e for e in epochs],
                "grad_var": [0.5 * e for e in epochs],
            }
        ).to_csv(root / f"validation-{batch}.csv", index=False)
    for gpu_type, speed in speeds.items():
        rows = []
        for placement in ("1", "2", "4", "8", "88"):
            replicas = sum(int(d) for d in placement)
            for bsz in (32, 64, 128):
                compute = (0.01 + 0.001 * bsz) / speed
                sync = 0.0 if replicas == 1 else (0.005 + 0.001 * replicas) * len(placement)
                rows.append((int(placement), bsz, compute + sync, sync))
        placements = pd.DataFrame(
            rows, columns=["placement", "local_bsz", "step_time", "sync_time"]
        )
        placements.to_csv(root / f"placements-{gpu_type}.csv", index=False)
        scalability = pd.DataFrame(
            [
                (n, n * 8, bsz, (0.01 + 0.001 * bsz) / speed + 0.02 * n, 0.02 * n)
                for n in (2, 4, 8, 16)
                for bsz in (32, 64, 128)
            ],
            columns=["num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"],
        )
        scalability.to_csv(root / f"scalability-{gpu_type}.csv", index=False)
    return Path(folder)
