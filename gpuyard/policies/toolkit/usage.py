"""GPU-seconds used, decayed with a half-life (Slurm's PriorityDecayHalfLife, Kueue's admission
fair sharing): fair-share policies keep one `Usage` per user or queue, in their state.

Usage is counted from the GPUs each holds between decisions, a step function: exact where the
policy decides at every change (`Needs.decide_on_exit`), to the next decision otherwise."""

from __future__ import annotations

import math

from msgspec import Struct


class Usage(Struct, array_like=True):
    """Decayed GPU-seconds: `value` at `since`, `gpus` held since."""

    value: float = 0.0
    since: float = 0.0
    gpus: int = 0

    def at(self, now: float, tau: float) -> float:
        """The decayed usage at `now` (`tau`: the half-life over ln 2)."""
        decay = math.exp(-(now - self.since) / tau)
        return self.value * decay + self.gpus * tau * (1.0 - decay)


def mean_life(half_life_s: float) -> float:
    """The decay's time constant for a half-life."""
    return half_life_s / math.log(2)


def decayed(usage: dict[str, Usage], name: str, now: float, tau: float) -> float:
    """`name`'s decayed usage at `now` (0 for one never seen)."""
    u = usage.get(name)
    return u.at(now, tau) if u is not None else 0.0


def account(usage: dict[str, Usage], held: dict[str, int], now: float, tau: float) -> None:
    """From `now` on, each holds the GPUs `held` says (none if not named): what they used since
    their last change is counted at what they held then. Costs the names held or seen."""
    for name in sorted(usage.keys() | {n for n, g in held.items() if g}):
        u = usage.get(name)
        gpus = held.get(name, 0)
        if u is None:
            usage[name] = Usage(0.0, now, gpus)
        elif u.gpus != gpus:
            usage[name] = Usage(u.at(now, tau), now, gpus)
