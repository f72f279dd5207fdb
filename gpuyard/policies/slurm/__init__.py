"""Policies as Slurm runs them: EASY backfill by the jobs' time limits."""

from .backfill import EasyBackfill, EasyParams, Reservation, reserve

__all__ = ["EasyBackfill", "EasyParams", "Reservation", "reserve"]
