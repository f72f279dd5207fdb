"""Bad input gets an error reply naming what is wrong, and the services keep running."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from gpuyard.run.launcher import ServiceSet
from gpuyard.services.admission.service import AdmissionConfig
from gpuyard.services.placement.service import PlacementConfig
from gpuyard.services.scheduler.service import SchedulerConfig
from gpuyard.shared.connection import Bus, connect
from gpuyard.shared.contract import (
    STATUS_HEADER,
    ErrorReply,
    Ping,
    RegisterNode,
    SubmitReply,
    SubmitRequest,
    TickRequest,
)
from gpuyard.shared.endpoints import PING, REGISTER, SUBMIT, Endpoint, Subjects
from gpuyard.shared.errors import RemoteError
from gpuyard.shared.model import JobSpec, NodeSpec


@pytest.fixture
async def control_plane(nats_url: str):
    configs = {
        "placement": PlacementConfig(),
        "scheduler": SchedulerConfig(),
        "admission": AdmissionConfig(),
    }
    async with ServiceSet(nats_url, "errs", configs):
        nc = await connect(nats_url, name="test")
        bus = Bus(nc, Subjects("errs"))
        await bus.call(REGISTER, RegisterNode(now=0.0, node=NodeSpec(node_id="n0", num_gpus=4)))
        yield bus
        await bus.close()


async def raw_request(bus: Bus, subject: str, data: bytes, headers=None) -> ErrorReply:
    reply = await bus.nc.request(subject, data, timeout=5, headers=headers)
    assert reply.headers and reply.headers.get(STATUS_HEADER) == "error", reply.data
    return msgspec.json.decode(reply.data, type=ErrorReply)


@pytest.mark.parametrize(
    ("payload", "field", "words"),
    [
        (b"{not json", None, "malformed"),
        (b'{"jobs": [{"num_gpus": 0}]}', "$.jobs[0].num_gpus", ">= 1"),
        (b'{"jobs": [{"duration": 5}]}', "$.jobs[0].num_gpus", "missing required field"),
        (b'{"jobs": [{"num_gpus": 1, "gpus": 2}]}', "$.jobs[0].gpus", "unknown field"),
        (b'{"jobs": [{"num_gpus": "two"}]}', "$.jobs[0].num_gpus", "Expected `int`"),
        (b'{"jobs": [{"num_gpus": 2, "min_gpus": 4}]}', "$.jobs[0].min_gpus", "must be <="),
        (b'{"jobs": [{"num_gpus": 1, "job_id": "a b"}]}', "$.jobs[0].job_id", "regex"),
        (b'{"jobs": 3}', "$.jobs", "Expected `array`"),
    ],
)
async def test_bad_submissions_name_the_field(control_plane: Bus, payload, field, words) -> None:
    subject = "gpuyard.errs.adm.submit.op.anonymous"
    error = await raw_request(control_plane, subject, payload)
    assert field == error.field
    assert words.lower() in error.error.lower()
    assert error.subject == subject


async def test_a_malformed_spec_in_a_batch_is_refused_alone(control_plane: Bus) -> None:
    """One bad spec among good ones: refused by its index and field, the others decided; its
    job id, where it names one, in its result."""
    batch = (b'{"jobs": [{"num_gpus": 1, "job_id": "good1"}, {"num_gpus": "two", "job_id": "bad"},'
             b' {"num_gpus": 1, "gpus": 2}, {"num_gpus": 2, "job_id": "good2"}]}')  # fmt: skip
    msg = await control_plane.nc.request("gpuyard.errs.adm.submit.op.anonymous", batch, timeout=5)
    reply = msgspec.json.decode(msg.data, type=SubmitReply)
    verdicts = {(r.job_id, r.verdict) for r in reply.results}
    assert verdicts == {("good1", "admit"), ("good2", "admit"), ("bad", "reject"), ("", "reject")}
    reasons = [r.reason for r in reply.results if r.verdict == "reject"]
    assert "Expected `int`" in reasons[0] and "$.jobs[1].num_gpus" in reasons[0]
    assert "unknown field" in reasons[1] and "$.jobs[2].gpus" in reasons[1]
    # A submitter naming another user is refused whole, by the spec's place in the submission.
    with pytest.raises(RemoteError) as refused:
        await control_plane.call(
            SUBMIT, {"jobs": [{"num_gpus": "x"}, {"num_gpus": 1, "user": "mallory"}]},
            caller="user.alice",
        )  # fmt: skip
    assert refused.value.reply.field == "$.jobs[1].user"


async def test_unknown_request_and_wrong_version(control_plane: Bus) -> None:
    error = await raw_request(control_plane, "gpuyard.errs.sched.frobnicate", b"{}")
    assert "unknown request 'frobnicate'" in error.error and "tick" in error.error
    error = await raw_request(
        control_plane, "gpuyard.errs.sched.tick", b'{"now": 1}', headers={"Gpuyard-Contract": "99"}
    )
    assert "contract version 99" in error.error


async def test_services_keep_running_after_bad_input(control_plane: Bus) -> None:
    for subject in ("adm.submit", "sched.tick", "sched.exited", "place.apply", "place.register"):
        await raw_request(control_plane, f"gpuyard.errs.{subject}", b'{"bogus": true}')
    for service in ("adm", "sched", "place"):
        pong = await control_plane.call(PING, Ping(), svc=service)
        assert pong.cluster == "errs"
    reply = await control_plane.call(
        SUBMIT, SubmitRequest(now=0.0, jobs=[JobSpec(num_gpus=2, duration=10.0)])
    )
    assert [r.verdict for r in reply.results] == ["admit"]
    assert reply.scheduler is not None and reply.scheduler.queued == 1


async def test_typed_client_raises_remote_error(control_plane: Bus) -> None:
    with pytest.raises(RemoteError) as info:
        await control_plane.call(SUBMIT, {"jobs": [{"num_gpus": -1}]})
    assert info.value.reply.field == "$.jobs[0].num_gpus"
    with pytest.raises(RemoteError, match="no service is listening"):
        nobody = Endpoint("nobody.here", TickRequest, TickRequest, "test -> nobody")
        await control_plane.call(nobody, TickRequest(now=0))


async def test_a_late_reply_answers_no_other_call(control_plane: Bus) -> None:
    """A call gives up after `within_s`; its reply, when it comes, is dropped, not taken for the
    answer to the call waiting then; calls at once each get their own answer."""
    nc = control_plane.nc
    echo = Endpoint("slow.echo", TickRequest, TickRequest, "test -> slow echo")
    replies: list[asyncio.Task[None]] = []

    async def answer(msg) -> None:  # type: ignore[no-untyped-def]
        delay = msgspec.json.decode(msg.data, type=TickRequest).now  # answer after `now` s

        async def later() -> None:
            await asyncio.sleep(delay)
            await nc.publish(msg.reply, msg.data)

        replies.append(asyncio.create_task(later()))

    await nc.subscribe(control_plane.subject(echo), cb=answer)
    with pytest.raises(RemoteError, match="timed out"):
        await control_plane.call(echo, TickRequest(now=0.3), within_s=0.1)
    # The late reply comes at 0.3 s, while this call waits for its own (at 0.1 + 0.4 s).
    assert (await control_plane.call(echo, TickRequest(now=0.4), within_s=5)).now == 0.4
    answers = await asyncio.gather(
        *(control_plane.call(echo, TickRequest(now=d), within_s=5) for d in (0.2, 0.0, 0.1))
    )
    assert [a.now for a in answers] == [0.2, 0.0, 0.1]
    await asyncio.gather(*replies)


async def test_duplicate_job_ids_are_rejected_not_lost(control_plane: Bus) -> None:
    spec = JobSpec(job_id="dup", num_gpus=1, duration=10.0)
    first = await control_plane.call(SUBMIT, SubmitRequest(now=0.0, jobs=[spec]))
    second = await control_plane.call(SUBMIT, SubmitRequest(now=1.0, jobs=[spec]))
    assert first.results[0].verdict == "admit"
    assert second.results[0].verdict == "reject" and "already in use" in second.results[0].reason


async def test_job_larger_than_cluster_is_rejected_with_reason(control_plane: Bus) -> None:
    reply = await control_plane.call(
        SUBMIT,
        SubmitRequest(
            now=0.0,
            jobs=[
                JobSpec(num_gpus=64, duration=1.0),
                JobSpec(num_gpus=1, gpu_type="tpu", duration=1.0),
            ],
        ),
    )
    assert [r.verdict for r in reply.results] == ["reject", "reject"]
    assert "largest GPU type has 4" in reply.results[0].reason
    assert "'tpu' is not in the cluster" in reply.results[1].reason
