"""ElasticFlow's scheduling, admission and placement policies on views built by hand (no NATS)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from gpuyard.policies.elasticflow import (
    Buddy,
    BuddyParams,
    DeadlineAdmissionParams,
    Edf,
    EdfAdmission,
    ElasticFlow,
    ElasticFlowAdmission,
    ElasticFlowParams,
    NodeSets,
)
from gpuyard.policies.elasticflow.demand import levels
from gpuyard.policies.elasticflow.planner import Plan
from gpuyard.policies.elasticflow.scheduling import _next_change
from gpuyard.shared.model import Allocation, GpuRef, JobSpec
from gpuyard.shared.policy import (
    AdmissionInput,
    ClusterView,
    JobView,
    NodeStatus,
    NodeView,
    PlacementInput,
    SchedulingInput,
    admission_policies,
    placement_policies,
    scheduling_policies,
)
from gpuyard.shared.throughput import ElasticFlowThroughputs, LearnedThroughputs

# "toy@64" speeds up sublinearly and peaks at 4 GPUs; "flat@64" never speeds up.
MODEL = ElasticFlowThroughputs(
    {
        "a100": {
            "toy": {64: {1: 1.0, 2: 1.8, 4: 3.2, 8: 3.0}},
            "flat": {64: {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0}},
        }
    }
)


def spec(job_id: str, steps: float, deadline: float | None, **more: Any) -> JobSpec:
    more.setdefault("job_type", "toy@64")
    return JobSpec(
        job_id=job_id, num_gpus=1, min_gpus=1, max_gpus=64, total_steps=steps,
        deadline=deadline, **more,
    )  # fmt: skip


def view(s: JobSpec, seq: int, *, gpus: int = 0, done: float = 0.0) -> JobView:
    record: dict[str, Any] = {"steps_done": done}
    if gpus:
        record |= {
            "gpus": gpus,
            "gpu_type": "a100",
            "rate": MODEL.throughput(s.job_type, "a100", gpus),
        }
    return JobView(
        job_id=s.job_id, seq=seq, spec=s, state="running" if gpus else "queued",
        submit_time=0.0, **record,
    )  # fmt: skip


def sched_input(
    jobs: list[JobView], now: float = 0.0, gpus: int = 8, slot: float = 60.0
) -> SchedulingInput:
    for j in jobs:
        j.record.run_start = j.record.progress_at = now
    cluster = ClusterView(capacity={"a100": gpus}, round_s=slot, throughputs=MODEL)
    return SchedulingInput(now=now, jobs=[JobView(j.record) for j in jobs], cluster=cluster)


def counts(allocations: list[Allocation]) -> dict[str, int]:
    return {a.job_id: a.num_gpus for a in allocations}


def test_registered_by_name():
    assert scheduling_policies.get("elasticflow") is ElasticFlow
    assert scheduling_policies.get("edf") is Edf
    assert admission_policies.get("elasticflow") is ElasticFlowAdmission
    assert admission_policies.get("edf") is EdfAdmission
    assert placement_policies.get("buddy") is Buddy
    assert placement_policies.get("node-sets") is NodeSets


def test_levels_stop_at_the_peak_as_elasticflow_caps_jobs():
    toy = spec("a", 10, 100)
    rate = lambda n: MODEL.throughput("toy@64", "a100", n)  # noqa: E731
    assert levels(toy, rate, 128, "peak")[0] == (1, 2, 4)
    assert levels(toy, rate, 128, "largest")[0] == (1, 2, 4, 8, 16, 32, 64)
    assert levels(toy, rate, 2, "largest")[0] == (1, 2)


def test_minimum_shares_then_leftovers():
    # 'urgent' needs 4 GPUs to make its deadline (3.2 steps/s); 'relaxed' 1 GPU; 3 are left over.
    urgent = view(spec("urgent", 192, 60), 0)
    relaxed = view(spec("relaxed", 600, 1200), 1)
    pol = ElasticFlow()
    allocations = pol.schedule(sched_input([urgent, relaxed]))
    # Largest first, ties in the order ElasticFlow's leftover walk leaves them: 'relaxed' was
    # served (it could grow), 'urgent' never could, and the walk's sorts keep 'relaxed' ahead.
    assert [a.job_id for a in allocations] == ["relaxed", "urgent"]
    got = counts(allocations)
    assert got["urgent"] == 4
    assert got["relaxed"] == 4  # its share is 1; leftovers take it to its peak level
    assert sum(got.values()) <= 8
    assert all(a.gpu_type == "a100" for a in allocations)


def test_without_leftovers_to_give_a_job_runs_its_minimum_share():
    urgent = view(spec("urgent", 192, 60), 0)
    pol = ElasticFlow()
    assert counts(pol.schedule(sched_input([urgent], gpus=4))) == {"urgent": 4}


def test_a_job_planned_to_start_later_gets_leftovers_first_and_runs_now():
    a = view(spec("a", 60, 3600), 0)
    pol = ElasticFlow()
    assert counts(pol.schedule(sched_input([a], gpus=1))) == {"a": 1}


def test_wakes_where_a_plan_changes_before_a_running_job_ends():
    # One GPU: 'a' (1 GPU until 600) then 'b', planned to start only when 'a' is done: 'a''s end
    # is an event of its own (where everything is planned again), so no wake-up is needed there;
    # a restart pause would move that end, and a wake at 600 would decide once more.
    a = view(spec("a", 600, 600), 0)
    b = view(spec("b", 60, 3600, job_type="flat@64"), 1)
    pol = ElasticFlow()
    assert counts(pol.schedule(sched_input([a, b], gpus=1))) == {"a": 1}
    assert pol.next_decision_time(sched_input([a, b], gpus=1)) is None
    # A plan that changes before every running job's planned end is a wake-up.
    running = Plan([0.0], [2], 600.0, 600.0, 600.0)
    assert _next_change([running, Plan([0.0, 300.0], [0, 1], 900.0, 900.0, 900.0)], 0.0) == 300.0
    assert _next_change([running, Plan([0.0, 600.0], [0, 1], 900.0, 900.0, 900.0)], 0.0) is None


def test_best_effort_jobs_live_on_leftovers():
    urgent = view(spec("urgent", 192, 60), 0)
    best = view(spec("best", 1e6, None, best_effort=True), 1)
    got = counts(ElasticFlow().schedule(sched_input([urgent, best], gpus=4)))
    assert got == {"urgent": 4}
    got = counts(ElasticFlow().schedule(sched_input([urgent, best], gpus=8)))
    assert got["urgent"] == 4 and got["best"] >= 1


def test_marginal_order_is_a_parameter():
    pol = scheduling_policies.create("elasticflow", {"marginal_order": "saving"})
    assert pol.params == ElasticFlowParams(marginal_order="saving")


def test_edf_serves_the_earliest_deadline_with_all_it_can_use():
    late = view(spec("late", 100, 5000), 0)
    soon = view(spec("soon", 100, 1000), 1)
    got = counts(Edf().schedule(sched_input([late, soon], gpus=8)))
    assert got == {"soon": 8}  # its largest level (8 GPUs) fits: 'late' waits
    got = counts(Edf().schedule(sched_input([late, soon], gpus=12)))
    assert got == {"soon": 8, "late": 4}


# --------------------------------------------------------------------------- admission


def admission_input(
    new: JobSpec, jobs: list[JobView], now: float = 0.0, gpus: int = 8,
    next_decision: float | None = None,
) -> AdmissionInput:  # fmt: skip
    cluster = ClusterView(capacity={"a100": gpus}, round_s=0.0, throughputs=MODEL)
    return AdmissionInput(now=now, job=new, cluster=cluster, jobs=jobs, next_decision=next_decision)


def test_admission_admits_what_fits_and_explains_what_does_not():
    pol = ElasticFlowAdmission()
    assert pol.decide(admission_input(spec("ok", 192, 60), [])).verdict == "admit"
    no = pol.decide(admission_input(spec("hopeless", 1000, 60), []))
    assert no.verdict == "reject"
    assert "cannot meet its deadline" in no.reason
    # Two jobs that each need all 4 GPUs until 60: the second would push the first past its deadline.
    first = view(spec("first", 192, 60), 0)
    pushed = pol.decide(admission_input(spec("second", 192, 59), [first], gpus=4))
    assert pushed.verdict == "reject"
    assert "first" in pushed.reason or "deadline" in pushed.reason


def test_admission_explains_refusals_from_the_submission_and_needs_the_work():
    pol = ElasticFlowAdmission(DeadlineAdmissionParams(slot_s=10.0))
    late = spec("late", 320, 1060.0, submit_time=1000.0)  # submitted at 1000, 60 s to go
    no = pol.decide(admission_input(late, [], now=1000.0))
    # 320 steps at 3.2 steps/s on its best level (4 GPUs): 100 s, more than the 60 s it has.
    assert no.reason == (
        "cannot meet its deadline: it would finish 100 s after submission at best, its deadline "
        "is 60 s after"
    )
    unknown = JobSpec(job_id="u", job_type="toy@64", num_gpus=1, deadline=600.0)
    no = pol.decide(admission_input(unknown, []))
    assert (no.verdict, no.reason) == (
        "reject",
        "a deadline needs the job's work: give total_steps (gpuyard submit --steps) or duration",
    )


def test_plans_follow_what_a_learning_model_has_learned():
    model = LearnedThroughputs(MODEL)  # a real cluster's scheduler learns from progress reports
    pol = ElasticFlowAdmission(DeadlineAdmissionParams(slot_s=10.0))
    tight = spec("tight", 320, 50.0)  # 100 s at best on the table (3.2 steps/s on 4 GPUs)

    def verdict() -> str:
        cluster = ClusterView(capacity={"a100": 8}, round_s=0.0, throughputs=model)
        return pol.decide(AdmissionInput(now=0.0, job=tight, cluster=cluster, jobs=[])).verdict

    assert verdict() == "reject"
    model.observe("toy@64", "a100", 1, 4.0)  # measured: 4 times the table's speed
    assert verdict() == "admit"  # 25 s on 4 GPUs now: the cached levels were computed again


def test_admission_always_admits_best_effort_jobs():
    pol = ElasticFlowAdmission()
    decision = pol.decide(admission_input(spec("b", 1e9, None, best_effort=True), []))
    assert (decision.verdict, decision.reason) == ("admit", "best effort")


def test_admission_plans_from_the_schedulers_next_decision():
    pol = admission_policies.create("elasticflow", {"slot_s": 60})
    # 192 steps by t=90 need 4 GPUs for 60 s: from t=30 that fits; from t=60, when the scheduler
    # (last decided at 0, events merged within its 60 s slots) first decides on it, not.
    assert pol.decide(admission_input(spec("x", 192, 90), [], now=30.0)).verdict == "admit"
    late = admission_input(spec("x", 192, 90), [], now=30.0, next_decision=60.0)
    assert pol.decide(late).verdict == "reject"
    later = admission_input(spec("x", 192, 120), [], now=30.0, next_decision=60.0)
    assert pol.decide(later).verdict == "admit"


def test_admission_at_events_waits_for_the_schedulers_decision():
    params = {"slot_s": 60, "decide_at": "event", "together": True}
    pol = admission_policies.create("elasticflow", params)
    assert pol.all_or_none and not ElasticFlowAdmission().all_or_none
    waits = pol.decide(admission_input(spec("x", 192, 120), [], now=30.0, next_decision=60.0))
    assert (waits.verdict, waits.retry_at) == ("hold", 60.0)  # until the scheduler decides
    at_event = admission_input(spec("x", 192, 120), [], now=60.0, next_decision=60.0)
    assert pol.decide(at_event).verdict == "admit"  # decided there on its own plan
    edf = admission_policies.create("edf", {"decide_at": "event"})
    assert not edf.all_or_none  # (ElasticFlow's EDF decides each arrival of an event alone)
    early = admission_input(spec("y", 100, 1000), [], now=5.0, next_decision=9.0)
    assert edf.decide(early).verdict == "hold"


def test_edf_admission_uses_edf_plans():
    pol = EdfAdmission()
    assert pol.decide(admission_input(spec("ok", 100, 1000), [])).verdict == "admit"
    assert pol.decide(admission_input(spec("no", 10_000, 100), [])).verdict == "reject"


# --------------------------------------------------------------------------- placement


def nodes(n: int, gpus: int = 8) -> list[NodeView]:
    return [NodeView(node_id=f"n{i}", gpu_type="a100", usable=list(range(gpus))) for i in range(n)]


def place(
    allocations: list[Allocation],
    current: dict[str, list[GpuRef]] | None = None,
    n: int = 2,
    sticky: bool = True,
) -> dict[str, list[GpuRef]]:
    pol = Buddy(BuddyParams(sticky=sticky))
    assert pol.rearranges
    return pol.place(
        PlacementInput(now=0.0, allocations=allocations, current=current or {}, nodes=nodes(n))
    )


def test_buddy_whole_nodes_for_big_jobs_and_aligned_blocks_for_small_ones():
    got = place(
        [Allocation("s1", 1), Allocation("big", 8), Allocation("s2", 2), Allocation("s4", 4)]
    )
    assert {g.node_id for g in got["big"]} == {"n0"} and len(got["big"]) == 8
    for job, size in (("s4", 4), ("s2", 2), ("s1", 1)):
        indices = sorted(g.index for g in got[job])
        assert len({g.node_id for g in got[job]}) == 1
        assert indices[0] % size == 0 and indices == list(range(indices[0], indices[0] + size))
    assert not set(got["s4"]) & set(got["s2"]) and not set(got["s2"]) & set(got["s1"])


def test_buddy_spans_whole_nodes_for_jobs_larger_than_one():
    got = place([Allocation("huge", 12), Allocation("one", 1)], n=3)
    assert len(got["huge"]) == 12 and len({g.node_id for g in got["huge"]}) == 2
    assert got["one"][0].node_id not in {g.node_id for g in got["huge"][:8]}


def test_buddy_keeps_a_job_on_its_block_and_grows_it_in_place():
    current = {"a": [GpuRef("n1", 4), GpuRef("n1", 5)]}
    assert place([Allocation("a", 2)], current) == {"a": current["a"]}
    grown = place([Allocation("a", 4)], current)["a"]
    assert grown == [GpuRef("n1", i) for i in range(4, 8)]
    assert place([Allocation("a", 2)], current, sticky=False)["a"][0].node_id == "n0"


def test_buddy_leaves_out_what_does_not_fit():
    got = place([Allocation("a", 8), Allocation("b", 8), Allocation("c", 1)], n=2)
    assert set(got) == {"a", "b"}


@pytest.mark.parametrize("gpus", [3, 5, 6])
def test_buddy_places_sizes_that_are_not_powers_of_two(gpus: int):
    got = place([Allocation("a", 8), Allocation("odd", gpus), Allocation("one", 1)])
    assert len(got["odd"]) == gpus and len(got["one"]) == 1
    assert not set(got["odd"]) & set(got["one"])


@pytest.mark.parametrize("seed", range(3))
def test_buddy_settled_is_its_own_fixed_point(seed: int):
    """Settled after placing power-of-two jobs: placed again from where they run, every job
    stays put, whatever moved before (jobs grew, shrank, came and went)."""
    rng = random.Random(seed)
    pol = Buddy(BuddyParams(sticky=rng.random() < 0.8))
    current: dict[str, list[GpuRef]] = {}
    for _ in range(60):
        sizes = [rng.choice([1, 1, 2, 4, 8, 16, 32]) for _ in range(rng.randint(1, 14))]
        allocations = [Allocation(f"j{rng.randint(0, 20)}", g, "a100") for g in sizes]
        allocations = list({a.job_id: a for a in allocations}.values())
        inp = PlacementInput(now=0.0, allocations=allocations, current=current, nodes=nodes(16))
        got = pol.place(inp)
        if not pol.settled:
            assert len(got) < len(allocations)  # only what did not fit unsettles it
            current = got
            continue
        again = PlacementInput(now=0.0, allocations=allocations, current=got, nodes=nodes(16))
        assert pol.place(again) == got and pol.settled
        current = got


def test_buddy_is_not_settled_on_free_gpus_of_the_fewest_nodes():
    pol = Buddy()
    got = pol.place(PlacementInput(now=0.0, allocations=[Allocation("a", 4)], current={},
                                   nodes=nodes(1)))  # fmt: skip
    assert pol.settled
    # Two jobs of 3 take the first three GPUs of each half: no aligned pair is left for the 2
    allocations = [Allocation("a", 3), Allocation("b", 3), Allocation("c", 2)]
    got = pol.place(PlacementInput(now=0.0, allocations=allocations, current={}, nodes=nodes(1)))
    assert got["c"] == [GpuRef("n0", 3), GpuRef("n0", 7)] and not pol.settled


# --------------------------------------------------------------------------- node sets


def node_sets(
    allocations: list[Allocation], order: str = "given", n: int = 4
) -> dict[str, list[tuple[str, int]]]:
    pol = placement_policies.create("node-sets", {"order": order})
    assert pol.rearranges and not pol.settled  # every apply places everything again
    current = {a.job_id: [GpuRef("n3", 0)] for a in allocations}  # (where they run: ignored)
    got = pol.place(PlacementInput(now=0.0, allocations=allocations, current=current,
                                   nodes=nodes(n)))  # fmt: skip
    return {job: [(g.node_id, g.index) for g in gpus] for job, gpus in got.items()}


def span(node: str, first: int, count: int) -> list[tuple[str, int]]:
    return [(node, i) for i in range(first, first + count)]


MIXED = [("a", 2), ("b", 8), ("c", 4), ("d", 2), ("e", 1), ("f", 4), ("g", 16)]


def test_node_sets_in_the_given_order_follow_elasticflows_classes():
    """Worked through ElasticFlow's `elastic_placement` by hand, on four nodes of 8 GPUs:
    'a' opens n0 (6 free: class 2); 'b' opens n1 (full); 'c' finds no set of class 4 and none of
    a larger class with room (n1 is full), so it opens n2 (class 4); 'd' joins n0, the least used
    set of class 2 (4 free: class 4, now [n2, n0]); 'e' has no set of class 1 and fills in the
    first set of the largest class with room, n2 (3 free: class 1); 'f' takes n0, the set left
    in class 4; 'g' needs two free nodes and finds one."""
    got = node_sets([Allocation(j, n) for j, n in MIXED])
    assert got == {
        "a": span("n0", 0, 2), "b": span("n1", 0, 8), "c": span("n2", 0, 4),
        "d": span("n0", 2, 2), "e": span("n2", 4, 1), "f": span("n0", 4, 4),
    }  # fmt: skip


def test_node_sets_largest_first_as_elasticflow_places_its_own_jobs():
    """Largest first (ties in the given order): 'g' takes n0 and n1, 'b' n2, the 4s share n3,
    and the smaller jobs find no room."""
    got = node_sets([Allocation(j, n) for j, n in MIXED], order="largest-first")
    assert got == {
        "g": span("n0", 0, 8) + span("n1", 0, 8), "b": span("n2", 0, 8),
        "c": span("n3", 0, 4), "f": span("n3", 4, 4),
    }  # fmt: skip


def test_edf_lists_new_jobs_after_the_last_decisions_order():
    """ElasticFlow sorts EDF's runnable jobs by deadline only at events that admit no job: a
    decision that takes in new jobs lists them after the others, in admission order, and so
    they are placed last (`node-sets`, order `given`)."""
    pol = Edf()
    late, soon = view(spec("late", 1000, 5000), 0), view(spec("soon", 1000, 3000), 1)
    first = [a.job_id for a in pol.schedule(sched_input([late, soon], gpus=12))]
    assert first == ["late", "soon"]  # both new: admission order
    urgent = view(spec("urgent", 1000, 1000), 2)
    second = [a.job_id for a in pol.schedule(sched_input([late, soon, urgent], gpus=14))]
    assert second == ["late", "soon", "urgent"]
    third = [a.job_id for a in pol.schedule(sched_input([late, soon, urgent], gpus=14))]
    assert third == ["urgent", "soon", "late"]  # no new job: deadline order
    restored = Edf()
    restored.restore(pol.snapshot())
    fourth = view(spec("fourth", 1000, 2000), 3)
    got = [a.job_id for a in restored.schedule(sched_input([late, soon, urgent, fourth], gpus=15))]
    assert got == ["urgent", "soon", "late", "fourth"]


def test_node_sets_keep_their_free_list_from_one_placement_to_the_next():
    """Two switches of two nodes (`switch_nodes=2`: n0, n1 | n2, n3). The first placement takes
    nodes in the cluster's order: 'a' (16 GPUs) n0 and n1, 'b' n2. The next releases every job,
    those that ended first, then by deadline: each set puts its nodes back at the end of the free
    list in the order it took them, and the list is sorted, stably, by index within a switch."""
    pol = placement_policies.create("node-sets", {"switch_nodes": 2})
    allocations = [Allocation("a", 16), Allocation("b", 8)]

    def place(deadlines: dict[str, float], ended: list[str] | None = None) -> dict[str, list[str]]:
        inp = PlacementInput(now=0.0, allocations=allocations, current={}, nodes=nodes(4),
                             deadlines=deadlines, ended=ended or [])  # fmt: skip
        return {
            j: list(dict.fromkeys(g.node_id for g in gpus)) for j, gpus in pol.place(inp).items()
        }

    assert place({"a": 100.0, "b": 50.0}) == {"a": ["n0", "n1"], "b": ["n2"]}
    # 'b' released first: [n3] + [n2] + [n0, n1] -> by index in switch: n2, n0, n3, n1
    assert place({"a": 100.0, "b": 50.0}) == {"a": ["n2", "n0"], "b": ["n3"]}
    # 'a' (n2, n0) released first: [n1] + [n2, n0] + [n3] -> n2, n0, n1, n3
    assert place({"a": 50.0, "b": 100.0}) == {"a": ["n2", "n0"], "b": ["n1"]}
    restored = placement_policies.create("node-sets", {"switch_nodes": 2})
    restored.restore(pol.snapshot())
    assert restored.snapshot() == pol.snapshot()


@pytest.mark.parametrize(("ended", "b_on"), [(["a"], "n2"), ([], "n0")])
def test_node_sets_release_the_jobs_that_ended_first(ended: list[str], b_on: str):
    """'a' and 'b' (8 GPUs each) on n0 and n1, then (b first by deadline) on n2 and n0. Next, 'b'
    alone: if 'a' ended it is released first ([n3, n1] + [n2] + [n0]: n2 leads), else by its
    deadline, after 'b' ([n3, n1] + [n0] + [n2]: n0 leads)."""
    pol = placement_policies.create("node-sets", {"switch_nodes": 2})
    deadlines = {"a": 100.0, "b": 50.0}

    def place(allocations: list[Allocation], gone: list[str]) -> dict[str, str]:
        inp = PlacementInput(now=0.0, allocations=allocations, current={}, nodes=nodes(4),
                             deadlines=deadlines, ended=gone)  # fmt: skip
        return {j: gpus[0].node_id for j, gpus in pol.place(inp).items()}

    both = [Allocation("a", 8), Allocation("b", 8)]
    assert place(both, []) == {"a": "n0", "b": "n1"}
    assert place(both, []) == {"a": "n2", "b": "n0"}
    assert place([Allocation("b", 8)], ended) == {"b": b_on}


@pytest.mark.parametrize(
    ("listed", "order"), [("started", ["a", "b"]), ("largest-first", ["b", "a"])]
)
def test_ef_lists_its_jobs_in_the_order_they_started(listed: str, order: list[str]) -> None:
    """ElasticFlow's `ef` places the jobs of whole nodes in the order they started (then the
    smaller ones, largest first): 'a' (2 GPUs, a whole node of 2) started before 'b' (4) and is
    placed first; `ef-accessctrl` places the largest first."""
    model = ElasticFlowThroughputs(
        {"a100": {"two": {64: {1: 1.0, 2: 1.8, 4: 1.5}}, "toy": {64: {1: 1.0, 2: 1.8, 4: 3.2}}}}
    )
    nodes = [NodeStatus(node_id=f"n{i}", gpu_type="a100", num_gpus=2) for i in range(4)]
    cluster = ClusterView(capacity={"a100": 8}, round_s=60.0, throughputs=model, nodes=nodes)
    a = spec("a", 100_000, 1e6, job_type="two@64")
    b = spec("b", 100_000, 1e6)
    pol = ElasticFlow(ElasticFlow.Params(listed=listed))  # type: ignore[arg-type]
    first = pol.schedule(SchedulingInput(now=0.0, jobs=[view(a, 0)], cluster=cluster))
    assert counts(first) == {"a": 2}
    running = view(a, 0, gpus=2)
    running.record.gpu_type, running.record.rate = "a100", model.throughput("two@64", "a100", 2)
    running.record.first_start = 0.0
    jobs = [running, view(b, 1)]
    for j in jobs:
        j.record.run_start = j.record.progress_at = 60.0
    second = pol.schedule(SchedulingInput(now=60.0, jobs=jobs, cluster=cluster))
    assert counts(second) == {"a": 2, "b": 4}
    assert [x.job_id for x in second] == order
