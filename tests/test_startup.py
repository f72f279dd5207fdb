"""What a command imports when it starts: the heavy modules (plots, tables, solvers, numerics,
certificates) only where a command uses them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

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
