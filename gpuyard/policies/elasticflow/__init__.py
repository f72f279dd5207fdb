"""The ElasticFlow family (ASPLOS 2023): deadlines and elasticity, and the baselines its paper
compares against, in ElasticFlow's own terms.

- `elasticflow` (scheduling): Minimum Satisfactory Share plans in deadline order, leftover GPUs by
  marginal gain, one level at a time; `elasticflow` (admission): admit a job only if every plan
  stays feasible. Together: ElasticFlow's `ef-accessctrl`; the scheduling policy alone: `ef`.
- `edf` (scheduling and admission): earliest deadline first with as many GPUs as a job can use,
  with or without the same access control (`edf`, `edf-accessctrl`).
- `node-sets` (placement): ElasticFlow's own, node sets in classes by their free GPUs, every job
  placed again from an empty cluster at each decision; `buddy`: power-of-two blocks, whole nodes
  for jobs of a node or more, jobs kept where they run when they can stay.
- `gandiva-ef`: Gandiva as ElasticFlow's simulator runs it, quirks included (`gandiva`);
  `gandiva-ts`: what that aims at, time slicing on node sets of same-size jobs; `themis`:
  finish-time fairness (on the Gavel family's program), `chronus`: lease-based selection as a
  MILP.
  Tiresias `dlas-gpu` is the `tiresias` policy with ElasticFlow's parameters.

`planner` holds the planning itself (pure functions on plain data).
"""

from .admission import (
    DeadlineAdmissionParams,
    EdfAdmission,
    EdfAdmissionParams,
    ElasticFlowAdmission,
)
from .baselines import Gandiva, GandivaParams, Themis, ThemisParams, ThemisState
from .chronus import Chronus, ChronusParams, ChronusState
from .gandiva import GandivaEf, GandivaEfParams, GandivaEfState
from .node_sets import NodeSets, NodeSetsParams
from .placement import Buddy, BuddyParams
from .scheduling import Edf, EdfParams, EdfState, ElasticFlow, ElasticFlowParams

__all__ = [
    "Buddy", "BuddyParams", "Chronus", "ChronusParams", "ChronusState", "DeadlineAdmissionParams", "Edf", "EdfAdmission", "EdfAdmissionParams",
    "EdfParams", "EdfState", "ElasticFlow", "ElasticFlowAdmission", "ElasticFlowParams", "Gandiva",
    "GandivaEf", "GandivaEfParams", "GandivaEfState", "GandivaParams", "NodeSets", "NodeSetsParams",
    "Themis", "ThemisParams", "ThemisState",
]  # fmt: skip
