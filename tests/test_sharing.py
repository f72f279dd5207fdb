"""The fragmentation measures of a run whose jobs share GPUs (`gpuyard.sharing`): GPU allocation
with shares as fractions, and the free GPUs a waiting job would fit in by number but cannot use
where they are; from hand-made runs, and from a simulation through the real services."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuyard.run.simulate import SimOptions, simulate
from gpuyard.shared.model import ClusterSpec, GpuRef, JobSpec
from gpuyard.sharing import Ask, allocation_frame, allocation_summary, ask_of

NODES = {"n0": "g", "n1": "g", "t0": "t4"}
CAPACITY = {"g": 2, "t4": 1}


def rows(frame: object) -> list[tuple[float, int, int, int]]:
    columns = [frame[c] for c in ("time", "allocated_milli", "stranded_milli", "waiting")]  # type: ignore[index]
    return [(float(t), int(a), int(s), int(w)) for t, a, s, w in zip(*columns, strict=True)]


def arrived(frame: object) -> list[int]:
    return [int(a) for a in frame["arrived_milli"]]  # type: ignore[index]


def test_free_gpus_split_between_shares_are_stranded_while_a_job_waits() -> None:
    # a and b (0.6 each) on two GPUs; c (0.7) arrives at 5 and waits: 0.4 + 0.4 free would hold
    # it were they one GPU. d (a whole g GPU) arrives at 10. At 100 a ends and c takes its GPU:
    # 0.7 free, less than d asks. At 200 b ends and d starts. t (a t4 share) waits from 300 to
    # 350 while both g GPUs are partly free: only the t4 GPU, which it may use, counts.
    asks = {"a": Ask(600, ("g",)), "b": Ask(600, ("g",)), "c": Ask(700, ("g",)),
            "d": Ask(1000, ("g",)), "t": Ask(300, ("t4",))}  # fmt: skip
    milli = {"a": 600, "b": 600, "c": 700, "d": None, "t": 300}
    arrivals = {"a": 0.0, "b": 0.0, "c": 5.0, "d": 10.0, "t": 300.0}
    runs = [
        (0.0, "a", [GpuRef("n0", 0)]), (0.0, "b", [GpuRef("n1", 0)]),
        (100.0, "a", []), (100.0, "c", [GpuRef("n0", 0)]),
        (200.0, "b", []), (200.0, "d", [GpuRef("n1", 0)]),
        (250.0, "x", [GpuRef("t0", 0)]), (350.0, "x", []), (350.0, "t", [GpuRef("t0", 0)]),
    ]  # fmt: skip
    asks["x"], milli["x"] = Ask(1000, ("t4",)), None
    frame = allocation_frame(runs, asks, arrivals, milli, NODES, CAPACITY)
    assert rows(frame) == [
        (0.0, 1200, 0, 0),
        (5.0, 1200, 800, 1),
        (10.0, 1200, 800, 2),
        (100.0, 1300, 0, 1),
        (200.0, 1700, 0, 0),
        (250.0, 2700, 0, 0),
        (300.0, 2700, 0, 1),  # (t waits: the t4 GPU is x's, the 300 free on g are not its)
        (350.0, 2000, 0, 0),
    ]
    # (what had arrived: a and b at 0, c at 5, d at 10, t at 300; x never arrives)
    assert arrived(frame) == [1200, 1900, 2900, 2900, 2900, 2900, 3200, 3200]
    figures = allocation_summary(frame, 3000, until=400.0)
    waited = (10 - 5) + (100 - 10) + (200 - 100) + (350 - 300)
    assert figures["waiting_s"] == waited
    assert figures["stranded_gpu_share"] == pytest.approx(800 * 95 / 3000 / waited)
    spans = [(1200, 100), (1300, 100), (1700, 50), (2700, 100), (2000, 50)]
    assert figures["gpu_allocation"] == pytest.approx(sum(a * s for a, s in spans) / 3000 / 400)


def test_a_job_stopped_and_started_again_waits_in_between() -> None:
    asks, milli = {"a": Ask(1000, ("g",)), "b": Ask(1000, ("g",))}, {"a": None, "b": None}
    runs = [
        (0.0, "a", [GpuRef("n0", 0), GpuRef("n1", 0)]),
        (50.0, "a", [GpuRef("n0", 0)]),  # (shrunk: still running)
        (60.0, "a", []),  # (preempted)
        (60.0, "b", [GpuRef("n0", 0)]),
        (90.0, "a", [GpuRef("n1", 0)]),
        (120.0, "a", []),
    ]
    frame = allocation_frame(runs, asks, {"a": 0.0, "b": 60.0}, milli, NODES, CAPACITY)
    assert rows(frame) == [
        (0.0, 2000, 0, 0), (50.0, 1000, 0, 0), (60.0, 1000, 1000, 1), (90.0, 2000, 0, 0),
        (120.0, 1000, 0, 0),
    ]  # fmt: skip


def test_a_job_asks_for_its_share_or_its_smallest_size_on_the_types_it_allows() -> None:
    types = ["A100", "T4", "V100"]
    assert ask_of(JobSpec(num_gpus=1, gpu_milli=250), types) == Ask(250, tuple(types))
    elastic = JobSpec(num_gpus=4, min_gpus=2, max_gpus=8, gpu_types=["T4", "V100"])
    assert ask_of(elastic, types) == Ask(2000, ("T4", "V100"))
    assert ask_of(JobSpec(num_gpus=2, gpu_type="A100"), types) == Ask(2000, ("A100",))


async def test_a_simulation_writes_its_allocation_and_stranded_gpus(
    tmp_path: Path, nats_url: str
) -> None:
    # Two nodes of one GPU: a and b (0.6) take one GPU each; c (0.7) waits from 1 s until a ends
    # at 100 s, while 0.8 of a GPU is free, split in two.
    jobs = [
        JobSpec(job_id="a", num_gpus=1, gpu_milli=600, duration=100.0, submit_time=0.0),
        JobSpec(job_id="b", num_gpus=1, gpu_milli=600, duration=300.0, submit_time=0.0),
        JobSpec(job_id="c", num_gpus=1, gpu_milli=700, duration=100.0, submit_time=1.0),
    ]
    options = SimOptions(cluster=ClusterSpec.parse("2x1"), policy="fifo")
    out = tmp_path / "out"
    await simulate(options, jobs, out, nats_url=nats_url, plots=True)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["waiting_s"] == 99.0
    assert summary["stranded_gpu_share"] == pytest.approx(0.4)
    assert summary["gpu_allocation_while_waiting"] == pytest.approx(0.6)
    lines = (out / "allocation.csv").read_text().splitlines()
    assert lines[:3] == [
        "time,allocated_milli,stranded_milli,waiting,arrived_milli",
        "0.0,1200,0,0,1200",
        "1.0,1200,800,1,1900",
    ]
    assert (out / "allocation.png").stat().st_size > 10_000


async def test_whole_gpu_runs_have_no_allocation_files(tmp_path: Path, nats_url: str) -> None:
    jobs = [JobSpec(job_id="a", num_gpus=1, duration=10.0, submit_time=0.0)]
    out = tmp_path / "out"
    await simulate(SimOptions(cluster=ClusterSpec.parse("1x1")), jobs, out, nats_url=nats_url,
                   plots=False)  # fmt: skip
    assert not (out / "allocation.csv").exists()
    assert "stranded_gpu_share" not in json.loads((out / "summary.json").read_text())
