"""Fragmentation-aware placement of GPU-sharing pods: the six policies of Alibaba's openb paper
("Beware of Fragmentation", Weng et al., USENIX ATC '23) and its "arrive until full"
experiment, as a pure library (no service wiring yet; see docs/fragmentation.md)."""

from .cluster import ClusterState, Placement, Task, pick_max
from .experiment import (
    PAPER_SEEDS,
    TUNE_RATIO,
    RunResult,
    Trace,
    arrival_order,
    read_nodes,
    read_pods,
    run,
)
from .fgd import ClusterFrag, Fgd, TypicalPods, fgd_scores, node_frag, typical_pods
from .scores import (
    POLICY_NAMES,
    Policy,
    best_fit,
    best_fit_scores,
    dot_product,
    dot_product_scores,
    gpu_clustering,
    gpu_clustering_scores,
    gpu_packing,
    gpu_packing_scores,
    make_policy,
    random_fit,
)

__all__ = [
    "PAPER_SEEDS", "POLICY_NAMES", "TUNE_RATIO", "ClusterFrag", "ClusterState", "Fgd", "Placement", "Policy",
    "RunResult", "Task", "Trace", "TypicalPods", "arrival_order", "best_fit", "best_fit_scores", "dot_product",
    "dot_product_scores", "fgd_scores", "gpu_clustering", "gpu_clustering_scores", "gpu_packing",
    "gpu_packing_scores", "make_policy", "node_frag", "pick_max", "random_fit", "read_nodes", "read_pods", "run",
    "typical_pods",
]  # fmt: skip
