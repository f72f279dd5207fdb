"""The Blox family (EuroSys 2024): FIFO, SJF, SRTF and LAS walk an order the way Blox's round loop
does; Optimus shares spare GPUs elastically. Semantics and differences: docs/fidelity.md."""

from .optimus import Optimus, OptimusParams
from .ordering import Fifo, FifoParams, Las, LasParams, Sjf, SjfParams, Srtf, SrtfParams

__all__ = [
    "Fifo", "FifoParams", "Las", "LasParams", "Optimus", "OptimusParams", "Sjf", "SjfParams",
    "Srtf", "SrtfParams",
]  # fmt: skip
