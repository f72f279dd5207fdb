"""A run's plots, drawn by a process of their own: started with the run, it imports matplotlib
(most of a small run's cost, once) while the run goes on, on another core, then draws the
figures it is handed at the end (`gpuyard.report.Figures`, pickled on its stdin), half of them
in a fork of itself (the run, waiting, leaves a core free), and exits.

It runs in a session of its own, so a Ctrl-C meant for the run leaves it to draw the partial
results; it exits when its stdin closes unused (the run failed, or was killed)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import traceback
from collections.abc import Callable
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

    from gpuyard.report import drawings

    data = sys.stdin.buffer.read()
    if not data:  # (the run ended without results to plot)
        return 0
    made: Figures = pickle.loads(data)  # (from the run that started us, on our stdin)
    pending = drawings(made)
    if len(pending) < 2:
        return draw_all(pending, made.out)
    pid = os.fork()
    if pid == 0:  # the child: every other figure, then gone without the parent's teardown
        code = 1
        try:
            code = draw_all(pending[1::2], made.out)
        except BaseException:  # (a bug: its traceback, and the parent's exit status says so)
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    code = 1
    try:
        code = draw_all(pending[::2], made.out)
    finally:
        _, status = os.waitpid(pid, 0)
    return code or (1 if os.waitstatus_to_exitcode(status) else 0)


def draw_all(pending: list[Callable[[], Path]], out: Path) -> int:
    """Draw these figures: 0, or 1 with one line on stderr."""
    try:
        for drawing in pending:
            drawing()
    except (OSError, ValueError) as exc:
        print(f"{Path(out)}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    # Every figure is written and closed: the interpreter's teardown of matplotlib (a tenth of a
    # second) would only keep the run waiting.
    os._exit(code)
