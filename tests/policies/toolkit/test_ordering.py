"""The ordering walk every ordering policy uses (`toolkit.fill_in_order`)."""

from __future__ import annotations

from gpuyard.policies.toolkit import fill_in_order

from ..views import ids, job

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


