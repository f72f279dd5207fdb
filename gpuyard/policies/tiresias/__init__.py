"""The Tiresias family (NSDI 2019): discretised 2D-LAS and its Gittins-index variant."""

from .dlas import (
    GittinsState,
    Tiresias,
    TiresiasGittins,
    TiresiasGittinsParams,
    TiresiasParams,
    TiresiasState,
)

__all__ = [
    "GittinsState", "Tiresias", "TiresiasGittins", "TiresiasGittinsParams", "TiresiasParams",
    "TiresiasState",
]  # fmt: skip
