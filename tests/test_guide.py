"""The policy guide's example package (examples/fewest-gpus-first) works as the guide says."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from gpuyard.shared.policy import Registry, SchedulingPolicy

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "fewest-gpus-first"


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The example as pip would install it: its module and a dist-info with its entry points."""
    site = tmp_path / "site"
    dist = site / "fewest_gpus_first-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: fewest-gpus-first\nVersion: 0.1.0\n"
    )
    # The entry points exactly as the example's pyproject.toml declares them.
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    lines = []
    for group, entries in project["entry-points"].items():
        lines += [f"[{group}]", *(f"{name} = {target}" for name, target in entries.items())]
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")
    (site / "fewest_gpus.py").write_text((EXAMPLE / "fewest_gpus.py").read_text())
    monkeypatch.syspath_prepend(str(site))
    return site


@pytest.mark.slow
def test_example_policy_is_short_and_its_unit_test_passes(installed: Path) -> None:
    code = [line for line in (EXAMPLE / "fewest_gpus.py").read_text().splitlines() if line.strip()]
    assert len(code) <= 25
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(EXAMPLE)],
        cwd=EXAMPLE, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(installed)},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


def test_entry_point_registers_the_policy(installed: Path) -> None:
    registry = Registry("scheduling", SchedulingPolicy)
    assert "fewest-gpus" in registry.names()
    policy = registry.create("fewest-gpus", {"backfill": "false"})
    assert policy.params.backfill is False


@pytest.mark.slow
def test_compare_with_las_in_one_command(installed: Path, tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    result = subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", "sim", "--policy", "fewest-gpus,las", "--jobs", "40",
         "--load", "30", "--cluster-spec", "2x4", "--gpu-demand", "1:0.5,2:0.3,4:0.2",
         "--out", str(out)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(installed)},
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    table = pd.read_csv(out / "comparison.csv")
    assert sorted(table["policy"]) == ["fewest-gpus", "las"]
    assert (table["completed"] == 40).all()
    for name in ("mean_jct_vs_load.png", "jct_cdfs.png"):
        assert (out / name).stat().st_size > 0
    # Each row is that run's own summary.
    las = pd.read_json(out / "las-load30-seed0" / "summary.json", typ="series")
    assert table.loc[table["policy"] == "las", "mean_jct"].item() == pytest.approx(las["mean_jct"])


def test_the_guide_shows_the_example_as_it_is() -> None:
    guide = (Path(__file__).resolve().parents[1] / "docs" / "writing-a-policy.md").read_text()
    shown = guide.split("`fewest_gpus.py`:\n\n```python\n", 1)[1].split("```", 1)[0]
    code = (EXAMPLE / "fewest_gpus.py").read_text()
    assert code.split('"""\n\n', 1)[1] == shown  # the file less its docstring
    test = guide.split("## 3.", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert (EXAMPLE / "test_fewest_gpus.py").read_text().split('"""\n\n', 1)[1] == test
