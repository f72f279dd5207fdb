"""Helios (`cluster_log.csv`) and Acme (`trace_seren.csv`, `trace_kalos.csv`) cluster logs: what
each job becomes, the jobs left out and counted, broken lines, and a replay that keeps each job's
recorded outcome."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from gpuyard.cli import main
from gpuyard.run.build import read_trace
from gpuyard.run.spec import RunSpec
from gpuyard.workloads import WorkloadError, detect_format, load_workload
from gpuyard.workloads.clusterlogs import load_acme, load_helios

HELIOS_HEADER = (
    "job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue"
)
HELIOS_ROWS = [
    # The publishers' README's three rows, then a CPU-only job and oddities.
    "1425511,uXBbc,vcJkd,1,1,1,COMPLETED,2020-06-09 18:41:01,2020-06-09 18:41:01,2020-06-10 04:55:09,36848,0",
    "1425512,uVMrF,vchbv,4,16,1,FAILED,2020-06-09 18:41:27,2020-06-09 18:41:27,2020-06-09 18:45:36,249,0",
    "1425513,uzqls,vcpDC,1,1,1,CANCELLED,2020-06-09 18:41:28,2020-06-09 18:41:28,2020-06-17 14:15:21,675233,0",
    "1425514,uzqls,vcpDC,0,4,1,COMPLETED,2020-06-09 18:42:00,2020-06-09 18:42:00,2020-06-09 18:43:00,60,0",
    "1425515,uzqls,vcpDC,8,4,1,CANCELLED,2020-06-09 18:43:00,,,0,",
    "1425516,uAAAA,vcJkd,16,32,2,SUSPENDED,2020-06-09 18:44:00,2020-06-09 18:45:00,2020-06-09 18:55:00,600,60",
    "1425517,uAAAA,vcJkd,2,2,1,COMPLETED,2020-06-09 18:46:00,2020-06-09 18:50:00,2020-06-09 18:49:00,,240",
    "1425518,uAAAA,vcJkd,2,2,1,COMPLETED,2020-06-09 18:47:00,2020-06-09 18:50:00,2020-06-09 18:50:00,0,180",
    "1425519,uAAAA,vcJkd,2,2,1,TIMEOUT,2020-06-09 18:48:00,2020-06-09 18:49:00,2020-06-09 19:49:00,,60",
]  # fmt: skip
SEREN = """\
job_id,user,node_num,gpu_num,cpu_num,type,state,submit_time,start_time,end_time,duration,queue,gpu_time
5778432,u5907,1,8,128,Other,FAILED,2023-03-01 00:18:22+08:00,2023-03-01 00:18:54+08:00,2023-03-01 00:20:51+08:00,117,32,936.0
5778469,u5907,1,8,128,Other,COMPLETED,2023-03-01 00:23:58+08:00,2023-03-01 00:24:11+08:00,2023-03-01 01:09:04+08:00,2693,13,21544.0
5778470,u1234,2,16,256,Pretrain,OUT_OF_MEMORY,2023-03-01 00:30:00+08:00,2023-03-01 00:31:00+08:00,2023-03-01 00:41:00+08:00,600,60,9600.0
5778471,u1234,1,0,8,Debug,COMPLETED,2023-03-01 00:32:00+08:00,2023-03-01 00:32:00+08:00,2023-03-01 00:33:00+08:00,60,0,0.0
"""
KALOS = """\
job_id,user,node_num,gpu_num,cpu_num,mem_per_pod_GB,shared_mem_per_pod,type,state,submit_time,start_time,end_time,fail_time,stop_time,duration,queue,gpu_time
dlctk696s0jbvitv,uf794,8,64,960,1000,100.0,Other,FAILED,2023-05-17 11:00:58+00:00,2023-05-17 11:01:08+00:00,2023-05-17 11:01:16+00:00,2023-05-17 11:01:16+00:00,,18,10.0,1152.0
dlc1t2ypl09b8qtp,uf794,8,64,960,1000,100.0,Other,CANCELLED,2023-05-17 11:28:42+00:00,2023-05-17 11:28:54+00:00,2023-05-17 11:30:04+00:00,,2023-05-17 11:30:04+00:00,82,12.0,5248.0
"""


def helios(tmp_path: Path, rows: list[str] = HELIOS_ROWS, name: str = "cluster_log.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join([HELIOS_HEADER, *rows]) + "\n")
    return path


def test_helios_jobs_as_written(tmp_path: Path) -> None:
    w = load_workload(helios(tmp_path))
    assert w.format == "helios"
    jobs = {j.job_id: j for j in w.jobs}
    assert list(jobs) == ["1425511", "1425512", "1425513", "1425516", "1425519"]
    first = jobs["1425511"]
    assert (first.submit_time, first.num_gpus, first.duration) == (0.0, 1, 36848.0)
    assert (first.user, first.tenant, first.outcome) == ("uXBbc", "vcJkd", None)
    assert (jobs["1425512"].submit_time, jobs["1425512"].num_gpus) == (26.0, 4)
    assert jobs["1425512"].outcome == "failed"
    assert jobs["1425513"].outcome == "cancelled"
    assert jobs["1425516"].outcome is None  # SUSPENDED: unknown, it completes
    # No duration cell: end - start; TIMEOUT counts as failed, as the publishers count it.
    assert (jobs["1425519"].duration, jobs["1425519"].outcome) == (3600.0, "failed")
    ex = w.extras
    assert ex is not None
    assert ex.loc["1425516", "node_num"] == 2 and ex.loc["1425516", "queue"] == 60
    assert ex.loc["1425512", "state"] == "FAILED"
    assert ex.loc["1425516", "start_time"] == 239.0  # seconds on the jobs' clock
    # The clock's origin, absolute, in Shanghai time (Helios's times carry no zone).
    assert w.metadata["first_submit"] == "2020-06-09T18:41:01+08:00"


def test_helios_oddities_are_counted_and_described(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    w = load_workload(helios(tmp_path))
    assert w.metadata["left_out"] == {
        "cpu_only": 1, "no_start_time": 1, "end_before_start": 1, "non_positive_duration": 1,
        "no_run_time": 0,
    }  # fmt: skip
    assert w.metadata["unknown_states"] == {"SUSPENDED": 1}
    assert w.metadata["rows"] == len(HELIOS_ROWS)
    described = w.describe()
    assert described["left_out"]["cpu_only"] == 1 and described["jobs"] == 5
    code = main(["trace", "describe", "--plots", str(tmp_path), str(tmp_path / "cluster_log.csv")])
    printed = capsys.readouterr().out
    assert code == 0 and '"no_start_time": 1' in printed and '"SUSPENDED": 1' in printed


def test_cpu_only_jobs_kept_on_request(tmp_path: Path) -> None:
    w = load_helios(helios(tmp_path), cpu_jobs="keep")
    kept = next(j for j in w.jobs if j.job_id == "1425514")
    assert kept.num_gpus == 1  # (the job model has no GPU-less job)
    assert w.extras is not None and bool(w.extras.loc["1425514", "cpu_only"])
    assert not w.extras.loc["1425511", "cpu_only"]
    assert "cpu_only" not in w.metadata["left_out"]
    with pytest.raises(ValueError, match="cpu_jobs must be"):
        load_helios(helios(tmp_path), cpu_jobs="drop")  # type: ignore[arg-type]


def test_cpu_jobs_option_is_refused_where_there_are_none(tmp_path: Path) -> None:
    blox = tmp_path / "jobs.csv"
    blox.write_text("job_id,arrival_time_s,duration_s,num_gpus\n0,0,10,1\n")
    with pytest.raises(ValueError, match="--cpu-jobs applies to Helios, Acme and openb traces"):
        read_trace(RunSpec(trace=str(blox), cpu_jobs="keep"))
    workload, info = read_trace(RunSpec(trace=str(helios(tmp_path)), cpu_jobs="keep"))
    assert info["cpu_jobs"] == "keep" and len(workload) == 6


def test_acme_seren_and_kalos(tmp_path: Path) -> None:
    seren = tmp_path / "trace_seren.csv"
    seren.write_text(SEREN)
    w = load_workload(seren)
    assert w.format == "acme"
    jobs = {j.job_id: j for j in w.jobs}
    assert list(jobs) == ["5778432", "5778469", "5778470"]
    assert [j.submit_time for j in w.jobs] == [0.0, 336.0, 698.0]
    assert [(j.num_gpus, j.duration, j.user) for j in w.jobs] == [
        (8, 117.0, "u5907"), (8, 2693.0, "u5907"), (16, 600.0, "u1234"),
    ]  # fmt: skip
    assert [j.outcome for j in w.jobs] == ["failed", None, "failed"]
    assert w.extras is not None and w.extras.loc["5778470", "type"] == "Pretrain"
    assert w.extras.loc["5778470", "node_num"] == 2 and w.extras.loc["5778470", "gpu_time"] == 9600
    assert w.metadata["left_out"]["cpu_only"] == 1
    assert w.metadata["first_submit"] == "2023-03-01T00:18:22+08:00"
    kalos = tmp_path / "trace_kalos.csv"
    kalos.write_text(KALOS)
    k = load_acme(kalos)
    assert [(j.job_id, j.submit_time, j.num_gpus, j.duration, j.outcome) for j in k.jobs] == [
        ("dlctk696s0jbvitv", 0.0, 64, 18.0, "failed"),
        ("dlc1t2ypl09b8qtp", 1664.0, 64, 82.0, "cancelled"),
    ]
    assert k.extras is not None
    assert k.extras.loc["dlctk696s0jbvitv", "fail_time"] == 18.0  # 11:01:16 - 11:00:58
    assert k.extras.loc["dlc1t2ypl09b8qtp", "mem_per_pod_GB"] == 1000
    assert k.metadata["first_submit"] == "2023-05-17T19:00:58+08:00"  # UTC, shown in Shanghai


def test_detection_by_header(tmp_path: Path) -> None:
    assert detect_format(helios(tmp_path)) == "helios"
    for name, text in (("s.csv", SEREN), ("k.csv", KALOS)):
        (tmp_path / name).write_text(text)
        assert detect_format(tmp_path / name) == "acme"
    bare = tmp_path / "bare.csv"
    bare.write_text("job_id,gpu_num,gpu_time\n1,2,3\n")
    assert detect_format(bare) == "acme"


def test_a_broken_line_names_file_and_line(tmp_path: Path) -> None:
    rows = list(HELIOS_ROWS)
    rows[1] = rows[1].replace(",4,16,", ",four,16,")
    rows[2] = rows[2].replace("2020-06-09 18:41:28", "yesterday", 1)
    rows.insert(4, "1,2,3,4,5,6,7,8,9,10,11,12,13")
    path = helios(tmp_path, rows)
    with pytest.raises(WorkloadError) as err:
        load_workload(path)
    assert str(err.value).startswith(f"{path}: 3 broken rows: line 3, field 'gpu_num': 'four'")
    assert "line 4, field 'submit_time': 'yesterday' is not a time" in str(err.value)
    assert "line 6: broken line: expected 12 fields, saw 13" in str(err.value)
    w = load_workload(path, skip_bad=True)
    assert w.skipped == 3 and len(w) == 3  # 1425511, 1425516, 1425519


def test_broken_lines_across_chunks_and_duplicates(tmp_path: Path) -> None:
    """Line numbers stay right when the file is read a few rows at a time."""
    rows = [
        f"{i},u,vc,1,1,1,COMPLETED,2020-06-09 18:41:{i:02d},2020-06-09 18:41:{i:02d},"
        f"2020-06-09 18:42:{i:02d},60,0"
        for i in range(20)
    ]
    rows[9] = rows[9] + ",extra"
    rows.insert(14, "")  # a blank line: no job, but a line
    rows[16] = rows[3]  # a duplicate id
    path = helios(tmp_path, rows)
    with pytest.raises(WorkloadError) as err:
        load_helios(path, chunk_rows=4)
    message = str(err.value)
    assert "line 11: broken line" in message and "line 18, field 'job_id': duplicate" in message
    w = load_helios(path, chunk_rows=4, skip_bad=True)
    assert w.skipped == 2 and len(w) == 18


def write_helios_rows(path: Path, n: int) -> None:
    """`n` generated Helios rows, one a second, 1-8 GPUs, mixed states."""
    states = ("COMPLETED", "FAILED", "CANCELLED", "COMPLETED", "TIMEOUT")
    base = 1_590_969_600  # 2020-06-01 00:00:00 UTC
    import datetime as dt

    tz = dt.timezone(dt.timedelta(hours=8))
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(HELIOS_HEADER.split(","))
        for i in range(n):
            submit = dt.datetime.fromtimestamp(base + i, tz)
            start = submit + dt.timedelta(seconds=i % 97)
            run = 60 + i % 3600
            end = start + dt.timedelta(seconds=run)
            fmt = "%Y-%m-%d %H:%M:%S"
            out.writerow([
                i, f"u{i % 500}", f"vc{i % 20}", 1 << (i % 4), 4, 1, states[i % 5],
                submit.strftime(fmt), start.strftime(fmt), end.strftime(fmt), run, i % 97,
            ])  # fmt: skip


def test_chunked_reading_gives_the_same_jobs(tmp_path: Path) -> None:
    path = tmp_path / "cluster_log.csv"
    write_helios_rows(path, 1000)
    whole, chunked = load_helios(path), load_helios(path, chunk_rows=64)
    assert whole.jobs == chunked.jobs and len(whole) == 1000
    assert whole.jobs[999].submit_time == 999.0


@pytest.mark.slow
def test_replay_keeps_recorded_outcomes(tmp_path: Path) -> None:
    trace = helios(tmp_path, name="small_helios.csv")
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", "sim", "--trace", str(trace), "--cluster-spec", "4x8",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    with (out / "jobs.csv").open() as f:
        jobs = {row["job_id"]: row for row in csv.DictReader(f)}
    failed = jobs["1425512"]  # FAILED after 249 s
    assert failed["state"] == "failed"
    assert float(failed["end"]) - float(failed["start"]) == 249.0
    assert jobs["1425513"]["state"] == "cancelled"
    assert float(jobs["1425513"]["executed_time"]) == 675233.0
    assert jobs["1425511"]["state"] == "completed"
    assert jobs["1425519"]["state"] == "failed"  # TIMEOUT
    assert len(jobs) == 5
    assert "jobs         2 completed, 2 failed, 1 cancelled of 5" in result.stdout
