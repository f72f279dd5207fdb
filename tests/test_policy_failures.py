"""A policy that raises: the one line the user sees (and the error reply) names the service, the
policy, the exception and the line of the policy's own code it came from, and points to the log
with the traceback; the service answers and keeps serving."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import structlog

from gpuyard.cli import main
from gpuyard.run.launcher import ServiceSet
from gpuyard.services.admission.service import AdmissionConfig
from gpuyard.services.placement.service import PlacementConfig
from gpuyard.services.scheduler.service import SchedulerConfig
from gpuyard.shared.connection import Bus, connect
from gpuyard.shared.contract import Ping, SubmitRequest
from gpuyard.shared.endpoints import PING, SUBMIT, Subjects
from gpuyard.shared.errors import RemoteError, policy_frame
from gpuyard.shared.model import JobSpec
from gpuyard.shared.policy import (
    AdmissionPolicy,
    ClusterView,
    Decision,
    SchedulingInput,
    SchedulingPolicy,
    admission_policies,
    scheduling_policies,
)

HERE = str(Path(__file__))


def ratio(inp: SchedulingInput) -> float:
    return len(inp.jobs) / 0  # RAISES HERE


class DividesByZero(SchedulingPolicy):
    def schedule(self, inp: SchedulingInput) -> Decision:
        ratio(inp)
        return Decision()


class RefusesTenants(AdmissionPolicy):
    def decide(self, inp: Any) -> Any:
        raise KeyError("tenant")  # RAISES HERE TOO


class SnapshotFails(SchedulingPolicy):
    State = dict

    def schedule(self, inp: SchedulingInput) -> Decision:
        return Decision()

    def snapshot(self) -> Any:
        return {}["missing"]  # SNAPSHOT RAISES HERE


class ReadsBadJson(SchedulingPolicy):
    def schedule(self, inp: SchedulingInput) -> Decision:
        json.loads("{not json")  # CALLS HERE
        return Decision()


def line_of(marker: str) -> int:
    """The line of this file that ends with `# MARKER`."""
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.endswith(f"# {marker}"))


def test_the_frame_is_the_innermost_of_the_policys_own_module() -> None:
    """Raised in a library the policy called: the line of the policy that called it; raised
    where the policy's code did not run: none."""
    policy = ReadsBadJson()
    with pytest.raises(ValueError) as raised:
        policy.schedule(SchedulingInput(now=0.0, jobs=[], cluster=ClusterView(capacity={})))
    frame = policy_frame(raised.value, policy)
    assert frame is not None
    assert (frame.filename, frame.lineno, frame.name) == (HERE, line_of("CALLS HERE"), "schedule")
    # The policy's module not in the traceback (the service's own error): none.
    assert policy_frame(raised.value, scheduling_policies.create("fifo")) is None
    assert policy_frame(raised.value, None) is None


@pytest.mark.slow
def test_a_sim_whose_policy_raises_names_policy_line_and_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(scheduling_policies._classes, "test-divides-by-zero", DividesByZero)
    out = tmp_path / "run"
    try:
        code = main(["sim", "--policy", "test-divides-by-zero", "--jobs", "5", "--out", str(out)])
    finally:
        structlog.reset_defaults()  # (the command pointed it at the run's services.log)
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("gpuyard sim: simulation 'sim' failed: "), err
    assert (
        "scheduling policy 'test-divides-by-zero' in the scheduler service raised "
        f"ZeroDivisionError: division by zero at {HERE}:{line_of('RAISES HERE')}, in ratio "
        "(traceback in the scheduler service's log)"
    ) in line, line
    assert line.endswith(f"; tracebacks in {out / 'services.log'}"), line
    # The scheduler logged it, its traceback with it (structlog JSON), the policy's frames in it.
    logged = [json.loads(entry) for entry in (out / "services.log").read_text().splitlines()]
    failed = [
        e for e in logged if e.get("event") == "request.failed" and e["service"] == "scheduler"
    ]
    assert len(failed) == 1, failed
    assert failed[0]["policy"] == "test-divides-by-zero"
    assert failed[0]["at"] == f"{HERE}:{line_of('RAISES HERE')}" and failed[0]["in"] == "ratio"
    assert f'File "{HERE}", line {line_of("RAISES HERE")}, in ratio' in failed[0]["exception"]
    assert failed[0]["exception"].endswith("ZeroDivisionError: division by zero")


async def test_the_service_answers_where_its_policy_raised_and_keeps_serving(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(admission_policies._classes, "test-refuses-tenants", RefusesTenants)
    configs = {
        "placement": PlacementConfig(),
        "scheduler": SchedulerConfig(),
        "admission": AdmissionConfig(policy="test-refuses-tenants"),
    }
    async with ServiceSet(nats_url, "pol", configs):
        nc = await connect(nats_url, name="test")
        bus = Bus(nc, Subjects("pol"))
        try:
            for _ in range(2):
                with pytest.raises(RemoteError) as failed:
                    await bus.call(
                        SUBMIT, SubmitRequest(now=0.0, jobs=[JobSpec(num_gpus=1, duration=10.0)])
                    )
                assert str(failed.value) == (
                    "gpuyard.pol.adm.submit.op.anonymous: admission policy "
                    "'test-refuses-tenants' in the admission service raised KeyError: 'tenant' "
                    f"at {HERE}:{line_of('RAISES HERE TOO')}, in decide (traceback in the "
                    "admission service's log)"
                )
            assert (await bus.call(PING, Ping(), svc="adm")).policy == "test-refuses-tenants"
        finally:
            await bus.close()


@pytest.mark.slow
async def test_a_service_whose_policy_snapshot_raises_is_named_with_why(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A durable scheduler whose policy raises in `snapshot` fails every request (its state is
    not written): waiting for it to answer ends in one line saying which and why, not in a bare
    TimeoutError (`gpuyard sim: ` and nothing)."""
    monkeypatch.setitem(scheduling_policies._classes, "test-snapshot-fails", SnapshotFails)
    configs = {"scheduler": SchedulerConfig(policy="test-snapshot-fails", durable=True)}
    services = ServiceSet(nats_url, "snap", configs)
    waits = ServiceSet.wait_ready
    monkeypatch.setattr(ServiceSet, "wait_ready", lambda self: asyncio.sleep(0))
    await services.start()
    try:
        with pytest.raises(RuntimeError) as failed:
            await waits(services, within_s=1.0)
    finally:
        await services.stop()
    assert str(failed.value) == (
        "the scheduler service did not answer within 1 s: gpuyard.snap.sched.ping: scheduling "
        "policy 'test-snapshot-fails' in the scheduler service raised KeyError: 'missing' at "
        f"{HERE}:{line_of('SNAPSHOT RAISES HERE')}, in snapshot (traceback in the scheduler "
        "service's log)"
    )
