"""Option text that commands and the services' entry points read alike."""

from __future__ import annotations

from collections.abc import Iterable


def key_values(option: str, items: Iterable[str]) -> dict[str, str]:
    """`["k=v", ...]` (`--label`, `--env`, `--param`, ...) as a dict, the last of a key winning;
    ValueError naming `option` and the item that is not KEY=VALUE."""
    found: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{option} {item!r} is not KEY=VALUE")
        found[key] = value
    return found
