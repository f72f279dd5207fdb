"""`gpuyard` commands for operators: events, status, policies."""

from __future__ import annotations

import argparse


def add_ops_parsers(sub: argparse._SubParsersAction) -> None:
    """Register the operations subcommands (filled in by the operations work)."""
