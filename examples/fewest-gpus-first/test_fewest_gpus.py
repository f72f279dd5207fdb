"""Unit test of the policy: no NATS, no services, just views in and allocations out."""

from fewest_gpus import FewestGpusFirst

from gpuyard.shared.model import JobSpec
from gpuyard.shared.policy import ClusterView, JobView, SchedulingInput


def queued(job_id: str, gpus: int, arrival: float) -> JobView:
    spec = JobSpec(job_id=job_id, num_gpus=gpus, duration=100.0)
    return JobView(job_id=job_id, seq=int(arrival), spec=spec, state="queued", submit_time=arrival)


def test_small_jobs_go_first_and_big_ones_wait() -> None:
    jobs = [queued("big", 4, 0.0), queued("small", 1, 1.0), queued("medium", 2, 2.0)]
    cluster = ClusterView(capacity={"gpu": 4}, round_s=300.0)
    allocations = FewestGpusFirst().schedule(SchedulingInput(now=10.0, jobs=jobs, cluster=cluster))
    assert [(a.job_id, a.num_gpus) for a in allocations] == [("small", 1), ("medium", 2)]
