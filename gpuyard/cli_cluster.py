"""`gpuyard` commands for real clusters (node agents, control plane, jobs)."""

from __future__ import annotations

import argparse


def add_cluster_parsers(sub: argparse._SubParsersAction) -> None:
    """Register the real-cluster subcommands (filled in by the real-cluster work)."""
