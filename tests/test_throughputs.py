"""Throughput models from Gavel, ElasticFlow and BFTrainer files, and the built-in default."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuyard.shared.model import JobSpec
from gpuyard.shared.throughput import (
    DEFAULT_GPU_SPEEDS,
    BFTrainerThroughputs,
    Curve,
    ElasticFlowThroughputs,
    GavelThroughputs,
    LinearModel,
    default_model,
    load_throughputs,
    parse_gavel_key,
    total_steps,
)
from gpuyard.workloads.generators import GAVEL_TEMPLATES


def test_curve_interpolation_rules() -> None:
    c = Curve({1: 10.0, 2: 18.0, 4: 30.0, 8: 0.0})
    assert c(1) == 10 and c(2) == 18 and c(3) == pytest.approx(24.0)
    assert c(5) == 0.0  # between a supported and an unsupported point
    assert c(8) == 0.0 and c(16) == 0.0  # last point unsupported
    assert c(0) == 0.0
    plateau = Curve({2: 5.0, 4: 9.0})
    assert plateau(1) == 0.0 and plateau(64) == 9.0
    assert Curve({1: float("nan"), 2: ""})(1) == 0.0  # type: ignore[dict-item]


def test_parse_gavel_key() -> None:
    assert parse_gavel_key("('ResNet-50 (batch size 64)', 4)") == ("ResNet-50 (batch size 64)", 4)
    with pytest.raises(ValueError):
        parse_gavel_key("ResNet-50")


def test_gavel_model(data: Callable[[str], Path]) -> None:
    path = data("gavel/simulation_throughputs.json")
    raw = json.loads(path.read_text())
    m = load_throughputs(path)
    assert isinstance(m, GavelThroughputs) and m.reference_gpu_type == "v100"
    assert set(m.job_types) == set(GAVEL_TEMPLATES)
    key = "('ResNet-50 (batch size 64)', 4)"
    assert m.throughput("ResNet-50 (batch size 64)", "p100", 4) == raw["p100"][key]["null"]
    assert m.throughput("ResNet-50 (batch size 64)", "any", 4) == raw["v100"][key]["null"]
    assert m.throughput("No such model", "v100", 1) == 0.0
    assert m.throughput("A3C", "h100", 1) == 0.0
    pair = raw["k80"]["('A3C', 1)"]["('CycleGAN', 1)"]
    assert m.colocated("A3C", "CycleGAN", "k80", 1) == tuple(pair)
    assert m.colocated("A3C", "nothing", "k80", 1) == (0.0, 0.0)
    # Pairs by GPU count: Gavel measured 4-GPU pairs too (and found none that shares).
    four = raw["v100"]["('ResNet-18 (batch size 128)', 4)"]["('ResNet-50 (batch size 128)', 4)"]
    one = raw["v100"]["('ResNet-18 (batch size 128)', 1)"]["('ResNet-50 (batch size 128)', 1)"]
    assert min(one) > 0 and four == [0.0, 0.0]
    assert m.colocated("ResNet-18 (batch size 128)", "ResNet-50 (batch size 128)", "v100", 1) == (
        tuple(one)
    )
    assert m.colocated("ResNet-18 (batch size 128)", "ResNet-50 (batch size 128)", "v100", 4) == (
        0.0,
        0.0,
    )
    # The job's work: duration on the reference type x its throughput.
    job = JobSpec(num_gpus=2, job_type="LM (batch size 20)", duration=100.0)
    assert total_steps(job, m) == pytest.approx(100 * m.throughput("LM (batch size 20)", "v100", 2))


def test_elasticflow_model(data: Callable[[str], Path]) -> None:
    m = load_throughputs(data("elasticflow"))
    assert isinstance(m, ElasticFlowThroughputs)
    assert set(m.gpu_types) == {"a100", "t4"} and m.reference_gpu_type == "a100"
    assert m.throughput("resnet50@256", "a100", 1) == pytest.approx(1.843374951404324)
    assert m.throughput("resnet50", "a100", 1) == m.throughput("resnet50@64", "a100", 1)
    assert m.throughput("resnet50_cifar10@64", "a100", 16) == 0.0  # table says 0
    assert m.throughput("deepspeech2@32", "a100", 64) == 0.0  # empty cell
    assert m.throughput("yolov3@64", "t4", 32) == 0.0  # nan
    lo, hi = (m.throughput("vgg16@64", "a100", n) for n in (4, 8))
    assert m.throughput("vgg16@64", "a100", 6) == pytest.approx((lo + hi) / 2)
    assert m.throughput("vgg16@64", "a100", 128) == m.throughput("vgg16@64", "a100", 64)
    assert m.throughput("bert@64", "t4", 1) == 0.0  # T4 measured bert at batch 384 only
    single = load_throughputs(data("elasticflow/throughputs_T4/ncf.csv"))
    assert single.gpu_types == ["t4"] and single.throughput("ncf", "any", 1) > 0


def test_bftrainer_model(data: Callable[[str], Path]) -> None:
    m = load_throughputs(data("bftrainer/ImageNet-imgps-JNPs-1001J.csv"))
    assert isinstance(m, BFTrainerThroughputs)
    assert m.throughput("J00000-AlexNet", "node", 1) == 7115.3
    assert m.throughput("J00000-AlexNet", "any", 3) == pytest.approx((13071.7 + 21066.1) / 2)
    assert m.throughput("J00000-AlexNet", "node", 128) == 202135.4


def test_default_model_and_errors(tmp_path: Path) -> None:
    m = load_throughputs(None)
    assert isinstance(m, LinearModel) and m is not default_model()
    assert m.throughput("x", "k80", 4) == pytest.approx(4 * DEFAULT_GPU_SPEEDS["k80"])
    assert m.throughput("x", "v100", 2) == 2.0
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n")
    with pytest.raises(ValueError, match="unknown throughput format"):
        load_throughputs(bad)
    with pytest.raises(FileNotFoundError):
        load_throughputs(tmp_path / "missing.json")
    binary = tmp_path / "table.csv"
    binary.write_bytes(b"\x95\x00\xff" * 10)
    with pytest.raises(ValueError, match=r"table\.csv: not a throughput table \(not UTF-8 text\)"):
        load_throughputs(binary)
    truncated = tmp_path / "gavel.json"
    truncated.write_text('{"v100": {"(\'ResNet-18 (batch size 16)\', 1)": {"null": 1.5')
    with pytest.raises(ValueError, match=r"gavel\.json': not valid JSON \(Input data was trunc"):
        load_throughputs(truncated)


def test_default_speeds_match_gavel_table(data: Callable[[str], Path]) -> None:
    import math

    raw = json.loads(data("gavel/simulation_throughputs.json").read_text())
    for gpu in ("p100", "k80"):
        ratios = [
            raw[gpu][k]["null"] / raw["v100"][k]["null"] for k in raw["v100"] if k.endswith(", 1)")
        ]
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        assert geo == pytest.approx(DEFAULT_GPU_SPEEDS[gpu], abs=0.001)


def test_learned_throughputs_replace_and_scale_the_prior() -> None:
    """Measurements answer where they were taken; a job type's other entries follow its prior,
    scaled by how its measurements compare with the prior; other job types keep the prior."""
    from gpuyard.shared.throughput import LearnedThroughputs

    prior = LinearModel({"a": 2.0, "b": 1.0})
    model = LearnedThroughputs(prior, weight=0.5)
    assert model.throughput("t", "a", 1) == 2.0
    model.observe("t", "a", 1, 1.0)  # half the table's figure
    assert model.throughput("t", "a", 1) == 1.0
    assert model.throughput("t", "b", 2) == pytest.approx(1.0)  # prior 2.0, scaled by 0.5
    assert model.throughput("other", "a", 1) == 2.0
    model.observe("t", "a", 1, 3.0)  # a moving average
    assert model.throughput("t", "a", 1) == 2.0
    model.observe("t", "a", 1, float("nan"))  # nonsense is ignored
    again = LearnedThroughputs(prior)
    again.restore(model.snapshot())
    assert again.throughput("t", "b", 1) == model.throughput("t", "b", 1)


def test_learned_throughputs_change_which_type_a_job_gets() -> None:
    """The table says a is twice as fast as b; a job type measured slow on a and fast on b goes
    to b next (the heterogeneity-aware walk picks the fastest type)."""
    from gpuyard.policies.toolkit import fastest_types, fill_in_order
    from gpuyard.shared.model import JobSpec as Spec
    from gpuyard.shared.policy import ClusterView, JobView, SchedulingInput
    from gpuyard.shared.throughput import LearnedThroughputs

    model = LearnedThroughputs(LinearModel({"a": 2.0, "b": 1.0}))
    cluster = ClusterView(capacity={"a": 1, "b": 1}, throughputs=model)

    def choice() -> str:
        job = JobView(job_id="j", seq=0, spec=Spec(num_gpus=1, job_type="t"), submit_time=0.0)
        inp = SchedulingInput(now=0.0, jobs=[job], cluster=cluster)
        (allocation,) = fill_in_order(inp.jobs, cluster, type_order=fastest_types(cluster))
        return allocation.gpu_type

    assert choice() == "a"
    model.observe("t", "a", 1, 0.5)
    model.observe("t", "b", 1, 1.5)
    assert choice() == "b"
