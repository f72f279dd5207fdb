"""A run's output folder: the files gpuyard writes there, and the rule that keeps one run's
results from mixing with another's: a folder that holds a run's results is refused, unless the
run is told to replace them (`--overwrite`, which removes gpuyard's own files and nothing else)."""

from __future__ import annotations

import contextlib
import datetime as dt
from pathlib import Path

RUN_FILES = frozenset({
    "jobs.csv", "timeline.csv", "summary.json", "options.json", "stats.json", "services.log",
    "workload.jsonl", "node_events.csv", "efficiency.csv", "jct_cdf.png", "timeline.png",
    "deadlines.png", "idle_nodes.png", "stderr.log", "queues.csv", "queues.png",
})  # fmt: skip
"""What one run writes into its folder (`stderr.log`: a comparison's run's terminal)."""
COMPARISON_FILES = frozenset(
    {"comparison.csv", "mean_jct.png", "mean_jct_vs_load.png", "jct_cdfs.png"}
)
"""What a comparison writes beside its runs' folders."""


def default_out(names: list[str], now: dt.datetime | None = None) -> Path:
    """`results/las-20261203-172501`: the run's policies and when it started."""
    stamp = (now or dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    return Path("results") / f"{'+'.join(names)}-{stamp}"


def results_in(folder: Path) -> list[str]:
    """gpuyard's result files in `folder`, a comparison's runs' folders with a `/`."""
    if not folder.is_dir():
        return []
    found = sorted(p.name for p in folder.iterdir()
                   if p.is_file() and p.name in RUN_FILES | COMPARISON_FILES)  # fmt: skip
    found += sorted(f"{p.name}/" for p in folder.iterdir() if p.is_dir() and _is_run(p))
    return found


def _is_run(folder: Path) -> bool:
    return any((folder / name).is_file() for name in RUN_FILES)


def claim(folder: Path, *, overwrite: bool) -> None:
    """Make `folder` this run's: ValueError (one line) if it holds another run's results and
    `overwrite` is not given; with it, those results are removed (gpuyard's files alone: any
    other file stays, and so does a folder that holds one)."""
    found = results_in(folder)
    if not found:
        return
    if not overwrite:
        shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
        raise ValueError(
            f"--out {folder} holds another run's results ({shown}): give another --out, or "
            "--overwrite to replace them"
        )
    for path in folder.iterdir():
        if path.is_file() and path.name in RUN_FILES | COMPARISON_FILES:
            path.unlink()
        elif path.is_dir() and _is_run(path):
            for item in path.iterdir():
                if item.is_file() and item.name in RUN_FILES:
                    item.unlink()
            with contextlib.suppress(OSError):  # (not empty: a file of someone else's stays)
                path.rmdir()
