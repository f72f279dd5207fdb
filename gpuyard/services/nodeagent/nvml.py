"""GPU discovery and metrics through NVML (the `nvidia-ml-py` package, imported as `pynvml`).

`Nvml.open()` returns None where NVML is absent (no driver, no GPU, no library): the agent then takes
its GPUs from flags and says so.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from gpuyard.shared.contract import GpuMetrics

MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_mib: int
    uuid: str


def _text(value: str | bytes) -> str:
    """Old nvidia-ml-py versions return bytes for names and UUIDs."""
    return value.decode() if isinstance(value, bytes) else value


class Nvml:
    """An initialised NVML with a handle per GPU."""

    def __init__(self, nvml: ModuleType, handles: list[Any]) -> None:
        self.nvml = nvml
        self.handles = handles

    @classmethod
    def open(cls) -> tuple[Nvml | None, str]:
        """NVML and its GPUs, or (None, why not)."""
        try:
            import pynvml
        except ImportError as exc:
            return None, f"nvidia-ml-py is not installed ({exc})"
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except pynvml.NVMLError as exc:
            return None, f"NVML is not available ({exc})"
        return cls(pynvml, handles), ""

    def gpus(self) -> list[GpuInfo]:
        nv = self.nvml
        return [
            GpuInfo(
                index=i,
                name=_text(nv.nvmlDeviceGetName(h)),
                memory_mib=nv.nvmlDeviceGetMemoryInfo(h).total // MIB,
                uuid=_text(nv.nvmlDeviceGetUUID(h)),
            )
            for i, h in enumerate(self.handles)
        ]

    def metrics(self) -> list[GpuMetrics]:
        """Utilisation and memory of each GPU now; a GPU that fails to answer gets no figures."""
        nv = self.nvml
        out: list[GpuMetrics] = []
        for i, h in enumerate(self.handles):
            try:
                util = nv.nvmlDeviceGetUtilizationRates(h)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
            except nv.NVMLError:
                out.append(GpuMetrics(index=i))
                continue
            out.append(
                GpuMetrics(
                    index=i,
                    utilization=float(util.gpu),
                    memory_used_mib=mem.used // MIB,
                    memory_total_mib=mem.total // MIB,
                )
            )
        return out

    def close(self) -> None:
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlShutdown()


def gpu_type_name(model: str) -> str:
    """`NVIDIA H100 80GB HBM3` -> `h100` (a name usable in subjects and specs)."""
    words = [w for w in re.split(r"[\s-]+", model.lower().replace("nvidia", "")) if w]
    for word in words:
        if any(c.isdigit() for c in word) and any(c.isalpha() for c in word):
            return "".join(c for c in word if c.isalnum() or c in "-_")
    return "".join(c for c in "-".join(words) if c.isalnum() or c in "-_") or "gpu"
