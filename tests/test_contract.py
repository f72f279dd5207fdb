"""The wire contract: its exported JSON Schema matches the code; subjects are namespaced."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from gpuyard.shared.contract import CONTRACT_VERSION, MESSAGES, json_schema
from gpuyard.shared.endpoints import (
    ENDPOINTS,
    ENQUEUE,
    EVENT,
    NODE_COMMAND,
    PING,
    Subjects,
    subject_table,
)
from gpuyard.shared.model import ClusterSpec

SCHEMA = (
    Path(__file__).resolve().parents[1]
    / "gpuyard"
    / "shared"
    / "schema"
    / f"contract-v{CONTRACT_VERSION}.json"
)


def test_committed_schema_matches_the_code() -> None:
    committed = json.loads(SCHEMA.read_text())
    assert committed == json.loads(json.dumps(json_schema())), (
        "the wire contract changed: run `gpuyard schema --write` (and bump CONTRACT_VERSION if "
        "old peers can no longer read it)"
    )


def test_subjects_are_namespaced_per_cluster() -> None:
    a, b = Subjects("alpha"), Subjects("beta")
    assert a.of(ENQUEUE) == "gpuyard.alpha.sched.enqueue"
    assert b.of(ENQUEUE) == "gpuyard.beta.sched.enqueue"
    assert a.of(NODE_COMMAND, node="n1") == "gpuyard.alpha.node.n1.cmd"
    assert a.every(NODE_COMMAND) == "gpuyard.alpha.node.*.cmd"
    assert a.of(EVENT, type="job.started") == "gpuyard.alpha.evt.job.started"
    assert a.of(PING, svc="place") == "gpuyard.alpha.place.ping"
    for bad in ("", "a.b", "a b", "a*", ">"):
        with pytest.raises((ValueError, msgspec.ValidationError)):
            Subjects(bad)


def test_every_message_type_of_the_table_is_in_the_contract() -> None:
    """The endpoint table and the versioned contract describe the same messages."""
    for e in ENDPOINTS:
        assert e.request in MESSAGES, e.pattern
        assert e.reply is None or e.reply in MESSAGES, e.pattern
    patterns = [e.pattern for e in ENDPOINTS]
    assert len(patterns) == len(set(patterns))


def test_docs_subject_table_is_generated_from_the_endpoint_table() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
    table = subject_table()
    assert table in page, (
        "docs/architecture.md's subject table differs from the endpoint table: paste the output of "
        "`python -c 'from gpuyard.shared.endpoints import subject_table; print(subject_table())'`"
    )


def test_cluster_spec_strings() -> None:
    spec = ClusterSpec.parse("36x4:v100, 36x4:p100,36x4:k80")
    assert spec.total_gpus == 432
    assert spec.gpus_by_type() == {"v100": 144, "p100": 144, "k80": 144}
    nodes = spec.nodes()
    assert len(nodes) == 108 and len({n.node_id for n in nodes}) == 108
    assert ClusterSpec.parse("32x4").gpus_by_type() == {"gpu": 128}
    with pytest.raises(ValueError, match="NODESxGPUS"):
        ClusterSpec.parse("32 by 4")
