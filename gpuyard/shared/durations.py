"""Durations as Slurm writes and reads them: `gpuyard jobs`' ELAPSED, a time limit's reason, and
`gpuyard submit --time-limit`."""

from __future__ import annotations

import re

_WITH_UNIT = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>s|m|h|d)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SLURM = re.compile(r"^(?:(?P<days>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?$")
TIME_LIMIT_FORMS = (
    "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (as Slurm's --time), or 90s, 30m, 2h, 1d"
)


def slurm_duration(seconds: float) -> str:
    """Slurm's elapsed-time format: `M:SS`, `H:MM:SS`, `D-HH:MM:SS`."""
    s = int(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{s:02d}"
    return f"{hours}:{minutes:02d}:{s:02d}" if hours else f"{minutes}:{s:02d}"


def parse_time_limit(text: str) -> float:
    """Seconds, from Slurm's `--time` forms (a bare number is minutes, as there) or a number
    with a unit. Raises ValueError naming the forms; a limit must be more than 0."""
    value = text.strip()
    seconds: float | None = None
    if m := _WITH_UNIT.match(value):
        seconds = float(m["n"]) * _UNITS[m["unit"]]
    elif m := _SLURM.match(value):
        parts = [int(p) for p in (m["a"], m["b"], m["c"]) if p is not None]
        if m["days"] is not None:  # D-H, D-H:M, D-H:M:S
            hours, minutes, secs = [*parts, 0, 0][:3]
            seconds = float(int(m["days"]) * 86400 + hours * 3600 + minutes * 60 + secs)
        elif len(parts) == 3:  # H:M:S
            seconds = float(parts[0] * 3600 + parts[1] * 60 + parts[2])
        else:  # M, M:S
            seconds = float(parts[0] * 60 + (parts[1] if len(parts) == 2 else 0))
    if seconds is None:
        raise ValueError(f"{text!r} is not a time limit; forms: {TIME_LIMIT_FORMS}")
    if seconds <= 0:
        raise ValueError(f"{text!r}: a time limit must be more than 0")
    return seconds
