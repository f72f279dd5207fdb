"""Throughput models: how fast a job of some type runs on `n` GPUs of some type.

One interface, `throughput(job_type, gpu_type, num_gpus) -> steps/s`, where 0 means "unsupported"
(the job cannot run there). A job's work is `total_steps`, or `duration` seconds at its requested GPU
count on the model's reference GPU type.
"""

from __future__ import annotations

from typing import Protocol

from .model import ANY_GPU, JobSpec


class ThroughputModel(Protocol):
    reference_gpu_type: str

    def throughput(self, job_type: str, gpu_type: str, num_gpus: int) -> float: ...


class LinearModel:
    """Every job type scales linearly with GPU count; GPU types differ by a constant factor.

    The default (all factors 1) makes a job's `duration` its run time at its requested GPU count
    on any GPU, which is what the Blox simulator assumes.
    """

    def __init__(self, factors: dict[str, float] | None = None, reference_gpu_type: str = ANY_GPU):
        self.factors = dict(factors or {})
        self.reference_gpu_type = reference_gpu_type

    def throughput(self, job_type: str, gpu_type: str, num_gpus: int) -> float:
        return num_gpus * self.factors.get(gpu_type, 1.0)


def total_steps(spec: JobSpec, model: ThroughputModel) -> float | None:
    """The job's work in steps, or None when neither `total_steps` nor `duration` is given."""
    if spec.total_steps is not None:
        return spec.total_steps
    if spec.duration is None:
        return None
    rate = model.throughput(spec.job_type, model.reference_gpu_type, spec.num_gpus)
    if rate <= 0:
        raise ValueError(
            f"job {spec.job_id}: type {spec.job_type!r} has no throughput on the reference GPU "
            f"type {model.reference_gpu_type!r} at {spec.num_gpus} GPUs"
        )
    return spec.duration * rate
