"""Shares of GPUs, GPU-type sets, CPUs and memory (issue 44): the model's checks, the walk and
the scheduler's guard counting thousandths of GPUs, placement packing shares on the GPU they fit
best and keeping to nodes' CPUs and memory, and simulations through the real services."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuyard.ops import read_events
from gpuyard.policies.placement.strategies import Consolidated, FirstFit
from gpuyard.policies.toolkit import fill_in_order
from gpuyard.policies.toolkit.ordering import agnostic_types
from gpuyard.run.simulate import SimOptions, simulate
from gpuyard.services.scheduler.guard import PolicyAnswerError, check
from gpuyard.shared.connection import connect
from gpuyard.shared.endpoints import Subjects
from gpuyard.shared.model import Allocation, ClusterSpec, GpuRef, JobRecord, JobSpec, NodeGroup
from gpuyard.shared.policy import ClusterView, JobView, NodeView, PlacementInput


def share(job_id: str, milli: int | None, **fields: object) -> JobSpec:
    return JobSpec(job_id=job_id, num_gpus=1, gpu_milli=milli, duration=100.0, **fields)  # type: ignore[arg-type]


def record(spec: JobSpec, seq: int, *, running_on: str | None = None) -> JobRecord:
    assert spec.job_id is not None
    r = JobRecord(job_id=spec.job_id, seq=seq, spec=spec, submit_time=0.0, admit_time=0.0)
    if running_on is not None:
        r.state, r.gpus, r.gpu_type = "running", spec.num_gpus, running_on
    return r


def test_the_model_refuses_shares_it_cannot_run() -> None:
    with pytest.raises(ValueError, match="share of one GPU"):
        JobSpec(num_gpus=2, gpu_milli=500)
    with pytest.raises(ValueError, match="share of one GPU"):
        JobSpec(num_gpus=1, max_gpus=2, gpu_milli=500)
    with pytest.raises(ValueError, match="not among gpu_types"):
        JobSpec(num_gpus=1, gpu_type="p100", gpu_types=["t4", "g3"])
    spec = JobSpec(num_gpus=1, gpu_types=["t4", "g3"])
    assert spec.allows("t4") and spec.allows("g3") and not spec.allows("p100")
    assert JobSpec(num_gpus=1, gpu_type="t4").allows("t4") and not spec.allows("any")
    assert (share("a", 300).milli(1), share("b", None).milli(1)) == (300, 1000)


def test_the_walk_packs_shares_and_keeps_to_the_types_a_job_allows() -> None:
    cluster = ClusterView(capacity={"p100": 1, "t4": 1})
    jobs = [
        share("a", 400, gpu_types=["t4"]), share("b", 400, gpu_types=["t4"]),
        share("c", 400, gpu_types=["t4"]), share("d", 600),
    ]  # fmt: skip
    views = [JobView(record(spec, i)) for i, spec in enumerate(jobs)]
    allocations = fill_in_order(views, cluster, backfill=True)
    # Two shares of 400 fit the one T4; the third does not (1,200 > 1,000), nor on the P100.
    assert [(a.job_id, a.gpu_type) for a in allocations] == [
        ("a", "t4"), ("b", "t4"), ("d", "p100"),
    ]  # fmt: skip


def test_the_guard_counts_thousandths() -> None:
    active = {s.job_id: record(s, i) for i, s in enumerate([share("a", 500), share("b", 500)])}
    both = [Allocation("a", 1, "gpu"), Allocation("b", 1, "gpu")]
    kept, _ = check("p", both, active, {"gpu": 1}, lambda r, a: True)  # type: ignore[arg-type]
    assert [a.job_id for a in kept] == ["a", "b"]
    active["c"] = record(share("c", 1), 2)
    with pytest.raises(PolicyAnswerError, match="more GPUs than exist"):
        check("p", [*both, Allocation("c", 1, "gpu")], active, {"gpu": 1}, lambda r, a: True)  # type: ignore[arg-type]


def placement(
    specs: list[JobSpec], nodes: list[NodeView], policy: type = Consolidated
) -> dict[str, list[GpuRef]]:
    inp = PlacementInput(
        now=0.0, allocations=[Allocation(s.job_id or "", s.num_gpus) for s in specs], current={},
        nodes=nodes, specs={s.job_id or "": s for s in specs},
    )  # fmt: skip
    placed: dict[str, list[GpuRef]] = policy().place(inp)
    return placed


def test_shares_go_to_the_gpu_they_fit_best() -> None:
    # GPU 0 has 300 left, GPU 1 700: a share of 250 goes to GPU 0 (50 left), one of 600 to
    # GPU 1, one of 500 to the free GPU 2; a whole GPU then finds none.
    node = NodeView(node_id="n", gpu_type="gpu", usable=[2], shares={0: 300, 1: 700})
    specs = [share("a", 250), share("b", 600), share("c", 500), share("d", None)]
    placed = placement(specs, [node])
    assert placed == {"a": [GpuRef("n", 0)], "b": [GpuRef("n", 1)], "c": [GpuRef("n", 2)]}


def test_a_node_whose_cpus_are_taken_hosts_no_gpu_job() -> None:
    busy = NodeView(node_id="a", gpu_type="gpu", usable=[0, 1, 2, 3], cpu_milli=1000)
    idle = NodeView(node_id="b", gpu_type="gpu", usable=[0, 1], cpu_milli=64000)
    specs = [
        share("small", 500, cpu_milli=1000),  # fits node a's CPUs
        share("big", 500, cpu_milli=2000),  # does not: node b
        JobSpec(job_id="pair", num_gpus=2, cpu_milli=64000, duration=1.0),  # b has 62000 left
    ]
    placed = placement(specs, [busy, idle], FirstFit)
    assert placed == {"small": [GpuRef("a", 0)], "big": [GpuRef("b", 0)]}
    # Memory counts as CPUs do; a job on two nodes asks each for its share of them.
    spread = JobSpec(job_id="wide", num_gpus=4, memory_mib=4000, duration=1.0)
    nodes = [NodeView(node_id=n, gpu_type="gpu", usable=[0, 1], memory_mib=2000) for n in "ab"]
    assert len(placement([spread], nodes)["wide"]) == 4
    nodes[1] = NodeView(node_id="b", gpu_type="gpu", usable=[0, 1], memory_mib=1999)
    assert placement([spread], nodes) == {}


def test_a_job_runs_only_on_the_types_it_allows() -> None:
    # Types are tried in name order (g3, p100, t4): a may use g3 or t4, and g3 is full.
    nodes = [
        NodeView(node_id="p100", gpu_type="p100", usable=[0, 1]),
        NodeView(node_id="t4", gpu_type="t4", usable=[0, 1]),
        NodeView(node_id="g3", gpu_type="g3", usable=[], shares={0: 100}),
    ]
    specs = [share("a", None, gpu_types=["g3", "t4"]), share("b", 100, gpu_types=["g3"]),
             share("c", 200, gpu_types=["g3"])]  # fmt: skip
    assert placement(specs, nodes) == {"a": [GpuRef("t4", 0)], "b": [GpuRef("g3", 0)]}


async def test_shares_of_a_gpu_run_together_in_a_simulation(tmp_path: Path, nats_url: str) -> None:
    # Two GPUs: a, b, c, d (0.5, 0.5, 0.5, 0.3) run at once; e, a whole GPU, waits for one to
    # empty (GPU 0 at 100 s); f allows only a type the cluster lacks: declined with why.
    jobs = [
        share("a", 500, submit_time=0.0), share("b", 500, submit_time=0.0),
        share("c", 500, submit_time=0.0), share("d", 300, submit_time=0.0),
        share("e", None, submit_time=0.0), share("f", 700, submit_time=1.0, gpu_types=["t4"]),
    ]  # fmt: skip
    options = SimOptions(cluster=ClusterSpec.parse("1x2"), policy="fifo")
    result = await simulate(options, jobs, tmp_path / "out", nats_url=nats_url, plots=False)
    ends = {r.job_id: r.end_time for r in result.jobs}
    assert ends == {"a": 100.0, "b": 100.0, "c": 100.0, "d": 100.0, "e": 200.0}
    by_id = {r.job_id: r for r in result.jobs}
    assert by_id["d"].gpu_seconds == 30.0 and by_id["e"].gpu_seconds == 100.0
    nc = await connect(nats_url, name="test")
    started = [e.event async for e in read_events(nc, Subjects("sim"), types=["job.started"])]
    await nc.drain()
    gpus = {e.job_id: [(g.node_id, g.index) for g in e.gpus] for e in started}
    assert gpus["a"] == gpus["b"] and gpus["c"] == gpus["d"] and gpus["a"] != gpus["c"]
    lines = (tmp_path / "out" / "jobs.csv").read_text().splitlines()
    assert lines[0].split(",")[3:5] == ["num_gpus", "gpu_milli"]
    declined = next(line for line in lines if line.startswith("f,"))
    assert "declined" in declined and "GPU types t4 are not in the cluster" in declined


async def test_cpus_hold_back_a_job_that_gpus_alone_would_start(
    tmp_path: Path, nats_url: str
) -> None:
    # One node of 4 GPUs and 8 CPUs: a takes 6 CPUs on one GPU; b (4 CPUs) waits for a to end
    # although 3 GPUs are free; c (2 CPUs) starts at once beside a.
    cluster = ClusterSpec(groups=[NodeGroup(count=1, gpus_per_node=4, cpu_milli=8000)])
    jobs = [
        share("a", None, submit_time=0.0, cpu_milli=6000),
        share("b", None, submit_time=1.0, cpu_milli=4000),
        share("c", None, submit_time=2.0, cpu_milli=2000),
    ]
    options = SimOptions(cluster=cluster, policy="fifo", placement="first-fit")
    result = await simulate(options, jobs, tmp_path / "out", nats_url=nats_url, plots=False)
    starts = {r.job_id: r.first_start for r in result.jobs}
    assert starts == {"a": 0.0, "b": 100.0, "c": 2.0}


@pytest.mark.parametrize("placement", ["consolidated", "fgd"])
async def test_a_job_a_type_cannot_hold_runs_on_another_it_allows(
    tmp_path: Path, nats_url: str, placement: str
) -> None:
    # Nodes of type a have too few CPUs for these jobs; type b's hold them. The scheduler's
    # type-agnostic walk gives some of them a first (by job): placement cannot place them there,
    # so the walk tries b next (`JobRecord.unplaced_on`), or FGD, which chooses among the types
    # a job allows, places them on b at once. Without either they would wait forever.
    cluster = ClusterSpec(groups=[
        NodeGroup(count=1, gpus_per_node=4, gpu_type="a", cpu_milli=2000),
        NodeGroup(count=1, gpus_per_node=4, gpu_type="b", cpu_milli=64_000),
    ])  # fmt: skip
    jobs = [share(f"j{i}", None, submit_time=float(i), cpu_milli=8000) for i in range(6)]
    prefers_a = [
        s.job_id for s in jobs
        if agnostic_types(JobView(record(s, 0)), ["a", "b"], 1)[0] == "a"
    ]  # fmt: skip
    assert prefers_a  # (the case is not trivial)
    options = SimOptions(cluster=cluster, policy="fifo", placement=placement)
    result = await simulate(options, jobs, tmp_path / "out", nats_url=nats_url, plots=False)
    on_b = [n.node_id for n in cluster.nodes() if n.gpu_type == "b"]
    assert {r.job_id: (r.state, r.ran_on) for r in result.jobs} == {
        s.job_id: ("completed", on_b) for s in jobs
    }
