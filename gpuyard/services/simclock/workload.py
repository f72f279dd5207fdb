"""A simulation's inputs as the simclock reads them: the workload (JSON lines of job specs) and
the node events (a `time,node,up` CSV)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec

from gpuyard.services.simclock.instants import NodeEvents
from gpuyard.shared.errors import BadRequest
from gpuyard.shared.model import JobSpec


def load_workload(path: str) -> list[JobSpec]:
    """Job specs from JSON lines, in arrival order; an error names the file, line and field."""
    jobs = read_workload(path)
    jobs.sort(key=lambda s: s.submit_time or 0.0)  # stable: file order breaks ties
    return jobs


def read_workload(path: str) -> list[JobSpec]:
    """Job specs from JSON lines, in the file's order (see `load_workload`)."""
    return list(workload_specs(path))


def workload_specs(path: str) -> Iterator[JobSpec]:
    """`read_workload`'s specs one at a time (a long replay's need not all be in memory)."""
    decoder = msgspec.json.Decoder(JobSpec)
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                spec = decoder.decode(line)
            except msgspec.ValidationError as exc:
                raise BadRequest(f"{path}:{lineno}: {exc}", field="$.workload") from None
            if spec.job_id is None or spec.submit_time is None:
                raise BadRequest(f"{path}:{lineno}: job_id and submit_time are required")
            yield spec


def write_workload(jobs: list[JobSpec], path: Path) -> None:
    """The file format `SimClockConfig.workload` reads."""
    encoder = msgspec.json.Encoder()
    with open(path, "wb") as f:
        for spec in jobs:
            f.write(encoder.encode(spec) + b"\n")


def load_node_events(path: str) -> NodeEvents:
    """Node events grouped by instant, in the file's order: [(time, [(node, up), ...]), ...]."""
    import pandas as pd

    df = pd.read_csv(path, dtype={"node": str})
    missing = {"time", "node", "up"} - set(df.columns)
    if missing:
        raise BadRequest(f"{path}: missing columns {sorted(missing)}")
    groups: NodeEvents = []
    for time_s, node, up in zip(
        df["time"].tolist(), df["node"].tolist(), df["up"].tolist(), strict=True
    ):
        if not groups or groups[-1][0] != time_s:
            groups.append((float(time_s), []))
        groups[-1][1].append((node, bool(up)))
    return groups
