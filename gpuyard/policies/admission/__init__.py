"""General-purpose admission policies: accept everything, Blox's load-based admission, a cap on
active jobs, per-tenant GPU quotas."""

from .basic import (
    AcceptAll,
    Load,
    LoadParams,
    QueueCap,
    QueueCapParams,
    TenantQuota,
    TenantQuotaParams,
)

__all__ = [
    "AcceptAll", "Load", "LoadParams", "QueueCap", "QueueCapParams", "TenantQuota",
    "TenantQuotaParams",
]  # fmt: skip
