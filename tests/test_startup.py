"""What a command imports when it starts: the heavy modules (plots, tables, solvers, numerics,
certificates) only where a command uses them. `gpuyard sim` has its results written by a process
forked from it, which imports matplotlib while the run simulates: the run's own process never
does, and the files are those the run would have written itself, byte for byte. (Start-up times
are measured by bench/bench_startup.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from gpuyard.cli import main

HEAVY = ("matplotlib", "pandas", "pyarrow", "ortools", "numpy", "cryptography")


def heavy_imported(code: str) -> list[str]:
    """The heavy top-level modules in a fresh interpreter's sys.modules after `code`."""
    report = f"import sys; print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)}))"
    result = subprocess.run(
        [sys.executable, "-c", f"{code}\n{report}"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1].replace("'", '"'))


def test_importing_the_command_imports_none_of_them() -> None:
    assert heavy_imported("import gpuyard.cli") == []


@pytest.mark.parametrize(
    "argv", [["--help"], ["sim", "--help"], ["jobs", "--help"], ["up", "--help"],
             ["sweep", "--help"], ["submit", "--help"]],
)  # fmt: skip
def test_a_command_that_needs_none_of_them_imports_none(argv: list[str]) -> None:
    code = (
        "import contextlib, io\nfrom gpuyard.cli import main\n"
        f"with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        f"    main({argv!r})"
    )
    assert heavy_imported(code) == []


def test_a_simulation_process_leaves_the_plots_to_its_results_process(tmp_path: Path) -> None:
    """`gpuyard sim` (its own process) imports no matplotlib, yet writes every plot."""
    out = tmp_path / "run"
    code = (
        "import sys\nfrom gpuyard.cli import main\n"
        f"sys.argv = ['gpuyard', 'sim', '--jobs', '10', '--cluster-spec', '2x4', '--out', {str(out)!r}]\n"
        "assert main() == 0"
    )
    assert "matplotlib" not in heavy_imported(code)
    assert sorted(p.name for p in out.glob("*.png")) == ["jct_cdf.png", "timeline.png"]


def run_here(argv: list[str]) -> int:
    """`gpuyard ARGV` in this process (not its own: the results are written in a thread)."""
    try:
        return main(argv)
    finally:
        structlog.reset_defaults()  # (the command pointed it at its log file)


def test_the_results_process_writes_what_the_run_writes_itself(tmp_path: Path) -> None:
    argv = ["sim", "--jobs", "40", "--cluster-spec", "4x4", "--policy", "las"]
    own, here = tmp_path / "own", tmp_path / "here"
    result = subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", *argv, "--out", str(own)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert run_here([*argv, "--out", str(here)]) == 0
    for name in ("jobs.csv", "timeline.csv", "jct_cdf.png", "timeline.png"):
        assert (own / name).read_bytes() == (here / name).read_bytes(), name
    summaries = [json.loads((d / "summary.json").read_text()) for d in (own, here)]
    for summary in summaries:
        del summary["wall_s"]
    assert summaries[0] == summaries[1]


def test_results_that_cannot_be_written_are_one_line(tmp_path: Path) -> None:
    out = tmp_path / "run"
    (out / "summary.json").mkdir(parents=True)  # (in the way of the file)
    result = subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", "sim", "--jobs", "5", "--cluster-spec", "2x4",
         "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if not line.startswith("sim [")]
    assert lines == [f"gpuyard sim: [Errno 21] Is a directory: '{out / 'summary.json'}'"]
