"""gpuyard: schedule deep-learning training jobs on GPU clusters."""

from gpuyard.shared import __version__

__all__ = ["__version__"]
