"""ElasticFlow's scheduling slot: decide at events, but never twice within one slot.

ElasticFlow (and every baseline in its simulator) reschedules when something happens (a job
arrives or ends, a plan changes), but at most once per scheduling slot: an event that comes less
than a slot after the last decision waits until that slot ends, together with every other event
that comes meanwhile. Its real-cluster scheduler waits out the slot the same way. The slot is the
scheduler's round (`--round`).

`SlotGate` gives a policy that behaviour in the scheduler's `events` mode: a decision asked for
within a slot of the last one keeps the running jobs as they are (new and freed GPUs wait) and asks
to be woken when the slot ends. (In `rounds` mode decisions are a slot apart anyway, on a grid.)
"""

from __future__ import annotations

from msgspec import Struct

from gpuyard.shared.model import Allocation
from gpuyard.shared.policy import SchedulingInput


class SlotState(Struct, kw_only=True):
    last_decision: float | None = None
    """When the policy last decided (a held call is not a decision)."""


class SlotGate:
    """The last decision's time, and whether a call falls within its slot."""

    def __init__(self) -> None:
        self.last: float | None = None

    def held(self, inp: SchedulingInput) -> list[Allocation] | None:
        """The running jobs as they are, if `inp.now` is within the last decision's slot;
        otherwise None, and `inp.now` becomes the last decision."""
        slot = inp.cluster.round_s
        if self.last is not None and inp.now < self.last + slot and inp.now >= self.last:
            running = [j for j in inp.jobs if j.running and j.gpus > 0]
            running.sort(key=lambda j: (-j.gpus, j.seq))
            return [Allocation(j.job_id, j.gpus, j.gpu_type or "any") for j in running]
        self.last = inp.now
        return None

    def wake(self, inp: SchedulingInput, wanted: float | None) -> float | None:
        """When to decide next: `wanted`, but not before the current slot ends; the slot's end
        if the last call was held."""
        if self.last is None:
            return wanted
        end = self.last + inp.cluster.round_s
        if inp.now != self.last:  # held: the events that came wait for the slot's end
            return end
        return None if wanted is None else max(wanted, end)

    def snapshot(self) -> SlotState:
        return SlotState(last_decision=self.last)

    def restore(self, state: SlotState) -> None:
        self.last = state.last_decision
