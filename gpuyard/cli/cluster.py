"""`gpuyard` commands for real clusters: the control plane (`up`), node agents (`nodeagent`) and
jobs (`submit`, `jobs`, `cancel`, `logs`, `nodes`)."""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import getpass
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import msgspec
import nats.errors

from gpuyard.cli.options import (
    LOG_LEVELS,
    CommandError,
    Subcommands,
    add_nats_options,
    add_time_limit_options,
    begin_time,
    check_nats_url,
    checked_subjects,
    checked_text,
    gpus_or_share,
    is_connection_loss,
    job_id_arg,
    nats_auth,
    non_negative_float,
    non_negative_int,
    number,
    open_bus,
    parsed,
    positive_float,
    positive_int,
    reopen_bus,
    run_command,
    run_on_bus,
    time_limit,
)
from gpuyard.jobview import (
    JOB_STATES,
    SCHEDULER_STATES,
    NotAdmitted,
    clock,
    format_jobs,
    job_row,
    not_admitted_row,
    parse_states,
    text_table,
)
from gpuyard.run.embedded import EmbeddedNats, StateDirInUse, StateDirLock
from gpuyard.run.spec import DEFAULT_ADMISSION, DEFAULT_PLACEMENT
from gpuyard.shared.connection import Bus
from gpuyard.shared.contract import (
    LOGS_TAIL_MAX,
    CancelRequest,
    ClusterInfo,
    DoneReply,
    Empty,
    HeartbeatsPage,
    HoldRequest,
    JobQuery,
    LogLine,
    LogsReply,
    LogsRequest,
    RequeueRequest,
)
from gpuyard.shared.durations import slurm_duration
from gpuyard.shared.endpoints import (
    CANCEL,
    CLUSTER,
    HEARTBEATS,
    HOLD,
    LOG_LINE,
    NODE_LOGS,
    QUERY,
    REQUEUE,
    SUBMIT,
)
from gpuyard.shared.errors import TIMED_OUT, RemoteError
from gpuyard.shared.identity import ANONYMOUS
from gpuyard.shared.model import JobRecord, parse_array, parse_dependency
from gpuyard.shared.options import key_values
from gpuyard.shared.policy import PolicyError

ENDED = {"completed", "failed", "cancelled", "timeout"}


def listen_address(text: str) -> str:
    """`HOST:PORT` (`[::1]:4222` for IPv6), PORT 0 to 65535 or -1 (any free one): checked before
    anything is made for the cluster (credentials, certificates)."""
    host, colon, port = text.rpartition(":")
    if not colon or not host.strip("[]"):
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (e.g. 0.0.0.0:4222)")
    try:
        number = int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: the port {port!r} is not a number") from None
    if not -1 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: the port must be 0 to 65535 (-1: any free)")
    return text


def add_cluster_parsers(sub: Subcommands) -> None:
    """Register the real-cluster subcommands."""
    from gpuyard.services.nodeagent.run import add_agent_args

    p = sub.add_parser(
        "up", help="run the control plane (admission, scheduler, placement)",
        description="Run the control plane; without --nats on an embedded server that requires "
        "the credentials it creates in --state-dir on first start.",
    )  # fmt: skip
    add_nats_options(p, url_default=None)
    p.set_defaults(nats_local_profile=False)
    p.add_argument(
        "--state-dir", type=Path,
        help="credentials, profiles and the embedded server's JetStream store (default "
        "$XDG_DATA_HOME/gpuyard/<cluster>, i.e. ~/.local/share/gpuyard/<cluster>)",
    )  # fmt: skip
    p.add_argument(
        "--listen", default="127.0.0.1:4222", type=listen_address,
        help="the embedded server's address (default 127.0.0.1:4222; port -1: any free one); "
        "beyond loopback it serves TLS, with the cluster's own CA (made once in --state-dir/tls) "
        "unless given --tls-cert",
    )  # fmt: skip
    p.add_argument("--tls-cert", type=Path, help="the embedded server's TLS certificate (PEM)")
    p.add_argument("--tls-key", type=Path, help="its private key (PEM)")
    p.add_argument(
        "--tls-ca", type=Path, help="the CA that signed it, written into the profiles for clients"
    )
    p.add_argument(
        "--open", action="store_true",
        help="DANGEROUS, for a laptop: the embedded server requires no credentials; anyone who "
        "reaches it can run any command on every node (loopback only)",
    )  # fmt: skip
    p.add_argument(
        "--broker-restarts", type=non_negative_int, default=5, metavar="N",
        help="the embedded server is started again when it dies, up to N times within "
        "--broker-restart-window; one more death and `up` exits 1 (for systemd to restart it) "
        "(default 5)",
    )  # fmt: skip
    p.add_argument(
        "--broker-restart-window", type=positive_float, default=60.0, metavar="S",
        help="seconds over which --broker-restarts counts the server's deaths (default 60)",
    )  # fmt: skip
    p.add_argument("--policy", default="fifo", help="scheduling policy (default fifo)")
    p.add_argument("--param", action="append", default=[], help="scheduling policy KEY=VALUE")
    p.add_argument(
        "--queues", metavar="FILE",
        help="with --policy kueue: its queues (TOML; `gpuyard policy set scheduler kueue --queues "
        "FILE` applies a new one at runtime)",
    )  # fmt: skip
    p.add_argument(
        "--placement", default=None,
        help=f"placement policy (default {DEFAULT_PLACEMENT}; --elasticflow's scheme's otherwise)",
    )  # fmt: skip
    p.add_argument("--placement-param", action="append", default=[], help="KEY=VALUE")
    p.add_argument(
        "--admission", default=None,
        help=f"admission policy (default {DEFAULT_ADMISSION}; --elasticflow's scheme's otherwise)",
    )  # fmt: skip
    p.add_argument("--admission-param", action="append", default=[], help="KEY=VALUE")
    p.add_argument(
        "--elasticflow", action="store_true",
        help="--policy names an ElasticFlow scheme (ef-accessctrl, ef, edf, edf-accessctrl, "
        "gandiva, dlas-gpu, themis, chronus): its scheduling, admission and placement policies, "
        "--round its scheduling slot",
    )  # fmt: skip
    p.add_argument(
        "--throughputs", default="default",
        help="throughput model (ElasticFlow table or folder, Gavel JSON, BFTrainer CSV): what "
        "deadline admission and elastic policies plan with; measured progress refines it",
    )  # fmt: skip
    p.add_argument(
        "--profiles", metavar="FOLDER",
        help="models' profiles (Pollux's traces/): adaptive jobs of a profiled model (their "
        "--job-type) fit their goodput to its step times where they measured none, and a policy "
        "that reads profiles (--policy pollux) reads these",
    )  # fmt: skip
    p.add_argument(
        "--round", type=positive_float, default=5.0, help="seconds between scheduling rounds"
    )
    p.add_argument(
        "--heartbeat-timeout", type=positive_float, default=95.0,
        help="seconds of silence: node lost, its jobs requeued (above the agents' --lease plus "
        "--grace: by then they stopped them)",
    )  # fmt: skip
    p.add_argument(
        "--min-resolve-s", type=non_negative_float, default=1920.0, metavar="S",
        help="Gavel's policies (time shares): solve again on arrivals, completions and learned "
        "throughputs at most every S seconds (default 1920, Gavel's)",
    )  # fmt: skip
    p.add_argument(
        "--new-jobs-run", action="store_true",
        help="Gavel's policies (time shares): a job that arrived since the last solve may run on "
        "GPUs the allocated jobs leave free (default: it waits for a solve that includes it, as "
        "in Gavel, up to --min-resolve-s)",
    )  # fmt: skip
    p.add_argument(
        "--min-run-s", type=non_negative_float, default=0.0,
        help="preemption guard: a started or resumed job runs at least this long before a "
        "decision may stop it (default 0: off)",
    )  # fmt: skip
    add_time_limit_options(p)
    p.add_argument(
        "--no-durable", dest="durable", action="store_false",
        help="keep the services' state in memory only (by default in JetStream key-value buckets)",
    )  # fmt: skip
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    p.set_defaults(run=cmd_up)

    p = sub.add_parser(
        "nodeagent", help="run this machine's node agent",
        description="Run this machine's node agent; on a secured cluster with the profile an "
        "operator issued for it (`gpuyard auth add-node ID`): --nats-config node.ID.json.",
    )  # fmt: skip
    add_agent_args(p)
    p.set_defaults(run=lambda args, p=p: cmd_nodeagent(args, p))

    p = sub.add_parser(
        "submit",
        help="submit a job",
        description="Submit a job: `gpuyard submit --gpus 2 -- python train.py`, or --file.",
    )
    add_nats_options(p)
    p.add_argument("--file", type=Path, help="a job (or {jobs: [...]}) as JSON or TOML")
    p.add_argument(
        "--gpus", type=gpus_or_share, default=(1, None),
        help="GPUs (default 1); below 1, a share of one GPU that jobs share (0.25: a quarter, "
        "told CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 and GPUYARD_GPU_MILLI=250)",
    )  # fmt: skip
    p.add_argument("--gpu-type", default=None, help="GPU type (default: any)")
    p.add_argument("--min-gpus", type=positive_int, help="elastic: fewest GPUs it runs on")
    p.add_argument("--max-gpus", type=positive_int, help="elastic: most GPUs it can use")
    p.add_argument("--priority", type=int)
    p.add_argument(
        "--priority-class", metavar="NAME",
        help="a priority by the name the cluster's queues file gives it (Kueue's priority classes)",
    )  # fmt: skip
    p.add_argument(
        "--deadline", type=positive_float,
        help="seconds from now by which the job must finish (deadline admission needs --steps)",
    )  # fmt: skip
    p.add_argument(
        "--time-limit", "-t", type=time_limit, dest="time_limit_s", metavar="TIME",
        help="the longest the job may run, its runs together: then it is stopped and ends "
        "TIMEOUT (Slurm's forms: MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]; or 90s, 30m, 2h, 1d)",
    )  # fmt: skip
    p.add_argument(
        "--array", "-a", type=job_array, metavar="INDEXES[%N]",
        help="a job array: one job per index (0-99, 1,3,5-9, 0-15:4), named <id>_<index>, each "
        "told GPUYARD_ARRAY_TASK_ID (and SLURM_ARRAY_TASK_ID); %%N: at most N of them at once",
    )  # fmt: skip
    p.add_argument(
        "--begin", "-b", type=begin_time, dest="begin_time", metavar="TIME",
        help="admitted now, started no sooner than TIME (Slurm's forms: now+10min, now+2h, "
        "18:30, 2026-12-04T18:30, midnight, tomorrow; local time); until then PENDING with "
        "reason BeginTime",
    )  # fmt: skip
    p.add_argument(
        "--dependency", "-d", type=dependency, dest="depends_on", metavar="DEP[,DEP...]",
        help="start only after other jobs (Slurm's forms, all must hold): afterok:J[:J...] "
        "(completed), afterany:J (ended), afternotok:J (failed, cancelled or timed out), after:J "
        "(started), singleton (no earlier job of yours with this name left)",
    )  # fmt: skip
    p.add_argument(
        "--steps", type=positive_float, dest="total_steps",
        help="the job's work in the throughput model's steps (what its job client reports)",
    )  # fmt: skip
    p.add_argument(
        "--job-type", help="the throughput model's name for the job (--throughputs of up)"
    )
    p.add_argument(
        "--rescale-up-s", type=non_negative_float, dest="rescale_up_s", metavar="S",
        help="what growing costs the job, in seconds of its throughput (BFTrainer's Tcup; "
        "default 0)",
    )  # fmt: skip
    p.add_argument(
        "--rescale-down-s", type=non_negative_float, dest="rescale_down_s", metavar="S",
        help="what shrinking, or losing a node, costs it (BFTrainer's Tcdw; default 0)",
    )  # fmt: skip
    p.add_argument("--name", default=None)
    p.add_argument("--job-id", default=None)
    p.add_argument("--per-node", action="store_true", help="one process per node, not per GPU")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for the job")
    p.add_argument(
        "--chdir", "--workdir", dest="chdir", type=Path, default=None, metavar="DIR",
        help="the directory the job starts in on its nodes (default: this one, as Slurm does; "
        "a job file's own `workdir` wins)",
    )  # fmt: skip
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    p.set_defaults(run=cmd_submit)

    p = sub.add_parser(
        "jobs", help="list jobs (queue and history)",
        description="Jobs with their state and the reason for it now (states and reasons: "
        "docs/cli.md), user, nodes, elapsed time and progress; rejected and held jobs too.",
    )  # fmt: skip
    add_nats_options(p)
    p.add_argument(
        "--state", action="append", default=[], metavar="STATE[,STATE...]",
        help=f"only jobs in these states (any case): {', '.join(JOB_STATES)}",
    )  # fmt: skip
    p.add_argument("--user", action="append", default=[], help="only this user's jobs")
    p.add_argument("--limit", type=positive_int, help="only the N most recently submitted")
    p.add_argument("--json", action="store_true", help="the rows as JSON, with the job records")
    p.add_argument("job_ids", nargs="*", help="only these jobs (an unknown one is an error)")
    p.set_defaults(run=cmd_jobs)

    p = sub.add_parser(
        "cancel", help="cancel jobs: those named, or those of a user and/or in a state",
        description="Cancel jobs, as scancel does: those named, or every job not ended of --user "
        "and/or in --state (a user cancels only their own).",
    )  # fmt: skip
    add_nats_options(p)
    p.add_argument("--user", help="every job of this user not ended (with no job named)")
    p.add_argument(
        "--state", action="append", default=[], metavar="STATE[,STATE...]",
        help="every job in these states (with no job named): PENDING (REQUEUED too), RUNNING",
    )  # fmt: skip
    p.add_argument("job_ids", nargs="*")
    p.set_defaults(run=cmd_cancel)

    p = sub.add_parser(
        "hold", help="hold waiting jobs: they start no more until released",
        description="Hold waiting jobs (reason JobHeldUser, or JobHeldAdmin when an operator "
        "holds them): they start no more until `gpuyard release`. A user holds their own jobs; "
        "only an operator releases an operator's hold. A running job: `gpuyard requeue --hold`.",
    )  # fmt: skip
    add_nats_options(p)
    p.add_argument("job_ids", nargs="+")
    p.set_defaults(run=cmd_hold, release=False)

    p = sub.add_parser("release", help="release held jobs: they wait to start again")
    add_nats_options(p)
    p.add_argument("job_ids", nargs="+")
    p.set_defaults(run=cmd_hold, release=True)

    p = sub.add_parser(
        "requeue", help="stop running jobs and queue them again",
        description="Stop running jobs as a preemption does (they checkpoint if they can) and "
        "queue them again, in their place; --hold holds them too (a waiting job is then only "
        "held).",
    )  # fmt: skip
    add_nats_options(p)
    p.add_argument("--hold", action="store_true", help="hold them too, until released")
    p.add_argument("job_ids", nargs="+")
    p.set_defaults(run=cmd_requeue)

    p = sub.add_parser("logs", help="a job's output (all ranks)")
    add_nats_options(p)
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    p.add_argument(
        "--tail", type=number(int, ge=0, le=LOGS_TAIL_MAX), default=65536,
        help=f"bytes per rank from the log files (at most {LOGS_TAIL_MAX})",
    )  # fmt: skip
    p.add_argument("job_id", type=job_id_arg)
    p.set_defaults(run=cmd_logs)

    p = sub.add_parser("nodes", help="nodes, their GPUs and last heartbeats")
    add_nats_options(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_nodes)


# --------------------------------------------------------------------------- up


def cmd_up(args: argparse.Namespace) -> int:
    from gpuyard.shared.logs import configure_logging

    configure_logging(args.log_level)
    return run_command("up", run_control_plane(args))


def cmd_nodeagent(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """A node agent retries a server it cannot reach (as a service should), but not a bad URL."""
    from gpuyard.natsauth import SYSTEM_STATE_DIR, default_state_dir
    from gpuyard.services.nodeagent.run import run_from_args

    try:
        check_nats_url(args.nats)
    except ValueError as exc:
        parser.error(str(exc))
    # A control plane's state that may be on this machine: no job may read it.
    args.protect += [str(SYSTEM_STATE_DIR), str(default_state_dir(args.cluster or "default"))]
    return run_from_args(args, parser)


RETRY_FOR_S = 60.0
"""How long the control plane's services retry a call while its callee restarts."""


def control_plane_configs(
    policy: str = "fifo", placement: str = "consolidated", admission: str = "accept-all",
    round_s: float = 5.0, heartbeat_timeout_s: float = 95.0, durable: bool = True, *,
    min_run_s: float = 0.0, policy_params: dict[str, Any] | None = None,
    placement_params: dict[str, Any] | None = None, admission_params: dict[str, Any] | None = None,
    throughputs: str = "default", mode: Literal["rounds", "events", "slots"] = "events",
    min_resolve_s: float = 1920.0, new_jobs_wait: bool = True,
    default_time_limit_s: float | None = None, max_time_limit_s: float | None = None,
    goodput_profiles: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The services of a real cluster's control plane: the scheduler ticks on the wall clock.

    `durable`: their state lives in JetStream key-value buckets, so any of them can be killed and
    started again (or replaced) mid-run; their calls to one another retry while the callee restarts.
    `throughputs`: the model the scheduler (learning from progress) and admission plan with.
    `mode`: as `SchedulerConfig.mode` (`slots`: at events, at most once a round). `min_resolve_s`: how
    often Gavel's policies may be asked again, `new_jobs_wait`: whether a job newer than their
    allocation waits for one that includes it (`TimeShareConfig`). `goodput_profiles`: the models'
    profiles adaptive jobs' goodput fits start from (`SchedulerConfig.goodput_profiles`).
    """
    from gpuyard.services.admission.service import AdmissionConfig
    from gpuyard.services.placement.service import PlacementConfig
    from gpuyard.services.scheduler.mechanism import TimeShareConfig
    from gpuyard.services.scheduler.service import SchedulerConfig

    return {
        "placement": PlacementConfig(
            policy=placement,
            params=placement_params or {},
            heartbeat_timeout_s=heartbeat_timeout_s,
            durable=durable,
        ),
        "scheduler": SchedulerConfig(
            policy=policy,
            params=policy_params or {},
            clock="wall",
            mode=mode,
            throughputs=throughputs,
            learn_throughputs=True,
            time_shares=TimeShareConfig(min_resolve_s=min_resolve_s, new_jobs_wait=new_jobs_wait),
            goodput_profiles=goodput_profiles,
            round_s=round_s,
            min_run_s=min_run_s,
            durable=durable,
            call_timeout_s=10.0,
            retry_for_s=RETRY_FOR_S,
        ),
        "admission": AdmissionConfig(
            policy=admission,
            params=admission_params or {},
            throughputs=throughputs,
            durable=durable,
            call_timeout_s=15.0,
            retry_for_s=RETRY_FOR_S,
            require_command=True,
            reconsider_on_events=True,
            default_time_limit_s=default_time_limit_s,
            max_time_limit_s=max_time_limit_s,
        ),
    }


def control_plane_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """`gpuyard up`'s services from its options; ValueError or PolicyError names a bad one.

    `--elasticflow`: the scheme's policies as `gpuyard sim --elasticflow --as-intended` sets
    them (without the simulated restart costs: on a real cluster restarts cost what they cost)."""
    from gpuyard.shared.policy import PolicyChoice, PolicySet, parse_params, scheduling_policies

    params = (parse_params(args.param), parse_params(args.admission_param),
              parse_params(args.placement_param))  # fmt: skip
    if args.queues is not None:
        from gpuyard.policies.kueue import queue_params

        if args.policy != "kueue":
            raise ValueError("--queues gives the kueue policy its queues: add --policy kueue")
        params[0].update(queue_params(args.queues))
    chosen: dict[str, Any] = {
        "policy": args.policy, "policy_params": params[0],
        "admission": args.admission or DEFAULT_ADMISSION, "admission_params": params[1],
        "placement": args.placement or DEFAULT_PLACEMENT, "placement_params": params[2],
        "mode": "events",
    }  # fmt: skip
    if args.elasticflow:
        from gpuyard.run.presets import elasticflow_options, preset_filled

        # Answered at once; as its simulator meant, not with its accidents (gandiva-ts).
        scheme = elasticflow_options(args.policy, args.round, 0, at_events=False, as_intended=True)
        # On a real cluster a job moved is a job restarted: buddy keeps jobs where they run
        # (`--placement node-sets` places as ElasticFlow's simulator does, every job again).
        scheme |= {"placement": "buddy", "placement_params": {}}
        filled = preset_filled(scheme, mode=getattr(args, "mode", None), admission=args.admission,
                               placement=args.placement, params=params)  # fmt: skip
        chosen = {key: filled[key] for key in chosen}
    if args.throughputs != "default" and not Path(args.throughputs).exists():
        raise ValueError(f"--throughputs {args.throughputs}: no such file or folder")
    profiles = None
    if args.profiles is not None:
        from gpuyard.shared.goodput import load_applications

        profiles = str(Path(args.profiles).resolve())
        try:
            load_applications(Path(profiles))  # (read again by the scheduler: checked here)
        except (ValueError, OSError) as exc:
            raise ValueError(f"--profiles {args.profiles}: {exc}") from None
        takes = msgspec.structs.fields(scheduling_policies.get(chosen["policy"]).Params)
        if any(f.name == "profiles" for f in takes) and "profiles" not in chosen["policy_params"]:
            chosen["policy_params"] = {**chosen["policy_params"], "profiles": profiles}
    policies = PolicySet(
        scheduling=PolicyChoice(name=chosen["policy"], params=chosen["policy_params"]),
        admission=PolicyChoice(name=chosen["admission"], params=chosen["admission_params"]),
        placement=PolicyChoice(name=chosen["placement"], params=chosen["placement_params"]),
    )
    made = policies.made()
    for service, registry, choice in policies.by_service():
        if made[service].needs.throughputs and args.throughputs == "default":
            raise ValueError(
                f"{registry.kind} policy {choice.name!r} plans with measured throughputs: give "
                f"--throughputs FILE (e.g. an ElasticFlow table of your job types)"
            )
    return control_plane_configs(
        round_s=args.round, heartbeat_timeout_s=args.heartbeat_timeout, durable=args.durable,
        min_run_s=args.min_run_s, throughputs=args.throughputs,
        min_resolve_s=args.min_resolve_s, new_jobs_wait=not args.new_jobs_run,
        default_time_limit_s=args.default_time_limit, max_time_limit_s=args.max_time_limit,
        goodput_profiles=profiles, **chosen,
    )  # fmt: skip


def _open_warning(listen: str) -> None:
    import structlog

    host = listen.rsplit(":", 1)[0].strip("[]")
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise CommandError(f"--open serves loopback only, not --listen {listen}", code=2)
    structlog.get_logger().warning(
        "auth.disabled", listen=listen,
        danger="anyone who can reach this server can run any command on every node",
    )  # fmt: skip
    print(
        "gpuyard up: WARNING: --open: the server requires no credentials; anyone who can reach "
        f"{listen} can submit, cancel, forge events and run any command on every node",
        file=sys.stderr, flush=True,
    )  # fmt: skip


def _server_tls(args: argparse.Namespace) -> Any:
    from gpuyard.run.embedded import ServerTls

    if (args.tls_cert is None) != (args.tls_key is None):
        raise CommandError("--tls-cert and --tls-key go together", code=2)
    for option in ("tls_cert", "tls_key", "tls_ca"):
        path = getattr(args, option)
        if path is not None and not path.is_file():
            raise CommandError(f"--{option.replace('_', '-')} {path}: no such file", code=2)
    return ServerTls(args.tls_cert, args.tls_key) if args.tls_cert else None


WILDCARDS = ("0.0.0.0", "::", "[::]", "")


async def _embedded_tls(args: argparse.Namespace, state: Path) -> tuple[Any, str | None]:
    """The embedded server's TLS, and the CA the profiles carry: the operator's own certificate
    (`--tls-cert/--tls-key/--tls-ca`, the CA's path); else, listening beyond loopback, the
    cluster's, made by `up` (its CA made once in `<state>/tls/`, carried as PEM in the profiles so
    they work on any machine); on loopback none (plain, as the server is reached from here only)."""
    import ipaddress

    from gpuyard.pki import cluster_tls
    from gpuyard.run.embedded import ServerTls

    tls = _server_tls(args)
    if tls is not None or args.open:
        return tls, str(args.tls_ca.resolve()) if args.tls_ca else None
    host = args.listen.rsplit(":", 1)[0].strip("[]") if ":" in args.listen else args.listen
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return None, str(args.tls_ca.resolve()) if args.tls_ca else None
    names = await asyncio.to_thread(_server_names, host)
    ca, cert, key = await asyncio.to_thread(cluster_tls, state / "tls", names, args.cluster)
    print(
        f"gpuyard up: TLS with the cluster's CA {ca} (server certificate for "
        f"{', '.join(names)}; your own: --tls-cert --tls-key --tls-ca)",
        file=sys.stderr, flush=True,
    )  # fmt: skip
    return ServerTls(cert, key), ca.read_text()


def _server_names(host: str) -> list[str]:
    """The names clients may reach a server listening on `host` by: that address, this host's
    name and, on every interface (a wildcard), its addresses and loopback too. (DNS: in a thread.)"""
    import socket

    hostname = socket.gethostname()
    if host not in WILDCARDS:
        return list(dict.fromkeys([host, hostname, socket.getfqdn()]))
    names = [hostname, socket.getfqdn()]
    with contextlib.suppress(OSError):
        names += sorted({str(a[4][0]) for a in socket.getaddrinfo(hostname, None)})
    return list(dict.fromkeys([*names, "localhost", "127.0.0.1", "::1"]))


def _wildcard_urls(url: str) -> tuple[str, str]:
    """(the URL the services here connect to, the URL the profiles carry) of a server at `url`:
    on every interface (`0.0.0.0`), loopback here and this host's name elsewhere; else `url`."""
    import socket

    scheme, _, rest = url.partition("://")
    host, _, port = rest.rpartition(":")
    if host.strip("[]") not in WILDCARDS:
        return url, url
    return f"{scheme}://127.0.0.1:{port}", f"{scheme}://{socket.gethostname()}:{port}"


async def run_control_plane(args: argparse.Namespace) -> int:
    import signal

    from gpuyard.natsauth import OPERATOR, Credentials, default_state_dir
    from gpuyard.run.launcher import ServiceSet
    from gpuyard.shared.connection import NatsAuth
    from gpuyard.shared.identity import Caller

    checked_subjects(args.cluster)
    try:
        configs = control_plane_from_args(args)
    except (ValueError, PolicyError) as exc:
        raise CommandError(str(exc), code=2) from None
    state = (args.state_dir or default_state_dir(args.cluster)).expanduser().resolve()
    creds = Credentials(state, args.cluster)
    if args.open and args.nats:
        raise CommandError("--open is for the embedded server; with --nats the server decides")
    lock = StateDirLock(state)
    if not args.nats:  # the store, the credentials and the profiles are one `up`'s at a time
        try:
            lock.acquire()
        except StateDirInUse as exc:
            raise CommandError(str(exc)) from None
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(lock.release)
        server: EmbeddedNats | None = None
        operator: NatsAuth | None = None
        services: dict[str, NatsAuth] = {}
        if args.nats:  # reachable? (else one line, not services retrying forever)
            await (await open_bus(args, "gpuyard-up")).close()
            url = args.nats
            operator = nats_auth(args)
            if creds.exists:  # each service as itself (`gpuyard auth init` for this server)
                services = {
                    n: NatsAuth.from_profile(creds.profile(Caller("svc", n))) for n in configs
                }
        else:
            if args.open:
                _open_warning(args.listen)
                state.mkdir(parents=True, exist_ok=True, mode=0o700)
            elif creds.init():
                print(f"gpuyard up: created the cluster's credentials in {state}", file=sys.stderr)
            tls, tls_ca = await _embedded_tls(args, state)
            server = EmbeddedNats(
                state_dir=state, listen=args.listen, tls=tls,
                auth=None if args.open else creds.users_conf,
            )  # fmt: skip
            try:
                url = await stack.enter_async_context(server)
            except RuntimeError as exc:
                raise CommandError(f"the embedded NATS server did not start: {exc}") from None
            url, reachable = _wildcard_urls(url)
            lock.record(reachable)
            if not args.open:
                creds.set_server(reachable, tls_ca)
                operator = NatsAuth.from_profile(creds.profile(OPERATOR))
                services = {
                    n: NatsAuth.from_profile(creds.profile(Caller("svc", n))) for n in configs
                }
        # From here a SIGTERM stops `up` cleanly (status 0), however soon after the line below.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        service_set = ServiceSet(url, args.cluster, configs, auth=operator, service_auth=services)
        await service_set.start()
        stack.push_async_callback(service_set.stop)
        print(f"gpuyard control plane up: --nats {url} --cluster {args.cluster}", flush=True)
        if not args.nats and not args.open:
            print(
                f"  operator profile: {creds.profile_path(OPERATOR)} (gpuyard commands on this "
                f"machine use it by default)\n"
                f"  a node's credentials: gpuyard auth add-node ID --state-dir {state}",
                flush=True,
            )
        if server is None:
            await stop.wait()
            code = 0
        else:
            code = await supervise_broker(
                server, stop, restarts=args.broker_restarts, window_s=args.broker_restart_window,
                back=service_set.wait_ready,
            )  # fmt: skip
        print("stopping", file=sys.stderr, flush=True)
    return code


async def supervise_broker(
    server: EmbeddedNats, stop: asyncio.Event, *, restarts: int, window_s: float,
    back: Callable[[], Awaitable[None]],
) -> int:  # fmt: skip
    """Until `stop`: start the embedded server again whenever it dies (same address, same store;
    the services reconnect by themselves, and `back` waits for them to answer), one line each
    time. Its `restarts + 1`th death within `window_s` seconds, or a failed restart, ends `up`
    with 1: something is wrong that starting it again does not mend, and a service manager
    (systemd) may do better."""
    deaths: collections.deque[float] = collections.deque()
    stopping = asyncio.ensure_future(stop.wait())

    async def again() -> str:
        url = await server.restart()
        await back()
        return url

    try:
        while True:
            died = asyncio.ensure_future(server.wait())
            await asyncio.wait([stopping, died], return_when=asyncio.FIRST_COMPLETED)
            if stopping.done():
                died.cancel()
                return 0
            how = exit_description(died.result())
            now = time.monotonic()
            deaths.append(now)
            while deaths[0] < now - window_s:
                deaths.popleft()
            if len(deaths) > restarts:
                print(
                    f"gpuyard up: the embedded NATS server {how}, {len(deaths)} deaths within "
                    f"{window_s:g} s (--broker-restarts {restarts}): exiting",
                    file=sys.stderr, flush=True,
                )  # fmt: skip
                return 1
            restarted = asyncio.ensure_future(again())
            await asyncio.wait([stopping, restarted], return_when=asyncio.FIRST_COMPLETED)
            if not restarted.done():  # (SIGTERM meanwhile: no need to wait for the services)
                restarted.cancel()
                with contextlib.suppress(asyncio.CancelledError, RuntimeError, TimeoutError):
                    await restarted
                return 0
            try:
                url = restarted.result()
            except (RuntimeError, TimeoutError) as exc:
                first = str(exc).splitlines()[-1] if str(exc) else "the services did not answer"
                print(
                    f"gpuyard up: the embedded NATS server {how} and the cluster did not come "
                    f"back: {first}",
                    file=sys.stderr, flush=True,
                )  # fmt: skip
                return 1
            print(
                f"gpuyard up: the embedded NATS server {how}; started it again on {url}, and "
                "the services answer again",
                file=sys.stderr, flush=True,
            )  # fmt: skip
    finally:
        stopping.cancel()


def exit_description(code: int) -> str:
    """`exited (3)`, or `was killed (SIGKILL)` for a negative code."""
    import signal

    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed ({signal.Signals(-code).name})"
        return f"was killed (signal {-code})"
    return f"exited ({code})"


# --------------------------------------------------------------------------- submit


def job_from_args(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The job(s) to submit, as plain dicts: admission validates them and names a bad field.

    Every job names a command, and starts in `--chdir` (default: the working directory) unless
    its file gives a `workdir`."""
    workdir = str((args.chdir or Path.cwd()).absolute())
    if args.file is not None:
        from gpuyard.workloads.core import read_document  # pandas: only when there is a file

        data = read_document(args.file)
        jobs = data["jobs"] if isinstance(data, dict) and "jobs" in data else [data]
        for i, given in enumerate(jobs):
            if not isinstance(given, dict):
                continue  # admission names what is wrong with it
            if not given.get("command"):
                where = f"job {i + 1}" if len(jobs) > 1 else "the job"
                raise ValueError(f"{args.file}: {where} has no `command`: nothing would run")
            given.setdefault("workdir", workdir)
        return jobs
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise ValueError("give the job's command after `--` (or --file)")
    gpus, share = args.gpus
    job: dict[str, Any] = {"num_gpus": gpus, "command": command, "workdir": workdir}
    if share is not None:
        job["gpu_milli"] = share
    for key in ("gpu_type", "min_gpus", "max_gpus", "priority", "priority_class", "name", "job_id",
                "job_type", "total_steps", "rescale_up_s", "rescale_down_s", "time_limit_s",
                "depends_on", "begin_time"):  # fmt: skip
        value = getattr(args, key, None)
        if value is not None:
            job[key] = value
    if args.deadline is not None:  # a job's deadline is absolute, on the clock of its submission
        job["deadline"] = time.time() + args.deadline
    if args.per_node:
        job["processes"] = "per_node"
    env = key_values("--env", args.env)
    if env:
        job["env"] = env
    if args.array is None:
        return [job]
    tasks, limit = args.array
    array = {"count": len(tasks), "low": min(tasks), "high": max(tasks), "limit": limit}
    return [job | {"array": {"task": t, **array}} for t in tasks]


job_array = parsed(parse_array)
"""`--array`'s value: the task ids and the limit (a usage error says what is wrong)."""
dependency = checked_text(parse_dependency)
"""`--dependency`'s value, checked (a usage error says what is wrong)."""


SUBMIT_WAIT_S = 30.0
"""How long `gpuyard submit` waits for admission's answer: the answer follows the jobs' durable
writes, which wait out a broker's failover (a new leader for the services' buckets)."""


def cmd_submit(args: argparse.Namespace) -> int:
    try:
        jobs = job_from_args(args)
    except (OSError, ValueError) as exc:
        print(f"gpuyard submit: {exc}", file=sys.stderr)
        return 2

    async def body(bus: Bus) -> int:
        if bus.caller == ANONYMOUS:  # an open server: no identity, so the login names the user
            for job in jobs:
                if isinstance(job, dict):
                    job.setdefault("user", getpass.getuser())
        # (as written: admission refuses a malformed job alone, naming its place and field)
        try:
            reply = await bus.call(SUBMIT, {"jobs": jobs})
        except RemoteError as exc:
            if exc.reply.error != TIMED_OUT:
                raise
            raise CommandError(
                f"no answer from admission within {SUBMIT_WAIT_S:g} s: the jobs may have been "
                "admitted all the same (`gpuyard jobs` lists them)"
            ) from None
        bad = 0
        for r in reply.results:
            if r.verdict == "admit":
                print(f"submitted {r.job_id}")
            elif r.verdict == "hold":  # accepted, waiting for admission's next look
                print(f"held {r.job_id}: {r.reason}")
            else:
                bad += 1
                print(f"rejected {r.job_id or 'a job'}: {r.reason}", file=sys.stderr)
        return 1 if bad else 0

    return run_on_bus("submit", args, body, request_timeout=SUBMIT_WAIT_S)


# --------------------------------------------------------------------------- jobs, cancel


async def not_admitted(bus: Bus) -> dict[str, NotAdmitted]:
    """Jobs admission held or rejected, from its events (they never reach the scheduler)."""
    from gpuyard.ops import NoEventStream, read_events

    try:
        events = [
            stored.event
            async for stored in read_events(
                bus.nc, bus.subjects, types=["job.held", "job.rejected"], idle_s=0.2
            )
            if stored.event is not None
        ]
    except NoEventStream:
        return {}
    return NotAdmitted.latest(events)


async def all_records(bus: Bus, query: JobQuery) -> list[JobRecord]:
    records: list[JobRecord] = []
    while True:
        page = await bus.call(QUERY, msgspec.structs.replace(query, offset=len(records)))
        records += page.jobs
        if not page.jobs or len(records) >= page.total:
            return records


def cmd_jobs(args: argparse.Namespace) -> int:
    try:
        states = parse_states(args.state)
    except ValueError as exc:
        print(f"gpuyard jobs: {exc}", file=sys.stderr)
        return 2
    internal = sorted({SCHEDULER_STATES[s] for s in states if s in SCHEDULER_STATES})

    async def body(bus: Bus) -> int:
        now = time.time()
        query = JobQuery(job_ids=args.job_ids, states=internal, limit=10_000, reasons=True)
        records = await all_records(bus, query) if internal or not states else []
        rows = [job_row(r, now) for r in records]
        if not states or {"PENDING", "REJECTED"} & states:
            others = await not_admitted(bus)
            if args.job_ids:
                others = {j: others[j] for j in args.job_ids if j in others}
            if others:  # held, then admitted (or a rejected duplicate of a job's id): a record
                query = JobQuery(job_ids=list(others), limit=10_000)
                known = {r.job_id for r in await all_records(bus, query)}
                rows += [not_admitted_row(j) for j in others.values() if j.job_id not in known]
        if states:
            rows = [r for r in rows if r["job_state"] in states]
        if args.user:
            rows = [r for r in rows if r["user"] in args.user]
        rows.sort(key=lambda r: r["submit_time"])
        if args.limit:
            rows = rows[-args.limit :]
        if args.json:
            print(msgspec.json.encode({"jobs": rows, "total": len(rows)}).decode())
        else:
            print(format_jobs(rows, now))
        shown = {r["job_id"] for r in rows} | {
            array["array_id"] for r in rows if (array := r.get("spec", {}).get("array"))
        }  # (an array's id stands for its tasks)
        missing = [j for j in args.job_ids if j not in shown]
        if missing and not states and not args.user:
            print(f"gpuyard jobs: no such job: {', '.join(missing)}", file=sys.stderr)
            return 1
        return 0

    return run_on_bus("jobs", args, body)


def cmd_cancel(args: argparse.Namespace) -> int:
    try:
        states = cancel_states(args.state)
    except ValueError as exc:
        print(f"gpuyard cancel: {exc}", file=sys.stderr)
        return 2
    if args.job_ids and (args.user or states):
        print("gpuyard cancel: name jobs, or choose them with --user/--state: not both",
              file=sys.stderr)  # fmt: skip
        return 2
    if not (args.job_ids or args.user or states):
        print("gpuyard cancel: name the jobs, or choose them with --user and/or --state",
              file=sys.stderr)  # fmt: skip
        return 2
    request = CancelRequest(job_ids=args.job_ids, user=args.user, states=states)

    async def body(bus: Bus) -> int:
        reply = await bus.call(CANCEL, request)
        for job_id in reply.cancelled:
            print(f"cancelled {job_id}")
        for job_id, why in reply.refused.items():
            print(f"not cancelled {job_id}: {why}", file=sys.stderr)
        if not reply.cancelled and not reply.refused:
            print("no job to cancel", file=sys.stderr)
        return 1 if reply.refused else 0

    return run_on_bus("cancel", args, body)


def cancel_states(values: list[str]) -> list[Literal["queued", "running"]]:
    """`--state pending,running` -> the scheduler's states (PENDING takes REQUEUED too)."""
    chosen = parse_states(values)
    if wrong := sorted(chosen - {"PENDING", "REQUEUED", "RUNNING"}):
        raise ValueError(f"--state {wrong[0]}: only waiting (PENDING, REQUEUED) or RUNNING jobs "
                         "are cancelled")  # fmt: skip
    states: list[Literal["queued", "running"]] = []
    if chosen & {"PENDING", "REQUEUED"}:
        states.append("queued")
    if "RUNNING" in chosen:
        states.append("running")
    return states


def print_done(reply: DoneReply, done: str) -> int:
    """`held j3` per job done, `not held j4: why` on stderr per job refused; 1 if any was."""
    for job_id in reply.done:
        print(f"{done} {job_id}")
    for job_id, why in reply.refused.items():
        print(f"not {done} {job_id}: {why}", file=sys.stderr)
    return 1 if reply.refused else 0


def cmd_hold(args: argparse.Namespace) -> int:
    async def body(bus: Bus) -> int:
        reply = await bus.call(HOLD, HoldRequest(job_ids=args.job_ids, release=args.release))
        return print_done(reply, "released" if args.release else "held")

    return run_on_bus("release" if args.release else "hold", args, body)


def cmd_requeue(args: argparse.Namespace) -> int:
    async def body(bus: Bus) -> int:
        reply = await bus.call(REQUEUE, RequeueRequest(job_ids=args.job_ids, hold=args.hold))
        return print_done(reply, "requeued")

    return run_on_bus("requeue", args, body)


# --------------------------------------------------------------------------- logs, nodes


def cmd_logs(args: argparse.Namespace) -> int:
    live: asyncio.Queue[tuple[str, LogLine]] = asyncio.Queue()
    decoder = msgspec.json.Decoder(LogLine)

    async def subscribe(bus: Bus) -> None:
        async def on_line(msg: Any) -> None:
            sender = bus.subjects.sender(LOG_LINE, msg.subject)
            with contextlib.suppress(msgspec.ValidationError, msgspec.DecodeError):
                line = decoder.decode(msg.data)
                if sender is not None and line.node_id == sender.name:
                    live.put_nowait((sender.name, line))

        await bus.nc.subscribe(bus.subjects.every(LOG_LINE, job=args.job_id), cb=on_line)

    async def body(bus: Bus) -> int:
        if args.follow:  # subscribe first: no line falls between the files and the stream
            await subscribe(bus)
        placed = await _placed(bus, args.job_id)
        # The files only from the nodes the job ran on: any other node's would be made up.
        page = await bus.call(QUERY, JobQuery(job_ids=[args.job_id]))
        if not page.jobs:  # (as `gpuyard jobs` says)
            print(f"gpuyard logs: no such job: {args.job_id}", file=sys.stderr)
            return 1
        ran_on = sorted({*placed, *(node for job in page.jobs for node in job.ran_on)})
        replies = await asyncio.gather(
            *(
                bus.call(
                    NODE_LOGS,
                    LogsRequest(job_id=args.job_id, tail_bytes=args.tail),
                    within_s=5.0,
                    node=node,
                )
                for node in ran_on
            ),
            return_exceptions=True,
        )
        for reply in replies:
            if isinstance(reply, LogsReply):
                for line in reply.lines:
                    print(line)
        sys.stdout.flush()
        if not args.follow:
            return 0
        return await _follow_lines(args, bus, live, subscribe, placed)

    return run_on_bus("logs", args, body, reports_loss=args.follow)


async def _placed(bus: Bus, job_id: str) -> set[str]:
    """The nodes `job_id` runs on now."""
    info = await bus.call(CLUSTER, Empty())
    return {g.node_id for g in info.busy.get(job_id, [])}


async def _follow_lines(
    args: argparse.Namespace, bus: Bus, live: asyncio.Queue[tuple[str, LogLine]],
    subscribe: Callable[[Bus], Awaitable[None]], placed: set[str],
) -> int:  # fmt: skip
    """`logs -f`: print the job's live lines until it ends. Live lines are plain publishes: a
    lost connection loses those published meanwhile (the job's files keep them), so it is one
    line saying so, and the lines go on, on the connection the client got back or a new one."""
    current, reconnects = bus, bus.nc.stats["reconnects"]
    try:
        while True:
            if current.nc.is_closed or current.nc.stats["reconnects"] != reconnects:
                print(
                    "gpuyard logs: lost the connection to NATS; lines written meanwhile are in "
                    f"the job's log files (gpuyard logs {args.job_id})", file=sys.stderr,
                    flush=True,
                )  # fmt: skip
                if current.nc.is_closed:
                    if current is not bus:
                        await current.close()
                    current = await reopen_bus(args, "gpuyard-logs")
                    await subscribe(current)
                reconnects = current.nc.stats["reconnects"]
            try:
                try:
                    async with asyncio.timeout(1.0):
                        node, line = await live.get()
                except TimeoutError:
                    page = await current.call(QUERY, JobQuery(job_ids=[args.job_id]))
                    if not page.jobs or page.jobs[0].state in ENDED:
                        return 0
                    continue
                if node not in placed:  # believed only from a node the job runs on
                    placed = await _placed(current, args.job_id)
                    if node not in placed:
                        continue
                print(f"[{line.node_id} rank{line.rank}] {line.line}", flush=True)
            except (nats.errors.Error, RemoteError) as exc:
                # The connection is going (said above once gone), or a service is not back yet.
                if not (exc.transient if isinstance(exc, RemoteError) else is_connection_loss(exc)):
                    raise
                await asyncio.sleep(0.2)
    finally:
        if current is not bus:
            await current.close()


def cmd_nodes(args: argparse.Namespace) -> int:
    async def body(bus: Bus) -> int:
        info = await bus.call(CLUSTER, Empty())
        beats = await bus.call(HEARTBEATS, Empty())
        if args.json:
            print(msgspec.json.encode({"cluster": info, "heartbeats": beats}).decode())
            return 0
        print(format_nodes(info, beats, time.time()))
        return 0

    return run_on_bus("nodes", args, body)


LATE_BEATS = 3
"""Heartbeats an agent may miss before `gpuyard nodes` marks its node not responding (`*`)."""


def format_nodes(info: ClusterInfo, beats: HeartbeatsPage, now: float) -> str:
    """Nodes up (UP; IDLE, MIXED or ALLOC by busy GPUs, as Slurm says; a draining one DRAIN while
    jobs still hold GPUs there, DRAINED once none does, with the reason; `*` after the state of
    one whose agent missed `LATE_BEATS` heartbeats, as Slurm marks a node not responding, until
    it is declared lost) and nodes that left or were lost (DOWN, why, since when), with their
    last heartbeat."""
    busy: dict[str, int] = {}
    for gpus in info.busy.values():
        for g in gpus:
            busy[g.node_id] = busy.get(g.node_id, 0) + 1
    last = {b.node_id: b for b in beats.beats}
    rows = [("NODE", "STATE", "TYPE", "GPUS", "BUSY", "SOURCE", "HEARTBEAT", "UTIL%", "MEM_MIB",
             "ADDRESS")]  # fmt: skip

    def heartbeat(node_id: str) -> str:
        seen = beats.received.get(node_id)
        return f"{now - seen:.1f}s ago" if seen else "-"

    for n in sorted(info.nodes, key=lambda n: n.node_id):
        b = last.get(n.node_id)
        util = [g.utilization for g in b.gpus if g.utilization is not None] if b else []
        mem = [g.memory_used_mib for g in b.gpus if g.memory_used_mib is not None] if b else []
        used = busy.get(n.node_id, 0)
        state = "IDLE" if not used else "ALLOC" if used >= n.num_gpus else "MIXED"
        if (reason := info.draining.get(n.node_id)) is not None:
            state = f"{'DRAIN' if used else 'DRAINED'} ({reason})"
        seen, every = beats.received.get(n.node_id), beats.every.get(n.node_id)
        if seen is not None and every and now - seen > LATE_BEATS * every:
            word, space, rest = state.partition(" ")  # ("DRAIN* (reason)")
            state = f"{word}*{space}{rest}"
        rows.append(
            (
                n.node_id, state, n.gpu_type, str(n.num_gpus), str(used),
                n.labels.get("gpu_source", "-"), heartbeat(n.node_id),
                f"{sum(util) / len(util):.0f}" if util else "-", str(sum(mem)) if mem else "-",
                n.address or "-",
            )
        )  # fmt: skip
    for node_id, since in sorted(info.down.items()):
        # (Slurm's down+drain: it stays drained when it returns)
        state = "DOWN+DRAIN" if node_id in info.draining else "DOWN"
        reasons = "; ".join(
            r for r in (info.draining.get(node_id), info.down_why.get(node_id)) if r
        )
        down = f"{state} ({reasons})" if reasons else state
        down += f" since {clock(since, now)} ({slurm_duration(max(now - since, 0.0))} ago)"
        rows.append((node_id, down, "-", "-", "-", "-", heartbeat(node_id), "-", "-", "-"))
    return text_table(rows)
