"""The suite's own setup holds: tests marked `xdist_group` run in one process (the deploy tests
share Docker and its image builds; the calibrated ones one long setup each)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

GROUPED = """
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("together")


@pytest.mark.parametrize("i", range(6))
def test_where(i: int) -> None:
    Path(f"worker.{i}").write_text(os.environ["PYTEST_XDIST_WORKER"])
"""


@pytest.mark.slow  # (a pytest of three processes)
def test_a_group_runs_in_one_of_several_processes(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # (not this project's options)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3",
         "--dist", "loadgroup", str(tmp_path / "test_grouped.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    workers = {p.read_text() for p in tmp_path.glob("worker.*")}
    assert len(list(tmp_path.glob("worker.*"))) == 6
    assert len(workers) == 1, f"one group ran in {sorted(workers)}"
