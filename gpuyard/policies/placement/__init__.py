"""General-purpose placement policies (consolidated, first fit, scattered, random, sticky) and the
pieces they share (`FreeMap`, the pickers, `place_with`)."""

from .strategies import (
    Consolidated,
    FirstFit,
    FreeMap,
    KeepParams,
    MostFree,
    RandomParams,
    RandomPlacement,
    Scattered,
    Sticky,
    consolidate,
    first_fit,
    keep_running,
    most_free_first,
    place_with,
    random_pick,
    scatter,
)

__all__ = [
    "Consolidated", "FirstFit", "FreeMap", "KeepParams", "MostFree", "RandomParams", "RandomPlacement", "Scattered", "Sticky", "consolidate",
    "first_fit", "keep_running", "most_free_first", "place_with", "random_pick", "scatter",
]  # fmt: skip
