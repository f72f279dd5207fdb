"""ElasticFlow benchmarks: admission decisions, simulations of ElasticFlow's traces, and every ITP
cluster in one command with a table of deadline ratios per cluster and scheme.

    python bench/bench_elasticflow.py --only admission    # one decision, 1,000 admitted jobs, 256 GPUs
    python bench/bench_elasticflow.py --only itp10        # ITP cluster10 on n32g8, 60 s slots, ef-accessctrl
    python bench/bench_elasticflow.py --only themis       # themis on fig10_100jobs (n16g8, 240 s slots)
    python bench/bench_elasticflow.py --only itp --schemes ef-accessctrl,edf --out results/itp
    python bench/bench_elasticflow.py --only itp --leftovers lazy --parallel 2 --out results/itp

Targets (issue 13): cluster10 under ef-accessctrl >= 10x faster than ElasticFlow's simulator,
themis on the 100-job trace >= 10x faster, all ten ITP clusters under ef-accessctrl in under
10 minutes, one admission decision with 1,000 admitted jobs on 256 GPUs under 20 ms. Reads
../shared/data beside the checkout. Cluster sizes per ITP trace are those of ElasticFlow's
`run_fig8b.sh`.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import pandas as pd
import uvloop

from gpuyard.policies.elasticflow import ElasticFlowAdmission
from gpuyard.policies.elasticflow.admission import DeadlineAdmissionParams
from gpuyard.run.embedded import EmbeddedNats
from gpuyard.run.presets import ELASTICFLOW_SCHEMES, elasticflow_options, elasticflow_switch_nodes
from gpuyard.run.simulate import SimOptions, simulate
from gpuyard.shared.logs import configure_logging
from gpuyard.shared.model import JobSpec
from gpuyard.shared.policy import AdmissionInput, ClusterView, JobView
from gpuyard.shared.throughput import load_throughputs
from gpuyard.workloads import load_cluster, load_workload

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
EF = DATA / "elasticflow"
ITP_CLUSTERS = {
    **dict.fromkeys(["cluster01", "cluster02", "cluster03", "cluster05", "cluster06"], "n64g8"),
    **dict.fromkeys(["cluster04", "cluster07", "cluster08", "cluster09"], "n128g8"),
    "cluster10": "n32g8",
}
JOB_TYPES = ["resnet50@64", "resnet50@128", "vgg16@64", "bert@64", "bert@128", "gpt2@128",
             "inception3@64", "deepspeech2@32"]  # fmt: skip


def bench_admission(jobs: int, gpus: int, repeat: int) -> None:
    """One ElasticFlow admission decision against `jobs` admitted jobs (a fifth of them running)."""
    model = load_throughputs(EF / "throughputs_A100")
    rng = random.Random(0)
    now = 1e6
    views: list[JobView] = []
    used = 0
    for i in range(jobs):
        job_type = rng.choice(JOB_TYPES)
        duration = 10 ** rng.uniform(2.5, 4.5)
        steps = duration * model.throughput(job_type, "a100", 1)
        deadline = now + rng.uniform(1.0, 4.0) * duration * jobs / gpus * 2
        spec = JobSpec(job_id=f"j{i}", job_type=job_type, num_gpus=1, min_gpus=1, max_gpus=64,
                       total_steps=steps, deadline=deadline)  # fmt: skip
        running = i % 5 == 0 and used < gpus
        record = {"gpus": 1, "gpu_type": "a100", "rate": model.throughput(job_type, "a100", 1),
                  "steps_done": steps * rng.uniform(0, 0.5), "run_start": now, "progress_at": now}  # fmt: skip
        used += running
        views.append(JobView(job_id=f"j{i}", seq=i, spec=spec, state="running" if running else "queued",
                             submit_time=now, **(record if running else {})))  # fmt: skip
    cluster = ClusterView(capacity={"a100": gpus}, round_s=0.0, throughputs=model)
    new = JobSpec(job_id="new", job_type="bert@64", num_gpus=1, min_gpus=1, max_gpus=64,
                  total_steps=5000, deadline=now + 36000, submit_time=now)  # fmt: skip
    policy = ElasticFlowAdmission(DeadlineAdmissionParams(slot_s=60.0))
    times, cpu = [], []
    for _ in range(repeat):
        started, started_cpu = time.perf_counter(), time.thread_time()
        decision = policy.decide(AdmissionInput(now=now, job=new, cluster=cluster, jobs=views))
        times.append(time.perf_counter() - started)
        cpu.append(time.thread_time() - started_cpu)
    print(f"admission: {jobs} admitted jobs ({used} running) on {gpus} GPUs -> {decision.verdict}")
    for what, t in (("wall", times), ("CPU", cpu)):
        print(f"  {what}: first decision {t[0] * 1000:.1f} ms (levels computed), then best "
              f"{min(t[1:]) * 1000:.1f} ms, median {sorted(t[1:])[len(t) // 2 - 1] * 1000:.1f} ms "
              f"over {repeat - 1} (target < 20 ms)")  # fmt: skip


async def run_trace(
    url: str, trace: Path, spec: str, scheme: str, slot: float, name: str, out: Path,
    params: dict[str, str],
) -> dict:  # fmt: skip
    cluster = load_cluster(EF / "cluster_specs" / f"{spec}.csv")
    cpu = time.process_time()
    workload = await asyncio.to_thread(load_workload, trace, None, False, elastic=True)
    scheme_options = elasticflow_options(
        scheme, slot, cluster.total_gpus, switch_nodes=elasticflow_switch_nodes(cluster)
    )
    if scheme_options["policy"] == "elasticflow":
        scheme_options["policy_params"] |= params
    options = SimOptions(
        cluster=cluster, throughputs=str(EF / "throughputs_A100"), round_s=slot, **scheme_options
    )
    result = await simulate(options, workload.jobs, out / name, nats_url=url, cluster_name=name)
    s = result.summary
    return {
        "trace": trace.stem, "cluster": spec, "scheme": scheme, "jobs": s["jobs"],
        "met": s["deadline_met"], "ratio": round(s["deadline_satisfactory_ratio"] or 0.0, 4),
        "declined": s["declined"], "mean_jct_s": round(s["mean_jct"] or 0.0),
        "wall_s": round(result.wall_s, 2), "cpu_s": round(time.process_time() - cpu, 2),
    }  # fmt: skip


Run = tuple[Path, str, str, float]
"""(trace, cluster spec, scheme, slot)."""


def _run_in_worker(url: str, run: Run, name: str, out: Path, params: dict[str, str]) -> dict:
    """One simulation in a worker process (its own services, the shared NATS server), on uvloop
    as `gpuyard sim` runs."""
    configure_logging("error")
    trace, spec, scheme, slot = run
    return uvloop.run(run_trace(url, trace, spec, scheme, slot, name, out, params))


async def bench_traces(
    runs: list[Run], out: Path, params: dict[str, str], parallel: int = 1
) -> pd.DataFrame:
    """Each run as one simulation, `parallel` at once (worker processes), on one NATS server;
    a line per run as it ends; the rows in the order of `runs`. `cpu_s` is the simulation's own
    process (the services and policies; not the NATS server)."""
    names = [f"ef{i}-{scheme}-{trace.stem}" for i, (trace, _, scheme, _) in enumerate(runs)]
    rows: dict[int, dict] = {}

    def show(i: int, row: dict) -> None:
        rows[i] = row
        print(f"  [{len(rows)}/{len(runs)}] " + "  ".join(f"{k}={v}" for k, v in row.items()),
              flush=True)  # fmt: skip

    async with EmbeddedNats(runs=parallel) as url:
        if parallel <= 1:
            for i, ((trace, spec, scheme, slot), name) in enumerate(zip(runs, names, strict=True)):
                show(i, await run_trace(url, trace, spec, scheme, slot, name, out, params))
        else:
            with ProcessPoolExecutor(parallel, mp_context=get_context("spawn")) as pool:

                async def one(i: int, run: Run, name: str) -> None:
                    job = pool.submit(_run_in_worker, url, run, name, out, params)
                    show(i, await asyncio.wrap_future(job))

                await asyncio.gather(
                    *(
                        one(i, run, name)
                        for i, (run, name) in enumerate(zip(runs, names, strict=True))
                    )
                )
    return pd.DataFrame([rows[i] for i in sorted(rows)])


def markdown(frame: pd.DataFrame) -> str:
    """A table of the ratios for docs (no tabulate needed)."""
    head = [frame.index.name or "", *map(str, frame.columns)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for index, row in frame.iterrows():
        lines.append("| " + " | ".join([str(index), *(f"{v:.3f}" for v in row)]) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", choices=["admission", "itp10", "themis", "itp"], action="append")
    ap.add_argument("--schemes", default="ef-accessctrl", help="itp: comma-separated schemes")
    ap.add_argument("--clusters", default=",".join(ITP_CLUSTERS), help="itp: which clusters")
    ap.add_argument("--jobs", type=int, default=1000, help="admission: admitted jobs")
    ap.add_argument("--gpus", type=int, default=256, help="admission: cluster GPUs")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--out", type=Path, help="where the runs' results go (default: a temp dir)")
    ap.add_argument(
        "--parallel", type=int, default=1,
        help="itp: simulations at once, each in its own process (default 1)",
    )  # fmt: skip
    ap.add_argument(
        "--leftovers", choices=["exact", "lazy"], default="exact",
        help="the elasticflow policy's walk over the leftover GPUs (lazy: for big clusters)",
    )  # fmt: skip
    args = ap.parse_args()
    configure_logging("error")
    only = args.only or ["admission", "itp10", "themis"]
    params = {"leftovers": args.leftovers}
    if not EF.is_dir():
        raise SystemExit(f"{EF} is not present")
    with tempfile.TemporaryDirectory(prefix="bench-ef-") as tmp:
        out = args.out or Path(tmp)
        if "admission" in only:
            bench_admission(args.jobs, args.gpus, args.repeat)
        if "itp10" in only:
            print("ITP cluster10 on n32g8, 60 s slots, ef-accessctrl (ElasticFlow: 48 s on the "
                  "machine the issue names)")  # fmt: skip
            uvloop.run(
                bench_traces(
                    [(DATA / "itp" / "cluster10.csv", "n32g8", "ef-accessctrl", 60.0)], out, params
                )
            )
        if "themis" in only:
            print("themis on fig10_100jobs, n16g8, 240 s slots (ElasticFlow: 158 s there)")
            uvloop.run(
                bench_traces(
                    [(EF / "traces" / "fig10_100jobs.csv", "n16g8", "themis", 240.0)], out, params
                )
            )
        if "itp" in only:
            clusters = [c for c in args.clusters.split(",") if c]
            schemes = [s for s in args.schemes.split(",") if s]
            unknown = [c for c in clusters if c not in ITP_CLUSTERS]
            unknown += [s for s in schemes if s not in ELASTICFLOW_SCHEMES]
            if unknown:
                raise SystemExit(f"unknown clusters or schemes: {', '.join(unknown)}")
            if args.parallel > 1:  # the largest traces first: the small ones fill in around them
                clusters.sort(key=lambda c: -(DATA / "itp" / f"{c}.csv").stat().st_size)
            runs = [
                (DATA / "itp" / f"{c}.csv", ITP_CLUSTERS[c], s, 60.0)
                for c in clusters
                for s in schemes
            ]
            print(f"ITP: {len(clusters)} clusters x {len(schemes)} schemes, 60 s slots, "
                  f"{args.parallel} at once, leftovers={args.leftovers}")  # fmt: skip
            started = time.perf_counter()
            table = uvloop.run(bench_traces(runs, out, params, args.parallel))
            wall = time.perf_counter() - started
            out.mkdir(parents=True, exist_ok=True)
            table.to_csv(out / "itp.csv", index=False)
            ratios = table.pivot(index="trace", columns="scheme", values="ratio")
            ratios = ratios.sort_index()[schemes]
            (out / "itp.md").write_text(markdown(ratios))
            print("deadline-satisfactory ratio per cluster and scheme:")
            print(ratios.to_string())
            print(f"{int(table['jobs'].sum() / max(len(schemes), 1))} jobs per scheme, "
                  f"{wall:.0f} s in all, {table['cpu_s'].sum():.0f} CPU s in the simulations "
                  f"(target: ef-accessctrl on all ten in < 600 s); {out}/itp.csv")  # fmt: skip


if __name__ == "__main__":
    main()
