"""Node availability events: nodes that join and leave a cluster over time.

BFTrainer's `node_events.csv.gz` has `time,node,idle`: a supercomputer node becomes idle (usable by
elastic training: it joins) or busy again (taken back by the batch scheduler: it leaves, and what
ran on it is preempted). Times are datetimes; they become seconds after `origin` (by default the
first event), so that they line up with a workload's submit times.

Our own normalised form, written for the simclock, is a CSV `time,node,up` with times in seconds.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd

from .core import WorkloadError


def load_node_events(path: str | Path, *, origin: dt.datetime | None = None) -> pd.DataFrame:
    """Events as a DataFrame `time` (s), `node`, `up` (bool), sorted by time (file order on ties)."""
    df = pd.read_csv(path, dtype={"node": str})
    for column in ("time", "node"):
        if column not in df.columns:
            raise WorkloadError(
                path, 1, column, f"missing column {column!r} (have {list(df.columns)})"
            )
    state = "idle" if "idle" in df.columns else "up"
    if state not in df.columns:
        raise WorkloadError(
            path, 1, "idle", "need a column 'idle' (BFTrainer) or 'up' (normalised)"
        )
    if pd.api.types.is_numeric_dtype(df["time"]):
        seconds = df["time"].to_numpy(dtype=float)
    else:
        stamps = pd.to_datetime(df["time"], errors="coerce", format="%Y-%m-%d %H:%M:%S")
        bad = np.flatnonzero(stamps.isna().to_numpy())
        if len(bad):
            line = int(bad[0]) + 2
            raise WorkloadError(path, line, "time", f"{df['time'].iat[bad[0]]!r} is not a time")
        start = pd.Timestamp(origin) if origin is not None else stamps.min()
        seconds = (stamps - start).dt.total_seconds().to_numpy()
    up = df[state].astype(str).str.strip().str.lower().isin(["1", "true", "yes"]).to_numpy()
    out = pd.DataFrame({"time": seconds, "node": df["node"].to_numpy(), "up": up})
    return out.sort_values("time", kind="stable").reset_index(drop=True)


def save_node_events(events: pd.DataFrame, path: str | Path) -> None:
    events.to_csv(path, index=False, columns=["time", "node", "up"])
