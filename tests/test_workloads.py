"""Workload loaders, generators and cluster specs (reference data: ../shared/data, if present)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gpuyard.shared.model import ClusterSpec
from gpuyard.shared.throughput import ElasticFlowThroughputs, GavelThroughputs
from gpuyard.workloads import (
    Workload,
    WorkloadError,
    blox,
    detect_format,
    elasticflow,
    from_frame,
    gavel,
    load_cluster,
    load_philly,
    load_workload,
    poisson_arrivals,
    save_workload,
    to_frame,
)
from gpuyard.workloads.generators import GAVEL_DISTRIBUTED, GAVEL_TEMPLATES, philly_durations

# ------------------------------------------------------------------ reference files


def test_itp_all_ten_clusters(data: Callable[[str], Path]) -> None:
    files = sorted(data("itp").glob("cluster*.csv"))
    assert len(files) == 10
    total = 0
    for f in files:
        w = load_workload(f)
        assert w.format == "itp" and w.skipped == 0
        total += len(w)
        ids = [j.job_id for j in w]
        assert len(set(ids)) == len(ids)
        j = w[0]
        assert "@" in j.job_type and j.total_steps and j.deadline and j.submit_time is not None
    assert total == 69_351


def test_elasticflow_traces_and_header_variants(data: Callable[[str], Path]) -> None:
    w = load_workload(data("elasticflow/traces/fig10_100jobs.csv"))
    assert w.format == "elasticflow" and len(w) == 100
    assert w[0].job_type == "resnet50@256" and w[0].total_steps == 7246 and w[0].deadline == 5896
    assert list(w.extras.columns) == ["model_name", "batch_size"]
    philly = load_workload(data("elasticflow/traces/philly_103959.csv"))
    assert len(philly) == 876 and "real_iteration" in philly.extras.columns
    # ElasticFlow's generator: iterations = duration x A100 throughput at num_gpu.
    model = ElasticFlowThroughputs.from_path(data("elasticflow/throughputs_A100"))
    ratio = [
        j.total_steps / (j.duration * model.throughput(j.job_type, "a100", j.num_gpus)) for j in w
    ]
    assert np.allclose(ratio, 1.0, atol=0.01)


def test_elasticflow_elastic_option(data: Callable[[str], Path]) -> None:
    w = load_workload(data("itp/195job.csv"), elastic=True)
    assert all(j.min_gpus == 1 and j.max_gpus >= j.num_gpus for j in w)


def test_gavel_traces(data: Callable[[str], Path]) -> None:
    for f in sorted(data("gavel/traces").glob("*.trace")):
        w = load_workload(f)
        assert w.format == "gavel" and len(w) > 0
        assert {j.job_type for j in w} <= set(GAVEL_TEMPLATES)
        assert [j.job_id for j in w] == [str(i) for i in range(len(w))]
    w = load_workload(data("gavel/traces/continuous_multi_gpu.trace"))
    assert w[0].num_gpus == 8 and w[0].total_steps == 17484476 and w[1].submit_time == 570.700837
    assert "command" in w.extras.columns and w.extras["SLO"].isna().all()


def test_gavel_slo_deadline(data: Callable[[str], Path], tmp_path: Path) -> None:
    model = GavelThroughputs.from_file(data("gavel/simulation_throughputs.json"))
    line = "ResNet-50 (batch size 64)\tpython3 main.py\tdir\t--n\t1\t1000\t1\t1\t2.0\t10\n"
    f = tmp_path / "slo.trace"
    f.write_text(line)
    job = load_workload(f, throughputs=model)[0]
    rate = model.throughput("ResNet-50 (batch size 64)", "v100", 1)
    assert job.deadline == pytest.approx(10 + 2.0 * 1000 / rate)
    assert load_workload(f)[0].deadline is None


def test_blox_and_bftrainer_files(data: Callable[[str], Path]) -> None:
    w = load_workload(data("blox/readme_load1_jobs.csv"))
    assert (
        w.format == "blox" and len(w) == 4170 and w[0].duration == pytest.approx(35424.3471980879)
    )
    b = load_workload(data("bftrainer/hps-shufflenet-Jbnd-10J.csv"))
    assert b.format == "bftrainer" and len(b) == 10
    assert b[0].min_gpus == 1 and b[0].max_gpus == 64 and b[0].total_steps == 1.3e8
    assert b[0].submit_time == 0 and b[1].submit_time == 4000
    assert {"Tcup", "Tcdw"} <= set(b.extras.columns)


def test_detect_format_rejects_scalability_file(data: Callable[[str], Path]) -> None:
    with pytest.raises(WorkloadError, match="load_throughputs"):
        detect_format(data("bftrainer/hps-shufflenet-JNPs-10J.csv"))


# ------------------------------------------------------------------ errors


def test_bad_field_names_file_line_field(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("job_id,arrival_time_s,duration_s,num_gpus\n0,1,10,1\n1,2,abc,1\n2,3,10,0\n")
    with pytest.raises(WorkloadError) as err:
        load_workload(f)
    assert err.value.line == 3 and err.value.field == "duration_s" and str(f) in str(err.value)
    w = load_workload(f, skip_bad=True)
    assert len(w) == 1 and w.skipped == 2
    assert "line 4" in w.skip_reasons[1] and "num_gpus" in w.skip_reasons[1]


def test_broken_line_and_duplicate_id(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text(
        "job_id,arrival_time_s,duration_s,num_gpus\n0,1,10,1\n1,2,10,1,9\n\n0,3,5,1\n3,4,5,2\n"
    )
    with pytest.raises(WorkloadError) as err:
        load_workload(f)
    assert err.value.line == 3 and err.value.field is None
    w = load_workload(f, skip_bad=True)
    assert [j.job_id for j in w] == ["0", "3"] and w.skipped == 2
    assert any("duplicate" in r and "line 5" in r for r in w.skip_reasons)


def test_many_broken_rows_report_the_first_five_in_file_order_and_a_count(tmp_path: Path) -> None:
    """A long trace with broken rows of every kind (a line of too many fields, a bad cell, a
    bad value, a duplicate id): one error naming the first five by line and field, and how many
    there are; `skip_bad` skips and counts the same rows."""
    rows = ["job_id,arrival_time_s,duration_s,num_gpus"]
    for i in range(1000):
        rows.append(f"{i},{i},10,1")
    for k, bad in enumerate(["x,1,10,1,9", "{k},1,abc,1", "{k},1,10,0", "7,1,10,1"] * 2):
        rows.insert(100 * (k + 1), bad.format(k=f"b{k}"))
    f = tmp_path / "t.csv"
    f.write_text("\n".join(rows) + "\n")
    with pytest.raises(WorkloadError) as err:
        load_workload(f)
    message = str(err.value)
    assert err.value.line == 101 and err.value.field is None  # (the first, as before)
    assert message.startswith(f"{f}: 8 broken rows: line 101: broken line")
    lines = [int(m) for m in re.findall(r"line (\d+)", message)]
    assert lines == [101, 201, 301, 401, 501] and message.endswith("; and 3 more")
    assert "field 'duration_s'" in message and "field 'num_gpus'" in message
    assert "duplicate job id '7'" in message
    w = load_workload(f, skip_bad=True)
    assert len(w) == 1000 and w.skipped == 8  # (the id 7 at line 401 is the duplicate)


def test_rows_validated_in_batches_give_what_one_batch_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our CSV's rows become jobs a batch at a time (`CONVERT_ROWS`): rows a job's own checks
    refuse, in several batches and at their edges, are the same errors and the same jobs."""
    from gpuyard.workloads import core

    rows = ["job_id,num_gpus,duration,submit_time"]
    rows += [
        f"j{i},{0 if i in (3, 4, 9, 22) else 1},{-5 if i == 16 else 10},{i}" for i in range(25)
    ]
    f = tmp_path / "jobs.csv"
    f.write_text("\n".join(rows) + "\n")

    def loaded() -> tuple[list[str], int, list[str], str]:
        w = load_workload(f, skip_bad=True)
        with pytest.raises(WorkloadError) as err:
            load_workload(f)
        return [j.job_id or "" for j in w], w.skipped, w.skip_reasons, str(err.value)

    whole = loaded()
    assert whole[1] == 5 and len(whole[0]) == 20 and "j3" not in whole[0]
    monkeypatch.setattr(core, "CONVERT_ROWS", 4)
    assert loaded() == whole


def test_gavel_bad_fields(tmp_path: Path) -> None:
    f = tmp_path / "bad.trace"
    good = "A3C\tcmd\tdir\t--n\t1\t100\t1\t1\t-1\t0\n"
    f.write_text(good + "A3C\tcmd\tdir\t--n\t1\t100\t1.5\t1\t-1\t0\n" + good)
    with pytest.raises(WorkloadError) as err:
        load_workload(f)
    assert err.value.line == 2 and err.value.field == "scale_factor"
    w = load_workload(f, skip_bad=True)
    assert [j.job_id for j in w] == ["0", "2"]


def test_unknown_format(tmp_path: Path) -> None:
    f = tmp_path / "x.csv"
    f.write_text("a,b\n1,2\n")
    with pytest.raises(WorkloadError, match="unknown workload format"):
        load_workload(f)


# ------------------------------------------------------------------ Philly


def _attempt(start: str, end: str, gpus: int) -> dict:
    return {"start_time": start, "end_time": end, "detail": [{"ip": "m1", "gpus": ["gpu0"] * gpus}]}


def test_philly_blox_semantics(tmp_path: Path) -> None:
    log = [
        {
            "status": "Pass",
            "vc": "vc1",
            "jobid": "application_1",
            "user": "u1",
            "submitted_time": "2017-10-01 00:00:00",
            "attempts": [
                _attempt("2017-10-01 00:10:00", "2017-10-01 01:10:00", 4),
                _attempt("2017-10-01 02:00:00", "2017-10-01 02:30:00", 8),
            ],
        },
        {
            "status": "Killed",
            "vc": "vc1",
            "jobid": "application_2",
            "user": "u2",
            "submitted_time": "2017-10-01 00:05:00",
            "attempts": [],
        },
        {
            "status": "Failed",
            "vc": "vc2",
            "jobid": "application_3",
            "user": "u3",
            "submitted_time": "2017-10-01 00:20:00",
            "attempts": [_attempt("2017-10-01 00:20:00", "2017-10-01 00:21:00", 1)],
        },  # too short
        {
            "status": "Pass",
            "vc": "vc2",
            "jobid": "application_4",
            "user": "u4",
            "submitted_time": "2017-10-01 00:30:00",
            "attempts": [
                _attempt("2017-10-01 00:30:00", "2017-10-01 03:30:00", 32),
                _attempt("None", "None", 2),
            ],
        },  # last attempt invalid: dropped by Blox
    ]
    f = tmp_path / "cluster_job_log"
    f.write_text(json.dumps(log))
    w = load_workload(f, format="philly")
    assert [j.job_id for j in w] == ["application_1"]
    j = w[0]
    assert j.duration == 5400 and j.num_gpus == 1 and j.submit_time == 0 and j.tenant == "vc1"
    assert w.extras.loc["application_1", "queueing_delay"] == 600
    assert load_philly(f, multigpu=True)[0].num_gpus == 8
    plain = load_philly(f, semantics="plain")
    assert [j.job_id for j in plain] == ["application_1", "application_3", "application_4"]
    assert plain[2].num_gpus == 32
    per_attempt = load_philly(f, sum_attempts=False)
    assert [j.job_id for j in per_attempt] == ["application_1-attempt1", "application_4-attempt1"]


# ------------------------------------------------------------------ our format


def test_native_roundtrip(tmp_path: Path) -> None:
    w = gavel(50, 20, seed=3, multi_gpu=True, multi_priority=True, slo=True)
    path = save_workload(w, tmp_path / "w.csv")
    back = load_workload(path)
    assert back.format == "gpuyard"
    assert back.jobs == w.jobs
    assert np.allclose(back.extras["SLO"], w.extras["SLO"])
    df = to_frame(w.jobs)
    assert from_frame(df).jobs == w.jobs


def test_native_command_env(tmp_path: Path) -> None:
    f = tmp_path / "w.csv"
    f.write_text(
        "job_id,num_gpus,command,env,min_gpus,best_effort\n"
        'a,2,"[""python"", ""t.py""]","{""X"": ""1""}",1,true\nb,1,,,,\n'
    )
    w = load_workload(f)
    assert w[0].command == ["python", "t.py"] and w[0].env == {"X": "1"} and w[0].min_gpus == 1
    assert w[0].best_effort and w[1].min_gpus is None


def test_native_time_limits(tmp_path: Path) -> None:
    """A `time_limit_s` column limits the jobs that give one (an empty cell: none); a limit that
    is not more than 0 names its line and field."""
    f = tmp_path / "w.csv"
    f.write_text("job_id,num_gpus,duration,time_limit_s\na,1,100,3600\nb,1,100,\n")
    w = load_workload(f)
    assert [j.time_limit_s for j in w] == [3600.0, None]
    f.write_text("job_id,num_gpus,duration,time_limit_s\na,1,100,0\n")
    with pytest.raises(WorkloadError, match=r"line 2.*time_limit_s"):
        load_workload(f)


def test_parquet_needs_pyarrow(tmp_path: Path) -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        with pytest.raises(WorkloadError, match="pyarrow"):
            save_workload(blox(5, 10), tmp_path / "w.parquet")
    else:
        w = blox(5, 10)
        assert load_workload(save_workload(w, tmp_path / "w.parquet")).jobs == w.jobs


# ------------------------------------------------------------------ generators


def test_blox_generator_distribution() -> None:
    w = blox(20_000, jobs_per_hour=6, seed=1)
    assert w.jobs == blox(20_000, jobs_per_hour=6, seed=1).jobs
    assert w.jobs != blox(20_000, jobs_per_hour=6, seed=2).jobs
    dur = np.array([j.duration for j in w])
    arr = np.array([j.submit_time for j in w])
    assert abs((dur > 60_000).mean() - 0.2) < 0.015
    assert dur.min() >= 60 * 10**1.5 and dur.max() <= 60 * 10**4
    # log10(duration / 60) of short jobs is U(1.5, 3): a KS-like check on its CDF.
    short = np.sort(np.log10(dur[dur < 60_000] / 60))
    cdf = (short - 1.5) / 1.5
    assert np.abs(cdf - np.arange(1, len(short) + 1) / len(short)).max() < 0.03
    gaps = np.diff(np.concatenate([[0.0], arr]))
    assert abs(gaps.mean() - 600) < 20 and arr[0] > 0
    assert {j.num_gpus for j in w} == {1}
    multi = blox(10_000, 6, seed=0, gpu_demand={1: 0.5, 4: 0.5})
    assert abs(np.mean([j.num_gpus == 4 for j in multi]) - 0.5) < 0.03


def test_gavel_generator_distribution() -> None:
    w = gavel(40_000, jobs_per_hour=10, seed=7, multi_gpu=True, multi_priority=True, slo=True)
    assert w.jobs == gavel(40_000, 10, seed=7, multi_gpu=True, multi_priority=True, slo=True).jobs
    sf = np.array([j.num_gpus for j in w])
    for size, share in {1: 0.70, 2: 0.10, 4: 0.15, 8: 0.05}.items():
        assert abs((sf == size).mean() - share) < 0.01
    types = np.array([j.job_type for j in w])
    assert set(types[sf > 1]) == set(GAVEL_DISTRIBUTED)
    assert len(set(types[sf == 1])) == 26
    assert abs(np.mean([j.weight == 5.0 for j in w]) - 0.2) < 0.01
    arr = np.array([j.submit_time for j in w])
    assert arr[0] == 0 and abs(np.diff(arr).mean() - 360) < 10
    slo = w.extras["SLO"].to_numpy()
    assert abs((slo == 10.0).mean() - 0.33) < 0.015
    j = w[5]
    assert j.deadline == pytest.approx(j.submit_time + w.extras["SLO"].iloc[5] * j.duration)
    static = gavel(100, None, seed=1)
    assert all(j.submit_time == 0 and j.num_gpus == 1 for j in static)


def test_gavel_generator_steps_from_throughputs(data: Callable[[str], Path]) -> None:
    model = GavelThroughputs.from_file(data("gavel/simulation_throughputs.json"))
    w = gavel(500, 10, seed=1, multi_gpu=True, throughputs=model)
    for j in w:
        assert j.total_steps == pytest.approx(
            j.duration * model.throughput(j.job_type, "v100", j.num_gpus)
        )


def test_elasticflow_generator_distribution() -> None:
    w = elasticflow(
        20_000, mean_gap_s=900, seed=0, deadline_factor=(0.5, 1.5), best_effort_share=0.3
    )
    assert (
        w.jobs
        == elasticflow(20_000, 900, seed=0, deadline_factor=(0.5, 1.5), best_effort_share=0.3).jobs
    )
    g = np.array([j.num_gpus for j in w])
    for size, share in {1: 0.83, 2: 0.03, 4: 0.03, 8: 0.10, 16: 0.01}.items():
        assert abs((g == size).mean() - share) < 0.01
    dur = np.array([j.duration for j in w])
    assert abs((dur >= 60 * 10**2.5).mean() - 0.2) < 0.015
    factor = np.array([(j.deadline - j.submit_time) / j.duration for j in w])
    assert factor.min() >= 0.49 and factor.max() <= 1.5 and abs(factor.mean() - 1.0) < 0.01
    assert abs(np.mean([j.best_effort for j in w]) - 0.3) < 0.015
    arr = np.array([j.submit_time for j in w])
    assert arr[0] == 0 and abs(np.diff(arr).mean() - 900) < 25


def test_elasticflow_generator_matches_reference_trace_shape(data: Callable[[str], Path]) -> None:
    ref = load_workload(data("elasticflow/traces/gen_200jobs_lam900.csv"))
    assert {j.job_type for j in ref} <= {j.job_type for j in elasticflow(2000, 900, seed=0)}


def test_describe() -> None:
    d = gavel(2000, 10, seed=0, multi_gpu=True).describe()
    assert d["jobs"] == 2000 and d["format"] == "gavel" and set(d["gpu_demand"]) == {1, 2, 4, 8}
    assert d["first_arrival_s"] == 0 and 300 < d["mean_gap_s"] < 420
    assert d["with_duration"] == 2000 and d["with_total_steps"] == 0


def test_poisson_replay() -> None:
    base = blox(10, 6, seed=0)
    w = poisson_arrivals(base, 25, jobs_per_hour=6, seed=1)
    assert len(w) == 25 and w[12].duration == base[2].duration and w[12].job_id == "12"
    assert isinstance(w, Workload)


# ------------------------------------------------------------------ clusters


def test_load_cluster_variants(tmp_path: Path) -> None:
    spec = load_cluster("36x4:v100,36x4:p100,36x4:k80")
    assert spec.gpus_by_type() == {"v100": 144, "p100": 144, "k80": 144}
    toml = tmp_path / "c.toml"
    toml.write_text('[[groups]]\ncount = 2\ngpus_per_node = 8\ngpu_type = "a100"\n')
    assert load_cluster(toml).total_gpus == 16
    toml.write_text('[cluster]\nspec = "4x2:t4"\n')
    assert load_cluster(str(toml)) == ClusterSpec.parse("4x2:t4")
    with pytest.raises(ValueError):
        toml.write_text("[[groups]]\ncount = 0\ngpus_per_node = 8\n")
        load_cluster(toml)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("c.toml", "[[groups]]\ncount = 4\ngpus_per_node 4\n",
         "c.toml, line 3: not TOML: Expected '=' after a key in a key/value pair (column 15)"),
        ("c.json", '{"groups": [{"count": 4,\n "gpus_per_node": }]}',
         "c.json, line 2: not JSON: Expecting value (column 19)"),
        ("c.json", '{"groups": [{"count": 4, "gpus_per_node": "x"}]}',
         "c.json: not a cluster spec: Expected `int`, got `str` - at `$.groups[0].gpus_per_node`"),
        ("c.toml", "[[groups]]\ncount = 0\ngpus_per_node = 8\n",
         "c.toml: not a cluster spec: Expected `int` >= 1 - at `$.groups[0].count`"),
        ("c.toml", 'spec = "lots"\n', "c.toml: cluster spec 'lots': part 'lots' is not NODESxGPUS"),
        ("c.toml", 'spec = "4x8,2x0:a100"\n',
         "c.toml: cluster spec '4x8,2x0:a100': part '2x0:a100' has no GPUs"),
        ("c.toml", 'spec = "0x8"\n', "c.toml: cluster spec '0x8': part '0x8' has no nodes"),
    ],
)  # fmt: skip
def test_cluster_file_errors_name_file_and_line(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError) as error:
        load_cluster(path)
    assert str(error.value).startswith(f"{tmp_path}/{message}")


def test_load_elasticflow_cluster_specs(data: Callable[[str], Path]) -> None:
    for f in sorted(data("elasticflow/cluster_specs").glob("n*g*.csv")):
        n, g = f.stem[1:].split("g")
        spec = load_cluster(f)
        assert spec.total_gpus == int(n) * int(g), f
        assert spec.groups[0].gpu_type == "a100"


def test_philly_durations_are_the_same_on_every_cpu() -> None:
    # numpy's vectorised power rounds differently where AVX-512 is there; libm's does not.
    durations = philly_durations(np.random.default_rng(3), 2000)
    rng = np.random.default_rng(3)
    is_long = rng.random(2000) < 0.2
    exponents = rng.uniform(np.where(is_long, 3.0, 1.5), np.where(is_long, 4.0, 3.0))
    assert durations.tolist() == [60.0 * math.pow(10.0, u) for u in exponents.tolist()]


def test_an_unknown_format_names_the_option_that_names_it(tmp_path: Path) -> None:
    path = tmp_path / "odd.csv"
    path.write_text("who,what\na,b\n")
    with pytest.raises(
        WorkloadError, match="name it with --trace-format, one of acme, bftrainer, blox"
    ):
        load_workload(path)


def test_a_run_spec_sets_the_elasticflow_generators_deadlines_and_best_effort_share() -> None:
    """`--deadline-factor` and `--best-effort-share` (a sweep's `deadline_factor` and
    `best_effort_share`) reach the generator, seeded, and options.json's workload says so."""
    from gpuyard.run.build import make_workload
    from gpuyard.run.spec import RunSpec

    spec = RunSpec(generator="elasticflow", jobs=2000, load=2.4, seed=3, deadline_factor="1.5",
                   best_effort_share=0.5)  # fmt: skip
    workload, info = make_workload(spec)
    jobs = workload.jobs
    share = sum(j.best_effort for j in jobs) / len(jobs)
    assert 0.46 < share < 0.54  # 2,000 draws: within 4 standard deviations of 0.5
    assert all(j.deadline == j.submit_time + math.floor(1.5 * j.duration) for j in jobs)
    assert info["deadline_factor"] == [1.5, 1.5] and info["best_effort_share"] == 0.5
    again, _ = make_workload(spec)  # the same seed, the same jobs
    assert [(j.best_effort, j.deadline) for j in again.jobs] == [
        (j.best_effort, j.deadline) for j in jobs
    ]
    other, _ = make_workload(RunSpec(generator="elasticflow", jobs=2000, seed=4,
                                     best_effort_share=0.5))  # fmt: skip
    assert [j.best_effort for j in other.jobs] != [j.best_effort for j in jobs]
    # the defaults: ElasticFlow's factor 0.5 to 1.5, no best-effort job
    plain, info = make_workload(RunSpec(generator="elasticflow", jobs=2000, seed=3))
    factors = [(j.deadline - j.submit_time) / j.duration for j in plain.jobs if j.duration >= 100]
    assert 0.49 < min(factors) < 0.55 and 1.45 < max(factors) <= 1.5
    assert not any(j.best_effort for j in plain.jobs) and info["best_effort_share"] == 0.0
    ranged, _ = make_workload(RunSpec(generator="elasticflow", jobs=500, deadline_factor="2:3"))
    assert all(2 <= (j.deadline - j.submit_time) / j.duration <= 3 for j in ranged.jobs
               if j.duration >= 100)  # fmt: skip


def test_generated_jobs_are_elastic_under_elasticflows_semantics() -> None:
    """As ElasticFlow reads its generator's traces: each job may run on 1 to 64 GPUs (else a job
    whose deadline is under its duration at its own GPU count could never meet it)."""
    from gpuyard.run.build import make_workload
    from gpuyard.run.spec import RunSpec

    spec = RunSpec(generator="elasticflow", jobs=50, preset="elasticflow", policy="ef")
    workload, info = make_workload(spec)
    assert info["elastic"] is True
    assert all(j.min_gpus == 1 and j.max_gpus == max(j.num_gpus, 64) for j in workload.jobs)
    plain, info = make_workload(RunSpec(generator="elasticflow", jobs=50))
    assert "elastic" not in info and all(j.max_gpus in (None, j.num_gpus) for j in plain.jobs)
