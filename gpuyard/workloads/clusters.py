"""Cluster specs from text, TOML, JSON or ElasticFlow's cluster_spec CSV.

Accepted by `load_cluster(text_or_path)`:

- a spec string: `32x4`, `36x4:v100,36x4:p100,36x4:k80` (nodes x GPUs per node[:type]);
- a TOML file, either `spec = "36x4:v100,36x4:p100"` or groups (optionally under `[cluster]`)::

      [[groups]]
      count = 36
      gpus_per_node = 4
      gpu_type = "v100"

- a JSON file holding a ClusterSpec (`{"groups": [...]}`);
- ElasticFlow's `cluster_specs/n<N>g<G>.csv` (`num_switch,num_node_p_switch,num_gpu_p_node,
  num_cpu_p_node,mem_p_node`): num_switch x num_node_p_switch nodes of num_gpu_p_node GPUs of
  type `gpu_type` (default "a100", the GPU of ElasticFlow's throughput tables). CPU and memory
  per node have no slot in ClusterSpec and are ignored; switches are flattened (one group per
  row).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import msgspec

from gpuyard.shared.model import ClusterSpec

from .core import read_document

ELASTICFLOW_COLUMNS = ("num_switch", "num_node_p_switch", "num_gpu_p_node")


def load_cluster(text_or_path: str | Path, *, gpu_type: str = "a100") -> ClusterSpec:
    """A ClusterSpec from a spec string or a file (module docstring). `gpu_type` names the GPUs of
    an ElasticFlow CSV, which does not say."""
    if isinstance(text_or_path, str) and not Path(text_or_path).exists():
        if text_or_path.endswith((".toml", ".csv", ".json")):
            raise FileNotFoundError(f"cluster spec file {text_or_path!r} does not exist")
        return ClusterSpec.parse(text_or_path)
    path = Path(text_or_path)
    suffix = path.suffix.lower()
    if suffix in (".toml", ".json"):
        return _from_document(path)
    if suffix == ".csv":
        return _from_elasticflow_csv(path, gpu_type)
    return ClusterSpec.parse(path.read_text().strip())


def _from_document(path: Path) -> ClusterSpec:
    """TOML: `spec = "..."` or [[groups]] (optionally under [cluster]); JSON: a ClusterSpec."""
    data: Any = read_document(path)
    if isinstance(data, dict) and path.suffix.lower() == ".toml":
        data = data.get("cluster", data)
        if "spec" in data:
            try:
                return ClusterSpec.parse(str(data["spec"]))
            except ValueError as exc:
                raise ValueError(f"{path}: {exc}") from None
        if "groups" not in data:
            raise ValueError(f'{path}: expected `spec = "NxG:type,..."` or [[groups]] tables')
        data = {"groups": data["groups"]}
    try:
        return msgspec.convert(data, ClusterSpec)
    except msgspec.ValidationError as exc:
        raise ValueError(f"{path}: not a cluster spec: {exc}") from None


def _from_elasticflow_csv(path: Path, gpu_type: str) -> ClusterSpec:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{path}: empty cluster spec")
    groups = []
    for line, row in enumerate(rows, start=2):
        missing = [c for c in ELASTICFLOW_COLUMNS if c not in row]
        if missing:
            raise ValueError(f"{path}, line 1: missing column {missing[0]!r}")
        try:
            switches, nodes, gpus = (int(str(row[c]).strip()) for c in ELASTICFLOW_COLUMNS)
        except ValueError as exc:
            raise ValueError(f"{path}, line {line}: {exc}") from exc
        # (a group per switch: ElasticFlow's placement orders nodes by their index in a switch)
        groups += [{"count": nodes, "gpus_per_node": gpus, "gpu_type": gpu_type}] * switches
    try:
        return msgspec.convert({"groups": groups}, ClusterSpec)
    except msgspec.ValidationError as exc:
        raise ValueError(f"{path}: {exc}") from exc
