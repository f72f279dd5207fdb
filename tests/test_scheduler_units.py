"""The scheduler's pieces without NATS: the job table's transitions and counters, the views
policies get of it, the time-share round mechanism, its cadence and the guard on policies'
answers."""

from __future__ import annotations

import msgspec
import pytest

from gpuyard.services.scheduler.cadence import Cadence
from gpuyard.services.scheduler.guard import PolicyAnswerError, check, hold_leases, made_whole
from gpuyard.services.scheduler.jobs import CountsLog, JobTable
from gpuyard.services.scheduler.mechanism import TimeShareConfig, TimeShareMechanism
from gpuyard.shared.contract import CountsChange, StepsReport
from gpuyard.shared.model import Allocation, JobRecord, JobSpec
from gpuyard.shared.policy import ClusterView, Decision, JobList, JobView, SchedulingInput
from gpuyard.shared.throughput import LinearModel

# --------------------------------------------------------------------------- the job table


def spec(job_id: str, gpus: int = 1, **kw) -> JobSpec:  # type: ignore[no-untyped-def]
    return JobSpec(job_id=job_id, num_gpus=gpus, **kw)


def test_counters_follow_every_transition() -> None:
    table = JobTable()
    a = table.admit(spec("a", 2), 0.0, total_steps=200.0)
    b = table.admit(spec("b", 1), 0.0, total_steps=100.0)
    assert (table.queued, table.running, table.busy_gpus, table.finished) == (2, 0, 0, 0)
    table.start(a, 10.0, ["n1"], 2, "v100", rate=2.0)
    table.start(b, 10.0, ["n1"], 1, "v100", rate=1.0)
    assert (table.queued, table.running, table.busy_gpus) == (0, 2, 3)
    assert table.requeue(b, 30.0, "preempted", StepsReport(15.0, 30.0))
    assert (b.steps_done, b.executed_time, b.gpu_seconds, b.preemptions) == (15.0, 20.0, 20.0, 1)
    assert (table.queued, table.running, table.busy_gpus) == (1, 1, 2)
    assert table.start(a, 40.0, ["n1"], 1, "v100", rate=1.0)  # resized
    assert (a.executed_time, a.gpu_seconds, a.steps_done) == (30.0, 60.0, 60.0)
    assert (table.running, table.busy_gpus, a.attempt) == (1, 1, 2)
    assert table.end(a, 50.0, "completed", steps=200.0)
    assert not table.end(a, 51.0, "failed")  # ended already: nothing changes
    assert table.end(b, 60.0, "cancelled", "cancelled by request")
    assert (table.queued, table.running, table.busy_gpus, table.finished) == (0, 0, 0, 2)
    assert (
        list(table.active) == [] and a.state == "completed" and b.reason == "cancelled by request"
    )
    # A restarted scheduler rebuilds the same counters from the records alone.
    again = JobTable()
    again.load(
        msgspec.json.decode(msgspec.json.encode(list(table.jobs.values())), type=list[JobRecord])
    )
    assert (again.queued, again.running, again.busy_gpus, again.finished) == (0, 0, 0, 2)


def test_held_and_requeued_jobs_leave_the_decisions_and_come_back_in_admission_order() -> None:
    table = JobTable()
    a, b, _ = (table.admit(spec(j), 0.0, total_steps=100.0) for j in "abc")
    table.start(a, 1.0, ["n1"], 1, "v100", rate=1.0)
    table.hold(b, "user")
    table.moved.clear()
    assert list(table.active) == ["a", "c"] and list(table.views) == ["a", "c"]
    assert (b.reason, table.queued, list(table.held)) == ("JobHeldUser", 1, ["b"])
    table.hold(b, "admin")  # (an operator's hold over the owner's)
    assert (b.hold, b.reason, list(table.held)) == ("admin", "JobHeldAdmin", ["b"])
    # A running job requeued on its agents: running (its GPUs free) until they say it stopped.
    table.requeue_running(a, 5.0, "requeued by op.admin", ["n1"], "user")
    assert (table.running, table.busy_gpus, list(table.active)) == (0, 0, ["c"])
    assert a.state == "running" and a.reason == "requeueing (requeued by op.admin)"
    # Stored and loaded back (a restarted scheduler): the same sets.
    again = JobTable()
    again.load(
        msgspec.json.decode(msgspec.json.encode(list(table.jobs.values())), type=list[JobRecord])
    )
    assert (list(again.active), list(again.held), list(again.stopping)) == (["c"], ["b"], ["a"])
    assert table.part_stopped(a, "n1", 6.0)
    assert (a.state, a.preemptions, a.reason, list(table.held)) == (
        "queued",
        1,
        "JobHeldUser",
        ["b", "a"],
    )
    table.release(a)
    table.release(b)
    assert list(table.active) == ["a", "b", "c"] and list(table.views) == ["a", "b", "c"]
    assert (a.reason, b.reason, b.hold, table.queued) == ("", "", "", 3)
    assert list(table.moved) == ["a", "b"]


def test_dependencies_release_or_cancel_jobs_as_the_jobs_they_name_start_and_end() -> None:
    table = JobTable()
    a = table.admit(spec("a"), 0.0, total_steps=100.0)
    b = table.admit(spec("b", depends_on="afterok:a"), 0.0, total_steps=100.0)
    c = table.admit(spec("c", depends_on="afterok:b"), 0.0, total_steps=100.0)
    d = table.admit(spec("d", depends_on="afterany:c,after:a"), 0.0, total_steps=100.0)
    e = table.admit(spec("e", depends_on="afternotok:b"), 0.0, total_steps=100.0)
    assert list(table.active) == ["a"] and table.queued == 1
    assert [r.reason for r in (b, c, d, e)] == ["Dependency"] * 4
    table.start(a, 1.0, ["n1"], 1, "v100", rate=1.0)  # (d's `after:a` holds; `afterany:c` not)
    assert list(table.active) == ["a"] and not table.resolved
    table.end(a, 2.0, "completed")
    assert list(table.active) == ["b"] and b.reason == "" and table.resolved == [(b, 2.0)]
    table.resolved.clear()
    table.start(b, 3.0, ["n1"], 1, "v100", rate=1.0)
    table.end(b, 4.0, "failed")  # c can never start: cancelled, and d then may (afterany)
    assert (c.state, c.reason, c.end_time) == ("cancelled", "DependencyNeverSatisfied", 4.0)
    assert [r.job_id for r, _ in table.resolved] == ["c", "d", "e"]
    assert list(table.active) == ["d", "e"] and table.finished == 3
    # A later job may name one that ended and left memory (its results handed over).
    table.forget_ended(3, remember=True)
    f = table.admit(spec("f", depends_on="afterok:a"), 5.0, total_steps=1.0)
    g = table.admit(spec("g", depends_on="afterok:c"), 5.0, total_steps=1.0)
    assert f.state == "queued" and (g.state, g.reason) == ("cancelled", "DependencyNeverSatisfied")
    table.forget_ended(5)  # (not remembered: a workload without dependencies keeps nothing)
    assert set(table.deps.outcomes) == {"a", "b", "c"}


def test_a_singleton_waits_for_the_earlier_jobs_of_its_user_and_name_and_a_hold_outlasts_it() -> (
    None
):
    table = JobTable()
    first = table.admit(spec("s1", user="u", name="train"), 0.0, total_steps=1.0)
    table.admit(spec("x", user="v", name="train"), 0.0, total_steps=1.0)  # (another user's)
    second = table.admit(spec("s2", user="u", name="train", depends_on="singleton"), 0.0, 1.0)
    assert list(table.active) == ["s1", "x"] and second.reason == "Dependency"
    table.hold(second, "user")
    assert second.reason == "JobHeldUser" and "s2" not in table.held
    # Stored and loaded back: the same jobs wait.
    again = JobTable()
    again.load(
        msgspec.json.decode(msgspec.json.encode(list(table.jobs.values())), type=list[JobRecord])
    )
    assert list(again.active) == ["s1", "x"] and list(again.deps.blocked) == ["s2"]
    table.end(first, 1.0, "cancelled")
    assert list(table.held) == ["s2"] and second.reason == "JobHeldUser"  # (held, then)
    table.release(second)
    assert list(table.active) == ["x", "s2"]


def test_an_array_has_at_most_its_limit_of_tasks_active_and_the_next_come_in_as_they_leave() -> (
    None
):
    from gpuyard.shared.model import ArrayTask

    def task(i: int, user: str = "u") -> JobSpec:
        array = ArrayTask(task=i, count=5, low=0, high=4, limit=2, array_id="j7")
        return spec(f"j7_{i}" if user == "u" else f"x{i}", user=user, array=array)

    table = JobTable()
    tasks = [table.admit(task(i), 0.0, total_steps=1.0) for i in range(5)]
    other = table.admit(task(0, user="v"), 0.0, total_steps=1.0)  # (another user's "j7")
    assert list(table.active) == ["j7_0", "j7_1", "x0"]
    assert [t.reason for t in tasks[2:]] == ["JobArrayTaskLimit"] * 3 and other.reason == ""
    table.start(tasks[0], 1.0, ["n1"], 1, "v100", rate=1.0)
    table.end(tasks[0], 2.0, "completed")
    assert list(table.active) == ["j7_1", "j7_2", "x0"] and tasks[2].reason == ""
    table.end(tasks[3], 2.0, "cancelled", "cancelled by op.admin")  # (a waiting one: skipped)
    table.hold(tasks[1], "user")  # (room for the next: j7_4)
    assert list(table.active) == ["j7_2", "j7_4", "x0"]
    # Stored and loaded back: the same tasks in, the held one held.
    again = JobTable()
    again.load(
        msgspec.json.decode(msgspec.json.encode(list(table.jobs.values())), type=list[JobRecord])
    )
    assert list(again.active) == ["j7_2", "j7_4", "x0"] and list(again.held) == ["j7_1"]
    table.release(tasks[1])  # (no room: it waits for it)
    assert tasks[1].reason == "JobArrayTaskLimit" and "j7_1" not in table.active
    table.end(tasks[2], 3.0, "completed")
    assert list(table.active) == ["j7_1", "j7_4", "x0"]


def test_a_request_telling_of_earlier_instants_logs_its_changes_at_each() -> None:
    """Exits and arrivals told of together (a quiet window): what each changed, by time, in
    time order whatever order they were handled in; nothing at the request's own time (its
    reply's counts show that), nothing where nothing changed."""
    table = JobTable()
    a = table.admit(spec("a", 2), 0.0, total_steps=100.0)
    table.start(a, 0.0, ["n1"], 2, "v100", rate=1.0)
    log = CountsLog(table, now=50.0)
    with log.at(40.0):
        table.admit(spec("b"), 40.0, total_steps=10.0)
    with log.at(30.0):
        table.end(a, 30.0, "completed", steps=100.0)
    with log.at(30.0):
        table.end(a, 30.0, "completed")  # (ended already: no change)
    with log.at(50.0):
        table.admit(spec("c"), 50.0, total_steps=10.0)
    assert log.changes() == [CountsChange(30.0, -2, 0, -1), CountsChange(40.0, 0, 1, 0)]
    log.now = 60.0  # (the request went on to a later instant: the one at 50 is told of too)
    assert log.changes()[-1] == CountsChange(50.0, 0, 1, 0)


def test_a_policy_reads_the_active_jobs_as_a_list_made_when_first_read() -> None:
    """`JobList`: its length is the table's without a list made; read, it is the list of the
    active jobs at that moment, in admission order, and stays so."""
    table = JobTable()
    for job_id in "abc":
        table.admit(spec(job_id), 0.0, total_steps=10.0)
    jobs = JobList(table.views)
    assert len(jobs) == 3 and jobs._items is None
    table.end(table.jobs["b"], 5.0, "completed")
    assert len(jobs) == 2 and jobs._items is None
    assert [v.job_id for v in jobs] == ["a", "c"] and jobs[-1].job_id == "c"
    assert [v.job_id for v in jobs[:1]] == ["a"]
    table.admit(spec("d"), 6.0, total_steps=10.0)
    assert len(jobs) == 2 and [v.job_id for v in sorted(jobs, key=lambda v: v.seq)] == ["a", "c"]


def test_busy_gpus_count_a_shared_gpu_once_through_moves_and_stops() -> None:
    """Space sharing: the partner that joins a job's GPUs adds none; moving it (a restart at
    once) or stopping it takes none away either (it used to go negative under Gandiva)."""
    table = JobTable()
    a = table.admit(spec("a"), 0.0, total_steps=100.0)
    b = table.admit(spec("b"), 0.0, total_steps=100.0)
    table.start(a, 0.0, ["n1"], 1, "v100", rate=1.0)
    table.start(b, 0.0, ["n1"], 1, "v100", rate=1.0, shares_with="a")
    assert table.busy_gpus == 1
    table.start(b, 10.0, ["n2"], 1, "v100", rate=1.0)  # moved, now alone
    assert table.busy_gpus == 2
    table.start(b, 20.0, ["n1"], 1, "v100", rate=1.0, shares_with="a")  # back with a
    assert table.busy_gpus == 1
    table.requeue(b, 30.0, "preempted")
    table.end(a, 40.0, "completed")
    assert (table.running, table.busy_gpus) == (0, 0)


def test_the_table_tells_which_jobs_moved_and_what_each_gpu_type_holds() -> None:
    """What a decision of what changes is told (`moved`) and checked against (`busy_by_type`):
    arrivals, starts, moves, stops and ends, each job once; progress is no move."""
    table = JobTable()
    a = table.admit(spec("a", 2), 0.0, total_steps=100.0)
    b = table.admit(spec("b"), 0.0, total_steps=100.0)
    c = table.admit(spec("c"), 0.0, total_steps=100.0)
    table.start(a, 0.0, ["n1"], 2, "v100", rate=1.0)
    table.start(b, 0.0, ["n2"], 1, "k80", rate=1.0)
    table.start(c, 0.0, ["n1"], 1, "v100", rate=1.0, shares_with="a")  # (holds no GPU of its own)
    assert list(table.moved) == ["a", "b", "c"]
    assert table.busy_by_type == {"v100": 2000, "k80": 1000}  # (thousandths of GPUs)
    table.moved.clear()
    table.report(a, StepsReport(10.0, 10.0))
    assert not table.moved
    table.requeue(b, 20.0, "preempted")
    table.start(a, 20.0, ["n2"], 1, "k80", rate=1.0)  # moved to another type
    assert list(table.moved) == ["b", "a"]
    assert table.busy_by_type == {"v100": 0, "k80": 1000}
    table.moved.clear()
    table.end(b, 30.0, "cancelled")  # (queued)
    table.cancel_running(a, 30.0, "cancelled", ["n2"])
    assert list(table.moved) == ["b", "a"]
    assert table.busy_by_type == {"v100": 0, "k80": 0}
    again = JobTable()
    d = again.admit(spec("d", 4), 0.0, total_steps=1.0)
    again.start(d, 0.0, ["n"], 4, "a100", rate=1.0)
    restored = JobTable()
    restored.load(msgspec.json.decode(msgspec.json.encode([d]), type=list[JobRecord]))
    assert restored.busy_by_type == {"a100": 4000} and not restored.moved
    # A share of a GPU counts as its thousandths; busy GPUs round up.
    e = restored.admit(spec("e", 1, gpu_milli=300), 0.0, total_steps=1.0)
    restored.start(e, 0.0, ["n"], 1, "a100", rate=1.0)
    assert restored.busy_by_type == {"a100": 4300} and restored.busy_gpus == 5


def test_progress_reports_are_taken_only_when_newer() -> None:
    table = JobTable()
    a = table.admit(spec("a"), 0.0, total_steps=100.0)
    table.start(a, 0.0, ["n"], 1, "gpu", rate=1.0)
    table.report(a, StepsReport(40.0, 30.0))
    table.report(a, StepsReport(10.0, 20.0))  # older than what is known: ignored
    assert (a.steps_done, a.progress_at) == (40.0, 30.0)


def test_a_runs_rate_comes_from_its_agent_or_from_two_reports() -> None:
    """The rate a node agent measured from the job's own reports counts from the run's first
    report on (a run of one round is measured); without it the scheduler needs two reports of
    the run."""
    table = JobTable()
    a = table.admit(spec("a"), 0.0, total_steps=1000.0)
    table.start(a, 0.0, ["n"], 1, "v100", rate=1.0)
    assert table.report(a, StepsReport(40.0, 10.0, 5.0)) == 5.0 and a.rate == 5.0
    b = table.admit(spec("b"), 0.0, total_steps=1000.0)
    table.start(b, 0.0, ["n"], 1, "v100", rate=1.0)
    assert table.report(b, StepsReport(40.0, 10.0)) is None and b.rate == 1.0
    assert table.report(b, StepsReport(70.0, 20.0)) == 3.0 and b.rate == 3.0


def test_reasons_are_current_and_unknown_work_counts_reported_steps() -> None:
    """A job's reason is why it is in its state now (none while it runs, none once it completed
    after a preemption); a job of unknown work (a real one that runs until it exits) counts the
    steps it reported, not the throughput model's guess."""
    table = JobTable()
    a = table.admit(spec("a"), 0.0, total_steps=None)
    table.start(a, 0.0, ["n"], 1, "gpu", rate=5.0)
    table.report(a, StepsReport(40.0, 10.0))
    assert table.requeue(a, 30.0, "preempted by las for b")
    assert (a.reason, a.steps_done) == ("preempted by las for b", 40.0)
    table.start(a, 40.0, ["n"], 1, "gpu", rate=5.0)
    assert a.reason == ""
    assert table.end(a, 90.0, "completed")
    assert (a.state, a.reason, a.steps_done) == ("completed", "", 40.0)


# --------------------------------------------------------------------------- views


def test_views_derive_service_progress_and_remaining_time_at_now() -> None:
    record = JobRecord(
        job_id="a", seq=0, spec=spec("a", 2, duration=100.0), submit_time=0.0, admit_time=0.0,
        state="running", run_start=50.0, progress_at=50.0, gpus=2, gpu_type="k80", rate=1.0,
        executed_time=20.0, gpu_seconds=40.0, steps_done=40.0, total_steps=200.0,
    )  # fmt: skip
    cluster = ClusterView(capacity={"k80": 2}, round_s=30.0, throughputs=LinearModel({"k80": 0.5}))
    view = JobView.of(record, cluster.context(now=80.0))
    assert (view.executed_time, view.attained_service, view.rounds_run) == (50.0, 100.0, 1)
    assert (view.steps_done, view.remaining_steps, view.remaining_time) == (70.0, 130.0, 130.0)
    # Queued, it is judged at its requested GPUs on the model's reference type (here: 2 steps/s).
    record.state, record.gpus, record.rate = "queued", 0, 0.0
    assert view.remaining_time == 80.0 and view.rate("k80", 2) == 1.0
    # The record itself never changes by being looked at.
    assert (record.executed_time, record.steps_done) == (20.0, 40.0)


# --------------------------------------------------------------------------- time shares


class SharingModel(LinearModel):
    """Linear, and any two jobs share a GPU at 60% of their speed, except on a k80."""

    def colocated(
        self, job_type: str, other: str, gpu_type: str, num_gpus: int
    ) -> tuple[float, float]:
        return (0.0, 0.0) if gpu_type == "k80" else (0.6, 0.6)


def time_share_input(now: float, running: dict[str, str]) -> SchedulingInput:
    """Three 1-GPU jobs on one v100 and one k80; `running`: job -> type it ran on since 0."""
    jobs = []
    for i, job_id in enumerate(("a", "b", "c")):
        record = JobRecord(job_id=job_id, seq=i, spec=spec(job_id), submit_time=0.0, admit_time=0.0)
        if job_id in running:
            record.state, record.gpus, record.gpu_type = "running", 1, running[job_id]
        jobs.append(JobView(record))
    cluster = ClusterView(capacity={"v100": 1, "k80": 1}, round_s=100.0, throughputs=SharingModel())
    return SchedulingInput(now=now, jobs=jobs, cluster=cluster)


def test_time_shares_track_the_allocation_round_after_round() -> None:
    """X gives each job a third of the v100 and a third of the k80: over many rounds each job
    receives about that, and jobs never run on two types at once."""
    mech = TimeShareMechanism(TimeShareConfig(), round_s=100.0)
    third = {"v100": 1 / 3, "k80": 1 / 3}
    decision = Decision(shares={j: dict(third) for j in "abc"})
    running: dict[str, str] = {}
    received = {j: {"v100": 0, "k80": 0} for j in "abc"}
    for r in range(30):
        inp = time_share_input(r * 100.0, running)
        for j in running:
            inp.jobs["abc".index(j)].record.run_start = (r - 1) * 100.0
        wants = mech.wants_decision(inp.now, changed=r == 0)
        allocations = mech.allocations(decision if wants else None, inp)
        assert len({a.job_id for a in allocations}) == len(allocations) <= 2
        running = {a.job_id: a.gpu_type for a in allocations}
        for j, t in running.items():
            received[j][t] += 1
    for j in "abc":
        assert 8 <= received[j]["v100"] <= 12 and 8 <= received[j]["k80"] <= 12, received
    assert mech.next_round(3000.0, 100.0, active=True) == 3000.0
    assert mech.next_round(3000.0, 100.0, active=False) is None


def test_time_shares_respect_a_skewed_allocation_and_the_resolve_interval() -> None:
    mech = TimeShareMechanism(TimeShareConfig(min_resolve_s=1000.0), round_s=100.0)
    decision = Decision(shares={"a": {"v100": 1.0}, "b": {"k80": 1.0}, "c": {}})
    inp = time_share_input(100.0, {})
    assert mech.wants_decision(100.0, changed=False)  # the first round always asks the policy
    out = mech.allocations(decision, inp)
    assert {(a.job_id, a.gpu_type) for a in out} == {("a", "v100"), ("b", "k80")}
    assert not mech.wants_decision(600.0, changed=True)  # too soon after the last solve
    assert mech.wants_decision(1100.0, changed=True) and not mech.wants_decision(
        1100.0, changed=False
    )
    # Gavel's quirk: a solve at time 0 counts as none, so the next change solves again at once.
    at_zero = TimeShareMechanism(TimeShareConfig(min_resolve_s=1000.0), round_s=100.0)
    at_zero.allocations(decision, time_share_input(0.0, {}))
    assert at_zero.wants_decision(50.0, changed=True)
    # The state survives a restart of the scheduler byte for byte.
    restored = TimeShareMechanism(TimeShareConfig(min_resolve_s=1000.0), round_s=100.0)
    restored.restore(msgspec.json.encode(mech.snapshot()))
    nxt = time_share_input(200.0, {"a": "v100", "b": "k80"})
    assert mech.allocations(None, nxt) == restored.allocations(
        None, time_share_input(200.0, {"a": "v100", "b": "k80"})
    )


def test_time_shares_pairs_share_gpus_and_count_once() -> None:
    mech = TimeShareMechanism(TimeShareConfig(), round_s=100.0)
    decision = Decision(pair_shares={("a", "b"): {"v100": 1.0}}, shares={"c": {"k80": 1.0}})
    out = mech.allocations(decision, time_share_input(0.0, {}))
    by_id = {a.job_id: a for a in out}
    assert by_id["b"].share_with == "a" and by_id["a"].gpu_type == by_id["b"].gpu_type == "v100"
    assert by_id["c"].gpu_type == "k80"


def test_time_shares_never_start_a_pair_where_it_cannot_share() -> None:
    """Gavel's mechanism skips a pair whose throughput on a type is 0 (it used to be started
    there, and the simulated jobs crashed): on a lone k80 the pair waits and one job runs alone."""
    mech = TimeShareMechanism(TimeShareConfig(), round_s=100.0)
    jobs = [
        JobView(JobRecord(job_id=j, seq=i, spec=spec(j), submit_time=0.0, admit_time=0.0))
        for i, j in enumerate("ab")
    ]
    cluster = ClusterView(capacity={"k80": 1}, round_s=100.0, throughputs=SharingModel())
    decision = Decision(pair_shares={("a", "b"): {"k80": 1.0}})
    out = mech.allocations(decision, SchedulingInput(now=0.0, jobs=jobs, cluster=cluster))
    assert len(out) == 1 and out[0].share_with is None


@pytest.mark.parametrize("global_queue", [False, True])
def test_time_shares_never_exceed_capacity(global_queue: bool) -> None:
    mech = TimeShareMechanism(TimeShareConfig(global_queue=global_queue), round_s=100.0)
    decision = Decision(shares={j: {"v100": 0.5, "k80": 0.5} for j in "abc"})
    out = mech.allocations(decision, time_share_input(0.0, {}))
    per_type: dict[str, int] = {}
    for a in out:
        per_type[a.gpu_type] = per_type.get(a.gpu_type, 0) + a.num_gpus
    assert all(n <= 1 for n in per_type.values()) and len(out) == 2


@pytest.mark.parametrize("whole_steps", [True, False])
def test_a_round_credits_the_time_of_its_whole_steps(whole_steps: bool) -> None:
    """Gavel's simulator runs `int(rate x round)` steps a round and credits each job the time
    its own took: at 0.337 steps/s, 33 steps of a 100 s round, 97.92 s. Those fractions of a
    second order the jobs of equal allocations. Otherwise the round's whole 100 s."""
    mech = TimeShareMechanism(TimeShareConfig(credit_whole_steps=whole_steps), round_s=100.0)
    decision = Decision(shares={"a": {"v100": 1.0}, "b": {"k80": 1.0}})
    mech.allocations(decision, time_share_input(0.0, {}))
    before = dict(mech.state.received["a"])
    later = time_share_input(100.0, {"a": "v100", "b": "k80"})
    for view, rate in zip(later.jobs[:2], (0.337, 0.5), strict=True):
        view.record.run_start, view.record.rate = 0.0, rate
    mech.allocations(None, later)
    got = mech.state.received["a"]["v100"] - before["v100"]
    assert got == pytest.approx(33 / 0.337 if whole_steps else 100.0)
    assert mech.state.received["b"]["k80"] - before["k80"] == pytest.approx(100.0)  # 50 steps


@pytest.mark.parametrize("new_jobs_wait", [True, False])
def test_a_job_newer_than_the_allocation_waits_for_one(new_jobs_wait: bool) -> None:
    """Gavel: a job that arrived since the last allocation runs only once one includes it; its
    place in the round's walk is counted and its GPU stays idle (the k80 here). Without
    `new_jobs_wait` it takes the GPU the allocated jobs leave free."""
    mech = TimeShareMechanism(TimeShareConfig(new_jobs_wait=new_jobs_wait), round_s=100.0)
    first = time_share_input(0.0, {})
    first.jobs = first.jobs[:1]  # only a was there when the policy decided
    mech.allocations(Decision(shares={"a": {"v100": 1.0}}), first)
    later = time_share_input(100.0, {"a": "v100"})
    out = {(a.job_id, a.gpu_type) for a in mech.allocations(None, later)}
    assert ("a", "v100") in out
    assert (out == {("a", "v100")}) == new_jobs_wait
    # Once an allocation includes them, they run.
    out = mech.allocations(Decision(shares={"a": {"v100": 1.0}, "b": {"k80": 1.0}}),
                           time_share_input(200.0, {"a": "v100"}))  # fmt: skip
    assert {(a.job_id, a.gpu_type) for a in out} == {("a", "v100"), ("b", "k80")}


# --------------------------------------------------------------------------- cadence


def test_each_mode_decides_what_is_due_at_its_own_time() -> None:
    rounds = Cadence("rounds", 100.0, external=True)
    assert rounds.decides(130.0, None) == 200.0 and rounds.decides(100.0, None) == 100.0
    assert rounds.decides(50.0, last_round=100.0) == 200.0  # (never twice at one boundary)
    slots = Cadence("slots", 100.0, external=True)
    assert slots.decides(130.0, last_round=100.0) == 200.0  # waits for the slot's end
    assert slots.decides(230.0, last_round=100.0) == 230.0 and slots.decides(130.0, None) == 130.0
    events = Cadence("events", 100.0, external=True)
    assert events.decides(130.0, last_round=100.0) == 130.0
    # next_wake: what changed now, or the policy's own wake-up (never in the past)
    assert events.next_wake(10.0, dirty=False, policy_wake=None, last_round=None) is None
    assert events.next_wake(10.0, dirty=False, policy_wake=5.0, last_round=None) == 10.0
    assert rounds.next_wake(130.0, dirty=True, policy_wake=500.0, last_round=100.0) == 200.0
    assert rounds.next_wake(130.0, dirty=False, policy_wake=500.0, last_round=100.0) == 500.0
    clock = Cadence("clock", 100.0, external=True)
    assert clock.next_wake(10.0, dirty=True, policy_wake=None, last_round=None) is None


def test_rounds_from_the_first_decision_keep_its_grid() -> None:
    """ElasticFlow's Themis: the first decision comes at once and the rounds follow it a round
    apart (`round_origin="first_decision"`), idle time included."""
    first = Cadence("rounds", 100.0, external=True, origin=None)
    assert first.decides(30.0, None) == 30.0 and first.quiet_until(30.0, None) is None
    assert first.decides(150.0, last_round=30.0) == 230.0  # (the scheduler fixes origin then)
    grid = Cadence("rounds", 100.0, external=True, origin=30.0)
    assert grid.decides(950.0, last_round=130.0) == 1030.0
    assert grid.quiet_until(140.0, last_round=130.0) == 230.0


def test_a_tick_runs_a_round_when_one_is_due_or_the_clock_owns_the_rounds() -> None:
    events = Cadence("events", 100.0, external=True)
    assert not events.round_due(10.0, wake=None, last_round=None)
    assert not events.round_due(10.0, wake=20.0, last_round=None)
    assert events.round_due(10.0, wake=10.0, last_round=None)
    assert Cadence("clock", 100.0, external=True).round_due(10.0, wake=None, last_round=None)
    assert Cadence("events", 100.0, external=False).round_due(10.0, wake=None, last_round=None)
    wall_slots = Cadence("slots", 100.0, external=False)
    assert not wall_slots.round_due(150.0, wake=None, last_round=100.0)  # (within the slot)
    assert wall_slots.round_due(200.0, wake=None, last_round=100.0)


def test_what_happens_before_the_next_decision_is_told_of_together() -> None:
    rounds = Cadence("rounds", 100.0, external=True)
    assert rounds.quiet_until(130.0, last_round=100.0) == 200.0
    assert rounds.quiet_until(200.0, last_round=200.0) == 300.0
    slots = Cadence("slots", 100.0, external=True)
    assert slots.quiet_until(150.0, last_round=100.0) == 200.0
    assert slots.quiet_until(250.0, last_round=100.0) is None
    assert Cadence("events", 100.0, external=True).quiet_until(150.0, 100.0) is None
    assert Cadence("rounds", 100.0, external=False).quiet_until(150.0, 100.0) is None


# --------------------------------------------------------------------------- the guard


def queued(job_id: str, gpus: int, **kw) -> JobRecord:  # type: ignore[no-untyped-def]
    return JobTable().admit(spec(job_id, gpus, **kw), 0.0, total_steps=100.0)


def running(job_id: str, gpus: int, gpu_type: str, since: float) -> JobRecord:
    table = JobTable()
    record = table.admit(spec(job_id, gpus), 0.0, total_steps=100.0)
    table.start(record, since, ["n1"], gpus, gpu_type, rate=1.0)
    return record


def test_a_policys_answer_is_checked_before_it_runs() -> None:
    a = running("a", 2, "v100", 0.0)
    b, c = queued("b", 2, min_gpus=1, max_gpus=4), queued("c", 1)
    active = {"a": a, "b": b, "c": c}
    capacity = {"v100": 4, "k80": 2}
    no_k80 = lambda r, al: al.gpu_type != "k80"  # noqa: E731
    kept, left_out = check(
        "p", [Allocation("a", 2, "v100"), Allocation("b", 2, "v100"), Allocation("c", 1, "k80")],
        active, capacity, no_k80,
    )  # fmt: skip
    assert [x.job_id for x in kept] == ["a", "b"] and [x.job_id for x in left_out] == ["c"]
    for bad, why in [
        ([Allocation("b", 1, "v100"), Allocation("b", 1, "v100")], "twice"),
        ([Allocation("z", 1, "v100")], "wrongly"),
        ([Allocation("b", 5, "v100")], r"outside \[1, 4\]"),
        ([Allocation("b", 3, "v100"), Allocation("a", 2, "v100")], "more GPUs than exist"),
        ([Allocation("c", 1, "v100", share_with="b")], "not allocated before it"),
    ]:
        with pytest.raises(PolicyAnswerError, match=why):
            check("p", bad, active, capacity, no_k80)
    # What the jobs it does not name hold counts too (a decision of what changes).
    with pytest.raises(PolicyAnswerError, match="more GPUs"):
        check("p", [Allocation("b", 2, "v100")], active, capacity, no_k80, used={"v100": 3000})


def test_the_preemption_guard_holds_a_young_run_and_fits_the_rest_around_it() -> None:
    young, old = running("young", 2, "v100", 90.0), running("old", 2, "v100", 0.0)
    wanted = [Allocation("new", 4, "v100"), Allocation("small", 2, "v100")]
    out, ends = hold_leases(100.0, wanted, {"v100": 4}, [young, old], lease_s=60.0)
    assert [a.job_id for a in out] == ["young", "small"] and ends == 150.0
    kept = [Allocation("young", 2, "v100"), Allocation("small", 2, "v100")]
    assert hold_leases(100.0, kept, {"v100": 4}, [young], 60.0) == (kept, None)
    assert hold_leases(100.0, wanted, {"v100": 4}, [young], 0.0) == (wanted, None)


def test_a_decision_of_what_changes_is_made_whole_from_the_last_apply() -> None:
    a, b, c = (
        running("a", 1, "v100", 0.0),
        running("b", 2, "v100", 0.0),
        running("c", 1, "k80", 0.0),
    )
    q = queued("q", 1)
    last = {"c": Allocation("c", 1, "k80"), "q": Allocation("q", 1, "v100"),
            "b": Allocation("b", 1, "v100"), "a": Allocation("a", 1, "v100")}  # fmt: skip
    decision = Decision(allocations=[Allocation("a", 1, "v100")], keep_running=True, stop=["c"])
    whole = made_whole(decision, last, {"a": a, "b": b, "c": c, "q": q})
    # b kept as it runs (its record says 2 GPUs), then what the decision names
    assert whole == [Allocation("b", 2, "v100"), Allocation("a", 1, "v100")]


# --------------------------------------------------------------------------- where decisions run


async def test_a_slow_decision_sends_the_next_to_a_thread_until_enough_are_quick_again() -> None:
    import threading
    import time

    from gpuyard.services.scheduler.offload import INLINE_AGAIN_AFTER, Offload

    ran_in: list[bool] = []  # whether each decision ran in the caller's thread

    def decide(slow: bool) -> str:
        ran_in.append(threading.get_ident() == caller)
        if slow:
            time.sleep(0.02)
        return "decided"

    caller = threading.get_ident()
    offload = Offload(limit_ms=10.0)
    assert (await offload.run(decide, False))[0] == "decided"
    await offload.run(decide, True)  # slow: the next ones go to a thread
    for _ in range(INLINE_AGAIN_AFTER + 2):
        await offload.run(decide, False)
    assert ran_in[:2] == [True, True]
    assert ran_in[2 : 2 + INLINE_AGAIN_AFTER] == [False] * INLINE_AGAIN_AFTER
    assert ran_in[2 + INLINE_AGAIN_AFTER :] == [True, True]  # quick again: back in its thread
    await offload.run(decide, True)  # slow again (inline): the next goes to a thread
    await offload.run(decide, False)
    assert ran_in[-2:] == [True, False]
