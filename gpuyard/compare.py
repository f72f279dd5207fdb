"""Compare policies, loads and seeds in one command: every combination is its own `gpuyard sim`
process on one NATS server under its own cluster namespace, run concurrently; the summaries are
gathered into one table (`comparison.csv`) and plots (mean JCT against load; JCT CDFs)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd

from gpuyard.embedded import EmbeddedNats

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def run_name(policy: str, load: float, seed: int) -> str:
    return f"{policy}-load{load:g}-seed{seed}".replace(".", "_")


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
    base_args: list[str], policies: list[str], loads: list[float], seeds: list[int],
    params: list[str], out: Path, nats_url: str | None, parallel: int,
) -> pd.DataFrame:  # fmt: skip
    """Run every (policy, load, seed) and return the comparison table."""
    combos = list(itertools.product(policies, loads, seeds))
    async with EmbeddedNats() if nats_url is None else _Given(nats_url) as url:
        gate = asyncio.Semaphore(parallel)
        done = 0

        async def one(policy: str, load: float, seed: int) -> None:
            nonlocal done
            name = run_name(policy, load, seed)
            folder = out / name
            folder.mkdir(parents=True, exist_ok=True)
            argv = [
                sys.executable, "-m", "gpuyard.cli", "sim", *base_args, "--nats", url,
                "--cluster", name, "--policy", policy, "--load", str(load), "--seed", str(seed),
                "--out", str(folder),
            ]  # fmt: skip
            for pair in policy_params(policy, params):
                argv += ["--param", pair]
            async with gate:
                with (folder / "stderr.log").open("wb") as err:
                    proc = await asyncio.create_subprocess_exec(
                        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=err
                    )
                    code = await proc.wait()
            done += 1
            status = "ok" if code == 0 else f"FAILED ({code}): see {folder / 'stderr.log'}"
            print(f"[{done}/{len(combos)}] {name}: {status}", file=sys.stderr, flush=True)

        await asyncio.gather(*(one(*c) for c in combos))
    rows = []
    for policy, load, seed in combos:
        summary_path = out / run_name(policy, load, seed) / "summary.json"
        if summary_path.exists():
            summary = json.loads(summary_path.read_text())
            rows.append({"policy": policy, "load": load, "seed": seed, **summary})
    return pd.DataFrame(rows)


class _Given:
    """`async with` for a server that is already running."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def __aenter__(self) -> str:
        return self.url

    async def __aexit__(self, *exc: object) -> None:
        return None


def write_comparison(table: pd.DataFrame, out: Path) -> list[Path]:
    table.to_csv(out / "comparison.csv", index=False)
    paths = [out / "comparison.csv"]
    if table.empty:
        return paths
    mean = table.groupby(["policy", "load"], sort=True)["mean_jct"].mean().reset_index()
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy, rows in mean.groupby("policy"):
        ax.plot(rows["load"], rows["mean_jct"] / 3600, marker="o", label=policy)
    ax.set_xlabel("load (jobs per hour)")
    ax.set_ylabel("mean JCT (hours, mean over seeds)")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    paths.append(out / "mean_jct_vs_load.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    loads = sorted(table["load"].unique())
    fig, axes = plt.subplots(1, len(loads), figsize=(5 * len(loads), 4), squeeze=False)
    for ax, load in zip(axes[0], loads, strict=True):
        for policy in sorted(table["policy"].unique()):
            jct = []
            for seed in sorted(table["seed"].unique()):
                jobs = out / run_name(policy, load, seed) / "jobs.csv"
                if jobs.exists():
                    frame = pd.read_csv(jobs)
                    jct.append(
                        frame.loc[frame["state"] == "completed", "jct"].to_numpy(dtype=float)
                    )
            values = np.sort(np.concatenate(jct)) if jct else np.array([])
            if len(values):
                ax.plot(values / 3600, np.arange(1, len(values) + 1) / len(values), label=policy)
        ax.set_xscale("log")
        ax.set_title(f"load {load:g} jobs/h")
        ax.set_xlabel("JCT (hours)")
        ax.set_ylabel("fraction of jobs")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    paths.append(out / "jct_cdfs.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def default_parallel() -> int:
    return max(1, len(os.sched_getaffinity(0)))
