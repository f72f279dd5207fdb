"""Pure tests of the built-in admission policies (no services)."""

from __future__ import annotations

import pytest

from gpuyard.policies.admission import (
    AcceptAll,
    Load,
    LoadParams,
    QueueCap,
    QueueCapParams,
    TenantQuota,
    TenantQuotaParams,
)
from gpuyard.shared.model import JobSpec
from gpuyard.shared.policy import (
    AdmissionInput,
    ClusterView,
    JobView,
    PolicyError,
    admission_policies,
)


def admitted(gpus: int, tenant: str = "") -> JobView:
    spec = JobSpec(num_gpus=gpus, tenant=tenant)
    return JobView(job_id=f"j{gpus}{tenant}", seq=0, spec=spec, submit_time=0.0)


def ask(
    gpus: int = 1,
    *,
    demand: int = 0,
    active: int = 0,
    tenant: str = "",
    tenants: dict[str, int] | None = None,
    cluster: int = 8,
) -> AdmissionInput:
    """The job to decide on, and admitted jobs: one per tenant in `tenants` with its GPUs, then
    jobs without a tenant up to `active` jobs and `demand` GPUs in all."""
    jobs = [admitted(n, t) for t, n in (tenants or {}).items()]
    rest = demand - sum(j.spec.num_gpus for j in jobs)
    extra = max(active - len(jobs), 1 if rest > 0 else 0)
    for i in range(extra):
        share = rest // extra + (1 if i < rest % extra else 0)
        jobs.append(admitted(max(share, 1)) if share or rest == 0 else admitted(1))
    assert sum(j.spec.num_gpus for j in jobs) == max(demand, len(jobs)) or not demand
    return AdmissionInput(
        now=0.0, job=JobSpec(num_gpus=gpus, tenant=tenant),
        cluster=ClusterView(capacity={"gpu": cluster}, round_s=300.0), jobs=jobs,
    )  # fmt: skip


def test_accept_all():
    assert AcceptAll().decide(ask(64, demand=1000, active=99)).verdict == "admit"


@pytest.mark.parametrize(
    ("threshold", "demand", "gpus", "verdict"),
    [
        (1.0, 7, 1, "admit"),  # 8 <= 8
        (1.0, 8, 1, "hold"),  # 9 > 8
        (1.2, 8, 1, "admit"),  # 9 <= 9.6
        (1.2, 9, 1, "hold"),  # 10 > 9.6
        (1.5, 10, 2, "admit"),  # 12 <= 12
        (1.5, 11, 2, "hold"),
    ],
)
def test_load_threshold(threshold: float, demand: int, gpus: int, verdict: str):
    pol = Load(LoadParams(threshold=threshold))
    assert pol.decide(ask(gpus, demand=demand, active=3)).verdict == verdict


def test_load_admits_when_nothing_is_active():
    pol = Load(LoadParams(threshold=0.5))
    assert pol.decide(ask(8, demand=0, active=0)).verdict == "admit"
    assert pol.decide(ask(8, demand=1, active=1)).verdict == "hold"


@pytest.mark.parametrize("action", ["hold", "reject"])
def test_queue_cap(action: str):
    pol = QueueCap(QueueCapParams(cap=3, action=action))  # type: ignore[arg-type]
    assert pol.decide(ask(active=2)).verdict == "admit"
    d = pol.decide(ask(active=3))
    assert d.verdict == action and "cap 3" in d.reason


def test_tenant_quota():
    pol = TenantQuota(TenantQuotaParams(quotas={"a": 4, "b": 2}, default_quota=1))
    assert pol.decide(ask(2, tenant="a", tenants={"a": 2})).verdict == "admit"  # 4 <= 4
    assert pol.decide(ask(2, tenant="a", tenants={"a": 3})).verdict == "hold"  # 5 > 4
    assert pol.decide(ask(2, tenant="a", tenants={"b": 2})).verdict == "admit"  # b's use ignored
    assert pol.decide(ask(3, tenant="b")).verdict == "reject"  # larger than the whole quota
    assert pol.decide(ask(1, tenant="other")).verdict == "admit"
    assert pol.decide(ask(1, tenant="other", tenants={"other": 1})).verdict == "hold"
    unlimited = TenantQuota(TenantQuotaParams(quotas={"a": 1}))
    assert unlimited.decide(ask(8, tenant="z", tenants={"z": 100})).verdict == "admit"
    rejecting = TenantQuota(TenantQuotaParams(quotas={"a": 4}, action="reject"))
    assert rejecting.decide(ask(2, tenant="a", tenants={"a": 3})).verdict == "reject"


def test_registry():
    assert {"accept-all", "load", "queue-cap", "tenant-quota"} <= set(admission_policies.names())
    pol = admission_policies.create("tenant-quota", {"quotas": {"a": "3"}})
    assert pol.params.quotas == {"a": 3}
    assert admission_policies.create("load", {"threshold": "1.4"}).params.threshold == 1.4
    with pytest.raises(PolicyError):
        admission_policies.create("queue-cap", {"action": "drop"})


def test_the_api_expresses_deadline_feasibility_admission():
    """An admission policy sees the admitted jobs (their remaining work and deadlines) and the
    cluster's throughputs: enough to admit only what can still finish in time."""
    from gpuyard.shared.policy import AdmissionDecision, AdmissionPolicy, Needs

    class EdfFeasible(AdmissionPolicy):
        needs = Needs(jobs=True, throughputs=True)

        def decide(self, inp: AdmissionInput) -> AdmissionDecision:
            new = JobView(job_id="new", seq=-1, spec=inp.job, submit_time=inp.now)
            new.bind(inp.cluster.context(inp.now))
            done_by = inp.now
            for j in sorted([*inp.jobs, new], key=lambda j: j.spec.deadline or float("inf")):
                seconds = (j.remaining_steps or 0.0) / inp.cluster.rate(
                    j, "gpu", inp.cluster.total_gpus
                )
                done_by += seconds
                if j.spec.deadline is not None and done_by > j.spec.deadline:
                    return AdmissionDecision("reject", f"{j.job_id} would miss its deadline")
            return AdmissionDecision("admit")

    def with_deadline(job_id: str, duration: float, deadline: float) -> JobView:
        spec = JobSpec(job_id=job_id, num_gpus=1, duration=duration, deadline=deadline)
        return JobView(job_id=job_id, seq=0, spec=spec, submit_time=0.0)

    cluster = ClusterView(capacity={"gpu": 1}, round_s=60.0)
    admitted = [with_deadline("a", 100.0, 150.0)]
    fits = JobSpec(num_gpus=1, duration=40.0, deadline=200.0)
    late = JobSpec(num_gpus=1, duration=60.0, deadline=120.0)  # first, it pushes "a" past 150
    policy = EdfFeasible()
    assert (
        policy.decide(AdmissionInput(now=0.0, job=fits, cluster=cluster, jobs=admitted)).verdict
        == "admit"
    )
    decision = policy.decide(AdmissionInput(now=0.0, job=late, cluster=cluster, jobs=admitted))
    assert (decision.verdict, decision.reason) == ("reject", "a would miss its deadline")
