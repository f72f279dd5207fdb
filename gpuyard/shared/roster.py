"""The control plane's services, in one place: each one's name, subject token, the kind of policy
it runs, and where its class and configuration live. Identities, subjects, permissions, the
launcher and the commands read it."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ServiceEntry:
    name: str
    """As identities, logs and commands name it (`svc.scheduler`, `--external scheduler`)."""
    token: str
    """Its subjects' token (`gpuyard.<cluster>.sched.enqueue`)."""
    policy_kind: str | None
    """The kind of policy it runs (`scheduling`); None: it runs none (the simulation's clock)."""
    module: str
    """The module of its class and configuration class."""
    cls: str
    config: str

    def service_class(self) -> Any:
        return getattr(importlib.import_module(self.module), self.cls)

    def config_class(self) -> Any:
        return getattr(importlib.import_module(self.module), self.config)


ROSTER = (
    ServiceEntry("admission", "adm", "admission", "gpuyard.services.admission.service",
                 "Admission", "AdmissionConfig"),
    ServiceEntry("scheduler", "sched", "scheduling", "gpuyard.services.scheduler.service",
                 "Scheduler", "SchedulerConfig"),
    ServiceEntry("placement", "place", "placement", "gpuyard.services.placement.service",
                 "Placement", "PlacementConfig"),
    ServiceEntry("simclock", "clock", None, "gpuyard.services.simclock.service",
                 "SimClock", "SimClockConfig"),
)  # fmt: skip
"""Every service, the control plane's first (a simulation's clock last)."""
BY_NAME = {entry.name: entry for entry in ROSTER}
SERVICES = tuple(entry.name for entry in ROSTER)
CONTROL_PLANE = tuple(entry.name for entry in ROSTER if entry.policy_kind is not None)
"""The services that run a policy: admission, scheduler, placement."""
SERVICE_TOKENS = {entry.name: entry.token for entry in ROSTER}
"""The subject token of each service (node agents use `node.<id>`)."""
