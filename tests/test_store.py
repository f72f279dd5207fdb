"""A service's durable state (`KvStore`) on a real NATS server with JetStream: many writes at
once, each stored, deleted keys gone, read back in one pass."""

from __future__ import annotations

from gpuyard.shared.connection import connect
from gpuyard.shared.store import WRITES_IN_FLIGHT, KvStore, store_key


async def test_many_writes_and_deletes_are_each_stored_and_read_back(nats_url: str) -> None:
    nc = await connect(nats_url, name="store-test")
    try:
        store = KvStore(nc, "storetest", "scheduler", storage="memory")
        await store.open()
        jobs = WRITES_IN_FLIGHT * 2 + 500  # (more than one flight of writes)
        items = {store_key(f"job-{i}"): {"job_id": f"job-{i}", "n": i} for i in range(jobs)}
        sent = nc.stats["out_msgs"]
        await store.put_many({**items, "meta": b'{"raw": true}'})
        assert nc.stats["out_msgs"] - sent == jobs + 1  # one publish a write, nothing more

        gone = [store_key(f"job-{i}") for i in range(0, jobs, 3)]
        await store.delete_many(gone)
        await store.put_many({store_key("job-1"): {"job_id": "job-1", "n": -1}})  # (one alone)
        await store.delete_many([store_key("job-2")])

        values = await store.load()
        kept = {k for k in items if k not in gone} - {store_key("job-2")}
        assert set(values) == kept | {"meta"}
        assert values["meta"] == b'{"raw": true}'
        assert values[store_key("job-1")] == b'{"job_id":"job-1","n":-1}'
        assert values[store_key("job-4")] == b'{"job_id":"job-4","n":4}'
    finally:
        await nc.close()
