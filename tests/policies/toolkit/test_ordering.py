"""The ordering walk every ordering policy uses (`toolkit.fill_in_order`)."""

from __future__ import annotations

from gpuyard.policies.toolkit import agnostic_types, fastest_types, fill_in_order

from ..views import ids, inp, job

# --------------------------------------------------------------------------- the shared walk


def test_walk_preempts_last_running_job_after_it():
    order = [
        job("new", 2),
        job("r1", 1, running=True),
        job("r2", 1, running=True),
        job("r3", 2, running=True),
    ]
    # 4 GPUs all held; "new" needs 2: the tail job r3 is preempted, r1 and r2 keep theirs.
    assert ids(fill_in_order(order, {"gpu": 4})) == ["new", "r1", "r2"]


def test_walk_hol_stop_keeps_later_running_jobs():
    order = [
        job("r1", 2, running=True),
        job("big", 3),  # cannot fit even preempting r2
        job("r2", 1, running=True),
        job("small", 1),
    ]
    out = fill_in_order(order, {"gpu": 4})
    assert ids(out) == ["r1", "r2"]  # stops at big; r2 keeps running; small is blocked
    out = fill_in_order(order, {"gpu": 4}, backfill=True)
    assert ids(out) == ["r1", "r2", "small"]


def test_walk_placed_jobs_are_not_preempted_by_later_ones():
    order = [job("a", 2), job("b", 3)]
    assert ids(fill_in_order(order, {"gpu": 4})) == ["a"]


def test_walk_keeps_gpu_type_and_respects_type_capacity():
    order = [
        job("r", 2, running=True, gpu_type="k80"),
        job("v", 2, spec={"gpu_type": "v100"}),
        job("any", 3),
    ]
    out = fill_in_order(order, {"k80": 4, "v100": 2})
    assert [(a.job_id, a.num_gpus, a.gpu_type) for a in out] == [
        ("r", 2, "k80"),
        ("v", 2, "v100"),
    ]  # "any" needs 3 on one type: k80 has 2 left, v100 none -> blocked
    assert sum(a.num_gpus for a in out if a.gpu_type == "k80") <= 4


# --------------------------------------------------------------------------- GPU types


class ToyModel:
    """v100 is 3x k80; job type "big" does not fit a k80 (throughput 0)."""

    reference_gpu_type = "v100"

    def throughput(self, job_type: str, gpu_type: str, num_gpus: int) -> float:
        if job_type == "big" and gpu_type == "k80":
            return 0.0
        return num_gpus * (3.0 if gpu_type in ("v100", "any") else 1.0)

    def colocated(
        self, job_type: str, other: str, gpu_type: str, num_gpus: int
    ) -> tuple[float, float]:
        return (0.0, 0.0)


def hetero(jobs, capacity):  # type: ignore[no-untyped-def]
    return inp(jobs, gpus=capacity, model=ToyModel())


def test_walk_never_gives_a_job_a_type_where_it_cannot_run():
    jobs = [job(f"b{i}", 1, submit=i, spec={"job_type": "big"}) for i in range(6)]
    out = fill_in_order(jobs, hetero(jobs, {"k80": 8, "v100": 2}).cluster, backfill=True)
    assert [(a.job_id, a.gpu_type) for a in out] == [("b0", "v100"), ("b1", "v100")]
    # Without backfill the third job blocks the walk: it waits for a v100, as it must.
    out = fill_in_order(jobs, hetero(jobs, {"k80": 8, "v100": 2}).cluster)
    assert [a.gpu_type for a in out] == ["v100", "v100"]


def test_agnostic_type_choice_is_uniform_among_types_with_room_and_stable_per_job():
    jobs = [job(f"j{i}", 1, submit=i) for i in range(400)]
    cluster = hetero(jobs, {"k80": 400, "p100": 400, "v100": 400}).cluster
    chosen = [a.gpu_type for a in fill_in_order(jobs, cluster)]
    counts = {t: chosen.count(t) for t in ("k80", "p100", "v100")}
    assert all(100 <= n <= 170 for n in counts.values()), counts  # 133 each on average
    again = [a.gpu_type for a in fill_in_order(jobs, cluster)]
    assert again == chosen  # the same job prefers the same type every round
    assert agnostic_types(jobs[0], ["k80", "v100"], 1) in (["k80", "v100"], ["v100", "k80"])


def test_fastest_types_first():
    jobs = [job(f"j{i}", 1, submit=i) for i in range(4)]
    cluster = hetero(jobs, {"k80": 4, "v100": 2}).cluster
    out = fill_in_order(jobs, cluster, type_order=fastest_types(cluster))
    assert [a.gpu_type for a in out] == ["v100", "v100", "k80", "k80"]


def test_capacity_mapping_still_accepted():
    """Policies written for the first policy API pass the capacity per type: every job runs on
    every type then."""
    jobs = [job("a", 2), job("b", 2)]
    assert ids(fill_in_order(jobs, {"gpu": 4})) == ["a", "b"]
