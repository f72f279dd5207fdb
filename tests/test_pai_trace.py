"""Alibaba PAI 2020 (cluster-trace-gpu-v2020): the job table joined with its task table (GPU
requests in percent of a GPU per instance, run times from the tasks, GPU types, outcomes), jobs
left out and counted, both tables with and without a header row, through to a simulation."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from gpuyard.cli import main
from gpuyard.run.build import read_trace
from gpuyard.run.spec import RunSpec
from gpuyard.workloads import WorkloadError, detect_format, load_pai, load_workload

JOB_HEADER = "job_name,inst_id,user,status,start_time,end_time"
TASK_HEADER = (
    "job_name,task_name,inst_num,status,start_time,end_time,plan_cpu,plan_mem,plan_gpu,gpu_type"
)
JOBS = [
    "j1,i1,u1,Terminated,1000.0,1120.0",
    "j2,i2,u2,Failed,1200.0,1510.0",
    "j3,i3,u1,Terminated,900.0,1060.0",  # (the first submission: the clock's origin)
    "j4,i4,u3,Running,1300.0,",
    "j5,i5,u1,Terminated,1400.0,1500.0",  # CPU only
    "j6,i6,u1,Waiting,1400.0,",  # no tasks
    "j7,i7,u2,Failed,1400.0,1500.0",  # its task never started (start_time 0)
    "j8,i8,u2,Terminated,1400.0,1500.0",  # a task ending before it starts
    "j9,i9,u4,Interrupted,1950.0,2110.0",  # a status the README does not name
    "j10,i10,u4,Terminated,,1500.0",  # no submission time
    "j11,i11,u4,Running,1400.0,",  # its task has no end
]
TASKS = [
    # A PS without a GPU and two half-GPU workers: 1 GPU, as the README's example job.
    "j1,ps,1.0,Terminated,1005.0,1110.0,600.0,29.3,,",
    "j1,worker,2.0,Terminated,1010.0,1100.0,400.0,10.0,50.0,V100",
    "j2,tensorflow,1.0,Failed,1300.0,1500.0,800.0,60.0,800.0,V100M32",
    "j3,tensorflow,1.0,Terminated,950.0,1050.0,200.0,5.0,25.0,MISC",
    "j4,worker,1.0,Running,1310.0,1400.0,100.0,1.0,100.0,T4",
    "j4,evaluator,3.0,Running,1320.0,1500.0,100.0,1.0,100.0,P100",
    "j5,worker,1.0,Terminated,1410.0,1490.0,600.0,10.0,0.0,",
    "j7,worker,1.0,Failed,0.0,0.0,600.0,10.0,100.0,T4",
    "j8,worker,1.0,Terminated,1450.0,1420.0,600.0,10.0,100.0,T4",
    "j9,worker,1.0,Terminated,2000.0,2100.0,600.0,10.0,150.0,P100",
    "j10,worker,1.0,Terminated,1410.0,1490.0,600.0,10.0,100.0,T4",
    "j11,worker,1.0,Running,1410.0,,600.0,10.0,100.0,T4",
    "ghost,worker,1.0,Terminated,1410.0,1490.0,600.0,10.0,100.0,T4",  # no such job
]


def trace(
    tmp_path: Path, *, header: bool = False, jobs: list[str] = JOBS, tasks: list[str] = TASKS,
    name: str = "pai_job_table.csv",
) -> Path:  # fmt: skip
    """The two tables as the publisher ships them (no header row), or with one."""
    job_path = tmp_path / name
    job_path.write_text("\n".join([JOB_HEADER] * header + jobs) + "\n")
    (tmp_path / "pai_task_table.csv").write_text("\n".join([TASK_HEADER] * header + tasks) + "\n")
    return job_path


def test_jobs_joined_with_their_tasks(tmp_path: Path) -> None:
    path = trace(tmp_path)
    assert detect_format(path) == "pai"  # (by its name: the file has no header)
    w = load_workload(path)
    assert w.format == "pai"
    jobs = {j.job_id: j for j in w.jobs}
    assert list(jobs) == ["j1", "j2", "j3", "j4", "j9"]
    assert w.metadata["first_submit_s"] == 900.0
    j1 = jobs["j1"]
    # Arrival: the job's start_time (its submission); run time: first task start to last end.
    assert (j1.submit_time, j1.duration, j1.user) == (100.0, 1110.0 - 1005.0, "u1")
    # 0% + 50% + 50%: one GPU, of the one type its GPU tasks were given.
    assert (j1.num_gpus, j1.gpu_type, j1.outcome) == (1, "V100", None)
    ex = w.extras
    assert ex is not None
    assert ex.loc["j1", "gpu_request"] == 1.0 and ex.loc["j1", "tasks"] == 2
    assert ex.loc["j1", "instances"] == 3 and ex.loc["j1", "cpu_request"] == 14.0
    assert ex.loc["j1", "inst_id"] == "i1" and ex.loc["j1", "state"] == "Terminated"
    assert ex.loc["j1", "task_start_time"] == 105.0 and ex.loc["j1", "end_time"] == 220.0
    # 800% of a GPU: 8 GPUs; Failed replays as failed.
    j2 = jobs["j2"]
    assert (j2.num_gpus, j2.gpu_type, j2.outcome, j2.duration) == (8, "V100M32", "failed", 200.0)
    assert j1.gpu_milli is None and not j1.gpu_types
    # A quarter of an old (MISC) GPU: a share of one GPU of any type, the request kept.
    j3 = jobs["j3"]
    assert (j3.submit_time, j3.num_gpus, j3.gpu_type, j3.gpu_milli) == (0.0, 1, "any", 250)
    assert ex.loc["j3", "gpu_request"] == 0.25 and ex.loc["j3", "gpu_types"] == "MISC"
    # Two types: any, both kept; Running completes.
    j4 = jobs["j4"]
    assert (j4.num_gpus, j4.gpu_type, j4.outcome, j4.duration) == (4, "any", None, 190.0)
    assert ex.loc["j4", "gpu_types"] == "P100|T4" and j4.gpu_types == ["P100", "T4"]
    # 150%: two whole GPUs.
    assert (jobs["j9"].num_gpus, ex.loc["j9", "gpu_request"]) == (2, 1.5)
    assert jobs["j9"].gpu_milli is None
    assert w.metadata["fraction_of_a_gpu"] == 3  # j1, j3, j9
    assert (w.metadata["misc_gpu_type"], w.metadata["several_gpu_types"]) == (1, 1)


def test_jobs_left_out_are_counted_and_described(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    w = load_workload(trace(tmp_path))
    assert w.metadata["left_out"] == {
        "no_tasks": 1, "cpu_only": 1, "no_submit_time": 1, "no_start_time": 1, "no_end_time": 1,
        "end_before_start": 1, "non_positive_run_time": 0,
    }  # fmt: skip
    assert w.metadata["rows"] == len(JOBS)
    assert w.metadata["tasks_without_job"] == 1
    assert w.metadata["unknown_states"] == {"Interrupted": 1}
    assert w.metadata["outcomes"] == {
        "Failed": 1, "Interrupted": 1, "Running": 1, "Terminated": 2,
    }  # fmt: skip
    assert len(w) + sum(w.metadata["left_out"].values()) == len(JOBS)
    code = main(
        ["trace", "describe", "--plots", str(tmp_path), str(tmp_path / "pai_job_table.csv")]
    )
    out = capsys.readouterr().out
    assert code == 0 and '"no_tasks": 1' in out and '"tasks_without_job": 1' in out
    assert '"fraction_of_a_gpu": 3' in out


def test_cpu_only_jobs_kept_on_request(tmp_path: Path) -> None:
    w = load_pai(trace(tmp_path), cpu_jobs="keep")
    kept = next(j for j in w.jobs if j.job_id == "j5")
    assert kept.num_gpus == 1  # (the job model has no GPU-less job)
    assert w.extras is not None and bool(w.extras.loc["j5", "cpu_only"])
    assert not w.extras.loc["j1", "cpu_only"]
    assert "cpu_only" not in w.metadata["left_out"]
    with pytest.raises(ValueError, match="cpu_jobs must be"):
        load_pai(trace(tmp_path), cpu_jobs="drop")  # type: ignore[arg-type]


def test_with_a_header_row_or_header_files(tmp_path: Path) -> None:
    plain = load_workload(trace(tmp_path))
    expected = [(j.job_id, j.submit_time, j.duration, j.num_gpus, j.gpu_type) for j in plain.jobs]

    def same(w: object) -> bool:
        return [(j.job_id, j.submit_time, j.duration, j.num_gpus, j.gpu_type)
                for j in w.jobs] == expected  # type: ignore[attr-defined]  # fmt: skip

    headed = tmp_path / "headed"
    headed.mkdir()
    # A header row: detected by it, whatever the file's name.
    path = trace(headed, header=True, name="jobs.csv")
    assert detect_format(path) == "pai"
    assert same(load_workload(path))
    # Without one, the publisher's `<table>.header` files beside name the columns.
    swapped = tmp_path / "swapped"
    swapped.mkdir()
    moved = [",".join([r.split(",")[2], *r.split(",")[:2], *r.split(",")[3:]]) for r in JOBS]
    path = trace(swapped, jobs=moved)
    (swapped / "pai_job_table.header").write_text(
        "user,job_name,inst_id,status,start_time,end_time\n"
    )
    assert same(load_workload(path))
    # Read in chunks of two rows: the same jobs.
    assert same(load_pai(trace(tmp_path), chunk_rows=2))


def test_a_broken_cell_is_one_line_naming_file_and_line(tmp_path: Path) -> None:
    tasks = [*TASKS[:2], "j2,tensorflow,1.0,Failed,1300.0,1500.0,800.0,60.0,lots,V100M32"]
    path = trace(tmp_path, tasks=tasks + TASKS[3:])
    with pytest.raises(WorkloadError) as caught:
        load_workload(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / 'pai_task_table.csv'}, line 3, field 'plan_gpu'")
    assert "'lots' is not a number" in message
    w = load_workload(path, skip_bad=True)
    assert w.skipped == 1 and "j2" not in {j.job_id for j in w.jobs}
    assert w.metadata["left_out"]["broken_task"] == 1
    # In the job table (with a header: line 4).
    jobs = [JOBS[0], "j2,i2,u2,Failed,soon,1510.0", *JOBS[2:]]
    headed = tmp_path / "headed"
    headed.mkdir()
    with pytest.raises(WorkloadError, match=r"pai_job_table.csv, line 3, field 'start_time'"):
        load_workload(trace(headed, header=True, jobs=jobs))
    # Too many fields on a line.
    broken = tmp_path / "broken"
    broken.mkdir()
    with pytest.raises(WorkloadError, match=r"pai_job_table.csv, line 2: broken line"):
        load_workload(trace(broken, jobs=[JOBS[0], JOBS[1] + ",x,y", *JOBS[2:]]))


def test_missing_or_misnamed_tables(tmp_path: Path) -> None:
    path = trace(tmp_path)
    with pytest.raises(WorkloadError, match="a PAI task table: give the job table"):
        load_workload(tmp_path / "pai_task_table.csv")
    (tmp_path / "pai_task_table.csv").rename(tmp_path / "tasks.csv")
    with pytest.raises(WorkloadError, match="no task table"):
        load_workload(path)
    assert len(load_pai(path, task_table=tmp_path / "tasks.csv")) == 5
    assert len(load_workload(path, "pai", task_table=tmp_path / "tasks.csv")) == 5


def test_read_trace_reports_the_counts(tmp_path: Path) -> None:
    workload, info = read_trace(RunSpec(trace=str(trace(tmp_path))))
    assert info["format"] == "pai" and info["jobs"] == len(workload) == 5
    assert info["left_out"]["no_tasks"] == 1 and info["fraction_of_a_gpu"] == 3


@pytest.mark.slow
def test_sim_replays_a_pai_trace(tmp_path: Path) -> None:
    path = trace(tmp_path)
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", "sim", "--trace", str(path), "--cluster-spec",
         "2x8:V100M32,1x4:V100,1x4:T4,1x4:P100", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    with (out / "jobs.csv").open() as f:
        jobs = {row["job_id"]: row for row in csv.DictReader(f)}
    assert set(jobs) == {"j1", "j2", "j3", "j4", "j9"}
    assert jobs["j2"]["state"] == "failed"
    assert float(jobs["j2"]["end"]) - float(jobs["j2"]["start"]) == 200.0
    assert all(jobs[j]["state"] == "completed" for j in ("j1", "j3", "j4", "j9"))
    assert jobs["j1"]["gpu_type"] == "V100"
    assert float(jobs["j1"]["start"]) >= 100.0
