"""A scheduling policy in its own package: run the jobs that need the fewest GPUs first."""

from msgspec import Struct

from gpuyard.policies.toolkit import fill_in_order
from gpuyard.shared.model import Allocation
from gpuyard.shared.policy import SchedulingInput, SchedulingPolicy


class Params(Struct, forbid_unknown_fields=True):
    backfill: bool = True
    """Let smaller jobs run when the next one does not fit."""


class FewestGpusFirst(SchedulingPolicy):
    Params = Params

    def schedule(self, inp: SchedulingInput) -> list[Allocation]:
        order = sorted(inp.jobs, key=lambda j: (j.spec.num_gpus, j.submit_time, j.seq))
        return fill_in_order(order, inp.cluster, backfill=self.params.backfill)
