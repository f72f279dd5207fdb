"""`gpuyard report RESULTS`: a sweep's figures (PNG and SVG, each captioned with what ran) and one
self-contained HTML page with all of them, a table per scheme and load, and the failed runs.

Runs are grouped into series: a series is a scheme (a run's label, else its policy) plus any other
input that varies across the sweep except the figures' x axis (the load, unless the sweep file's
`[report]` names another field) and the seed; seeds are repetitions. Every
mean over seeds names its n (the seeds it averages) and comes with a bar (`spread`): the 95%
confidence interval (Student's t) from 3 seeds on, clipped to what the metric can be (`BOUNDS`);
the lowest to the highest value with 2 seeds (a t interval on one degree of freedom is 12.7
standard errors wide); none with 1."""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from gpuyard.report import save_figure, subplots
from gpuyard.sweep.config import RUN_FIELDS, FigureName, ReportSettings, report_settings
from gpuyard.sweep.engine import measured

T_975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042]  # fmt: skip
"""Student's t, 97.5% quantile, for 1 to 30 degrees of freedom."""


LINES: list[Any] = ["-", "--", "-.", (0, (3, 1, 1, 1, 1, 1))]
"""Line styles, in turn, so that series that coincide stay visible (dotted is for GPUs present)."""


BOUNDS: dict[str, tuple[float, float]] = {
    "mean_jct": (0, math.inf), "p95_jct": (0, math.inf), "makespan": (0, math.inf),
    "utilization": (0, 1), "deadline_satisfactory_ratio": (0, 1),
    "rho_max": (1, math.inf), "rho_jain": (0, 1), "jct_improvement": (0, math.inf),
}  # fmt: skip
"""What each metric can be (unscaled): times are never negative; utilisation, the deadline ratio
and Jain's index lie in [0, 1]; rho (a job's JCT over its time running) is at least 1. A t
interval is clipped to this range, widened to take in any value observed outside it."""

MIN_T = 3
"""Fewest values that get a t interval; fewer get min to max (two) or no bar (one)."""


class ReportError(ValueError):
    """No results to report on, in one line."""


def ci95(values: pd.Series) -> float:
    """Half-width of the 95% confidence interval of the mean (0 for fewer than two values)."""
    values = values.dropna()
    n = len(values)
    if n < 2:
        return 0.0
    t = T_975[n - 2] if n - 1 <= len(T_975) else 1.96
    return float(t * values.std(ddof=1) / math.sqrt(n))


@dataclass(frozen=True)
class Spread:
    """A mean over `n` values and its bar, from `low` to `high`: `kind` "ci" (a 95% t interval,
    clipped at the metric's bounds where it would pass them), "range" (min to max) or "none"
    (one value)."""

    mean: float
    n: int
    low: float
    high: float
    kind: str
    clipped_low: bool = False
    clipped_high: bool = False

    @property
    def clipped(self) -> bool:
        return self.clipped_low or self.clipped_high


def spread(values: pd.Series, bounds: tuple[float, float] = (-math.inf, math.inf)) -> Spread:
    """The mean of `values` (NaN left out) and its bar: a 95% t interval clipped to `bounds` from
    `MIN_T` values on, min to max for fewer, none for one."""
    values = pd.to_numeric(values, errors="coerce").dropna()
    n = len(values)
    mean = float(values.mean()) if n else math.nan
    if n < 2:
        return Spread(mean, n, mean, mean, "none")
    least, most = float(values.min()), float(values.max())
    if n < MIN_T:
        return Spread(mean, n, least, most, "range")
    half = ci95(values)
    # the range the metric allows, widened to the data should a value lie outside it
    floor, ceiling = min(bounds[0], least), max(bounds[1], most)
    low, high = max(mean - half, floor), min(mean + half, ceiling)
    return Spread(mean, n, low, high, "ci", low > mean - half, high < mean + half)


AXIS_LABELS = {
    "load": "load (jobs per hour)", "cluster_spec": "cluster", "trace": "trace",
    "best_effort_share": "share of best-effort jobs (%)", "seed": "seed",
}  # fmt: skip
"""How an x axis is labelled (others: the field's name)."""


@dataclass(frozen=True)
class Axis:
    """The figures' x axis: a run field (`load` by default; the sweep file's `[report] x`).
    Numbers are a line's points; other values (clusters, traces) groups of bars, in the sweep
    file's order."""

    field: str = "load"

    @property
    def label(self) -> str:
        return AXIS_LABELS.get(self.field, self.field.replace("_", " "))

    def present(self, table: pd.DataFrame) -> bool:
        """Whether the runs vary along it (one value is no axis: a bar per series instead)."""
        return self.field in table and table[self.field].dropna().nunique() > 1

    def given(self, table: pd.DataFrame) -> bool:
        """Whether the runs have values of it (the summary table's column, even of one value)."""
        return self.field in table and bool(table[self.field].notna().any())

    def numeric(self, table: pd.DataFrame) -> bool:
        return bool(pd.api.types.is_numeric_dtype(table[self.field]))

    def values(self, table: pd.DataFrame) -> list[Any]:
        """Its values in `table`: numbers rising, others in the sweep file's order."""
        found = table[self.field].dropna().drop_duplicates().tolist()
        return sorted(found) if self.numeric(table) else found

    def scale(self, value: Any) -> Any:
        """A value as the axis shows it (a share in %)."""
        return 100 * value if self.field == "best_effort_share" else value

    def tick(self, table: pd.DataFrame, value: Any) -> str:
        """A value as a tick names it: a cluster file by its nodes and GPUs when the runs say."""
        if self.field == "cluster_spec" and "cluster" in table:
            named = table.loc[table[self.field] == value, "cluster"].dropna()
            if len(named):  # `8x8:a100` over `(64 GPUs)`
                return str(named.iloc[0]).replace(" (", "\n(")
        shown = _short(self.field, self.scale(value))
        if self.field not in ("trace", "cluster_spec"):
            return shown
        # By its stem; by its folder too where stems repeat (a workload at several loads).
        stems = [Path(str(v)).stem for v in table[self.field].dropna().unique()]
        path = Path(str(value))
        return f"{path.parent.name}/{path.stem}" if stems.count(path.stem) > 1 else path.stem

    def at(self, table: pd.DataFrame, value: Any) -> str:
        """A panel's title: `load 10 jobs/h`, `cluster 8x8:a100 (64 GPUs)`."""
        if self.field == "load":
            return f"load {value:g} jobs/h"
        unit = "% best-effort" if self.field == "best_effort_share" else ""
        name = "" if unit else f"{AXIS_LABELS.get(self.field, self.field)} "
        return f"{name}{self.tick(table, value).replace(chr(10), ' ')}{unit}"


LOAD = Axis()


def _short(column: str, value: Any) -> str:
    if isinstance(value, str) and ("/" in value or column in ("trace", "throughputs")):
        return Path(value).name
    return f"{value:g}" if isinstance(value, float) else str(value)


def with_series(table: pd.DataFrame, axis: Axis = LOAD) -> pd.DataFrame:
    """`table` with a `series` column: the scheme and every other input that varies (but the
    axis's and the seed), and `inputs`, those other inputs alone."""
    fixed = {"label", "policy", "seed", axis.field}
    keys = [table["scheme"], table[axis.field].astype(str), table["seed"].astype(str)]
    # An input is named when it tells apart runs of the same scheme, load and seed.
    varying = [c for c in table.columns if c in RUN_FIELDS - fixed
               and (table[c].astype(str).groupby(keys, dropna=False).nunique() > 1).any()]  # fmt: skip
    table = table.copy()

    def inputs(row: pd.Series) -> str:
        return ", ".join(f"{c}={_short(c, row[c])}" for c in varying)

    table["inputs"] = table.apply(inputs, axis=1) if len(table) else []
    table["series"] = [f"{scheme} ({extra})" if extra else scheme
                       for scheme, extra in zip(table["scheme"], table["inputs"], strict=True)]  # fmt: skip
    return table


def _values(table: pd.DataFrame, column: str) -> str:
    values = [str(v) for v in table[column].dropna().unique()] if column in table else []
    return ", ".join(values[:4]) + (f" and {len(values) - 4} more" if len(values) > 4 else "")


def caption(table: pd.DataFrame, sweep: str) -> str:
    """What ran, for every figure: the sweep, its runs, workloads, seeds, cluster, policies."""
    failed = int((table["status"] != "ok").sum())
    seeds = _values(table, "seed")
    lines = [
        f"sweep {sweep}: {len(table)} runs" + (f" ({failed} failed or missing)" if failed else "")
        + (f"; seeds {seeds}" if seeds else ""),
        f"workload {_workload(table)}; cluster {_values(table, 'cluster') or _values(table, 'cluster_spec')}",
    ]  # fmt: skip
    policies = f"admission {_values(table, 'ran_admission') or _values(table, 'admission')}, "
    policies += f"placement {_values(table, 'ran_placement') or _values(table, 'placement')}"
    presets = _values(table, "preset")
    if presets and "as_intended" in table:
        mended = table["as_intended"].fillna(False).astype(bool)
        presets += (
            " (as intended)"
            if mended.all()
            else " (as intended where marked)"
            if mended.any()
            else ""
        )
    lines.append(policies + (f"; {presets} semantics" if presets else ""))
    rounds = (
        ", ".join(f"{v:g}" for v in table["round_s"].dropna().unique())
        if "round_s" in table
        else ""
    )
    if rounds:  # (ElasticFlow's scheduling slots, Blox's and Gavel's rounds)
        lines[-1] += f", {rounds} s {'slots' if presets == 'elasticflow' else 'rounds'}"
    return "\n".join(lines)


def _workload(table: pd.DataFrame) -> str:
    if table["trace"].notna().any():
        return "trace " + ", ".join(sorted({Path(t).name for t in table["trace"].dropna()}))
    generators = _values(table, "generator") or "blox"
    jobs = _values(table, "jobs") or "400"
    text = f"{generators} generator, {jobs} jobs per run"
    for column, before, after in (("load", "", " jobs/h"), ("deadline_factor", "deadline factor ", ""),
                                  ("best_effort_share", "best-effort share ", "")):  # fmt: skip
        values = _values(table, column)
        text += f", {before}{values}{after}" if values else ""
    return text


def _by_series_load(ok: pd.DataFrame, column: str, axis: Axis = LOAD) -> pd.DataFrame:
    """`spread` of `column` over seeds (its fields a column each), per series and value of the
    axis (the load)."""
    keys = ["series", axis.field] if axis.present(ok) else ["series"]
    bounds = BOUNDS.get(column, (-math.inf, math.inf))
    rows = [dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
            | vars(spread(group[column], bounds))
            for key, group in ok.groupby(keys, sort=True, dropna=False)]  # fmt: skip
    columns = [*keys, "mean", "n", "low", "high", "kind", "clipped_low", "clipped_high"]
    return pd.DataFrame(rows, columns=columns)


def _bars(stats: pd.DataFrame, scale: float) -> np.ndarray:
    """Error bars for matplotlib: below and above each mean."""
    return np.vstack([stats["mean"] - stats["low"], stats["high"] - stats["mean"]]) * scale


def _error_bars(stats: pd.DataFrame, scale: float) -> np.ndarray | None:
    """`_bars`, or None where no point has one (one seed each: no caps drawn at the means)."""
    return None if (stats["kind"].isin(["none"]) | stats["n"].isna()).all() else _bars(stats, scale)


def _n(counts: Any) -> str:
    """`n=3`, or `n=2 to 3` where the points' counts differ."""
    least, most = int(min(counts)), int(max(counts))
    return f"n={least}" if least == most else f"n={least} to {most}"


def spread_note(stats: pd.DataFrame, column: str, scale: float = 1.0) -> str:
    """What the points and bars of `stats` (`_by_series_load`) are, for a caption: their n, and
    per n the kind of bar, and where a t interval was clipped."""
    stats = stats[stats["n"] > 0]
    if stats.empty:
        return "no values"
    if (stats["n"] == 1).all():
        return "one seed per point (n=1): no bars"
    parts = [f"points: mean over seeds, {_n(stats['n'])} (each series' n beside its name)"]
    if (stats["kind"] == "ci").any():
        text = f"n≥{MIN_T}: bars 95% confidence interval (Student's t)"
        low, high = stats["clipped_low"], stats["clipped_high"]
        met = sorted({*stats.loc[low, "low"], *stats.loc[high, "high"]})
        if met:  # the bounds the clipped intervals met, in the plot's unit
            at = " and ".join(_num(b * scale) for b in met)
            text += f", {int((low | high).sum())} clipped at {at} (what the metric allows)"
        parts.append(text)
    if (stats["kind"] == "range").any():
        parts.append("n=2: bars min to max (too few seeds for a t interval)")
    if (stats["n"] == 1).any():
        parts.append("n=1: no bar")
    return "; ".join(parts)


def plot_metric(ok: pd.DataFrame, column: str, ylabel: str, title: str, path: Path,
                caption_text: str, scale: float = 1.0, axis: Axis = LOAD) -> tuple[Path, str]:  # fmt: skip
    """`column` against the axis (the load), a line per series (groups of bars for values that
    are not numbers; a bar per series without the axis), each point the mean over seeds with
    its `spread`; the figure and its note on the statistics."""
    stats = _by_series_load(ok, column, axis)
    if axis.present(ok) and axis.numeric(ok):
        fig, ax = subplots(figsize=(9, 5))
        for i, series in enumerate(ok["series"].drop_duplicates()):  # (the file's order)
            rows = stats[stats["series"] == series]
            ax.errorbar(axis.scale(rows[axis.field]), rows["mean"] * scale,
                        yerr=_bars(rows, scale), marker="o", capsize=4,
                        label=f"{series} ({_n(rows['n'])})", linestyle=LINES[i % len(LINES)])  # fmt: skip
        ax.set_xlabel(axis.label)
        ax.set_ylabel(ylabel)
        # beside the plot: lines that meet (schemes alike) stay visible
        ax.legend(title="scheme", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    elif axis.present(ok):
        fig, ax = _grouped_bars(ok, stats, scale, axis)
        ax.set_ylabel(ylabel)
    else:
        # A bar per series, sideways: its name (the scheme and the inputs that vary: ten
        # clusters' traces, say) stays readable however many there are. In the file's order.
        order = {series: i for i, series in enumerate(ok["series"].drop_duplicates())}
        stats = stats.sort_values("series", key=lambda names: names.map(order), kind="stable")
        names = [f"{s} (n={n})" for s, n in zip(stats["series"], stats["n"], strict=True)]
        longest = max((len(name) for name in names), default=0)
        fig, ax = subplots(
            figsize=(max(7.5, 4.5 + 0.09 * longest), max(3.5, 1.8 + 0.35 * len(stats)))
        )  # (wide enough for the names beside a readable plot)
        bars = ax.barh(names, stats["mean"] * scale, xerr=_error_bars(stats, scale), capsize=4)
        ax.bar_label(bars, fmt="%.3g", fontsize=8, padding=3)
        ax.invert_yaxis()  # the first series on top
        ax.set_xlabel(ylabel)
        ax.margins(x=0.12)  # room for the values beside the longest bar
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    note = spread_note(stats, column, scale)
    return save_figure(fig, path, f"{caption_text}\n{note}", svg=True), note


def _grouped_bars(ok: pd.DataFrame, stats: pd.DataFrame, scale: float,
                  axis: Axis) -> tuple[Any, Any]:  # fmt: skip
    """A group of bars per value of the axis (a cluster, a trace), a bar per series, in the
    sweep file's order, each its mean over seeds with its bar."""
    values = axis.values(ok)
    order = list(ok["series"].drop_duplicates())
    width = 0.8 / len(order)
    legend = max(len(series) for series in order) + 8  # (its " (n=1)" too)
    # Wide enough for the bars and, beside them, the legend's longest name.
    fig, ax = subplots(figsize=(max(7.5, 2.5 + 0.22 * len(values) * len(order)) + 0.07 * legend, 5))
    for i, series in enumerate(order):
        rows = stats[stats["series"] == series].set_index(axis.field).reindex(values)
        at = np.arange(len(values)) + (i - (len(order) - 1) / 2) * width
        shown = rows.dropna(subset=["mean"])
        n = f" ({_n(shown['n'])})" if len(shown) else ""
        ax.bar(at, rows["mean"] * scale, width, label=f"{series}{n}", color=f"C{i}",
               yerr=_error_bars(rows, scale), capsize=2 if len(order) > 4 else 4)  # fmt: skip
    many = len(values) > 4  # (slanted, each ending under its group)
    ax.set_xticks(np.arange(len(values)), [axis.tick(ok, v) for v in values],
                  rotation=30 if many else 0, ha="right" if many else "center")  # fmt: skip
    ax.set_xlabel(axis.label)
    ax.legend(title="scheme", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig, ax


def _jobs(folder: Path, run: pd.Series) -> pd.DataFrame | None:
    """A run's jobs; with a measurement window, only the jobs it measured (arrival order)."""
    path = folder / "runs" / run["name"] / "jobs.csv"
    if not path.exists():
        return None
    window = run.get("window")
    return measured(pd.read_csv(path), window if isinstance(window, str) else None)


def _panels(ok: pd.DataFrame, axis: Axis, most: int) -> list[Any]:
    """The axis's values a figure gives a panel each (at most `most`, evenly spread; [None]:
    one panel for all)."""
    return _spread(axis.values(ok), most) if axis.present(ok) else [None]


def plot_cdfs(ok: pd.DataFrame, folder: Path, path: Path, caption_text: str,
              axis: Axis = LOAD) -> Path:  # fmt: skip
    """JCT CDFs: a panel per value of the axis (load), a line per series, every seed's
    completed jobs pooled."""
    loads = _panels(ok, axis, 4)
    fig, axes = subplots(1, len(loads), figsize=(5.2 * len(loads), 4.6), squeeze=False)
    for ax, load in zip(axes[0], loads, strict=True):
        at = ok if load is None else ok[ok[axis.field] == load]
        for i, (series, rows) in enumerate(at.groupby("series")):
            parts = [j.loc[j["state"] == "completed", "jct"].to_numpy(dtype=float)
                     for j in (_jobs(folder, r) for _, r in rows.iterrows()) if j is not None]  # fmt: skip
            values = np.sort(np.concatenate(parts)) / 3600 if parts else np.array([])
            if len(values):
                ax.plot(values, np.arange(1, len(values) + 1) / len(values),
                        linestyle=LINES[i % len(LINES)], label=f"{series} ({len(values):,} jobs)")  # fmt: skip
        ax.set_xscale("log")
        ax.set_title("JCT CDF" + ("" if load is None else f", {axis.at(ok, load)}"))
        ax.set_xlabel("JCT (hours, log scale)")
        ax.set_ylabel("fraction of completed jobs")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # (runs whose jobs files are gone draw nothing)
            ax.legend(fontsize=7)
    seeds = ok["seed"].nunique()
    note = f"every seed's jobs pooled ({seeds} seeds)" if seeds > 1 else "one seed"
    windows = _values(ok, "window")
    if windows:
        note += f"; the measured jobs only (window {windows}, in arrival order)"
    return save_figure(fig, path, f"{caption_text}\n{note}", svg=True)


def _spread(values: list[Any], most: int) -> list[Any]:
    """At most `most` of `values`, evenly spread, first and last included."""
    if len(values) <= most:
        return values
    picks = np.linspace(0, len(values) - 1, most).round().astype(int)
    return [values[i] for i in sorted(set(picks))]


def _binned(timeline: pd.DataFrame, column: str, edges: np.ndarray) -> np.ndarray:
    """The time-weighted mean of a step function over each bin between `edges`."""
    times = timeline["time"].to_numpy(dtype=float)
    values = timeline[column].to_numpy(dtype=float)
    # integral of the step function at each edge
    at = np.searchsorted(times, edges, side="right") - 1
    cumulative = np.concatenate([[0.0], np.cumsum(values[:-1] * np.diff(times))])
    safe = np.clip(at, 0, len(times) - 1)
    integral = cumulative[safe] + values[safe] * (edges - times[safe])
    integral[at < 0] = 0.0
    means: np.ndarray = np.diff(integral) / np.diff(edges)
    return means


def plot_timelines(ok: pd.DataFrame, folder: Path, path: Path, caption_text: str,
                   axis: Axis = LOAD) -> Path:  # fmt: skip
    """GPUs in use (and present, when nodes come and go) and queued jobs over time: a column per
    value of the axis (load), a line per series, the lowest seed; time-weighted means over 200
    bins."""
    loads = _panels(ok, axis, 3)
    fig, axes = subplots(2, len(loads), figsize=(5.5 * len(loads), 6.4), squeeze=False,
                             sharex="col")  # fmt: skip
    churn = False
    for col, load in enumerate(loads):
        at = ok if load is None else ok[ok[axis.field] == load]
        timelines = _run_files(at, folder, "timeline.csv")
        if not timelines:
            continue
        # One time axis per column: the series' curves (and the GPUs present) line up.
        edges = np.linspace(min(t["time"].iloc[0] for t in timelines.values()),
                            max(t["time"].iloc[-1] for t in timelines.values()), 201)  # fmt: skip
        hours = (edges[:-1] + edges[1:]) / 2 / 3600
        present = []
        for i, (series, timeline) in enumerate(timelines.items()):
            color, line = f"C{i}", LINES[i % len(LINES)]
            axes[0][col].plot(hours, _binned(timeline, "busy_gpus", edges), color=color,
                              linestyle=line, label=series)  # fmt: skip
            if timeline["gpus"].nunique() > 1:
                present.append((timeline, color))
            axes[1][col].plot(hours, _binned(timeline, "queued", edges), color=color,
                              linestyle=line)  # fmt: skip
        churn = churn or bool(present)
        _plot_present(axes[0][col], present, edges)
        title = "" if load is None else f", {axis.at(ok, load)}"
        axes[0][col].set_title(f"GPUs in use{title}")
        axes[0][col].set_ylabel("GPUs in use" + (" (grey: present)" if churn else ""))
        axes[1][col].set_ylabel("queued jobs")
        axes[1][col].set_xlabel("simulated time (hours)")
        for ax in axes[:, col]:
            ax.grid(True, alpha=0.3)
        axes[0][col].legend(fontsize=7)
    note = "lowest seed of each; time-weighted means over 200 bins"
    return save_figure(fig, path, f"{caption_text}\n{note}", svg=True)


def _run_files(at: pd.DataFrame, folder: Path, name: str) -> dict[str, pd.DataFrame]:
    """Per series, the lowest seed's run's file `name` (a timeline: two points at least)."""
    first = at[at["seed"] == at["seed"].min()] if at["seed"].notna().any() else at
    found: dict[str, pd.DataFrame] = {}
    for series, rows in first.groupby("series", sort=False):
        path = folder / "runs" / rows["name"].iloc[0] / name
        if path.exists() and len(frame := pd.read_csv(path)) >= 2:
            found[str(series)] = frame
    return found


def plot_efficiency(ok: pd.DataFrame, folder: Path, path: Path, caption_text: str,
                    axis: Axis = LOAD) -> Path:  # fmt: skip
    """ElasticFlow's cluster efficiency over time (`efficiency.csv`): a panel per value of the
    axis (at most three), a line per series, the lowest seed; time-weighted means over 200
    bins."""
    values = _panels(ok, axis, 3)
    fig, axes = subplots(1, len(values), figsize=(max(9.0, 5.5 * len(values)), 4.6),
                             squeeze=False, sharey=True)  # fmt: skip
    for ax, value in zip(axes[0], values, strict=True):
        at = ok if value is None else ok[ok[axis.field] == value]
        curves = _run_files(at, folder, "efficiency.csv")
        if curves:
            edges = np.linspace(min(c["time"].iloc[0] for c in curves.values()),
                                max(c["time"].iloc[-1] for c in curves.values()), 201)  # fmt: skip
            hours = (edges[:-1] + edges[1:]) / 2 / 3600
            for i, (series, curve) in enumerate(curves.items()):
                ax.plot(hours, _binned(curve, "efficiency", edges), color=f"C{i}",
                        linestyle=LINES[i % len(LINES)], label=series)  # fmt: skip
            ax.legend(title="scheme", fontsize=8)
        else:
            ax.text(0.5, 0.5, "no efficiency.csv (ElasticFlow's runs write one)", ha="center",
                    va="center", transform=ax.transAxes)  # fmt: skip
        ax.set_title(
            "cluster efficiency over time" + ("" if value is None else f", {axis.at(ok, value)}")
        )
        ax.set_xlabel("simulated time (hours)")
        ax.set_ylabel("cluster efficiency")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    note = ("cluster efficiency (ElasticFlow's): the sum over running jobs of throughput(n GPUs) "
            "/ throughput(1 GPU), over the cluster's GPUs; lowest seed of each; time-weighted "
            "means over 200 bins")  # fmt: skip
    return save_figure(fig, path, f"{caption_text}\n{note}", svg=True)


def jct_improvement(ok: pd.DataFrame, baseline: str, axis: Axis = LOAD) -> pd.Series:
    """Per run, the baseline scheme's mean JCT over the run's: the baseline's run with the same
    inputs, value of the axis and seed (NaN where it has none; above 1: faster than it)."""
    keys = ["inputs", axis.field, "seed"]
    runs = ok[ok["scheme"] == baseline]
    base = pd.Series(pd.to_numeric(runs["mean_jct"]).to_numpy(dtype=float),
                     pd.MultiIndex.from_frame(runs[keys].astype(str)))  # fmt: skip
    theirs = base.reindex(pd.MultiIndex.from_frame(ok[keys].astype(str))).to_numpy(dtype=float)
    return pd.Series(theirs / pd.to_numeric(ok["mean_jct"]).to_numpy(dtype=float), ok.index)


def _plot_present(ax: Any, present: list[tuple[pd.DataFrame, str]], edges: np.ndarray) -> None:
    """The GPUs present over time where nodes come and go, behind the lines of GPUs in use: one
    grey area when the series replay the same nodes (the same GPUs present while both ran),
    else a dotted line per series."""
    if not present:
        return
    hours = (edges[:-1] + edges[1:]) / 2 / 3600
    longest = max(present, key=lambda p: p[0]["time"].iloc[-1])[0]
    if all(_same_steps(timeline, longest) for timeline, _ in present):
        ax.fill_between(hours, _binned(longest, "gpus", edges), step=None, color="0.85",
                        linewidth=0, zorder=0, label="GPUs present")  # fmt: skip
        return
    for timeline, color in present:
        ax.plot(hours, _binned(timeline, "gpus", edges), color=color, linestyle=":", linewidth=1)


def _same_steps(timeline: pd.DataFrame, longest: pd.DataFrame) -> bool:
    """Whether `timeline`'s GPUs present are `longest`'s wherever `timeline` ran."""
    at = np.searchsorted(longest["time"].to_numpy(), timeline["time"].to_numpy(), side="right") - 1
    theirs = longest["gpus"].to_numpy()[np.clip(at, 0, None)]
    return bool(np.array_equal(theirs, timeline["gpus"].to_numpy()))


def _num(value: float) -> str:
    """Three significant digits or so, never in exponent form."""
    size = abs(value)
    return f"{value:,.0f}" if size >= 100 else f"{value:.1f}" if size >= 10 else f"{value:.3g}"


SPREADS = {"ci": "95% CI (Student's t)", "range": "min to max", "none": "-"}
"""The `spread` column of the summary: what a row's intervals are."""

TABLE_NOTE = (
    f"seeds: the n of every mean in the row. From {MIN_T} seeds on, mean ± the half-width of its "
    "95% confidence interval (Student's t); an interval that would pass what the metric allows "
    "(a time below 0, a percentage outside 0 to 100, Jain's index above 1, rho below 1) is "
    'clipped there and shown as its bounds, "(low to high, clipped)". With 2 seeds, mean (min '
    "to max): too few for a t interval. With 1, the value. A cell with fewer values than the "
    "row's seeds names its own n."
)


def _cell(found: Spread, scale: float, seeds: int) -> str:
    """A summary cell: the mean and its bar (see `TABLE_NOTE`), in the metric's unit."""
    mean, low, high = found.mean * scale, found.low * scale, found.high * scale
    if found.kind == "range":
        text = f"{_num(mean)} ({_num(low)} to {_num(high)})"
    elif found.kind == "ci" and found.clipped:
        text = f"{_num(mean)} ({_num(low)} to {_num(high)}, clipped)"
    elif found.kind == "ci":
        text = f"{_num(mean)} ± {_num((high - low) / 2)}"
    else:
        text = _num(mean)
    return text if found.n == seeds else f"{text} (n={found.n})"


def summary_table(ok: pd.DataFrame, axis: Axis = LOAD, baseline: str | None = None) -> pd.DataFrame:
    """Per series and load, in the sweep file's order: the seeds (n), what the intervals are (`spread`), and the mean over
    seeds of each headline metric with its bar (`TABLE_NOTE`)."""
    columns = {
        "mean_jct": ("mean JCT (h)", 1 / 3600), "p95_jct": ("p95 JCT (h)", 1 / 3600),
        "makespan": ("makespan (h)", 1 / 3600), "utilization": ("utilisation (%)", 100),
        "deadline_satisfactory_ratio": ("deadlines met (%)", 100),
        "rho_max": ("worst rho", 1), "rho_jain": ("Jain's index of 1/rho", 1),
    }  # fmt: skip
    if baseline is not None:
        columns["jct_improvement"] = (f"JCT improvement over {baseline}", 1)
    keys = ["series", axis.field] if axis.given(ok) else ["series"]
    rows = []
    for key, group in ok.groupby(keys, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        seeds = len(group)
        kind = "ci" if seeds >= MIN_T else "range" if seeds == 2 else "none"
        row: dict[str, Any] = dict(zip(keys, key, strict=True)) | {"seeds": seeds}
        row["spread"] = SPREADS[kind]
        for column, (label, scale) in columns.items():
            values = pd.to_numeric(group[column], errors="coerce") if column in group else None
            if values is None or values.isna().all():
                continue
            row[label] = _cell(spread(values, BOUNDS[column]), scale, seeds)
        rows.append(row)
    # In the sweep file's order (the table's), each series' loads rising.
    order = {series: i for i, series in enumerate(ok["series"].drop_duplicates())}
    rank = {v: i for i, v in enumerate(axis.values(ok))} if axis.given(ok) else {}
    rows.sort(key=lambda r: (order[r["series"]], rank.get(r.get(axis.field), 0)))
    return pd.DataFrame(rows)


def write_report(results: Path, out: Path | None = None) -> list[Path]:
    """Every figure (PNG and SVG) and `report.html`; the paths, the HTML last."""
    if not results.exists():
        raise ReportError(
            f"{results} does not exist: give the folder `gpuyard sweep` wrote (its --out)"
        )
    if not results.is_dir() and results.name != "results.parquet":
        raise ReportError(
            f"{results} is not a sweep's results: give the folder `gpuyard sweep` wrote (its "
            "--out), or its results.parquet"
        )
    folder = results if results.is_dir() else results.parent
    table_path = folder / "results.parquet"
    if not table_path.exists():
        raise ReportError(
            f"{folder} holds no results.parquet: give the folder `gpuyard sweep` wrote (a sweep "
            "writes it when its runs are done)"
        )
    try:
        table = pd.read_parquet(table_path)
    except (OSError, ValueError) as exc:  # (pyarrow's ArrowInvalid is a ValueError)
        raise ReportError(f"{table_path}: not a sweep's results table: {exc}") from None
    if table.empty:
        raise ReportError(f"{table_path}: no runs")
    out = out or folder / "report"
    out.mkdir(parents=True, exist_ok=True)
    sweep = str(table["sweep"].iloc[0]) if "sweep" in table else folder.name
    settings = _settings(folder)
    axis = Axis(settings.x)
    if axis.field not in table:
        raise ReportError(f"{folder / 'sweep.toml'}: report.x: {axis.field!r} is no run field")
    table = with_series(table, axis)
    ok = table[table["status"] == "ok"]
    ratios = ok.get("deadline_satisfactory_ratio")  # (pd.to_numeric(None) is NaN, not None)
    deadline = pd.to_numeric(ratios, errors="coerce") if ratios is not None else None
    if deadline is not None:
        ok = ok.assign(deadline_satisfactory_ratio=deadline)
    if settings.baseline is not None:
        ok = ok.assign(jct_improvement=jct_improvement(ok, settings.baseline, axis))
    text = caption(table, sweep)
    versus = f"vs {axis.label.split(' (')[0]}" if axis.present(ok) else "per scheme"
    # Each figure: whether the results allow it, and how it is drawn (its path, its note on
    # the statistics, its title).
    drawers: dict[FigureName, tuple[bool, Callable[[], tuple[Path, str, str]]]] = {
        "mean_jct": (True, lambda: (*plot_metric(
            ok, "mean_jct", "mean JCT (hours)", f"mean JCT {versus}", out / "mean_jct.png", text,
            1 / 3600, axis), f"mean JCT {versus}")),
        "jct_cdfs": (True, lambda: (
            plot_cdfs(ok, folder, out / "jct_cdfs.png", text, axis), "", "JCT CDFs")),
        "makespan": (True, lambda: (*plot_metric(
            ok, "makespan", "makespan (hours)", f"makespan {versus}", out / "makespan.png", text,
            1 / 3600, axis), "makespan")),
        "timelines": (True, lambda: (
            plot_timelines(ok, folder, out / "timelines.png", text, axis), "",
            "utilisation and queue over time")),
        "deadlines": (deadline is not None and bool(deadline.notna().any()), lambda: (*plot_metric(
            ok, "deadline_satisfactory_ratio", "jobs that met their deadline (%)",
            f"deadline satisfactory ratio {versus}", out / "deadlines.png", text, 100, axis),
            "deadline ratio")),
        "fairness": ("rho_max" in ok and bool(ok["rho_max"].notna().any()), lambda: (
            *plot_fairness(ok, out / "fairness.png", text, axis), "fairness")),
        "cluster_efficiency": (_any_file(ok, folder, "efficiency.csv"), lambda: (
            plot_efficiency(ok, folder, out / "cluster_efficiency.png", text, axis), "",
            "cluster efficiency over time")),
        "jct_improvement": (settings.baseline is not None, lambda: (*plot_metric(
            ok, "jct_improvement", f"{settings.baseline}'s mean JCT / the scheme's",
            f"JCT improvement over {settings.baseline} {versus}", out / "jct_improvement.png",
            text, 1, axis), f"JCT improvement over {settings.baseline}")),
    }  # fmt: skip
    chosen = settings.figures or list(drawers)
    figures = [drawers[name][1]() for name in chosen if not ok.empty and drawers[name][0]]
    stats = summary_table(ok, axis, settings.baseline) if not ok.empty else pd.DataFrame()
    stats.to_csv(out / "summary.csv", index=False)
    page = out / "report.html"
    page.write_text(_html(sweep, table, stats, figures, text, folder))
    paths = [p for f, _, _ in figures for p in (f, f.with_suffix(".svg"))]
    return [*paths, out / "summary.csv", page]


def _settings(folder: Path) -> ReportSettings:
    """The `[report]` table of the sweep file as it ran (its defaults without one)."""
    path = folder / "sweep.toml"
    if not path.exists():
        return ReportSettings()
    try:
        return report_settings(path.read_text())
    except (ValueError, msgspec.ValidationError) as exc:  # (TOML's errors are ValueErrors)
        raise ReportError(f"{path}: report: {exc}") from None


def _any_file(ok: pd.DataFrame, folder: Path, name: str) -> bool:
    return any((folder / "runs" / run / name).exists() for run in ok["name"])


def plot_fairness(ok: pd.DataFrame, path: Path, caption_text: str,
                  axis: Axis = LOAD) -> tuple[Path, str]:  # fmt: skip
    """Finish-time fairness: the worst rho (JCT over time running) and Jain's index of 1/rho,
    means over seeds with their `spread`; the figure and its note on the statistics."""
    fig, axes = subplots(1, 2, figsize=(12, 4.8))
    notes = []
    for ax, column, label in ((axes[0], "rho_max", "worst finish-time fairness rho"),
                              (axes[1], "rho_jain", "Jain's index of 1/rho")):  # fmt: skip
        stats = _by_series_load(ok, column, axis)
        notes.append(spread_note(stats, column))
        if axis.present(ok):  # (an axis of clusters or traces: their names are its ticks)
            for i, (series, rows) in enumerate(stats.groupby("series")):
                xs = [v if axis.numeric(ok) else axis.tick(ok, v) for v in rows[axis.field]]
                ax.errorbar(xs, rows["mean"], yerr=_bars(rows, 1), marker="o",
                            capsize=4, label=f"{series} ({_n(rows['n'])})",
                            linestyle=LINES[i % len(LINES)])  # fmt: skip
            ax.set_xlabel(axis.label)
        else:
            names = [f"{s} (n={n})" for s, n in zip(stats["series"], stats["n"], strict=True)]
            ax.bar(names, stats["mean"], yerr=_bars(stats, 1), capsize=4)
            ax.tick_params(axis="x", labelrotation=20)
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[0].set_yscale("log")
    axes[0].set_title("worst job: rho = JCT / time running (1 is fair)")
    axes[1].set_title("Jain's index of 1/rho (1: all slowed alike)")
    axes[1].set_ylim(0, 1.05)
    if axis.present(ok):
        axes[0].legend(fontsize=7)
    note = notes[0] if notes[0] == notes[1] else f"worst rho: {notes[0]}\nJain's index: {notes[1]}"
    return save_figure(fig, path, f"{caption_text}\n{note}", svg=True), note


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 0.85em; color: #555; white-space: pre-line; }
table { border-collapse: collapse; font-size: 0.8em; } td, th { border: 1px solid #ccc;
padding: 2px 6px; text-align: right; } th { background: #f4f4f4; }
pre { background: #f7f7f7; padding: 1em; font-size: 0.8em; overflow-x: auto; }
.failed { color: #a00; }
"""


def _html(sweep: str, table: pd.DataFrame, stats: pd.DataFrame,
          figures: list[tuple[Path, str, str]], caption_text: str, folder: Path) -> str:  # fmt: skip
    """One page, nothing outside it: the figures are inlined as PNG data."""
    esc = html.escape
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>gpuyard sweep {esc(sweep)}</title><style>{STYLE}</style></head><body>",
        f"<h1>gpuyard sweep <code>{esc(sweep)}</code></h1>",
        f"<p>{esc(caption_text).replace(chr(10), '<br>')}</p>",
    ]  # fmt: skip
    failed = table[table["status"] != "ok"]
    counts = f"{len(table) - len(failed)} of {len(table)} runs succeeded"
    parts.append(f"<p>{counts}.</p>")
    if not stats.empty:
        per = next(
            (
                f"Per scheme and {AXIS_LABELS.get(c, c).split(' (')[0]}"
                for c in stats
                if c in RUN_FIELDS and c != "seed"
            ),
            "Per scheme",
        )
        parts += [f"<h2>{per} (mean over seeds)</h2>", f"<p>{esc(TABLE_NOTE)}</p>",
                  stats.to_html(index=False, na_rep="-", border=0)]  # fmt: skip
    for path, note, title in figures:
        data = base64.b64encode(path.read_bytes()).decode()
        parts.append(
            f'<figure id="{esc(path.stem)}"><h2>{esc(title)}</h2>'
            f'<img src="data:image/png;base64,{data}" alt="{esc(title)}" '
            "onload=\"this.dataset.loaded='yes'\" onerror=\"this.dataset.loaded='broken'\">"
            f"<figcaption>{esc(note) + '<br>' if note else ''}{esc(path.name)} and "
            f"{esc(path.with_suffix('.svg').name)} beside this page</figcaption></figure>"
        )
    if len(failed):
        parts.append("<h2 class='failed'>Failed or missing runs</h2><ul>")
        parts += [f"<li class='failed'><code>{esc(r['name'])}</code>: {esc(str(r['error']))}</li>"
                  for _, r in failed.iterrows()]  # fmt: skip
        parts.append("</ul>")
    config = folder / "sweep.toml"
    if config.exists():
        parts += ["<h2>The sweep file</h2>", f"<pre>{esc(config.read_text())}</pre>"]
    runs = table[["name", "run_id", "status", "mean_jct", "makespan", "utilization"]
                 if "mean_jct" in table else ["name", "run_id", "status"]]  # fmt: skip
    parts += ["<h2>Runs</h2>", runs.to_html(index=False, na_rep="-", border=0,
                                            float_format=lambda v: f"{v:,.4g}")]  # fmt: skip
    parts.append(
        f"<script type='application/json' id='figures'>{json.dumps([p.name for p, _, _ in figures])}</script>"
    )
    parts.append("</body></html>")
    return "\n".join(parts)
