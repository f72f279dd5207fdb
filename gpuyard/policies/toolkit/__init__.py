"""What every policy family builds on: the ordering walk, the starvation guard, and `lp`, a
linear-programming helper over numpy arrays on OR-Tools (import it from `toolkit.lp`; it loads
OR-Tools, which ordering policies do not need)."""

from .ordering import (
    TypeOrder,
    agnostic_types,
    fastest_types,
    fill_in_order,
    held_or_requested,
    runnable_types,
)
from .standing import StandingOrder
from .starvation import BLOX_STARVATION_S, earliest, is_starved, next_starvation, priority_class
from .waiting import WaitingOrder

__all__ = [
    "BLOX_STARVATION_S",
    "StandingOrder",
    "TypeOrder",
    "WaitingOrder",
    "agnostic_types",
    "earliest",
    "fastest_types",
    "fill_in_order",
    "held_or_requested",
    "is_starved",
    "next_starvation",
    "priority_class",
    "runnable_types",
]  # fmt: skip
