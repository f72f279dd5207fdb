"""Compare policies, loads and seeds in one command: every combination is a run of its own
(`gpuyard.run.single`) in a process of its own, on a private server of its own (or all on a given one, each under its own cluster
namespace), run concurrently, each on a CPU of its own; the summaries are gathered into one table
(`comparison.csv`) and plots (mean JCT against load, with the spread over seeds; JCT CDFs), each
captioned with what ran. The runs' processes are forked from a fork server that has imported
gpuyard once for all of them."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import signal
import sys
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from gpuyard.report import save_figure, subplots
from gpuyard.run.forks import Forked, cpu_slots, fork_server
from gpuyard.run.presets import semantics
from gpuyard.run.single import simulate_encoded
from gpuyard.run.spec import RunPlace, RunSpec

Combo = tuple[str, float | None, int | None]
"""(policy, load, seed); a trace has no load or seed."""


def run_name(policy: str, load: float | None, seed: int | None) -> str:
    name = policy
    if load is not None:
        name += f"-load{load:g}"
    if seed is not None:
        name += f"-seed{seed}"
    return name.replace(".", "_")


async def run_all(
    runs: list[tuple[str, RunSpec]], place: RunPlace, parallel: int, *, pin: bool = True
) -> None:
    """Run every (name, spec), `parallel` at a time; results land in `place.out/<name>/`, under
    the cluster namespace `<name>`. Without `place.nats_url`, each on a private server of its
    own (as `gpuyard sim` runs); `pin`: each on a CPU of its own, its server with it (`Forked`'s
    `cpu`), the CPUs this process may use in turn.

    Cancelled, it interrupts the runs under way (each writes its partial results), waits for
    them, starts no other, and raises CancelledError.
    """
    await asyncio.to_thread(fork_server)
    cpus: asyncio.Queue[int | None] = asyncio.Queue()
    for cpu in cpu_slots(parallel) if pin else [None] * parallel:
        cpus.put_nowait(cpu)  # a run takes one, and gives it back when it ends
    done = 0

    async def one(name: str, spec: RunSpec) -> None:
        nonlocal done
        folder = place.out / name
        folder.mkdir(parents=True, exist_ok=True)
        here = dataclasses.replace(place, out=folder, cluster=name, json=False)
        cpu = await cpus.get()
        try:
            proc = Forked(simulate_encoded, (msgspec.msgpack.encode(spec), here),
                          folder / "stderr.log", cpu=cpu)  # fmt: skip
            start = asyncio.ensure_future(proc.start())
            try:
                await asyncio.shield(start)
                code = await proc.wait()
            except asyncio.CancelledError:
                await start  # a start under way completes: then interrupt what it started
                proc.signal(signal.SIGINT)  # it writes its partial results
                await proc.wait()
                raise
        finally:
            cpus.put_nowait(cpu)
        done += 1
        status = "ok" if code == 0 else f"FAILED ({code}): see {folder / 'stderr.log'}"
        print(f"[{done}/{len(runs)}] {name}: {status}", file=sys.stderr, flush=True)

    # A task group, not gather: cancelled, it waits for every run to write its results.
    async with asyncio.TaskGroup() as group:
        for name, spec in runs:
            group.create_task(one(name, spec))


def comparison_table(combos: list[Combo], out: Path) -> pd.DataFrame:
    """One row per run, in the order of `combos`: its policy, load, seed, `status` (ok, partial:
    interrupted, failed, or not run) and, where it wrote one, its summary (policy parameters as
    JSON text); a failed run's `error` is the last line it wrote on stderr."""
    rows = []
    for policy, load, seed in combos:
        folder = out / run_name(policy, load, seed)
        row: dict[str, Any] = {"policy": policy, "load": load, "seed": seed}
        if (folder / "summary.json").exists():
            summary = json.loads((folder / "summary.json").read_text())
            summary = {
                k: json.dumps(v, sort_keys=True) if isinstance(v, dict) else v
                for k, v in summary.items()
            }
            status = "partial" if summary.get("partial") else "ok"
            rows.append({**summary, **row, "status": status})
        elif (folder / "stderr.log").exists():  # (started: its stderr is its one line of why)
            said = (folder / "stderr.log").read_text(errors="replace").strip().splitlines()
            rows.append({**row, "partial": False, "status": "failed",
                         "error": said[-1] if said else "it ended without a word"})  # fmt: skip
        else:
            rows.append({**row, "partial": False, "status": "not run"})
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


def _with_params(table: pd.DataFrame, kind: str) -> str:
    """Each policy of a kind the runs used, with its parameters as the service ran them:
    `las (key=gpu_seconds, starvation_s=3600000.0); fifo (backfill=False)`."""
    column = "policy_params" if kind == "policy" else f"{kind}_params"
    shown = []
    for name, params in table[[kind, column]].drop_duplicates().itertuples(index=False):
        given = json.loads(params) if isinstance(params, str) and params else {}
        text = ", ".join(f"{k}={v}" for k, v in given.items())
        shown.append(f"{name} ({text})" if text else str(name))
    return "; ".join(shown) or "-"


def comparison_caption(table: pd.DataFrame, spec: RunSpec) -> str:
    """What ran, for every plot of a comparison (`spec`: its first run): workload, seeds,
    simulator semantics, rounds and throughputs where given, cluster, the other policies."""
    if spec.trace is not None:
        workload = f"trace {Path(spec.trace).name}"
    else:
        workload = f"{spec.generator or 'blox'} generator, {spec.jobs or 400:,} jobs per run"
        if not table.empty:
            workload += f", seeds {_values(table, 'seed')}"
    lines = [workload]
    setting = []
    if spec.preset is not None:
        setting.append(f"{semantics(spec.preset).title}'s simulator semantics (--{spec.preset})")
    if not table.empty and "round_s" in table:  # (as the runs ran them: a preset's own)
        rounds = ", ".join(f"{r:g}" for r in table["round_s"].drop_duplicates() if not _missing(r))
        setting.append(f"{rounds} s rounds, {_values(table, 'mode')} mode")
    elif spec.round_s:
        setting.append(f"{spec.round_s:g} s rounds")
    if spec.throughputs:
        setting.append(f"throughputs {Path(spec.throughputs).name}")
    if setting:
        lines.append("; ".join(setting))
    if not table.empty and "cluster" in table:
        lines[0] += f"; cluster {_values(table, 'cluster')}"
        lines.append(f"scheduling {_with_params(table, 'policy')}")
        lines.append(
            f"admission {_with_params(table, 'admission')}, placement "
            f"{_with_params(table, 'placement')}"
        )
        if "window" in table and table["window"].notna().any():
            first, end = table["window"].dropna().iloc[0]
            lines[-1] += f"; JCT of jobs {first} to {end - 1} of each run (measurement window)"
        if table["partial"].any():
            lines.append(f"PARTIAL: {int(table['partial'].sum())} run(s) interrupted")
        failed = int((table["status"] == "failed").sum()) if "status" in table else 0
        if failed:
            lines.append(f"FAILED: {failed} run(s), not shown (comparison.csv says why)")
    return "\n".join(lines)


SHOWN = ("jobs_in_workload", "jobs", "completed", "mean_jct", "p95_jct", "makespan", "utilization")
"""The summary's columns the comparison shows (a table of failed runs alone has none)."""


def format_comparison(table: pd.DataFrame) -> str:
    """The comparison for people: hours and percentages, one row per run (a run that failed or
    did not run: its status, and `-`)."""
    table = table.reindex(columns=[*table.columns, *(c for c in SHOWN if c not in table)])
    total = table["jobs_in_workload"].fillna(table["jobs"])
    shown = pd.DataFrame(
        {
            "policy": table["policy"],
            "load (jobs/h)": table["load"].map(lambda v: "-" if _missing(v) else f"{v:g}"),
            "seed": table["seed"].map(lambda v: "-" if _missing(v) else str(v)),
            "completed": [
                "-" if _missing(c) else f"{int(c):,}/{int(t):,}"
                for c, t in zip(table["completed"], total, strict=True)
            ],
            "mean JCT (h)": (table["mean_jct"] / 3600).round(2),
            "p95 JCT (h)": (table["p95_jct"] / 3600).round(2),
            "makespan (h)": (table["makespan"] / 3600).round(2),
            "utilisation (%)": (100 * table["utilization"]).round(1),
            "status": table["status"].map(lambda s: "" if s == "ok" else s.upper()),
        }
    )
    shown = shown.astype(object).where(shown.notna(), "-")
    if (
        "deadline_satisfactory_ratio" in table
        and table["deadline_satisfactory_ratio"].notna().any()
    ):
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
    done = table[table["status"] == "ok"]  # an interrupted run's mean is not comparable
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
    fig, ax = subplots(figsize=(7, 5))
    for policy, rows in stats.groupby("policy"):
        mean = rows["mean"].to_numpy() / 3600
        spread = np.vstack([mean - rows["min"] / 3600, rows["max"] / 3600 - mean])
        ax.errorbar(rows["load"], mean, yerr=spread, marker="o", capsize=4,
                    label=f"{policy} (n={_seeds(rows['count'])})")  # fmt: skip
    # Every point's n: points of one policy can average fewer seeds (a run interrupted).
    seeds, most = _seeds(stats["count"]), int(stats["count"].max())
    ax.set_xlabel("load (jobs per hour)")
    ax.set_ylabel("mean JCT (hours)")
    ax.set_title(
        f"mean JCT vs load: mean over {seeds} seed{'s' if most > 1 else ''}"
        + (", bars min to max over seeds" if most > 1 else "")
    )
    ax.legend(title="scheduling policy")
    ax.grid(True, alpha=0.3)
    how = (
        f"points: mean over {seeds} seeds"
        + ("" if seeds == str(most) else " (each policy's n in the legend)")
        + "; bars: from the lowest to the highest seed's mean JCT"
        if most > 1
        else "one seed: no spread to show"
    )
    return save_figure(fig, out / "mean_jct_vs_load.png", f"{caption}\n{how}")


def _seeds(counts: pd.Series) -> str:
    """The seeds the points average: `3`, or `2 to 3` where they differ."""
    least, most = int(counts.min()), int(counts.max())
    return str(least) if least == most else f"{least} to {most}"


def _plot_mean_jct(done: pd.DataFrame, out: Path, caption: str) -> Path:
    """A trace has no load: mean JCT per policy, bars."""
    fig, ax = subplots(figsize=(7, 5))
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
    fig, axes = subplots(1, len(loads), figsize=(5.5 * len(loads), 4.8), squeeze=False)
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
