"""The wire contract: its exported JSON Schema matches the code; subjects are namespaced."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from gpuyard.shared.contract import CONTRACT_VERSION, Subjects, json_schema
from gpuyard.shared.model import ClusterSpec

SCHEMA = (
    Path(__file__).resolve().parents[1] / "shared" / "schema" / f"contract-v{CONTRACT_VERSION}.json"
)


def test_committed_schema_matches_the_code() -> None:
    committed = json.loads(SCHEMA.read_text())
    assert committed == json.loads(json.dumps(json_schema())), (
        "the wire contract changed: run `gpuyard schema --write` (and bump CONTRACT_VERSION if "
        "old peers can no longer read it)"
    )


def test_subjects_are_namespaced_per_cluster() -> None:
    a, b = Subjects("alpha"), Subjects("beta")
    assert a.scheduler == "gpuyard.alpha.sched" and b.scheduler == "gpuyard.beta.sched"
    assert a.node("n1") == "gpuyard.alpha.node.n1"
    assert a.event("job.started") == "gpuyard.alpha.evt.job.started"
    for bad in ("", "a.b", "a b", "a*", ">"):
        with pytest.raises((ValueError, msgspec.ValidationError)):
            Subjects(bad)


def test_cluster_spec_strings() -> None:
    spec = ClusterSpec.parse("36x4:v100, 36x4:p100,36x4:k80")
    assert spec.total_gpus == 432
    assert spec.gpus_by_type() == {"v100": 144, "p100": 144, "k80": 144}
    nodes = spec.nodes()
    assert len(nodes) == 108 and len({n.node_id for n in nodes}) == 108
    assert ClusterSpec.parse("32x4").gpus_by_type() == {"gpu": 128}
    with pytest.raises(ValueError, match="NODESxGPUS"):
        ClusterSpec.parse("32 by 4")
