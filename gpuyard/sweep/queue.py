"""The work queue on the NATS server: runs go out to workers, results come back, no shared disk.

- `GPUYARD_SWEEP_RUNS`, a work-queue stream on `gpuyard.sweep.<sweep>.run`, read by one durable
  pull consumer (`sweep-workers`) that every worker shares: each run goes to one worker at a time;
  a worker acknowledges it only once its result is stored, and says it is still at work every
  third of the redelivery time, so a run whose worker dies is delivered again to another
  (at-least-once).
- `GPUYARD_SWEEP_RESULTS`, on `gpuyard.sweep.<sweep>.result.<run id>`, the last result of each run
  (a run done twice is stored once: results are de-duplicated by run id).
- The object store `gpuyard-sweep`: the files runs read (`input/<sha256>`, uploaded once) and each
  run's result files (`<sweep>/<run id>`, a tar.gz of jobs.csv, timeline.csv, summary.json, ...).
"""

from __future__ import annotations

import asyncio
import io
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
from msgspec import Struct
from nats.js import JetStreamContext, api

from gpuyard.run.spec import RunSpec
from gpuyard.sweep.config import InputFile

RUNS_STREAM = "GPUYARD_SWEEP_RUNS"
RESULTS_STREAM = "GPUYARD_SWEEP_RESULTS"
WORKERS = "sweep-workers"
BUCKET = "gpuyard-sweep"
REDELIVER_AFTER_S = 60.0


def run_subject(sweep: str) -> str:
    return f"gpuyard.sweep.{sweep}.run"


def result_subject(sweep: str, run_id: str = "*") -> str:
    return f"gpuyard.sweep.{sweep}.result.{run_id}"


class RunOrder(Struct, kw_only=True):
    """A run on the queue: everything a worker needs, the input files by content."""

    sweep: str
    run_id: str
    name: str
    spec: RunSpec
    inputs: list[InputFile] = []
    timeout_s: float | None = None
    max_attempts: int = 3
    order: str = ""
    """Which publication of the sweep sent it (a failed run is tried again only by a later one)."""
    code: str = ""
    """The sweep's `code_digest` of the run: a worker whose code differs says so in its result."""


class RunResult(Struct, kw_only=True):
    sweep: str
    run_id: str
    name: str
    ok: bool
    error: str | None = None
    summary: dict[str, Any] = {}
    attempt: int = 1
    worker: str = ""
    wall_s: float = 0.0
    order: str = ""
    code: str = ""
    """The `code_digest` of the worker that ran it."""


def describe_failure(exc: BaseException) -> str:
    """A failure of the queue's server in a few words (no JetStream is the likely one)."""
    if isinstance(exc, nats.js.errors.ServiceUnavailableError | nats.errors.NoRespondersError):
        return "the NATS server has no JetStream (start it with -js): the sweep queue needs it"
    from gpuyard.shared.connection import describe_error

    return describe_error(exc)


class Refusals:
    """`on_error`, a connection's `error_cb`: the server's refusals (permission violations) are
    kept, for `check` to explain what then timed out; any other error is one line on stderr, once."""

    def __init__(self, who: str) -> None:
        self.who = who
        self.seen: list[str] = []
        self.reported: set[str] = set()

    async def on_error(self, exc: Exception) -> None:
        text = str(exc).removeprefix("nats: ")
        if "permissions violation" in text.lower():
            self.seen.append(text)
        elif text not in self.reported:
            self.reported.add(text)
            print(f"{self.who}: {text}", file=sys.stderr)

    def check(self) -> None:
        """RuntimeError naming the first refusal, if there was one."""
        if self.seen:
            raise RuntimeError(
                f"the server refused: {self.seen[0]}. A sweep keeps its queue, inputs and results "
                "in JetStream streams and stores of its own: use a server (or an identity) that "
                "allows them, not a cluster identity from `gpuyard auth`"
            )


async def ensure_queue(js: JetStreamContext, redeliver_after_s: float | None = None) -> None:
    """The streams, the workers' consumer and the bucket, created where missing; with
    `redeliver_after_s`, the consumer's redelivery time set to it."""
    await js.add_stream(
        name=RUNS_STREAM, subjects=[run_subject("*")], retention=api.RetentionPolicy.WORK_QUEUE,
        storage=api.StorageType.FILE,
    )  # fmt: skip
    await js.add_stream(
        name=RESULTS_STREAM, subjects=[result_subject("*")], max_msgs_per_subject=1,
        storage=api.StorageType.FILE,
    )  # fmt: skip
    config = api.ConsumerConfig(
        durable_name=WORKERS, ack_policy=api.AckPolicy.EXPLICIT,
        ack_wait=redeliver_after_s or REDELIVER_AFTER_S, max_ack_pending=-1,
        filter_subject=run_subject("*"),
    )  # fmt: skip
    try:
        info = await js.consumer_info(RUNS_STREAM, WORKERS)
        if redeliver_after_s is not None and info.config.ack_wait != redeliver_after_s:
            await js.add_consumer(RUNS_STREAM, config)  # an update: ack_wait may change
    except nats.js.errors.NotFoundError:
        await js.add_consumer(RUNS_STREAM, config)
    try:
        await js.object_store(BUCKET)
    except nats.js.errors.BucketNotFoundError:
        await js.create_object_store(BUCKET, storage=api.StorageType.FILE)


async def upload_inputs(js: JetStreamContext, inputs: list[InputFile]) -> None:
    """Every input file or folder (as a tar) into the bucket, once per content."""
    store = await js.object_store(BUCKET)
    done: set[str] = set()
    for item in inputs:
        if item.digest in done:
            continue
        done.add(item.digest)
        key = f"input/{item.digest}"
        try:
            await store.get_info(key)
            continue
        except nats.js.errors.ObjectNotFoundError:
            pass
        data = await asyncio.to_thread(_pack_input, Path(item.path), item.folder)
        await store.put(key, data)


def _pack_input(path: Path, folder: bool) -> bytes:
    if not folder:
        return path.read_bytes()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(path, arcname=".")
    return buffer.getvalue()


async def fetch_input(js: JetStreamContext, item: InputFile, cache: Path) -> Path:
    """The input on this machine: `cache/<sha256>/<its name>`, fetched from the bucket once."""
    target = cache / item.digest / Path(item.path).name
    if target.exists():
        return target
    store = await js.object_store(BUCKET)
    data = (await store.get(f"input/{item.digest}")).data or b""
    await asyncio.to_thread(_unpack_input, data, target, item.folder)
    return target


def _unpack_input(data: bytes, target: Path, folder: bool) -> None:
    """Unpack under a name of our own, then move it into place: workers that fetch the same input
    at once (on one machine, one cache) each unpack their own copy, and the first in place stays."""
    target.parent.mkdir(parents=True, exist_ok=True)
    own = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        if folder:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
                tar.extractall(own, filter="data")
            unpacked = own
        else:
            unpacked = own / target.name
            unpacked.write_bytes(data)
        try:
            unpacked.rename(target)  # (a file replaces the same file; a folder does not)
        except OSError:
            if not target.exists():
                raise
    finally:
        shutil.rmtree(own, ignore_errors=True)


RESULT_FILES = ("summary.json", "options.json", "jobs.csv", "timeline.csv", "efficiency.csv")


def pack_results(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in RESULT_FILES:
            if (folder / name).exists():
                tar.add(folder / name, arcname=name)
    return buffer.getvalue()


def unpack_results(data: bytes, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(folder, filter="data")


def results_key(sweep: str, run_id: str) -> str:
    return f"{sweep}/{run_id}"


RESULT_DECODER = msgspec.json.Decoder(RunResult)
ORDER_DECODER = msgspec.json.Decoder(RunOrder)
