"""gpuyard's shared code: the wire contract, the bus helper, the policy API and the models."""

__version__ = "0.1.0"
