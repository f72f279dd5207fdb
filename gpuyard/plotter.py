"""A run's figures drawn in a process of its own (`python -m gpuyard.plotter`), started with the
run: it imports matplotlib and loads its fonts (a third of a second, the dearest part of a short
run's results) on another CPU while the run goes, then draws what `report.plot_run` is given."""

from __future__ import annotations

import pickle
import subprocess
import sys
from typing import Any

DRAW_WITHIN_S = 600.0
"""A million-job replay's figures take seconds; more than this, and the plotter is stuck."""


class Plotter:
    """The plotter process of one run: `draw` once, or `close` (it exits when its input ends)."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "gpuyard.plotter"], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True,  # (Ctrl-C is the run's: it still has figures to draw)
        )  # fmt: skip

    def draw(self, *args: Any) -> None:
        """`report.plot_run(*args)` in the plotter; raises RuntimeError naming what went wrong."""
        try:
            _, error = self._proc.communicate(
                pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL), timeout=DRAW_WITHIN_S
            )
        except subprocess.TimeoutExpired:
            self.close()
            raise RuntimeError(f"the figures were not drawn within {DRAW_WITHIN_S:g} s") from None
        except OSError as exc:  # (it died before it read them)
            self.close()
            raise RuntimeError(f"the plotter process is gone: {exc}") from None
        if self._proc.returncode < 0:
            raise RuntimeError(f"the plotter process was killed (signal {-self._proc.returncode})")
        if self._proc.returncode:
            lines = error.decode(errors="replace").strip().splitlines() or ["(nothing said)"]
            raise RuntimeError(f"drawing the figures failed: {lines[-1]}")

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()


def main() -> int:
    from gpuyard.report import plot_run, warm_up

    warm_up()
    data = sys.stdin.buffer.read()
    if not data:  # (the run ended without figures to draw)
        return 0
    plot_run(*pickle.loads(data))  # (from the run that started this process, over its pipe)
    return 0


if __name__ == "__main__":
    sys.exit(main())
