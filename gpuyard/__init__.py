"""gpuyard: schedule deep-learning training jobs on GPU clusters."""

from __future__ import annotations

__all__ = ["__version__"]


def __getattr__(name: str) -> str:
    # Lazily: `gpuyard.jobclient`, which jobs import, needs nothing else of gpuyard (a job's
    # interpreter may see this folder alone, on PYTHONPATH).
    if name == "__version__":
        from gpuyard.shared import __version__

        return __version__
    raise AttributeError(f"module 'gpuyard' has no attribute {name!r}")
