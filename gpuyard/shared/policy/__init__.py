"""The policy API: what admission, scheduling and placement policies see, return, and how they are
found.

A policy is a small class with typed parameters (a msgspec Struct named `Params`) and one pure
method. It never does I/O and never reads the OS clock: time comes in `now`. It declares what it
needs beyond the basics (`Needs`), and, if it keeps state between decisions, how to snapshot and
restore it. Policies are registered by name; third-party packages add their own through the
entry-point groups `gpuyard.scheduling`, `gpuyard.admission` and `gpuyard.placement` (see
docs/writing-a-policy.md).
"""

from ..model import ANY_GPU, Allocation, GpuRef
from .interfaces import (
    AdmissionDecision,
    AdmissionPolicy,
    Decision,
    Needs,
    NoParams,
    PlacementInput,
    PlacementPolicy,
    Policy,
    SchedulingPolicy,
)
from .registry import (
    PolicyChoice,
    PolicyError,
    PolicySet,
    Registry,
    admission_policies,
    own_params,
    parse_params,
    placement_policies,
    scheduling_policies,
)
from .views import (
    AdmissionInput,
    ClusterView,
    JobList,
    JobView,
    NodeStatus,
    NodeView,
    SchedulingInput,
    ViewContext,
)

__all__ = [
    "ANY_GPU", "AdmissionDecision", "AdmissionInput", "AdmissionPolicy",
    "Allocation", "ClusterView", "Decision", "GpuRef", "JobList", "JobView", "Needs", "NoParams", "NodeStatus",
    "NodeView", "PlacementInput", "PlacementPolicy", "Policy", "PolicyChoice", "PolicyError",
    "PolicySet", "Registry", "SchedulingInput", "SchedulingPolicy", "ViewContext",
    "admission_policies", "own_params", "parse_params", "placement_policies", "scheduling_policies",
]  # fmt: skip
