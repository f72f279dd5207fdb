"""Durable service state: one JetStream key-value bucket per service and cluster.

Why key-value rather than replaying the event stream: events say what happened, not everything a
service needs to go on (a scheduler's preemption counters, placement's exact GPUs, admission's id
counter and held queue); deriving all of that from events would duplicate each service's logic in
a replay path that is rarely run. A bucket holds the state itself, one key per entity (a job, a
node map), written after each request that changed it and before the reply, so a reply means
"durable". Loading is a read of every key: a restart does not depend on how long the cluster ran.

`NullStore` keeps nothing (simulations, by default): the same code runs either way.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Annotated, Any, TypeVar

import msgspec
import structlog
from msgspec import Meta
from nats.aio.client import Client
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.client import KV_PRE_TEMPLATE
from nats.js.errors import APIError, NoStreamResponseError, ServiceUnavailableError

from .connection import Fence
from .leader import LEASE_KEY

T = TypeVar("T")

_encoder = msgspec.json.Encoder()


def store_key(name: str) -> str:
    """A key any job id can map to (NATS keys allow `[-/_=.A-Za-z0-9]`)."""
    return base64.urlsafe_b64encode(name.encode()).decode()


def name_of(key: str) -> str:
    return base64.urlsafe_b64decode(key.encode()).decode()


class StoreError(RuntimeError):
    """A service's bucket cannot be made or opened as configured (e.g. 3 replicas on one server)."""


class NullStore:
    """Keeps nothing: a service that is not durable."""

    durable = False

    async def put_many(self, items: dict[str, Any]) -> None:
        return None

    async def delete_many(self, keys: list[str]) -> None:
        return None

    async def load(self) -> dict[str, bytes]:
        return {}


REPLICAS_DOC = """Copies of the service's durable state (and the scheduler's event stream) that JetStream
keeps, each on another server of a NATS cluster: 3 on a three-server cluster, so that losing any
one server loses nothing; 1 on one server."""
Replicas = Annotated[int, Meta(ge=1, le=5, description=REPLICAS_DOC)]

UNAVAILABLE_FOR_S = 30.0
"""How long a write or read is tried again while the bucket has no leader: on a NATS cluster,
after its leader's server died, the other copies elect one (seconds)."""
_UNAVAILABLE = (NoStreamResponseError, ServiceUnavailableError, NatsTimeoutError)
WRITES_IN_FLIGHT = 1000
"""The most writes of one `put_many` awaiting the server's answer at once (under nats-py's
limit on asynchronous publishes in flight, past which a publish waits)."""
WRITE_ANSWER_S = 5.0
"""How long the writes in flight wait for the server's answers before the unanswered are tried
again one by one."""
_DELETE = {"KV-Operation": "DEL"}


class KvStore(NullStore):
    """A service's bucket `gpuyard_<cluster>_<service>` (file storage: it outlives the server)."""

    durable = True

    def __init__(
        self, nc: Client, cluster: str, service: str, *, storage: str = "file", replicas: int = 1
    ) -> None:
        self.nc = nc
        self.bucket = f"gpuyard_{cluster}_{service}".replace(".", "_")
        self.storage = storage
        self.replicas = replicas
        self.unavailable_since = 0.0  # (monotonic) since when writes find no leader; 0: they do
        self.kv: Any = None
        """The bucket (nats-py's KeyValue), once open."""
        self.js: Any = None
        """Its JetStream context (nats-py's), once open: one, as each has its own subscription
        for the answers to asynchronous publishes."""
        self.fence: Fence | None = None
        """The service's leader lease: a write is tried again only while we still hold it."""
        self.log = structlog.get_logger().bind(bucket=self.bucket)

    async def open(self) -> None:
        from nats.js.api import KeyValueConfig, StorageType

        js = self.js = self.nc.jetstream()
        config = KeyValueConfig(
            bucket=self.bucket, history=1, storage=StorageType(self.storage), replicas=self.replicas
        )
        try:
            self.kv = await self.while_unavailable(lambda: js.create_key_value(config))
        except APIError as exc:
            raise StoreError(
                f"cannot make the key-value bucket {self.bucket} with {self.replicas} "
                f"replica(s): {exc.description or exc}"
            ) from None

    async def while_unavailable(self, op: Callable[[], Awaitable[T]]) -> T:
        """`op()`, tried again while the bucket is without a leader (`UNAVAILABLE_FOR_S`).
        Writes are puts and deletes of whole values: one repeated after a lost answer is harmless."""
        started = time.monotonic()
        tries = 0
        while True:
            try:
                result = await op()
            except _UNAVAILABLE as exc:
                if time.monotonic() - started > UNAVAILABLE_FOR_S:
                    raise
                if not self.unavailable_since:  # one line an outage, not one a try
                    self.unavailable_since = started
                    self.log.warning("store.unavailable", error=repr(exc))
                tries += 1
                await asyncio.sleep(0.25)
                if self.fence is not None and not self.fence.holds():
                    await self.fence.confirm()  # (raises NotLeading if another took over)
                continue
            if tries and self.unavailable_since:
                took_s = round(time.monotonic() - self.unavailable_since, 2)
                self.unavailable_since = 0.0
                self.log.info("store.available", after_s=took_s)
            return result

    async def put_many(self, items: dict[str, Any]) -> None:
        """Write every item (bytes as they are, anything else as JSON); returns once the server
        has stored them all."""
        await self._write_many(
            {k: v if isinstance(v, bytes) else _encoder.encode(v) for k, v in items.items()},
            self.kv.put, None,
        )  # fmt: skip

    async def delete_many(self, keys: list[str]) -> None:
        await self._write_many(
            dict.fromkeys(keys, b""), lambda key, _: self.kv.delete(key), _DELETE
        )

    async def _write_many(
        self, values: dict[str, bytes], one: Callable[[str, bytes], Awaitable[Any]],
        headers: dict[str, str] | None,
    ) -> None:  # fmt: skip
        """Write `values` (with `headers`: a delete's), up to `WRITES_IN_FLIGHT` at a time, each
        published without waiting for the answer to the one before (JetStream's asynchronous
        publish: half the CPU of a write awaited alone); those the bucket did not take (no
        leader, no answer in time) are written again one by one with `one` while it is
        unavailable."""
        if len(values) <= 1:
            for key, value in values.items():
                await self.while_unavailable(partial(one, key, value))
            return
        prefix = KV_PRE_TEMPLATE.format(bucket=self.bucket)
        keys, again = list(values), []
        for start in range(0, len(keys), WRITES_IN_FLIGHT):
            acks = {
                key: await self.js.publish_async(prefix + key, values[key], headers=headers)
                for key in keys[start : start + WRITES_IN_FLIGHT]
            }
            _, late = await asyncio.wait(acks.values(), timeout=WRITE_ANSWER_S)
            for ack in late:
                ack.cancel()
            for key, ack in acks.items():
                if ack.cancelled():
                    again.append(key)
                elif (exc := ack.exception()) is not None:
                    if not isinstance(exc, _UNAVAILABLE):
                        raise exc
                    again.append(key)
        for key in again:
            await self.while_unavailable(partial(one, key, values[key]))

    async def load(self) -> dict[str, bytes]:
        """Every key with its latest value (deleted keys left out), in one pass over the bucket's
        stream (an ordered consumer of the last value per key): ~10x faster than a get per key."""
        values: dict[str, bytes] = {}
        status = await self.while_unavailable(self.kv.status)
        if not status.values:
            return values
        # Read until the entry with nothing pending after it: the watcher's own "initial values
        # done" marker can come first when the server pushed everything before it looked.
        watcher = await self.kv.watchall()
        try:
            while True:
                entry = await watcher.updates(timeout=30.0)
                if entry is None:
                    continue
                if entry.key == LEASE_KEY:  # (whose the service is, not its state)
                    pass
                elif entry.operation is None and entry.value:
                    values[entry.key] = entry.value
                else:
                    values.pop(entry.key, None)  # deleted or purged
                if not entry.delta:
                    break
        finally:
            await watcher.stop()
        self.log.info("state.loaded", keys=len(values))
        return values


async def open_store(
    nc: Client, cluster: str, service: str, *, durable: bool, replicas: int = 1
) -> NullStore:
    if not durable:
        return NullStore()
    store = KvStore(nc, cluster, service, replicas=replicas)
    await store.open()
    return store


def decode(data: bytes, typ: type[T]) -> T:
    return msgspec.json.decode(data, type=typ)
