"""Leader lease: which one of a durable service's instances serves, and when a standby takes over.

The lease is one key (`LEASE_KEY`) in the service's own key-value bucket, so it is replicated
like the state it guards. Its value is the holder's instance id; every write of it is revision
checked (JetStream's expected last sequence of the key), so of two instances writing at once
exactly one wins. The holder renews it every `lease_s / 3`; a standby that has seen the same
revision for `lease_s` (the holder was killed, paused or cut off) takes it, loads the stored state
and serves. A holder stopping gracefully deletes it, and a standby takes it at once.

Fencing: the holder acts (handles a request, calls, publishes, writes) only within
`HOLD_FRACTION` of the lease after its last renewal was sent, or after renewing it again on its
own revision (proof that nobody took it): a standby counts the lease from when it saw that
renewal, later, so the holder has stopped at least `lease_s / 3` before anyone else can start. A
holder that cannot renew in time acts on nothing until it can (a bucket electing a leader after a
server died stops it for that long, and nobody can take the lease meanwhile); one that finds the
lease taken, or cannot renew it for `UNCONFIRMED_FOR_S`, stops serving and becomes a standby
(`leader.lost`, with the reason). A standby that could not read the lease for a while gives the
holder half a lease to renew it once it can.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Annotated, Any

import structlog
from msgspec import Meta
from nats.errors import Error as NatsError
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from .errors import NotLeading

LEASE_KEY = "leader.lease"
"""The lease's key in the service's bucket (no state key has a dot: those are base64 or words)."""

LEASE_DOC = """How long a durable service's leader lease lasts (seconds): a standby takes over
when the active instance has not renewed it for this long (renewals come every third of it); an
active instance that could not renew it for two thirds of it acts on nothing until it has."""
LEASE_S = 3.0
"""The lease's default length: a standby takes over 3-4 s after the active instance died."""
LeaseSeconds = Annotated[float, Meta(ge=0.5, le=120.0, description=LEASE_DOC)]

HOLD_FRACTION = 2 / 3
"""The part of the lease, from its last renewal, in which the holder acts without confirming it."""

UNCONFIRMED_FOR_S = 30.0
"""How long a holder that cannot renew (the bucket has no leader, or we are cut off) waits,
acting on nothing, before it gives the lease up and stands by: as long as a write waits for the
bucket (`shared.store.UNAVAILABLE_FOR_S`)."""


class Lease:
    """One instance's side of a service's lease, in the service's key-value bucket `kv`."""

    def __init__(self, kv: Any, holder: str, lease_s: float, log: Any = None) -> None:
        self.kv = kv
        self.holder = holder
        self.lease_s = lease_s
        # (which process leads: an operator's `kill`, a test's)
        self.log = (log or structlog.get_logger()).bind(instance=holder, pid=os.getpid())
        self.revision = 0
        """The revision of our last write of the lease (0: we do not hold it)."""
        self.renewed_at = -float("inf")
        """When our last renewal that the server stored was sent (monotonic)."""
        self.lost = asyncio.Event()
        """Set when we held the lease and lost it (`lost_reason` says why)."""
        self.lost_reason = ""
        self._writing = asyncio.Lock()
        self._stopped = False
        """We handed the lease over or released it: we act no more, and renew no more."""
        self._failing_since: float | None = None
        """Since when renewals fail (monotonic); None: the last one succeeded."""
        self._unconfirmed = False
        """Renewals failed past our part of the lease: we act no more until one succeeds."""
        self._renewer: asyncio.Task[None] | None = None

    @property
    def poll_s(self) -> float:
        """How often a standby looks at the lease (a released one is taken within this)."""
        return min(0.25, self.lease_s / 10)

    # ------------------------------------------------------------------ a standby's side

    async def acquire(self) -> str:
        """Wait until we hold the lease: when it is free (never taken, or released), or when its
        holder has not renewed it for `lease_s`. Returns how it came free."""
        seen, seen_at = -1, time.monotonic()
        back_at = -float("inf")  # when we could read the lease again after we could not
        unreachable = False
        while True:
            try:
                # (asyncio.timeout: Python 3.11's wait_for may drop a cancellation, a stop)
                async with asyncio.timeout(self.lease_s):
                    holder, revision = await self._read()
                now = time.monotonic()
                if unreachable:
                    unreachable, back_at = False, now
                if revision != seen:
                    seen, seen_at = revision, now
                # Lapsed: unrenewed for a lease, and, if the bucket was out of reach (electing a
                # leader: nobody could renew), for half a lease since (the holder renews at once).
                lapsed = now - seen_at >= self.lease_s and now - back_at >= self.lease_s / 2
                how = "free" if holder in (None, self.holder) else "lapsed" if lapsed else None
                if how is not None:
                    async with asyncio.timeout(self.lease_s):
                        written = await self._write(revision)
                    if written:
                        self._held(how, previous=holder)
                        return how
            except (NatsError, TimeoutError) as exc:  # the bucket has no leader, or we are cut off
                if not unreachable:
                    unreachable = True
                    self.log.warning("leader.lease_unreachable", error=repr(exc))
            await asyncio.sleep(self.poll_s)

    async def seize(self) -> bool:
        """Take the lease now, whoever holds it (a replacement, after the running instance
        handed over or when none answered): False if another instance took it meanwhile."""
        holder, revision = await self._read()
        if not await self._write(revision):
            return False
        self._held("seized", previous=holder)
        return True

    def _held(self, how: str, previous: str | None) -> None:
        self.log.info("leader.acquired", how=how, previous=previous, lease_s=self.lease_s)
        self._renewer = asyncio.create_task(self._renew())

    # ------------------------------------------------------------------ the holder's side

    def holds(self) -> bool:
        """Whether we may act now without confirming the lease first."""
        return (
            self.revision > 0 and time.monotonic() < self.renewed_at + self.lease_s * HOLD_FRACTION
        )

    async def confirm(self) -> None:
        """Return once we may act: at once while the lease is fresh, else when a renewal on our
        revision succeeds (proof that nobody took it meanwhile: a bucket electing a leader stops
        us for that long, and no longer). Raise NotLeading when it was taken, or could not be
        renewed for `UNCONFIRMED_FOR_S`: then the lease is lost and we act no more."""
        while not self.holds():
            if not self.revision or self.lost.is_set() or self._stopped:
                raise NotLeading(
                    self.lost_reason or ("handed over" if self._stopped else "not the leader")
                )
            await self._try_renewing()
            if not self.holds():
                await asyncio.sleep(self.poll_s)

    async def _renew(self) -> None:
        """Renew every third of the lease (more often while renewals fail)."""
        while self.revision and not self.lost.is_set() and not self._stopped:
            await asyncio.sleep(self.lease_s / 3 if self._failing_since is None else self.poll_s)
            await self._try_renewing()

    async def _try_renewing(self) -> None:
        """One renewal; the lease is lost when it was taken, or unconfirmed for too long."""
        try:
            async with asyncio.timeout(self.lease_s / 3):
                await self._renew_once()
        except (NatsError, TimeoutError) as exc:
            now = time.monotonic()
            if self._failing_since is None:
                self._failing_since = now
                self.log.warning("leader.not_renewed", error=repr(exc))
            if not self.holds() and not self._unconfirmed:
                self._unconfirmed = True  # (one line: we act no more until it is confirmed)
                self.log.warning("leader.unconfirmed", error=repr(exc))
            if now - self._failing_since > UNCONFIRMED_FOR_S:
                self._lose(f"not renewed for {UNCONFIRMED_FOR_S:.0f} s: {exc!r}")
            return
        if self._failing_since is not None and self.revision:
            took_s = round(time.monotonic() - self._failing_since, 2)
            self.log.info("leader.renewed", after_s=took_s, unconfirmed=self._unconfirmed)
        self._failing_since, self._unconfirmed = None, False

    async def _renew_once(self) -> None:
        if not await self._write(self.revision):
            holder, revision = await self._read()
            if holder == self.holder:  # our own write (a concurrent renewal, or a lost answer)
                self.revision = max(self.revision, revision)
            else:
                self._lose(f"taken over by {holder}" if holder else "released by another")

    def _lose(self, reason: str) -> None:
        if self.revision and not self.lost.is_set():
            self.revision = 0
            self.lost_reason = reason
            self.log.warning("leader.lost", reason=reason)
            self.lost.set()

    async def release(self) -> None:
        """Stop renewing and, still holding the lease, delete it: a standby takes it at once."""
        await self.stop_renewing()
        revision, self.revision = self.revision, 0
        if revision:  # (revision checked: if another took it meanwhile, it stays theirs)
            with contextlib.suppress(NatsError, TimeoutError):
                async with asyncio.timeout(self.lease_s / 3):
                    await self.kv.delete(LEASE_KEY, last=revision)
                self.log.info("leader.released")

    async def stop_renewing(self) -> None:
        """Hold no more (a replacement takes the lease over: it writes it on our revision)."""
        self._stopped = True
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
            self._renewer = None
        self.renewed_at = -float("inf")  # (acts no more; `revision` kept for a release)

    # ------------------------------------------------------------------ the key

    async def _read(self) -> tuple[str | None, int]:
        """The holder (None: nobody; the lease was released or never taken) and the revision."""
        try:
            entry = await self.kv.get(LEASE_KEY)
        except KeyNotFoundError as exc:  # never written, or deleted (a marker with a revision)
            return None, exc.entry.revision if exc.entry is not None else 0
        return entry.value.decode() or None, entry.revision

    async def _write(self, last: int) -> bool:
        """Write our id over revision `last` (0: none): False if the key is at another."""
        async with self._writing:
            sent = time.monotonic()
            try:
                self.revision = await self.kv.update(LEASE_KEY, self.holder.encode(), last=last)
            except KeyWrongLastSequenceError:
                return False
            self.renewed_at = sent
            return True
