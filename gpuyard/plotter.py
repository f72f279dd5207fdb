"""A run's plots, drawn by a process of their own: started with the run, it imports matplotlib
(most of a small run's cost, once) while the run goes on, on another core, then draws the
figures it is handed at the end (`gpuyard.report.Figures`, pickled on its stdin) and exits.

It runs in a session of its own, so a Ctrl-C meant for the run leaves it to draw the partial
results; it exits when its stdin closes unused (the run failed, or was killed)."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuyard.report import Figures

DRAW_TIMEOUT_S = 300.0
"""How long the figures may take to draw (a million-job run's take seconds: they are thinned)."""


class PlotError(RuntimeError):
    """The plotter failed: one line saying why."""


class Plotter:
    """The plotting process of one run (`start`); `draw` hands it the figures, once."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    @classmethod
    def start(cls) -> Plotter:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuyard.plotter"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip
        return cls(proc)

    def draw(self, made: Figures) -> None:
        """Have the figures drawn; raises PlotError with the plotter's last line if it failed."""
        try:
            _, err = self.proc.communicate(pickle.dumps(made), timeout=DRAW_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.close()
            raise PlotError(f"the plots took over {DRAW_TIMEOUT_S:g} s to draw") from None
        if self.proc.returncode != 0:
            lines = err.decode(errors="replace").strip().splitlines()
            why = lines[-1] if lines else f"exit status {self.proc.returncode}"
            raise PlotError(f"the plots could not be drawn: {why}")

    def __enter__(self) -> Plotter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop it if it is still there (it was never handed figures, or took too long)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def main() -> int:
    import matplotlib.figure  # noqa: F401 (the import this process is for, while the run goes on)

    from gpuyard.report import draw

    data = sys.stdin.buffer.read()
    if not data:  # (the run ended without results to plot)
        return 0
    made = pickle.loads(data)  # (from the run that started us, on our stdin)
    try:
        draw(made)
    except (OSError, ValueError) as exc:
        print(f"{Path(made.out)}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
