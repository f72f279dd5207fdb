"""The simulated node agents: which parts of which jobs run on which GPUs of which node, as the
node commands placement sends start and stop them, and what a job keeps when it stops. No I/O:
the simclock service answers the commands with these."""

from __future__ import annotations

from gpuyard.services.simclock.costs import GpuSet, PreemptionCost
from gpuyard.services.simclock.timeline import QueueChanges
from gpuyard.shared.contract import NodeCommand, NodeCommandReply
from gpuyard.shared.errors import BadRequest
from gpuyard.shared.goodput import GoodputJob
from gpuyard.shared.model import ClusterSpec, JobSpec, NodeSpec


class SimJob:
    """A simulated job's processes: which GPUs of which nodes run its parts, and its progress."""

    __slots__ = (
        "attempt", "base", "done", "down_s", "ended_at", "failure", "floor", "gpu_type", "held",
        "job_type", "limit_at", "min_gpus", "most_gpus", "parts", "placed", "queue", "ranks",
        "rate", "restarting", "restoring", "round_steps", "share", "since", "timed_out", "total",
        "training", "until", "up_s", "version",
    )  # fmt: skip

    def __init__(
        self, spec: JobSpec, total: float, queue: int = -1, training: GoodputJob | None = None
    ) -> None:
        self.job_type = spec.job_type
        self.training = training
        """Its training, where it progresses at its goodput (`Completions.advance`): then `rate`
        stays 0 and `done` is its training's progress."""
        self.share = spec.gpu_milli  # a share of one GPU: it runs beside others, not as a pair
        self.queue = queue  # the index of its queue, whose GPUs it counts in (-1: none)
        self.total = total
        self.done = 0.0
        self.rate = 0.0
        self.since = 0.0
        self.parts: dict[str, tuple[int, ...]] = {}  # node -> GPU indices
        self.ranks: GpuSet | None = None  # `gpu_set`, while parts do not change
        self.attempt = 0
        self.round_steps = 0.0  # Gavel's rounds: the steps of this round's micro-task
        self.ended_at: float | None = None  # Gavel's rounds: its last micro-task's end
        self.gpu_type = ""
        self.version = 0
        self.failure = ""  # why the job crashes as soon as it starts, if it does
        self.restarting = False  # some part was stopped at this instant
        self.restoring = False  # resumed after a preemption: the restore time is still to pay
        self.floor = 0.0  # progress at the current launch: a pause never takes it below
        self.until: float | None = None  # no progress after this (`predicted_ends`)
        self.limit_at: float | None = None  # stopped then: its launch's time limit ends
        self.timed_out = False  # its exit is its time limit's
        # Rescale costs (JobSpec.rescale_up_s/down_s): the GPUs per node it ran on since the last
        # instant, and what it kept after this instant's node losses (None: none lost).
        self.up_s, self.down_s = spec.rescale_up_s, spec.rescale_down_s
        self.min_gpus, self.most_gpus = spec.gpu_range
        self.placed: dict[str, int] = {}
        self.held = 0
        self.base: int | None = None

    def gpu_set(self) -> GpuSet:
        """Its GPUs, (node, index) each: made again only when its parts change."""
        if self.ranks is None:
            self.ranks = frozenset((node, g) for node, gpus in self.parts.items() for g in gpus)
        return self.ranks

    def settle(self, now: float) -> None:
        if self.rate:
            span = (now if self.until is None else min(now, self.until)) - self.since
            self.done = max(self.done + self.rate * max(span, 0.0), self.floor)
        self.since = now


class SimNodes:
    """Every simulated node's agent at once: the jobs' parts on the nodes present, who holds
    each GPU, and the jobs whose parts changed at the current instant (`changed`, `launched`:
    their rates are made again at its end)."""

    def __init__(
        self, cluster: ClusterSpec, cost: PreemptionCost, queues: QueueChanges | None = None
    ) -> None:
        self.cost = cost
        self.queues = queues  # with queues: the GPUs each holds, as parts start and stop
        self.node_specs = {n.node_id: n for n in cluster.nodes()}
        self.node_types = {n.node_id: n.gpu_type for n in self.node_specs.values()}
        self.present: set[str] = set(self.node_specs)
        self.gpus = cluster.total_gpus  # usable GPUs of the nodes present
        self.jobs: dict[str, SimJob] = {}
        self.holding: dict[tuple[str, int], list[str]] = {}  # (node, GPU) -> jobs running there
        self.changed: set[str] = set()
        self.launched: set[str] = set()  # jobs launched at the current instant
        self.running: set[str] = set()  # jobs with parts on some node
        self.preemption_steps = 0.0  # steps lost by jobs whose nodes left

    def add_node(self, spec: NodeSpec) -> None:
        """A node that is not in the cluster from the start (it joins with node events)."""
        self.node_specs[spec.node_id] = spec
        self.node_types[spec.node_id] = spec.gpu_type

    def command(self, cmd: NodeCommand) -> NodeCommandReply:
        """Be the node agent of `cmd.node_id`: stop and start the job parts placed there."""
        if cmd.node_id not in self.node_types:
            raise BadRequest(f"no simulated node {cmd.node_id!r}", field="$.node_id")
        progress: dict[str, float] = {}
        preempted: list[str] = []
        for job_id in cmd.preempt:
            job = self.jobs.get(job_id)
            if job is None:  # it ended (placement hears of that at its next apply): nothing runs
                continue
            preempted.append(job_id)
            job.settle(cmd.now)
            self.partners_alone(self.detach(job_id, cmd.node_id, cmd.now), cmd.now)
            if not job.restarting:  # a distributed job restarts as a whole: checkpoint once
                self.checkpoint(job)
            progress[job_id] = job.done
            self.changed.add(job_id)
        for launch in cmd.launch:
            job = self.jobs[launch.job_id]
            job.settle(cmd.now)
            self.partners_alone(self.detach(launch.job_id, cmd.node_id, cmd.now), cmd.now)
            job.parts[cmd.node_id] = tuple(launch.gpus)
            self.queue_holds(job, cmd.now, len(launch.gpus))
            job.ranks = None
            for g in launch.gpus if job.share is None else ():
                self.holding.setdefault((cmd.node_id, g), []).append(launch.job_id)
            job.gpu_type = self.node_types[cmd.node_id]
            job.attempt = launch.attempt
            limit = launch.time_limit_s
            job.limit_at = None if limit is None else cmd.now + limit
            self.changed.add(launch.job_id)
            self.launched.add(launch.job_id)
            self.running.add(launch.job_id)
        return NodeCommandReply(
            preempted=preempted, launched=[launch.job_id for launch in cmd.launch],
            progress=progress,
        )  # fmt: skip

    def detach(self, job_id: str, node_id: str, now: float) -> list[str]:
        """The job's part on `node_id` stops holding its GPUs at `now`; returns the jobs still
        there."""
        left: list[str] = []
        job = self.jobs[job_id]
        job.ranks = None
        part = job.parts.pop(node_id, ())
        self.queue_holds(job, now, -len(part))
        for g in part if job.share is None else ():
            holders = self.holding[(node_id, g)]
            holders.remove(job_id)
            if not holders:
                del self.holding[(node_id, g)]
            left = holders
        if not job.parts:
            self.running.discard(job_id)
        return left

    def queue_of(self, user: str) -> int:
        """The index of the queue of `user`'s jobs (-1: none, or a run without queues)."""
        return self.queues.index_of(user) if self.queues is not None else -1

    def queue_holds(self, job: SimJob, now: float, gpus: int) -> None:
        """The job holds `gpus` more GPUs (fewer: negative) from `now` on: so does its queue."""
        if self.queues is not None:
            self.queues.change(now, job.queue, gpus)

    def partners_alone(self, partners: list[str], now: float) -> None:
        """Jobs whose space-sharing partner just left their GPUs: they keep the progress made
        at the pair's rate until `now`, and run on at their own rate from then on."""
        for job_id in partners:
            self.jobs[job_id].settle(now)
            self.changed.add(job_id)

    def checkpoint(self, job: SimJob) -> None:
        """The job stops: it keeps what its last checkpoint saved, and pays a restore to resume."""
        checkpoint_s, _ = self.cost.of(job.job_type)
        job.done = job.floor = max(job.done - job.rate * checkpoint_s, 0.0)
        job.restarting, job.restoring = True, True

    def sharing(self) -> dict[str, str]:
        """The changed jobs that run on the very GPUs of another (space sharing), and their
        partners: {job: partner}."""
        pairs: dict[str, str] = {}
        for job_id in self.changed:
            job = self.jobs.get(job_id)
            for node, gpus in job.parts.items() if job is not None else ():
                holders = self.holding.get((node, gpus[0]), []) if gpus else []
                if len(holders) == 2:
                    a, b = holders
                    pairs[a], pairs[b] = b, a
        return pairs

    def gpu_set(self, job_id: str) -> GpuSet | None:
        """The GPUs of a job that has some (`Restarts.pauses`)."""
        job = self.jobs.get(job_id)
        return job.gpu_set() if job is not None and job.parts else None

    def node_events(
        self, events: list[tuple[str, bool]]
    ) -> tuple[dict[str, bool], list[NodeSpec], list[str]]:
        """What an instant's node events change: each node's last state (a node that flips twice
        in one instant ends in its last), the nodes that join and those that leave."""
        final: dict[str, bool] = {}
        for node, up in events:
            final[node] = up
        joining = [
            self.node_specs[n] for n, is_up in final.items() if is_up and n not in self.present
        ]
        leaving = [n for n, is_up in final.items() if not is_up and n in self.present]
        return final, joining, leaving

    def nodes_changed(
        self, now: float, final: dict[str, bool], joined: list[NodeSpec], left: list[str],
        lost_jobs: list[str],
    ) -> None:  # fmt: skip
        """Nodes joined and left (placement has stopped the other parts of `lost_jobs`, the jobs
        that ran on those that left): each of those jobs loses its part there."""
        self.present.difference_update(left)
        self.present.update(n.node_id for n in joined)
        self.gpus = sum(self.node_specs[n].num_gpus for n in self.present)
        for job_id in lost_jobs:
            job = self.jobs.get(job_id)
            if job is None:  # it ended (placement hears of that at its next apply): nothing lost
                continue
            job.settle(now)
            if job.down_s and job.rate > 0:  # its share on the departed nodes is preempted
                lost = job.down_s * job.rate
                job.done -= lost
                job.floor = min(job.floor, job.done)  # (its checkpoint saved no more)
                self.preemption_steps += lost
            job.base = sum(n for node, n in job.placed.items() if node not in final or final[node])
            for node in left:
                self.detach(job_id, node, now)
            if not job.restarting:
                self.checkpoint(job)
            self.changed.add(job_id)
