"""Node availability events: nodes that join and leave a cluster over time.

BFTrainer's `node_events.csv.gz` has `time,node,idle`: a supercomputer node becomes idle (usable by
elastic training: it joins) or busy again (taken back by the batch scheduler: it leaves, and what
ran on it is preempted). Times are datetimes; they become seconds after `origin` (by default the
first event), so that they line up with a workload's submit times.

Our own normalised form, written for the simclock, is a CSV `time,node,up` with times in seconds.

`replay_events` cuts a log the way BFTrainer's replayer (`BFTrainer-replay.py`) does: a subset of
the nodes (`--nodes-from`), their state at the start time (the last event at or before it; busy if
none), then only the events that change some node's state (its `trace.deduplicate_events` over the
subset keeps an event time only if the state vector differs from the last kept one).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .core import WorkloadError

if TYPE_CHECKING:  # (imported where a file is read: a generated workload needs none)
    import pandas as pd


def load_node_events(
    path: str | Path, *, origin: dt.datetime | None = None, nodes: list[str] | None = None
) -> pd.DataFrame:
    """Events as a DataFrame `time` (s), `node`, `up` (bool), sorted by time (file order on ties);
    only those of `nodes` if given (read first: BFTrainer's log has 850,000 lines)."""
    import pandas as pd

    # pandas' own reader, not pyarrow's: its thread pool, left running as the process ends (on
    # a bad file's one-line error, say), could abort it ("terminate called without an active
    # exception"); BFTrainer's 850,000 lines take 0.3 s instead of 0.1-0.2.
    try:
        df = pd.read_csv(path, dtype={"node": str})
    except pd.errors.ParserError as exc:
        message = str(exc).strip().removeprefix("Error tokenizing data. C error: ")
        raise WorkloadError(path, None, None, message) from None
    except UnicodeDecodeError:
        raise WorkloadError(path, None, None, "not a node log (not UTF-8 text)") from None
    if nodes is not None and "node" in df.columns:
        df = df[df["node"].isin(set(nodes))]
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
    if pd.api.types.is_numeric_dtype(df[state]) or pd.api.types.is_bool_dtype(df[state]):
        up = df[state].to_numpy() != 0
    else:
        up = df[state].astype(str).str.strip().str.lower().isin(["1", "true", "yes"]).to_numpy()
    out = pd.DataFrame({"time": seconds, "node": df["node"].to_numpy(), "up": up})
    return out.sort_values("time", kind="stable").reset_index(drop=True)


def parse_start(text: str) -> dt.datetime | float:
    """`--start`: a date and time ("2021-02-10 20:21:15", for datetime logs) or seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return dt.datetime.strptime(text.strip(), "%Y-%m-%d %H:%M:%S")
    except ValueError:
        raise ValueError(
            f"--start {text!r}: expected 'YYYY-MM-DD HH:MM:SS' or a number of seconds"
        ) from None


def load_node_list(path: str | Path) -> list[str]:
    """Node names, one a line (blank lines and `#` comments skipped)."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(path, 0, "node", f"cannot read the node list: {exc}") from None
    nodes = [s for line in lines if (s := line.split("#", 1)[0].strip())]
    if not nodes:
        raise WorkloadError(path, 1, "node", "no node names in the file")
    return nodes


def replay_events(events: pd.DataFrame, nodes: list[str] | None = None) -> pd.DataFrame:
    """The events of a replay that starts at time 0 (see the module docstring): each node of
    `nodes` (all if None) up at 0 if its last event at or before 0 left it idle, then only the
    events after 0 that change its state. Sorted by time, file order on ties."""
    import pandas as pd

    if nodes is not None:
        events = events[events["node"].isin(set(nodes))]
    before = events[events["time"] <= 0].groupby("node", sort=False).tail(1)
    initial = before[before["up"]].assign(time=0.0)
    later = events[events["time"] > 0]
    combined = pd.concat([initial, later], ignore_index=True)
    previous = combined.groupby("node", sort=False)["up"].shift(fill_value=False)
    kept: pd.DataFrame = combined[combined["up"].to_numpy() != previous.to_numpy(dtype=bool)]
    return kept.reset_index(drop=True)


def save_node_events(events: pd.DataFrame, path: str | Path) -> None:
    events.to_csv(path, index=False, columns=["time", "node", "up"])
