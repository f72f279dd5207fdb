"""What a durable scheduler keeps in its key-value bucket, and how it is written and read back.

One key per job (its `JobRecord`, written after each request that changed it, before the reply), one
for the scheduler's own bookkeeping (`meta`: the released list, the round's timing, the policy in
force, swaps included), one for the policy's state (`policy`: its `snapshot()`) and one for the
round mechanism's (`mechanism`) and, when it learns them, the throughputs measured
(`throughputs`). These are written only when their bytes changed.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Struct

from gpuyard.shared.model import JobRecord
from gpuyard.shared.store import NullStore, name_of, store_key

from .jobs import JobTable

META_KEY = "meta"
POLICY_KEY = "policy"
MECHANISM_KEY = "mechanism"
THROUGHPUTS_KEY = "throughputs"

_encoder = msgspec.json.Encoder()


class StoredMeta(Struct, kw_only=True):
    released: list[str] = []
    last_round: float | None = None
    dirty: bool = True
    policy_wake: float | None = None
    """Whether a round is due and when the policy asked to decide again: a restarted scheduler on
    an external clock (a durable simulation) decides exactly when the old one would have."""
    policy: str | None = None
    params: dict[str, Any] = {}
    """The policy in force: a `policy set` outlives a restart with the same configuration."""
    configured: str | None = None
    configured_params: dict[str, Any] = {}
    """The policy of the configuration it started with (a replacement started with another
    configuration uses its own)."""
    changed: bool = True
    """The set of active jobs changed since the policy last decided (time-share mechanism)."""
    round_origin: float | None = None
    """Where the grid of rounds starts (`SchedulerConfig.round_origin`)."""


class Restored(Struct, kw_only=True):
    records: list[JobRecord]
    meta: StoredMeta | None
    policy_state: bytes | None
    mechanism_state: bytes | None
    throughputs: bytes | None


class SchedulerStore:
    """Writes what changed; reads everything back."""

    def __init__(self, store: NullStore) -> None:
        self.store = store
        self._written: dict[str, bytes] = {}

    async def write(
        self, table: JobTable, meta: StoredMeta, policy_state: Struct | None,
        mechanism_state: Struct | None, throughputs: Any = None,
    ) -> None:  # fmt: skip
        touched, table.touched = table.touched, set()
        if not self.store.durable:
            return
        items: dict[str, Any] = {store_key(j): table.jobs[j] for j in touched if j in table.jobs}
        fresh: dict[str, bytes] = {}
        for key, value in (
            (META_KEY, meta), (POLICY_KEY, policy_state), (MECHANISM_KEY, mechanism_state),
            (THROUGHPUTS_KEY, throughputs),
        ):  # fmt: skip
            if value is None:
                continue
            data = _encoder.encode(value)
            if self._written.get(key) != data:
                items[key] = fresh[key] = data
        try:
            await self.store.put_many(items)
        except Exception:
            table.touched |= touched  # written with the next request
            raise
        self._written.update(fresh)

    def read(self, values: dict[str, bytes]) -> Restored:
        meta = values.pop(META_KEY, None)
        policy_state = values.pop(POLICY_KEY, None)
        mechanism_state = values.pop(MECHANISM_KEY, None)
        throughputs = values.pop(THROUGHPUTS_KEY, None)
        records = []
        for key, data in values.items():
            record = msgspec.json.decode(data, type=JobRecord)
            assert record.job_id == name_of(key)
            records.append(record)
        for key, stored in ((META_KEY, meta), (POLICY_KEY, policy_state),
                            (MECHANISM_KEY, mechanism_state), (THROUGHPUTS_KEY, throughputs)):  # fmt: skip
            if stored is not None:
                self._written[key] = stored
        return Restored(
            records=records,
            meta=msgspec.json.decode(meta, type=StoredMeta) if meta is not None else None,
            policy_state=policy_state, mechanism_state=mechanism_state, throughputs=throughputs,
        )  # fmt: skip
