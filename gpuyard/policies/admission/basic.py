"""Built-in admission policies.

A policy only decides: "admit", "hold" (the service keeps the job in a FIFO overflow queue and
asks again later) or "reject". Jobs that can never fit the cluster are rejected by the service.
The load-based ones look at the admitted jobs that have not ended (`Needs(jobs=True)`), those
admitted earlier in the same request included.
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct, field

from gpuyard.shared.policy import AdmissionDecision, AdmissionInput, AdmissionPolicy, Needs

Action = Literal["hold", "reject"]


class AcceptAll(AdmissionPolicy):
    """Admit every valid job (jobs that can never fit the cluster are rejected by the service).

    Registry name `accept-all`; Blox's accept-all.
    """

    def decide(self, inp: AdmissionInput) -> AdmissionDecision:
        return AdmissionDecision("admit")


class LoadParams(Struct, forbid_unknown_fields=True):
    threshold: Annotated[float, Meta(gt=0)] = 1.0
    """Admit while total GPU demand stays <= threshold * cluster GPUs (Blox's paper: 1.0, 1.2,
    1.4, 1.5)."""


class Load(AdmissionPolicy):
    """Blox's load-based admission: admit a job if the GPUs requested by admitted, unfinished jobs
    plus its own `num_gpus` stay within `threshold` x the cluster's usable GPUs; otherwise hold it.

    Registry name `load`. Held jobs wait in order in the service's overflow queue. Difference from
    Blox: a job is admitted when no job is active even if it alone exceeds the limit (a threshold
    below 1 or a very large job would otherwise wait for ever).
    """

    Params = LoadParams
    needs = Needs(jobs=True)

    def decide(self, inp: AdmissionInput) -> AdmissionDecision:
        limit = self.params.threshold * inp.cluster.total_gpus
        demand = sum(j.spec.num_gpus for j in inp.jobs) + inp.job.num_gpus
        if demand <= limit or not inp.jobs:
            return AdmissionDecision("admit")
        return AdmissionDecision(
            "hold", f"GPU demand {demand} would exceed {self.params.threshold:g} x cluster GPUs"
        )


class QueueCapParams(Struct, forbid_unknown_fields=True):
    cap: Annotated[int, Meta(ge=1)] = 1000
    """Most active (admitted, unfinished) jobs."""
    action: Action = "hold"
    """What to do with a job that arrives when `cap` jobs are active."""


class QueueCap(AdmissionPolicy):
    """Bound the number of active jobs: when `cap` are active, hold (or reject) new ones.

    Registry name `queue-cap`.
    """

    Params = QueueCapParams
    needs = Needs(jobs=True)

    def decide(self, inp: AdmissionInput) -> AdmissionDecision:
        active = len(inp.jobs)
        if active >= self.params.cap:
            return AdmissionDecision(
                self.params.action, f"{active} active jobs (cap {self.params.cap})"
            )
        return AdmissionDecision("admit")


class TenantQuotaParams(Struct, forbid_unknown_fields=True):
    quotas: dict[str, Annotated[int, Meta(ge=0)]] = field(default_factory=dict)
    """GPUs each tenant's active jobs may request in total."""
    default_quota: Annotated[int, Meta(ge=0)] | None = None
    """Quota of tenants not in `quotas` (None: unlimited)."""
    action: Action = "hold"
    """What to do with a job over its tenant's quota (a job larger than the whole quota is always
    rejected: it could never be admitted)."""


class TenantQuota(AdmissionPolicy):
    """Per-tenant GPU quota: admit a job if the GPUs its tenant's admitted, unfinished jobs
    request plus its `num_gpus` stay within the tenant's quota.

    Registry name `tenant-quota`. A job with no tenant counts as tenant "".
    """

    Params = TenantQuotaParams
    needs = Needs(jobs=True)

    def decide(self, inp: AdmissionInput) -> AdmissionDecision:
        tenant = inp.job.tenant
        quota = self.params.quotas.get(tenant, self.params.default_quota)
        if quota is None:
            return AdmissionDecision("admit")
        need = inp.job.num_gpus
        if need > quota:
            return AdmissionDecision(
                "reject", f"job needs {need} GPUs; tenant {tenant!r} quota {quota}"
            )
        used = sum(j.spec.num_gpus for j in inp.jobs if j.spec.tenant == tenant)
        if used + need > quota:
            return AdmissionDecision(
                self.params.action,
                f"tenant {tenant!r} would use {used + need} GPUs (quota {quota})",
            )
        return AdmissionDecision("admit")
