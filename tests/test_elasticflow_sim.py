"""ElasticFlow in complete simulations: elastic resizes across the services, restart costs, the
`--elasticflow` option set, and fidelity against ElasticFlow's own simulator on its traces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from gpuyard.run.presets import elasticflow_options
from gpuyard.run.simulate import SimOptions, simulate
from gpuyard.services.simclock.service import PreemptionCost, RestartCost
from gpuyard.shared.model import ClusterSpec, JobSpec


@pytest.fixture
def toy_model(tmp_path: Path) -> str:
    """A throughput table (`toy@64`): 1, 2 and 4 steps/s on 1, 2 and 4 GPUs."""
    folder = tmp_path / "throughputs_A100"
    folder.mkdir()
    (folder / "toy.csv").write_text("global_batch_size,1,2,4\n64,1.0,2.0,4.0\n")
    return str(folder)


def toy(job_id: str, steps: float, arrival: float, deadline: float, **kw: object) -> JobSpec:
    return JobSpec(
        job_id=job_id, job_type="toy@64", num_gpus=kw.pop("num_gpus", 1),  # type: ignore[arg-type]
        min_gpus=kw.pop("min_gpus", 1), max_gpus=kw.pop("max_gpus", 64),  # type: ignore[arg-type]
        total_steps=steps, submit_time=arrival, deadline=deadline, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def ef_options(
    toy_model: str, scheme: str, round_s: float = 10.0, at_events: bool = True, **kw: object
) -> SimOptions:
    options = SimOptions(
        cluster=ClusterSpec.parse("1x4:a100"), throughputs=toy_model, round_s=round_s,
        **elasticflow_options(scheme, round_s, 4, at_events=at_events),
    )  # fmt: skip
    for key, value in kw.items():
        setattr(options, key, value)
    return options


def test_gandiva_takes_its_last_arrival_from_the_workload(toy_model: str) -> None:
    """ElasticFlow's Gandiva loop runs at arrivals until the last one, then every slot, and
    charges restarts until then: the run's options take that time from the workload (as
    intended, `gandiva-ts` needs none)."""
    from gpuyard.run.presets import semantics

    jobs = [toy("a", 10, 0.0, 100.0), toy("b", 10, 500.0, 900.0)]
    options = ef_options(toy_model, "gandiva")
    assert (options.policy, options.mode, options.placement) == (
        "gandiva-ef",
        "events",
        "consolidated",
    )
    filled = semantics("elasticflow").with_workload(options, jobs)
    assert filled.policy_params == {"last_arrival": 500.0}
    assert filled.preemption_cost.restart is not None
    assert filled.preemption_cost.restart.until_s == 500.0
    intended = SimOptions(
        cluster=ClusterSpec.parse("1x4:a100"), throughputs=toy_model, round_s=10.0,
        **elasticflow_options("gandiva", 10.0, 4, as_intended=True),
    )  # fmt: skip
    assert (intended.policy, intended.mode, intended.placement) == ("gandiva-ts", "slots", "buddy")
    assert semantics("elasticflow").with_workload(intended, jobs) == intended


@pytest.mark.slow
async def test_elastic_resizes_end_with_the_job_and_free_its_gpus(
    tmp_path: Path, nats_url: str, toy_model: str
) -> None:
    """Slots of 10 s, linear speed-up to 4 GPUs. 'a' runs on all 4 GPUs (leftovers), shrinks to 2
    when 'b' (2 GPUs to make its deadline) arrives at 50, grows back to 4 when 'b' ends at 110
    (80 steps left) and shrinks to 2 again when 'c' arrives at 125 (20 left): it ends at 135.
    'd' arrives at 126, waits for the slot's end and takes 'a's GPUs at 135; 'c' grows to 4
    when 'd' ends at 185. (A resized job's exit was once taken for an earlier run's: its GPUs were
    never freed, and stopping it again failed the node command that started 'd'.)"""
    jobs = [
        toy("a", 400, 0.0, 10_000.0),
        toy("b", 120, 50.0, 110.0),
        toy("c", 400, 125.0, 10_000.0),
        toy("d", 100, 126.0, 10_000.0),
    ]
    options = ef_options(toy_model, "ef-accessctrl", preemption_cost=PreemptionCost())
    result = await simulate(options, jobs, tmp_path / "out", nats_url=nats_url)
    by_id = {r.job_id: r for r in result.jobs}
    assert all(r.state == "completed" for r in result.jobs)
    assert (by_id["b"].first_start, by_id["b"].end_time) == (50.0, 110.0)
    assert by_id["a"].end_time == pytest.approx(135.0)
    assert by_id["a"].preemptions == 0  # resized four times, never queued
    assert (by_id["d"].first_start, by_id["d"].end_time) == (135.0, pytest.approx(185.0))
    assert (by_id["c"].first_start, by_id["c"].end_time) == (125.0, pytest.approx(255.0))


@pytest.mark.slow
@pytest.mark.parametrize(("arrival", "w_start"), [(None, 110.0), (104.0, 104.0)])
async def test_a_job_ends_where_its_plan_ends_or_at_the_next_event_after(
    tmp_path: Path, nats_url: str, toy_model: str, arrival: float | None, w_start: float
) -> None:
    """ElasticFlow's simulator ends a job at the end its plan predicted (the end of the last
    10 s slot its run reaches, counted from its last decision), or at the first event after its
    real finish. 'a' (4 GPUs, 402 steps) finishes at 101 (100.5, rounded up to a whole second);
    its plan, made again when 'w' arrives at 20, ends at 110: 'w' (waiting for all 4 GPUs) starts
    there, or at 104 when another arrival at 104 is an event. 'a''s JCT counts to its finish."""
    rigid = {"num_gpus": 4, "min_gpus": 4, "max_gpus": 4}
    jobs = [toy("a", 402, 0.0, 10_000.0, **rigid), toy("w", 40, 20.0, 10_000.0, **rigid)]
    if arrival is not None:
        jobs.append(toy("x", 10, arrival, 10_000.0, **rigid))
    options = ef_options(toy_model, "ef", preemption_cost=PreemptionCost())
    result = await simulate(options, jobs, tmp_path / "out", nats_url=nats_url)
    by_id = {r.job_id: r for r in result.jobs}
    assert by_id["a"].end_time == 101.0
    assert by_id["w"].first_start == w_start


async def test_restart_cost_pays_warm_ranks_less(
    tmp_path: Path, nats_url: str, toy_model: str
) -> None:
    """A first launch on 4 GPUs costs 2 + 2 x (log2 4 + 1) = 8 s; a later launch on the same GPUs
    finds warm processes and costs 2 s."""
    restart = RestartCost(base_s=2.0, per_doubling_s=2.0, cold_s=27.0, scope="launched")
    jobs = [toy("a", 400, 0.0, 10_000.0), toy("c", 400, 200.0, 10_000.0)]
    options = ef_options(toy_model, "ef", preemption_cost=PreemptionCost(restart=restart))
    result = await simulate(options, jobs, tmp_path / "out", nats_url=nats_url)
    by_id = {r.job_id: r for r in result.jobs}
    assert by_id["a"].end_time == pytest.approx(108.0)
    assert by_id["c"].end_time == pytest.approx(302.0)


@pytest.mark.parametrize(
    ("scope", "a_end"), [("launched", 106.0), ("changes", 108.0), ("decisions", 108.0)]
)
async def test_restart_scope(
    tmp_path: Path, nats_url: str, toy_model: str, scope: str, a_end: float
) -> None:
    """Rigid 2-GPU jobs: 'a' from 0, 'b' from 50. Each first launch costs 2 + 2 x 2 = 6 s; with
    scope `changes` or `decisions` the running 'a' also restarts when 'b' starts (warm: 2 s)."""
    restart = RestartCost(base_s=2.0, per_doubling_s=2.0, scope=scope, decision_gap_s=10.0)  # type: ignore[arg-type]
    jobs = [
        toy("a", 200, 0.0, 1e6, num_gpus=2, min_gpus=2, max_gpus=2),
        toy("b", 100, 50.0, 1e6, num_gpus=2, min_gpus=2, max_gpus=2),
    ]
    options = SimOptions(
        cluster=ClusterSpec.parse("1x4:a100"), throughputs=toy_model, placement="buddy",
        preemption_cost=PreemptionCost(restart=restart),
    )  # fmt: skip
    result = await simulate(options, jobs, tmp_path / "out", nats_url=nats_url)
    by_id = {r.job_id: r for r in result.jobs}
    assert by_id["a"].end_time == pytest.approx(a_end)
    assert by_id["b"].end_time == pytest.approx(106.0)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("as_intended", "expected", "met"),
    [(False, {"a": (3.0, 113.0), "z": (203.0, 213.0)}, 1),
     (True, {"a": (10.0, 111.0), "z": (200.0, 210.0)}, 2)],
)  # fmt: skip
async def test_themis_decides_every_slot_from_its_first_event_and_ends_jobs_at_slot_ends(
    tmp_path: Path, nats_url: str, toy_model: str, as_intended: bool,
    expected: dict[str, tuple[float, float]], met: int,
) -> None:  # fmt: skip
    """ElasticFlow's Themis decides every 10 s slot from its first event (3), idle or not, and
    ends a job at the end of the slot it finishes in: 'a' (4 GPUs, 100.5 s of work) starts at 3,
    finishes at 103.5 and ends at 113, past its deadline (112); 'z' arrives at 200, when nothing
    runs, and waits for the slot at 203. `--as-intended`: slots at multiples of 10 and jobs that
    end when they finish (at the whole second): 'a' ends at 111, in time."""
    rigid = {"num_gpus": 4, "min_gpus": 4, "max_gpus": 4}
    jobs = [toy("a", 402, 3.0, 112.0, **rigid), toy("z", 40, 200.0, 10_000.0, **rigid)]
    options = SimOptions(
        cluster=ClusterSpec.parse("1x4:a100"), throughputs=toy_model, round_s=10.0,
        as_intended=as_intended, **elasticflow_options("themis", 10.0, 4, as_intended=as_intended),
    )  # fmt: skip
    result = await simulate(options, jobs, tmp_path / "out", nats_url=nats_url)
    assert {r.job_id: (r.first_start, r.end_time) for r in result.jobs} == expected
    assert result.summary["deadline_met"] == met


async def test_admission_declines_what_cannot_make_it(
    tmp_path: Path, nats_url: str, toy_model: str
) -> None:
    """'b' needs 8 steps/s to make its deadline: more than the cluster has; it is declined and
    the others run."""
    jobs = [toy("a", 400, 0.0, 10_000.0), toy("b", 800, 20.0, 120.0), toy("c", 40, 30.0, 500.0)]
    options = ef_options(toy_model, "ef-accessctrl")
    result = await simulate(options, jobs, tmp_path / "out", nats_url=nats_url)
    assert sorted(r.job_id for r in result.jobs) == ["a", "c"]
    assert all(r.end_time is not None and r.end_time <= r.spec.deadline for r in result.jobs)  # type: ignore[operator]


@pytest.mark.slow
@pytest.mark.parametrize(("as_intended", "a_end"), [(True, 110.0), (False, 105.0)])
async def test_admission_sees_the_progress_that_restart_pauses_took(
    tmp_path: Path, nats_url: str, toy_model: str, as_intended: bool, a_end: float
) -> None:
    """Every decision pauses each running job 5 s. 'a' (400 steps, deadline 103) is admitted at 0:
    on all 4 GPUs it needs 100 s, but its first pause makes it end at 105 at best. The simulated
    nodes tell the scheduler the progress the pause took (as a real node's heartbeats would), so
    when 'b' arrives at 30 admission sees 'a' late and declines 'b' for it, as ElasticFlow's
    planner does. (Planned as if nothing paused, 'a' would end at 100 and 'b' be admitted.) The
    declined arrival is a decision all the same: 'a' pauses again and ends at 110. As
    ElasticFlow's simulator runs, that pause does not move the end predicted at 30 (105): 'a'
    progresses until then, ends at its planned end event (115) short of its work, and is
    recorded at 105."""
    restart = RestartCost(base_s=5.0, per_doubling_s=0.0, cold_s=0.0, scope="decisions")
    jobs = [toy("a", 400, 0.0, 103.0), toy("b", 10, 30.0, 1_000.0)]
    options = ef_options(
        toy_model, "ef-accessctrl", preemption_cost=PreemptionCost(restart=restart),
        as_intended=as_intended,
    )  # fmt: skip
    result = await simulate(options, jobs, tmp_path / "out", nats_url=nats_url)
    assert [r.job_id for r in result.jobs] == ["a"]
    assert result.summary["declined"] == 1
    assert result.jobs[0].end_time == pytest.approx(a_end)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("scheme", "as_intended", "a_end", "b_start"),
    [("ef-accessctrl", False, 100.0, 108.0), ("ef", False, 108.0, 108.0),
     ("ef-accessctrl", True, 108.0, 108.0), ("ef", True, 108.0, 108.0)],
)  # fmt: skip
async def test_a_pause_leaves_the_predicted_end_where_it_was_as_elasticflow_runs(
    tmp_path: Path, nats_url: str, toy_model: str, scheme: str, as_intended: bool, a_end: float,
    b_start: float,
) -> None:  # fmt: skip
    """'a' (4 GPUs, 400 steps: 100 s) starts at 0 and pauses 8 s (2 + 2 x (log2 4 + 1)). Its plan
    predicted its real end at 100, and in ElasticFlow's simulator the pause does not move it: 'a'
    progresses until 100 only (368 steps), ends at its planned end event, 108 (its slots' end,
    100, plus the pause), and is recorded at 100 by `ef-accessctrl` (which judges deadlines by
    that end), at 108 by `ef`. As intended, it finishes its work at 108. 'b' (all 4 GPUs) starts
    when 'a' leaves, at 108 in every case."""
    rigid = {"num_gpus": 4, "min_gpus": 4, "max_gpus": 4}
    jobs = [toy("a", 400, 0.0, 10_000.0, **rigid), toy("b", 40, 50.0, 10_000.0, **rigid)]
    restart = RestartCost(base_s=2.0, per_doubling_s=2.0, cold_s=0.0, scope="launched")
    options = ef_options(
        toy_model, scheme, preemption_cost=PreemptionCost(restart=restart),
        as_intended=as_intended,
    )  # fmt: skip
    result = await simulate(options, jobs, tmp_path / "out", nats_url=nats_url)
    by_id = {r.job_id: r for r in result.jobs}
    assert by_id["a"].end_time == pytest.approx(a_end)
    assert by_id["b"].first_start == pytest.approx(b_start)


async def test_a_declined_arrival_starts_a_slot_and_admission_plans_from_its_end(
    tmp_path: Path, nats_url: str, toy_model: str
) -> None:
    """Slots of 10 s, each arrival decided at once (`at_events=False`). 'x' (arriving at 15) cannot
    make its deadline and is declined, but its arrival is a scheduling event all the same, as in
    ElasticFlow: the next decision comes at 25, the slot's end. 'b' arrives at 20 needing all 4
    GPUs for 10 s by 32: planned from 25, when the scheduler will first decide on it, it would end
    at 35; it is declined. (Planned from its arrival, or with no decision at 15, it would fit.)"""
    jobs = [
        toy("a", 400, 0.0, 10_000.0),
        toy("x", 10_000, 15.0, 50.0),
        toy("b", 40, 20.0, 32.0),
    ]
    options = ef_options(
        toy_model, "ef-accessctrl", at_events=False, preemption_cost=PreemptionCost()
    )
    result = await simulate(options, jobs, tmp_path / "out", nats_url=nats_url)
    assert [r.job_id for r in result.jobs] == ["a"]
    assert result.summary["declined"] == 2
    assert result.jobs[0].end_time == pytest.approx(100.0)


async def test_a_held_arrival_declined_at_its_event_starts_a_slot(
    tmp_path: Path, nats_url: str, toy_model: str
) -> None:
    """Slots of 10 s, arrivals held to the scheduler's next decision (ElasticFlow's merged events).
    'x' arrives at 5 and is declined at 10; that event is a decision all the same, so 'b' (all 4
    GPUs for 10 s, by 28), arriving at 12, waits for the slot's end at 20: planned from there it
    would end at 30, and it is declined. (Without a decision at 10, 'b' would be decided at 12 and
    end at 22.)"""
    jobs = [
        toy("a", 400, 0.0, 10_000.0),
        toy("x", 10_000, 5.0, 50.0),
        toy("b", 40, 12.0, 28.0),
    ]
    options = ef_options(toy_model, "edf-accessctrl", preemption_cost=PreemptionCost())
    result = await simulate(options, jobs, tmp_path / "out", nats_url=nats_url)
    assert [r.job_id for r in result.jobs] == ["a"]
    assert result.summary["declined"] == 2


@pytest.mark.parametrize(
    ("scheme", "at_events"),
    [("ef-accessctrl", True), ("ef-accessctrl", False), ("edf-accessctrl", True)],
)
@pytest.mark.slow
async def test_the_arrivals_of_one_event_are_decided_at_it_as_in_elasticflow(
    tmp_path: Path, nats_url: str, toy_model: str, scheme: str, at_events: bool
) -> None:
    """Slots of 10 s; 'a' starts at 0, so the next decision is at 10. 'b' (10 steps by 1,000)
    arrives at 3 and 'x' (10,000 steps by 50: it cannot make it) at 5: one merged event.
    ElasticFlow's simulator decides them at 10: its `ef-accessctrl` declines both (all or none),
    its `edf-accessctrl` each on its own ('b' admitted at 10). Decided at arrival
    (`at_events=False`), 'b' is admitted at 3 and runs from 10. 'e', a best-effort job in the
    same event, is admitted whatever the others get. 'c' arrives alone at 53 (more than a slot
    after the last decision) and is admitted at once in every case."""
    jobs = [
        toy("a", 400, 0.0, 10_000.0),
        toy("b", 10, 3.0, 1_000.0),
        toy("e", 10, 4.0, None, best_effort=True),  # type: ignore[arg-type]
        toy("x", 10_000, 5.0, 50.0),
        toy("c", 10, 53.0, 1_000.0),
    ]
    options = ef_options(toy_model, scheme, at_events=at_events, preemption_cost=PreemptionCost())
    out = tmp_path / "out"
    result = await simulate(options, jobs, out, nats_url=nats_url)
    by_id = {r.job_id: r for r in result.jobs}
    table = pd.read_csv(out / "jobs.csv").set_index("job_id")
    assert table.loc["x", "admission"] == "declined"
    assert table.loc["e", "admission"] == "best-effort" and by_id["e"].state == "completed"
    assert by_id["c"].state == "completed" and by_id["c"].admit_time == 53.0
    if scheme == "ef-accessctrl" and at_events:
        assert sorted(by_id) == ["a", "c", "e"] and result.summary["declined"] == 2
        assert table.loc["b", "admission"] == "declined"
        assert (
            "with the jobs decided with it (x: cannot meet its deadline" in table.loc["b", "reason"]
        )
    else:
        assert sorted(by_id) == ["a", "b", "c", "e"] and result.summary["declined"] == 1
        assert by_id["b"].admit_time == (10.0 if at_events else 3.0)
        assert by_id["b"].first_start == 10.0


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_cli_runs_a_scheme_and_names_a_wrong_one(tmp_path: Path, data) -> None:  # type: ignore[no-untyped-def]
    base = [
        "sim", "--trace", str(data("elasticflow/traces/gen_200jobs_lam900.csv")),
        "--cluster-spec", str(data("elasticflow/cluster_specs/n16g8.csv")),
        "--throughputs", str(data("elasticflow/throughputs_A100")), "--elasticflow", "--round", "240",
    ]  # fmt: skip
    result = cli(*base, "--policy", "nosuch", "--out", str(tmp_path / "bad"))
    assert result.returncode == 2
    assert (
        "unknown ElasticFlow scheme 'nosuch'" in result.stderr and "ef-accessctrl" in result.stderr
    )
    out = tmp_path / "run"
    # (a placement parameter reaches the scheme's placement, as an admission parameter does)
    result = cli(*base, "--policy", "edf-accessctrl", "--placement-param", "order=largest-first",
                 "--out", str(out), "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["scheme"] == "edf-accessctrl" and summary["jobs"] == 200
    assert summary["accepted"] + summary["declined"] == 200
    jobs = pd.read_csv(out / "jobs.csv")
    assert (jobs["admission"] == "declined").sum() == summary["declined"] > 0
    assert jobs.loc[jobs["admission"] == "declined", "reason"].str.contains("deadline").all()
    assert (out / "efficiency.csv").exists() and (out / "deadlines.png").exists()
    options = json.loads((out / "options.json").read_text())
    assert (options["policy"], options["admission"], options["placement"]) == (
        "edf",
        "edf",
        "node-sets",
    )
    assert options["placement_params"] == {"order": "largest-first", "switch_nodes": 0}


def test_elasticflow_fills_in_only_the_policies_not_given(tmp_path: Path, data) -> None:  # type: ignore[no-untyped-def]
    """`--elasticflow` sets the scheme's admission and placement unless the command names its
    own (with only its own parameters); parameters alone go on top of the scheme's. `gpuyard up
    --elasticflow` and a sweep's check resolve them the same way."""
    from gpuyard.cli import build_parser
    from gpuyard.cli.cluster import control_plane_from_args
    from gpuyard.cli.sim import run_spec
    from gpuyard.policies.elasticflow.node_sets import NodeSetsParams
    from gpuyard.policies.elasticflow.placement import BuddyParams
    from gpuyard.run.build import build
    from gpuyard.shared.policy import placement_policies
    from gpuyard.sweep.config import ConfigError, RunSpec, _check

    table = str(data("elasticflow/throughputs_A100"))
    base = [
        "sim", "--trace", str(data("elasticflow/traces/fig10_100jobs.csv")), "--cluster-spec",
        str(data("elasticflow/cluster_specs/n16g8.csv")), "--throughputs", table,
        "--elasticflow", "--policy", "ef-accessctrl", "--round", "240", "--out", str(tmp_path),
    ]  # fmt: skip

    def options(*extra: str):  # type: ignore[no-untyped-def]
        return build(run_spec(build_parser().parse_args([*base, *extra])), tmp_path)[0]

    plain = options("--admission-param", "decide_at=arrival", "--placement-param", "order=given")
    assert (plain.admission, plain.placement) == ("elasticflow", "node-sets")
    assert plain.admission_params["decide_at"] == "arrival"
    assert plain.admission_params["slot_s"] == 240.0  # (the scheme's, kept)
    assert placement_policies.create("node-sets", plain.placement_params).params == NodeSetsParams(
        "given"
    )
    assert plain.mode == "slots"  # (the scheme's)
    own = options("--admission", "accept-all", "--placement", "consolidated", "--mode", "events")
    assert (own.admission, own.admission_params) == ("accept-all", {})
    assert (own.placement, own.placement_params) == ("consolidated", {})
    assert own.mode == "events"
    assert own.policy == plain.policy and own.preemption_cost.restart is not None  # the rest stays

    up = ["up", "--elasticflow", "--policy", "ef-accessctrl", "--throughputs", table]
    services = control_plane_from_args(build_parser().parse_args([*up, "--placement-param",
                                                                  "sticky=false"]))  # fmt: skip
    placement = services["placement"]  # (a real cluster's: jobs kept where they run)
    assert placement_policies.create(placement.policy, placement.params).params == BuddyParams(
        False
    )
    services = control_plane_from_args(
        build_parser().parse_args([*up, "--admission", "accept-all"])
    )
    assert (services["admission"].policy, services["admission"].params) == ("accept-all", {})

    spec = RunSpec(preset="elasticflow", policy="ef-accessctrl", placement_params={"order": "given"},
                   admission_params={"decide_at": "arrival"}, throughputs=table)  # fmt: skip
    _check(spec, Path("sweep.toml"), "run 1")  # the scheme's policies take these parameters
    with pytest.raises(ConfigError, match="unknown field `order`"):
        _check(RunSpec(preset="elasticflow", policy="ef", placement="first-fit",
                       placement_params={"order": "given"}), Path("sweep.toml"), "run 1")  # fmt: skip
    run = RunSpec(preset="elasticflow", policy="ef-accessctrl", placement="consolidated",
                  trace=base[2], cluster_spec=base[4], throughputs=table, round_s=240.0)  # fmt: skip
    made = build(run, tmp_path)[0]
    assert (made.admission, made.placement) == ("elasticflow", "consolidated")  # as named


# Figures of ElasticFlow's own simulator (gudiandian/ElasticFlow, scheduler.py, run as its
# scripts do: --cluster_spec=cluster_specs/S.csv --scheme=elastic --schedule=SCHEME
# --simulation=True --scheduling_slot=240 --gpu_type=A100): jobs that met their deadline, and
# mean JCT (s) of the jobs it ran; fig10_100jobs.csv on n16g8 (run_fig10.sh) and
# gen_200jobs_lam900.csv on n8g8 (run_fig11.sh's trace shape and cluster).
REFERENCE = {
    ("fig10_100jobs", "n16g8", "ef-accessctrl"): (100, 23807),
    ("fig10_100jobs", "n16g8", "ef"): (97, 24378),
    ("fig10_100jobs", "n16g8", "edf-accessctrl"): (92, 39406),
    ("fig10_100jobs", "n16g8", "edf"): (92, 63319),
    ("fig10_100jobs", "n16g8", "dlas-gpu"): (100, 51045),
    ("fig10_100jobs", "n16g8", "themis"): (99, 51243),
    ("fig10_100jobs", "n16g8", "gandiva"): (79, 63853),
    ("gen_200jobs_lam900", "n8g8", "ef-accessctrl"): (170, 20308),
    ("gen_200jobs_lam900", "n8g8", "ef"): (109, 30126),
    ("gen_200jobs_lam900", "n8g8", "gandiva"): (58, 49724),
    ("gen_200jobs_lam900", "n8g8", "themis"): (92, 37440),
}


@pytest.mark.slow
@pytest.mark.parametrize(("trace", "spec", "scheme"), sorted(REFERENCE))
async def test_fidelity(
    tmp_path: Path, nats_url: str, data, trace: str, spec: str, scheme: str
) -> None:  # type: ignore[no-untyped-def]
    """Within 3% of the jobs and 5% of mean JCT of ElasticFlow's own figures."""
    from gpuyard.workloads import load_cluster, load_workload

    cluster = load_cluster(data(f"elasticflow/cluster_specs/{spec}.csv"))
    workload = load_workload(data(f"elasticflow/traces/{trace}.csv"), elastic=True)
    options = SimOptions(
        cluster=cluster, throughputs=str(data("elasticflow/throughputs_A100")), round_s=240.0,
        **elasticflow_options(scheme, 240.0, cluster.total_gpus),
    )  # fmt: skip
    result = await simulate(
        options, workload.jobs, tmp_path, nats_url=nats_url, cluster_name=scheme
    )
    met, mean_jct = REFERENCE[trace, spec, scheme]
    assert abs(result.summary["deadline_met"] - met) <= 0.03 * len(workload.jobs)
    assert result.summary["mean_jct"] == pytest.approx(mean_jct, rel=0.05)


@pytest.mark.slow
async def test_fidelity_fig10_gandiva_and_as_intended(tmp_path: Path, nats_url: str, data) -> None:  # type: ignore[no-untyped-def]
    """`gandiva` is ElasticFlow's own Gandiva (`gandiva-ef`, quirks included): its 79 deadlines
    of 100 (mean JCT 63,853 s); as intended (`gandiva-ts`), 100 (51,071 s)."""
    from gpuyard.workloads import load_cluster, load_workload

    cluster = load_cluster(data("elasticflow/cluster_specs/n16g8.csv"))
    workload = load_workload(data("elasticflow/traces/fig10_100jobs.csv"), elastic=True)
    for as_intended, policy, met, mean_jct in (
        (False, "gandiva-ef", 79, 63853), (True, "gandiva-ts", 100, 51071)
    ):  # fmt: skip
        scheme = elasticflow_options("gandiva", 240.0, cluster.total_gpus, as_intended=as_intended)
        options = SimOptions(
            cluster=cluster, throughputs=str(data("elasticflow/throughputs_A100")), round_s=240.0,
            **scheme,
        )  # fmt: skip
        result = await simulate(
            options, workload.jobs, tmp_path / policy, nats_url=nats_url, cluster_name=policy
        )
        assert result.summary["scheduling_policy"] == policy
        if as_intended:
            assert result.summary["deadline_met"] == met
        else:
            assert abs(result.summary["deadline_met"] - met) <= 3
        assert result.summary["mean_jct"] == pytest.approx(mean_jct, rel=0.05)
