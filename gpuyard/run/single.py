"""One run as `gpuyard sim` makes it, in this process: its workload written into its output
folder, its services started, its progress, summary and results, and on stderr one line for
whatever went wrong. A comparison's forked runs are this too (`simulate_encoded`)."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from typing import Any

import msgspec

from gpuyard.plotter import Plotter
from gpuyard.run.build import build
from gpuyard.run.process import stop_on_signals
from gpuyard.run.spec import RunPlace, RunSpec
from gpuyard.shared.errors import RemoteError
from gpuyard.shared.policy import PolicyError


def simulate_one(spec: RunSpec, place: RunPlace, plotter: Plotter | None = None) -> int:
    """Run `spec` where `place` says, its plots drawn by `plotter` (None: one started here);
    the exit status: 0, 1 (the run failed), 2 (it could not start: the one line says why) or
    130 (interrupted: what it got to is written)."""
    if plotter is not None:
        return _simulate_one(spec, place, plotter)
    with Plotter.start() as started:  # (it imports matplotlib while the run goes on)
        return _simulate_one(spec, place, started)


def _simulate_one(spec: RunSpec, place: RunPlace, plotter: Plotter) -> int:
    import nats.errors
    import uvloop

    from gpuyard.report import format_summary, thrashing_line
    from gpuyard.run.simulate import ProgressBar, simulate
    from gpuyard.shared.logs import configure_logging
    from gpuyard.shared.service import collect_cycles_rarely
    from gpuyard.workloads import WorkloadError

    made = not place.out.exists()
    try:
        place.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"gpuyard sim: --out {place.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        options, workload, described = written_setup(spec, place)
    except (ValueError, OSError, msgspec.ValidationError, WorkloadError) as exc:
        if made:  # (nothing ran: no folder left behind)
            shutil.rmtree(place.out, ignore_errors=True)
        print(f"gpuyard sim: {exc}", file=sys.stderr)
        return 2
    if place.durable:
        options = msgspec.structs.replace(options, durable=True)
    log = open(place.out / "services.log", "a")  # noqa: SIM115 (open for the whole run)
    configure_logging(place.log_level, log)
    started = time.time()
    never_fits = 0

    def show(summary: dict[str, Any]) -> None:  # (before the other result files are written)
        nonlocal never_fits
        if summary.get("partial"):  # (`interrupted` says what was written)
            return
        print(json.dumps(summary, indent=2) if place.json else format_summary(summary), flush=True)
        if thrashing_line(summary):
            print(f"gpuyard sim: warning: {thrashing_line(summary)}", file=sys.stderr)
        never_fits = summary.get("never_fits") or 0
        if never_fits and not place.strict:
            print(
                f"gpuyard sim: warning: {never_fits_line(never_fits, strict=False)}",
                file=sys.stderr,
            )

    collect_cycles_rarely()  # (this process runs the services)
    try:
        uvloop.run(
            stop_on_signals(
                simulate(
                    options,
                    workload,
                    place.out,
                    nats_url=place.nats_url,
                    cluster_name=place.cluster,
                    processes=place.processes,
                    lost_after_s=place.lost_after_s,
                    on_progress=ProgressBar(place.cluster),
                    external=place.external,
                    log_level=place.log_level,
                    auth=place.auth,
                    workload=described,
                    on_policies=lambda ran: warn_policies(options, ran),
                    on_summary=show,
                    plotter=plotter,
                    keep_jobs=False,  # (the summary is all it shows)
                )
            )
        )
    except (KeyboardInterrupt, asyncio.CancelledError):
        return interrupted(place, started)
    except (RuntimeError, OSError, PolicyError, RemoteError, nats.errors.Error) as exc:
        # (RemoteError: a service refused to start the run, e.g. on profiles it cannot read)
        print(f"gpuyard sim: {exc}", file=sys.stderr)
        return 1
    finally:
        log.close()
    print(f"results in {place.out}/", file=sys.stderr)
    if never_fits and place.strict:
        print(f"gpuyard sim: --strict: {never_fits_line(never_fits, strict=True)}", file=sys.stderr)
        return 1
    return 0


def never_fits_line(count: int, *, strict: bool) -> str:
    """What to say of the jobs no node of the cluster can hold."""
    return f"{count:,} job{'s' if count > 1 else ''} can never run on this cluster (declined, " + (
        "with why, in jobs.csv)"
        if strict
        else "with why, in jobs.csv); --strict makes that an error"
    )


def simulate_encoded(spec: bytes, place: RunPlace) -> int:
    """`simulate_one` of a spec encoded with msgspec (a comparison's forked run)."""
    return simulate_one(msgspec.msgpack.decode(spec, type=RunSpec), place)


def written_setup(spec: RunSpec, place: RunPlace) -> tuple[Any, Any, dict[str, Any]]:
    """`build`'s run with its workload written into `place.out` (`sim.WrittenWorkload`): the
    jobs leave this process's memory before the run starts (the clock reads them from the file).
    Says on stderr what was skipped, and how a Philly trace was read."""
    from gpuyard.run.simulate import written_workload

    options, workload, described = build(spec, place.out, place.external)
    if workload.skipped:
        print(f"gpuyard sim: {skipped_lines(workload)}", file=sys.stderr)
    for line in (philly_line(described), openb_line(described)):
        if line:
            print(f"gpuyard sim: {line}", file=sys.stderr)
    return options, written_workload(workload.jobs, place.out), described


PHILLY_LEFT_OUT = {
    "jobs_without_attempts": "jobs without attempts",
    "attempts_without_times": "attempts without a start or end time",
    "attempts_non_positive_duration": "attempts of non-positive duration",
    "attempts_without_gpus": "attempts without GPUs",
}
"""How `philly_line` names the counts of `load_philly`'s `metadata["left_out"]`."""


def philly_line(info: dict[str, Any]) -> str | None:
    """Which reading of a Philly trace ran, and what the log had that no reading takes (the
    non-zero counts), for stderr (None for other formats)."""
    if "philly_reading" not in info:
        return None
    counts = info.get("left_out", {})
    odd = [f"{counts[k]:,} {name}" for k, name in PHILLY_LEFT_OUT.items() if counts.get(k)]
    return (
        f"{info['trace']}: Philly trace read the {info['philly_reading']} way"
        f"{' with --multi-gpu' if info['multi_gpu'] else ''} ({info['jobs']:,} jobs; "
        "--philly-reading blox|plain|attempts)"
        f"{'; left out: ' + ', '.join(odd) if odd else ''}"
    )


def openb_line(info: dict[str, Any]) -> str | None:
    """What an openb trace's jobs ask beyond whole GPUs, for stderr (None for other formats)."""
    if info.get("format") != "openb":
        return None
    return (
        f"{info['trace']}: {info['fraction_of_a_gpu']:,} pods ask for a share of a GPU; "
        f"{info['several_gpu_types']:,} allow several GPU types"
    )


def skipped_lines(workload: Any, shown: int = 5) -> str:
    """`skipped 12 broken trace lines:` and the first few reasons (file, line, why), then a count."""
    lines = [f"skipped {workload.skipped} broken trace line{'s' if workload.skipped != 1 else ''}:"]
    lines += [f"  {reason}" for reason in workload.skip_reasons[:shown]]
    if workload.skipped > shown:
        lines.append(f"  ... and {workload.skipped - shown} more")
    return "\n".join(lines)


def warn_policies(options: Any, ran: dict[str, Any]) -> None:
    """On stderr: each service whose policy or parameters are not those `options` (SimOptions)
    asked for (services started elsewhere, `--external`, run their own)."""
    from gpuyard.shared.contract import PolicyInfo

    for service, registry, choice in options.policies.by_service():
        name, params = choice.name, choice.params
        info = ran.get(service)
        if not isinstance(info, PolicyInfo):
            print(
                f"gpuyard sim: warning: {service} did not say its policy: {info}", file=sys.stderr
            )
            continue
        runs = f"{info.policy} {' '.join(f'{k}={v}' for k, v in info.params.items())}".rstrip()
        if info.policy != name:
            print(
                f"gpuyard sim: warning: {service} runs {runs}, not the {name} asked for; "
                "results record what ran",
                file=sys.stderr,
            )
            continue
        try:  # the parameters asked for, typed and with defaults, as the service reports its own
            wanted = msgspec.to_builtins(registry.create(name, params).params)
        except (PolicyError, ValueError):
            continue
        differs = sorted(k for k, v in wanted.items() if info.params.get(k) != v)
        if differs:
            print(
                f"gpuyard sim: warning: {service} runs {runs}, not the {', '.join(differs)} "
                "asked for; results record what ran",
                file=sys.stderr,
            )


def interrupted(place: RunPlace, started: float) -> int:
    """After Ctrl-C or SIGTERM: say what was written (the partial summary, if the run had begun;
    the whole one, if it had ended). `started`: when the run began (an older summary is not its)."""
    from gpuyard.report import format_summary

    path = place.out / "summary.json"
    ours = path.exists() and path.stat().st_mtime >= started
    summary = json.loads(path.read_text()) if ours else {}
    if not summary:
        print("gpuyard sim: interrupted before the run began; nothing written", file=sys.stderr)
        return 130
    if not summary.get("partial"):  # (stopping after its results were written)
        print(f"gpuyard sim: interrupted after the run ended: its results are whole in {place.out}/",
              file=sys.stderr)  # fmt: skip
        return 130
    print(json.dumps(summary, indent=2) if place.json else format_summary(summary))
    print(
        f"gpuyard sim: interrupted at t = {summary['simulated_s'] / 3600:,.1f} h simulated: "
        f"{summary['completed']:,} of {summary['jobs_in_workload']:,} jobs had completed; "
        f'partial results ("partial": true) in {place.out}/',
        file=sys.stderr,
    )
    return 130
