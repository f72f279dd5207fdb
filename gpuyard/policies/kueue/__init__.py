"""Kueue's quota management (ClusterQueues, cohorts, borrowing and reclaim) as a policy family:
the queues file (`config`) and the `kueue` scheduling policy."""

from .config import Queues, QueueSpec, load_queues, queue_params
from .policy import Book, Kueue

__all__ = ["Book", "Kueue", "QueueSpec", "Queues", "load_queues", "queue_params"]
