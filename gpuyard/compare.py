"""Compare policies, loads and seeds in one command: every combination is its own `gpuyard sim`
process on one NATS server under its own cluster namespace, run concurrently; the summaries are
gathered into one table (`comparison.csv`) and plots (mean JCT against load, with the spread over
seeds; JCT CDFs), each captioned with what ran. The runs' processes are forked from a fork server
that has imported gpuyard once for all of them."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import signal
import sys
import threading
import warnings
from multiprocessing import forkserver
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd

from gpuyard.embedded import EmbeddedNats, die_with_parent
from gpuyard.report import save_figure

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# Started as `python -m gpuyard.cli`, a comparison's runs each execute that module again (as
# multiprocessing's `__mp_main__`, before their target runs); runpy then warns, once a run, that
# the fork server imported it already. Harmless: the fork server imports this module first.
warnings.filterwarnings(
    "ignore", r"'gpuyard\.cli' found in sys\.modules after import", RuntimeWarning, "runpy"
)

Combo = tuple[str, float | None, int | None]
"""(policy, load, seed); a trace has no load or seed."""


def run_name(policy: str, load: float | None, seed: int | None) -> str:
    name = policy
    if load is not None:
        name += f"-load{load:g}"
    if seed is not None:
        name += f"-seed{seed}"
    return name.replace(".", "_")


def policy_params(policy: str, params: list[str]) -> list[str]:
    """`k=v` applies to every policy, `policy.k=v` to that policy only."""
    chosen = []
    for pair in params:
        key = pair.partition("=")[0]
        if "." not in key:
            chosen.append(pair)
        elif key.split(".", 1)[0] == policy:
            chosen.append(pair.split(".", 1)[1])
    return chosen


async def run_all(
    base_args: list[str], combos: list[Combo], params: list[str], out: Path,
    nats_url: str | None, parallel: int,
) -> None:  # fmt: skip
    """Run every (policy, load, seed), `parallel` at a time; results land in `out/<run name>/`.

    Cancelled, it interrupts the runs under way (each writes its partial results), waits for
    them, starts no other, and raises CancelledError.
    """
    forks = multiprocessing.get_context("forkserver")
    forks.set_forkserver_preload(PRELOADED)
    await asyncio.to_thread(forkserver.ensure_running)
    # Every run holds the read end; nothing is ever written: it reads end-of-file when this
    # process ends, however it ends, and stops (its parent is the fork server, not us).
    comparison_lives, _writer = forks.Pipe(duplex=False)
    async with EmbeddedNats(runs=parallel) if nats_url is None else _Given(nats_url) as url:
        gate = asyncio.Semaphore(parallel)
        done = 0

        async def one(policy: str, load: float | None, seed: int | None) -> None:
            nonlocal done
            name = run_name(policy, load, seed)
            folder = out / name
            folder.mkdir(parents=True, exist_ok=True)
            argv = [
                "sim", *base_args, "--nats", url, "--cluster", name, "--policy", policy,
                "--out", str(folder),
            ]  # fmt: skip
            if load is not None:
                argv += ["--load", str(load)]
            if seed is not None:
                argv += ["--seed", str(seed)]
            for pair in policy_params(policy, params):
                argv += ["--param", pair]
            async with gate:
                proc = forks.Process(
                    target=_sim_process, args=(argv, folder / "stderr.log", comparison_lives)
                )
                # (Off the loop: the first start waits for the fork server's imports.)
                start = asyncio.ensure_future(asyncio.to_thread(proc.start))
                try:
                    await asyncio.shield(start)
                    code = await _exit_code(proc)
                except asyncio.CancelledError:
                    await start  # a start under way completes: then interrupt what it started
                    os.kill(proc.pid, signal.SIGINT)  # it writes its partial results
                    await _exit_code(proc)
                    raise
            done += 1
            status = "ok" if code == 0 else f"FAILED ({code}): see {folder / 'stderr.log'}"
            print(f"[{done}/{len(combos)}] {name}: {status}", file=sys.stderr, flush=True)

        # A task group, not gather: cancelled, it waits for every run to write its results
        # before the server they share goes away.
        async with asyncio.TaskGroup() as group:
            for combo in combos:
                group.create_task(one(*combo))


PRELOADED = [
    "gpuyard.compare", "gpuyard.cli", "gpuyard.sim", "gpuyard.report", "gpuyard.workloads", "uvloop",
    "gpuyard.services.admission.service", "gpuyard.services.scheduler.service",
    "gpuyard.services.placement.service", "gpuyard.services.nodeagent.service",
    "gpuyard.policies.gavel.policies",  # (OR-Tools: the dearest import of the policies)
]  # fmt: skip
"""Imported once, by the fork server every run's process is forked from, rather than by each
run (1.5-2 CPU-s a run on a 2-core machine)."""


def _sim_process(argv: list[str], stderr_log: Path, comparison_lives: Connection) -> None:
    """A run's process: `gpuyard sim ARGV`, forked from the fork server with `PRELOADED`
    imported; its stderr to `stderr_log`, its stdout nowhere. Its own process group (a Ctrl-C
    reaches the comparison, which passes it on once); sent SIGTERM when the comparison ends
    (`comparison_lives` reads end-of-file), as a run started by the comparison itself would be
    (`die_with_parent`)."""
    from gpuyard.cli import main

    die_with_parent()  # (its parent: the fork server)
    threading.Thread(target=_stop_with, args=(comparison_lives,), daemon=True).start()
    for fd, path, flags in ((1, os.devnull, os.O_WRONLY),
                            (2, stderr_log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):  # fmt: skip
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


def _stop_with(comparison_lives: Connection) -> None:
    with contextlib.suppress(EOFError, OSError):
        comparison_lives.recv()  # (nothing is ever sent)
    os.kill(os.getpid(), signal.SIGTERM)


async def _exit_code(proc: multiprocessing.process.BaseProcess) -> int:
    """Wait, without blocking the loop, for `proc` to end; its exit code (-N: killed by signal
    N)."""
    loop = asyncio.get_running_loop()
    ended = loop.create_future()
    loop.add_reader(proc.sentinel, lambda: ended.done() or ended.set_result(None))
    try:
        await ended
    finally:
        loop.remove_reader(proc.sentinel)
    proc.join()
    assert proc.exitcode is not None
    return proc.exitcode


class _Given:
    """`async with` for a server that is already running."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def __aenter__(self) -> str:
        return self.url

    async def __aexit__(self, *exc: object) -> None:
        return None


def comparison_table(combos: list[Combo], out: Path) -> pd.DataFrame:
    """One row per run that wrote a summary (complete or partial): its policy, load, seed and
    summary; policy parameters as JSON text."""
    rows = []
    for policy, load, seed in combos:
        summary_path = out / run_name(policy, load, seed) / "summary.json"
        if summary_path.exists():
            summary = json.loads(summary_path.read_text())
            summary = {
                k: json.dumps(v, sort_keys=True) if isinstance(v, dict) else v
                for k, v in summary.items()
            }
            rows.append({**summary, "policy": policy, "load": load, "seed": seed})
    table = pd.DataFrame(rows)
    if not table.empty:
        table["partial"] = table["partial"].fillna(False).astype(bool)
        table["load"] = table["load"].astype(float)  # NaN: a trace
        table["seed"] = table["seed"].astype(object)  # None: a trace
    return table


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _values(table: pd.DataFrame, column: str) -> str:
    values = [v for v in table[column].drop_duplicates().tolist() if not _missing(v)]
    return ", ".join(str(v) for v in values) or "-"


PRESETS = {"blox": "Blox", "gavel": "Gavel", "elasticflow": "ElasticFlow", "bftrainer": "BFTrainer"}
"""`gpuyard sim`'s option sets that stand for a reference simulator, and its name."""


def comparison_caption(table: pd.DataFrame, args: argparse.Namespace) -> str:
    """What ran, for every plot of a comparison: workload, seeds, simulator semantics, rounds
    and throughputs where given, cluster, the other policies."""
    if args.trace is not None:
        workload = f"trace {Path(args.trace).name}"
    else:
        workload = f"{args.generator or 'blox'} generator, {args.jobs or 400:,} jobs per run"
        if not table.empty:
            workload += f", seeds {_values(table, 'seed')}"
    lines = [workload]
    setting = [f"{name}'s simulator semantics (--{preset})" for preset, name in PRESETS.items()
               if getattr(args, preset, False)]  # fmt: skip
    if getattr(args, "round_s", None):
        setting.append(f"{args.round_s:g} s rounds")
    if getattr(args, "throughputs", None):
        setting.append(f"throughputs {Path(args.throughputs).name}")
    if setting:
        lines.append("; ".join(setting))
    if not table.empty and "cluster" in table:
        lines[0] += f"; cluster {_values(table, 'cluster')}"
        lines.append(
            f"admission {_values(table, 'admission')}, placement {_values(table, 'placement')}"
        )
        if "window" in table and table["window"].notna().any():
            first, end = table["window"].dropna().iloc[0]
            lines[-1] += f"; JCT of jobs {first} to {end - 1} of each run (measurement window)"
        if table["partial"].any():
            lines.append(f"PARTIAL: {int(table['partial'].sum())} run(s) interrupted")
    return "\n".join(lines)


def format_comparison(table: pd.DataFrame) -> str:
    """The comparison for people: hours and percentages, one row per run."""
    total = table["jobs_in_workload"] if "jobs_in_workload" in table else table["jobs"]
    total = total.fillna(table["jobs"]).astype(int)
    shown = pd.DataFrame(
        {
            "policy": table["policy"],
            "load (jobs/h)": table["load"].map(lambda v: "-" if _missing(v) else f"{v:g}"),
            "seed": table["seed"].map(lambda v: "-" if _missing(v) else str(v)),
            "completed": [f"{c:,}/{t:,}" for c, t in zip(table["completed"], total, strict=True)],
            "mean JCT (h)": (table["mean_jct"] / 3600).round(2),
            "p95 JCT (h)": (table["p95_jct"] / 3600).round(2),
            "makespan (h)": (table["makespan"] / 3600).round(2),
            "utilisation (%)": (100 * table["utilization"]).round(1),
            "partial": table["partial"].map({True: "PARTIAL", False: ""}),
        }
    )
    if "deadline_satisfactory_ratio" in table and table["deadline_satisfactory_ratio"].notna().any():
        shown.insert(
            len(shown.columns) - 1, "deadlines met (%)",
            (100 * table["deadline_satisfactory_ratio"].astype(float)).round(1),
        )  # fmt: skip
    return shown.to_string(index=False)


def write_comparison(table: pd.DataFrame, out: Path, caption: str = "") -> list[Path]:
    table.to_csv(out / "comparison.csv", index=False)
    paths = [out / "comparison.csv"]
    if table.empty:
        return paths
    done = table[~table["partial"]]  # an interrupted run's mean is not comparable
    if done.empty:
        pass
    elif done["load"].notna().any():
        paths.append(_plot_mean_jct_vs_load(done, out, caption))
    else:
        paths.append(_plot_mean_jct(done, out, caption))
    paths.append(_plot_cdfs(table, out, caption))
    return paths


def _plot_mean_jct_vs_load(done: pd.DataFrame, out: Path, caption: str) -> Path:
    """Mean JCT against load, one line per policy: the mean over seeds, bars from the lowest to
    the highest seed's value."""
    stats = (
        done.groupby(["policy", "load"], sort=True)["mean_jct"]
        .agg(["mean", "min", "max", "count"])
        .reset_index()
    )
    fig, ax = plt.subplots(figsize=(7, 5))
    for policy, rows in stats.groupby("policy"):
        mean = rows["mean"].to_numpy() / 3600
        spread = np.vstack([mean - rows["min"] / 3600, rows["max"] / 3600 - mean])
        ax.errorbar(rows["load"], mean, yerr=spread, marker="o", capsize=4, label=policy)
    seeds = int(stats["count"].max())
    ax.set_xlabel("load (jobs per hour)")
    ax.set_ylabel("mean JCT (hours)")
    ax.set_title(
        f"mean JCT vs load: mean over {seeds} seed{'s' if seeds > 1 else ''}"
        + (", bars min to max over seeds" if seeds > 1 else "")
    )
    ax.legend(title="scheduling policy")
    ax.grid(True, alpha=0.3)
    how = (
        f"points: mean over {seeds} seeds; bars: from the lowest to the highest seed's mean JCT"
        if seeds > 1
        else "one seed: no spread to show"
    )
    return save_figure(fig, out / "mean_jct_vs_load.png", f"{caption}\n{how}")


def _plot_mean_jct(done: pd.DataFrame, out: Path, caption: str) -> Path:
    """A trace has no load: mean JCT per policy, bars."""
    fig, ax = plt.subplots(figsize=(7, 5))
    bars = ax.bar(done["policy"], done["mean_jct"] / 3600, color="tab:blue")
    ax.bar_label(bars, fmt="%.2f h", fontsize=8)
    ax.set_ylabel("mean JCT (hours)")
    ax.set_title("mean JCT per scheduling policy")
    ax.grid(True, axis="y", alpha=0.3)
    return save_figure(fig, out / "mean_jct.png", caption)


def _plot_cdfs(table: pd.DataFrame, out: Path, caption: str) -> Path:
    """JCT CDFs, one panel per load, one line per policy (every seed's jobs together)."""
    loads = table["load"].drop_duplicates().tolist()
    seeds = table["seed"].drop_duplicates().tolist()
    pooled = f" ({len(seeds)} seeds pooled)" if len(seeds) > 1 else ""
    fig, axes = plt.subplots(1, len(loads), figsize=(5.5 * len(loads), 4.8), squeeze=False)
    for ax, load in zip(axes[0], loads, strict=True):
        at_load = table[table["load"].isna()] if _missing(load) else table[table["load"] == load]
        for policy in sorted(at_load["policy"].unique()):
            jct: list[np.ndarray] = []
            for seed in at_load.loc[at_load["policy"] == policy, "seed"]:
                name = run_name(policy, None if _missing(load) else load, seed)
                jobs = out / name / "jobs.csv"
                if jobs.exists():
                    frame = pd.read_csv(jobs)
                    jct.append(
                        frame.loc[frame["state"] == "completed", "jct"].to_numpy(dtype=float)
                    )
            values = np.sort(np.concatenate(jct)) if jct else np.array([])
            if len(values):
                ax.plot(
                    values / 3600, np.arange(1, len(values) + 1) / len(values),
                    label=f"{policy} ({len(values):,} jobs)",
                )  # fmt: skip
        ax.set_xscale("log")
        ax.set_title(("JCT CDF" if _missing(load) else f"JCT CDF, load {load:g} jobs/h") + pooled)
        ax.set_xlabel("JCT (hours, log scale)")
        ax.set_ylabel("fraction of completed jobs")
        ax.grid(True, alpha=0.3)
        ax.legend(title="scheduling policy", fontsize=8)
    return save_figure(fig, out / "jct_cdfs.png", caption)


def default_parallel() -> int:
    return max(1, len(os.sched_getaffinity(0)))
