"""Every recorded workload gives, byte for byte, the `jobs.csv` and `timeline.csv` recorded from
the code of the commit its manifest names (tests/recorded/; `python -m tests.recorded.record` to
record again after a bug fix documented in docs/fidelity.md). Both modes, every preset, policies
that preempt, multi-GPU jobs, a heterogeneous cluster, deadlines."""

from __future__ import annotations

import csv
import gzip
import json
import math
import shlex
from pathlib import Path

import pytest

from gpuyard.services.simclock.instants import AHEAD_JOBS
from tests.polling import run_gpuyard
from tests.recorded.record import (
    CASES,
    FILES,
    HERE,
    MANIFEST,
    ROOT,
    SHARED_DATA,
    Case,
    counts,
    run_case,
)

RECORDED = {entry["name"]: entry for entry in json.loads(MANIFEST.read_text())["cases"]}
SHOWN_ROWS = 5


def first_differences(name: str, expected: bytes, got: bytes) -> str:
    """The first rows that differ (with the header, to read them by), and how many do."""
    want, have = expected.decode().splitlines(), got.decode().splitlines()
    rows = [i for i in range(max(len(want), len(have)))
            if i >= len(want) or i >= len(have) or want[i] != have[i]]  # fmt: skip
    lines = [f"{name}: {len(rows)} rows differ (recorded {len(want) - 1} rows, now "
             f"{len(have) - 1}); header: {want[0] if want else ''}"]  # fmt: skip
    for i in rows[:SHOWN_ROWS]:
        lines.append(f"  row {i}:")
        lines.append(f"    recorded {want[i] if i < len(want) else '(none)'}")
        lines.append(f"    now      {have[i] if i < len(have) else '(none)'}")
    return "\n".join(lines)


def compare(c: Case, out: Path) -> None:
    for name in FILES:
        expected = gzip.decompress((HERE / f"{c.name}.{name}.gz").read_bytes())
        got = (out / name).read_bytes()
        if got != expected:
            pytest.fail(f"{c.name} ({c.command}):\n{first_differences(name, expected, got)}")


def recorded(c: Case) -> dict:
    if c.needs_data and not SHARED_DATA.is_dir():
        pytest.skip(f"reference data {SHARED_DATA} absent")
    entry = RECORDED.get(c.name)
    assert entry is not None, f"{c.name} not recorded: python -m tests.recorded.record {c.name}"
    assert entry["command"] == c.command, f"{c.name} changed since it was recorded: record it again"
    return entry


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c.name, marks=[pytest.mark.slow] if c.slow else []) for c in CASES]
)
@pytest.mark.slow
def test_results_are_those_recorded(case: Case, tmp_path: Path) -> None:
    entry = recorded(case)
    summary = run_case(case, tmp_path)
    compare(case, tmp_path)
    assert counts(summary) == entry["counts"]


@pytest.mark.slow
def test_the_command_as_typed_gives_them_too(tmp_path: Path) -> None:
    """The same through `gpuyard sim` in a process of its own (plots and all), from the root,
    with the services' counters in `stats.json`: in rounds mode the arrivals of a round are
    submitted ahead of their arrival, a thousand at a time, once something runs (before, the
    scheduler has no completion to go on to)."""
    c = next(c for c in CASES if c.name == "tiresias-rounds")
    recorded(c)
    run_gpuyard(*shlex.split(c.command)[1:], "--out", str(tmp_path), cwd=ROOT)
    compare(c, tmp_path)
    # and the services' own counters: every request each made, every decision
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert sorted(stats) == ["admission", "placement", "scheduler", "simclock"]
    submits = stats["simclock"]["requests"]["adm.submit.{caller}"]["count"]
    lines = gzip.decompress((HERE / f"{c.name}.jobs.csv.gz").read_bytes()).decode().splitlines()
    arrivals = [float(row["arrival"]) for row in csv.DictReader(lines)]
    rounds = {math.floor(t / 300) for t in arrivals}  # (--mode rounds: 300 s rounds)
    assert submits <= 2 + math.ceil(len(arrivals) / AHEAD_JOBS) < len(rounds) / 4
    assert stats["scheduler"]["decisions"] >= stats["scheduler"]["requests"]["place.apply"]["count"]


def test_the_cases_cover_what_must_not_change() -> None:
    """Both modes, every preset, preempting policies, multi-GPU jobs, deadlines, node events."""
    commands = " ".join(c.command for c in CASES)
    for needed in ("--mode rounds", "--mode slots", "--blox", "--gavel", "--elasticflow",
                   "--node-events", "--policy las", "--policy srtf", "--policy tiresias",
                   "--gpu-demand 1:0.7,2", "--multi-gpu", "--checkpoint-s", "--window"):  # fmt: skip
        assert needed in commands, needed
    assert any(e["counts"]["deadline_jobs"] for e in RECORDED.values())
    assert sum(1 for e in RECORDED.values() if e["counts"]["preemptions"]) >= 8
    assert {e["name"] for e in RECORDED.values()} == {c.name for c in CASES}
    assert sum(p.stat().st_size for p in HERE.iterdir() if p.is_file()) < 1 << 20
