"""When the scheduler decides (`SchedulerConfig.mode`), as functions of the times involved.

- events: what is due is decided on at once;
- rounds: at the round boundary after it (Blox), never twice at one boundary; the boundaries are
  multiples of `round_s` from `origin` (None: from the first decision, which comes at once);
- slots: what comes within `round_s` of the last decision waits until then, to be decided on
  together (ElasticFlow's scheduling slot);
- clock: at every tick of a clock that owns the rounds (Gavel's simulator).

A wall clock (a real cluster) ticks the scheduler itself and runs a round at every tick; a
simulation's clock (`external`) asks for one only when it is due. Policies that decide time shares
keep the rounds of their mechanism instead (`TimeShareMechanism.next_round`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Mode = Literal["events", "rounds", "slots", "clock"]


@dataclass(frozen=True)
class Cadence:
    mode: Mode
    round_s: float
    external: bool
    """The clock is a simulation's (`SchedulerConfig.clock == "external"`), not the wall's."""
    origin: float | None = 0.0
    """Where the rounds' grid starts (`SchedulerConfig.round_origin`); None: not known yet, the
    first decision comes at once and starts it."""

    def grid_origin(self, last_round: float | None) -> float | None:
        """Where the rounds' grid starts; None before a first decision that starts it."""
        return self.origin if self.origin is not None else last_round

    def decides(self, due: float, last_round: float | None) -> float:
        """When what is due at `due` is decided on."""
        round_s = self.round_s
        if self.mode == "rounds":
            origin = self.grid_origin(last_round)
            if origin is None:
                return due
            boundary = origin + math.ceil((due - origin) / round_s) * round_s
            if last_round is not None and boundary <= last_round:
                boundary = last_round + round_s
            return boundary
        if self.mode == "slots" and last_round is not None:
            return max(due, last_round + round_s)
        return due

    def next_wake(
        self, now: float, *, dirty: bool, policy_wake: float | None, last_round: float | None
    ) -> float | None:
        """When the next round is due: at once if something changed (`dirty`), when the policy
        asked to decide again, whichever is first, on this cadence; None when nothing can
        change until the next event (and in clock mode: its clock ticks at every round's end)."""
        if self.mode == "clock":
            return None
        wanted: list[float] = []
        if dirty:
            wanted.append(now)
        if policy_wake is not None:
            wanted.append(max(policy_wake, now))
        if not wanted:
            return None
        return self.decides(min(wanted), last_round)

    def round_due(self, now: float, wake: float | None, last_round: float | None) -> bool:
        """A tick at `now` runs a round: every tick of a wall clock or of a clock that owns the
        rounds (but not within a slot), else when one is due (`wake`)."""
        every = not self.external or self.mode == "clock"
        merging = self.mode == "slots" and self.decides(now, last_round) > now
        return (every and not merging) or (wake is not None and wake <= now)

    def quiet_until(self, now: float, last_round: float | None) -> float | None:
        """Until when jobs that arrive or end after `now` are decided on no sooner than then
        (a simulation's clock tells what happens meanwhile in one request): the next round
        boundary (rounds), the end of the slot the last decision began (slots); None: at once."""
        if not self.external:
            return None
        round_s = self.round_s
        if self.mode == "rounds":
            origin = self.grid_origin(last_round)
            if origin is None:
                return None
            return self.decides(
                origin + (math.floor((now - origin) / round_s) + 1) * round_s, last_round
            )
        if self.mode == "slots" and last_round is not None:
            ends = last_round + round_s
            return ends if ends > now else None
        return None
