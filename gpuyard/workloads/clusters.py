"""Cluster specs from text, TOML, JSON, ElasticFlow's cluster_spec CSV or openb's node list.

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
- Alibaba openb's `openb_node_list_*.csv` (`sn,cpu_milli,memory_mib,gpu,model`, told from
  ElasticFlow's by that header): each node `gpu` GPUs of type `model` (spelled as the pod lists'
  gpu_spec, so jobs restricted to a type run only there); nodes without GPUs are left out
  (`load_openb_nodes` counts them); each node's CPUs and memory count for the jobs that ask
  for some; consecutive identical nodes make one group, in the file's order.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import msgspec

from gpuyard.shared.model import ClusterSpec

from .core import read_document

ELASTICFLOW_COLUMNS = ("num_switch", "num_node_p_switch", "num_gpu_p_node")
OPENB_NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")


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
        with open(path, newline="") as f:
            header = tuple(c.strip() for c in f.readline().rstrip("\r\n").split(","))
        if header == OPENB_NODE_COLUMNS:
            return load_openb_nodes(path)[0]
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


def load_openb_nodes(path: str | Path) -> tuple[ClusterSpec, int]:
    """An openb node list as a ClusterSpec (module docstring), and how many nodes without GPUs
    it left out."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    groups: list[dict[str, Any]] = []
    gpu_less = 0
    for line, row in enumerate(rows, start=2):
        try:
            gpus = int(str(row["gpu"]).strip())
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}, line {line}: gpu {row['gpu']!r}: {exc}") from None
        model = str(row["model"] or "").strip()
        if gpus == 0:
            gpu_less += 1
            continue
        if not model:
            raise ValueError(f"{path}, line {line}: a node with {gpus} GPUs has no model")
        try:
            cpu, memory = (int(str(row[c] or 0).strip()) for c in ("cpu_milli", "memory_mib"))
        except ValueError as exc:
            raise ValueError(f"{path}, line {line}: cpu_milli or memory_mib: {exc}") from None
        node = {"gpus_per_node": gpus, "gpu_type": model, "cpu_milli": cpu, "memory_mib": memory}
        last = groups[-1] if groups else None
        if last and all(last[k] == v for k, v in node.items()):
            last["count"] += 1
        else:
            groups.append({"count": 1, **node})
    if not groups:
        raise ValueError(f"{path}: no node with GPUs")
    try:
        return msgspec.convert({"groups": groups}, ClusterSpec), gpu_less
    except msgspec.ValidationError as exc:
        raise ValueError(f"{path}: {exc}") from exc
