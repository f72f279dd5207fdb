"""Alibaba's openb trace: pod lists as jobs (run times, shares of GPUs, GPU types, CPUs and
memory, pods left out and counted) and node lists as clusters, through to a simulation that keeps a
type-restricted job on its type."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from gpuyard.cli import main
from gpuyard.run.build import read_trace
from gpuyard.run.simulate import cluster_label
from gpuyard.run.spec import RunSpec
from gpuyard.shared.model import ClusterSpec
from gpuyard.workloads import WorkloadError, detect_format, load_cluster, load_workload
from gpuyard.workloads.clusters import load_openb_nodes
from gpuyard.workloads.openb import load_openb

POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
    "deletion_time,scheduled_time"
)
POD_ROWS = [
    # The publisher's README's three rows (creation 9437497 is the clock's origin), then a
    # CPU-only pod and the oddities.
    "openb-pod-0017,88000,327680,8,1000,,Burstable,Succeeded,9437497,10769854,9437497",
    "openb-pod-0022,4000,15258,1,220,,BE,Running,9679175,9973826,9679175",
    "openb-pod-0035,16000,32768,1,1000,V100M16|V100M32,LS,Running,9967058,9968575,9967063",
    "openb-pod-0040,2000,4096,1,1000,T4,LS,Failed,9967100,9967200,9967110",
    "openb-pod-0041,8000,8192,0,0,,BE,Succeeded,9967200,9967300,9967200",
    "openb-pod-0042,8000,8192,1,500,,BE,Pending,9967300,9967400,",
    "openb-pod-0043,8000,8192,2,1000,,LS,Running,9967400,,9967400",
    "openb-pod-0044,8000,8192,4,1000,,LS,Failed,9967500,9967500,9967500",
]
NODE_LIST = """\
sn,cpu_milli,memory_mib,gpu,model
openb-node-0000,32000,262144,0,
openb-node-0001,64000,262144,2,P100
openb-node-0002,64000,262144,2,P100
openb-node-0003,96000,393216,2,T4
openb-node-0004,64000,262144,2,P100
openb-node-0005,128000,786432,8,G3
"""


def pods(tmp_path: Path, rows: list[str] = POD_ROWS, name: str = "openb_pod_list.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join([POD_HEADER, *rows]) + "\n")
    return path


def nodes(tmp_path: Path) -> Path:
    path = tmp_path / "openb_node_list.csv"
    path.write_text(NODE_LIST)
    return path


def test_pods_as_jobs(tmp_path: Path) -> None:
    w = load_workload(pods(tmp_path))
    assert w.format == "openb"
    jobs = {j.job_id: j for j in w.jobs}
    assert list(jobs) == ["openb-pod-0017", "openb-pod-0022", "openb-pod-0035", "openb-pod-0040"]
    big = jobs["openb-pod-0017"]
    assert (big.submit_time, big.num_gpus, big.duration) == (0.0, 8, 10769854.0 - 9437497.0)
    # Run time from scheduling to deletion, not from creation: the wait was the old scheduler's.
    late = jobs["openb-pod-0035"]
    assert (late.submit_time, late.duration) == (9967058.0 - 9437497.0, 9968575.0 - 9967063.0)
    assert w.metadata["first_creation_s"] == 9437497.0
    # A share of a GPU, counted; whole GPUs have none.
    shared = jobs["openb-pod-0022"]
    assert (shared.num_gpus, shared.gpu_milli) == (1, 220)
    assert big.gpu_milli is None and late.gpu_milli is None
    assert w.metadata["fraction_of_a_gpu"] == 1
    ex = w.extras
    assert ex is not None
    # gpu_spec: one type restricts the job to it; several are the types it may use.
    assert (jobs["openb-pod-0040"].gpu_type, jobs["openb-pod-0040"].gpu_types) == ("T4", [])
    assert (late.gpu_type, late.gpu_types) == ("any", ["V100M16", "V100M32"])
    assert ex.loc["openb-pod-0035", "gpu_spec"] == "V100M16|V100M32"
    assert big.gpu_type == "any" and w.metadata["several_gpu_types"] == 1
    assert ex.loc["openb-pod-0040", "qos"] == "LS"
    assert ex.loc["openb-pod-0040", "pod_phase"] == "Failed"
    assert (jobs["openb-pod-0040"].cpu_milli, jobs["openb-pod-0040"].memory_mib) == (2000, 4096)
    assert ex.loc["openb-pod-0035", "scheduled_time"] == 9967063.0 - 9437497.0


def test_pods_left_out_are_counted_and_described(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    w = load_workload(pods(tmp_path))
    assert w.metadata["left_out"] == {
        "cpu_only": 1, "never_scheduled": 1, "no_deletion_time": 1, "non_positive_run_time": 1,
    }  # fmt: skip
    assert w.metadata["rows"] == len(POD_ROWS)
    # The Pending pod's fraction is not counted: it is not a job.
    assert w.metadata["fraction_of_a_gpu"] == 1
    code = main(
        ["trace", "describe", "--plots", str(tmp_path), str(tmp_path / "openb_pod_list.csv")]
    )
    out, err = capsys.readouterr()
    assert code == 0 and '"never_scheduled": 1' in out and '"fraction_of_a_gpu": 1' in out
    assert "1 pods ask for a share of a GPU; 1 allow several GPU types" in err


def test_cpu_only_pods_kept_on_request(tmp_path: Path) -> None:
    w = load_openb(pods(tmp_path), cpu_jobs="keep")
    kept = next(j for j in w.jobs if j.job_id == "openb-pod-0041")
    assert kept.num_gpus == 1
    assert w.extras is not None and bool(w.extras.loc["openb-pod-0041", "cpu_only"])
    assert "cpu_only" not in w.metadata["left_out"]
    workload, info = read_trace(RunSpec(trace=str(pods(tmp_path)), cpu_jobs="keep"))
    assert info["cpu_jobs"] == "keep" and len(workload) == 5


def test_detection_and_broken_cells(tmp_path: Path) -> None:
    assert detect_format(pods(tmp_path)) == "openb"
    no_times = tmp_path / "openb_pod_list_multigpu50.csv"  # (as published: no times)
    no_times.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\nopenb-pod-0000,1,1,1,1000\n")
    with pytest.raises(WorkloadError, match="creation_time"):
        load_workload(no_times)
    broken = pods(tmp_path, [POD_ROWS[0], "openb-pod-0099,1,1,one,1000,,LS,Running,1,5,2"], "b.csv")
    with pytest.raises(WorkloadError, match=r"line 3.*num_gpu"):
        load_workload(broken)
    assert len(load_workload(broken, skip_bad=True)) == 1


def test_node_list_as_cluster(tmp_path: Path) -> None:
    cluster, gpu_less = load_openb_nodes(nodes(tmp_path))
    assert gpu_less == 1
    # Consecutive identical nodes are one group, in the file's order.
    assert [(g.count, g.gpus_per_node, g.gpu_type, g.cpu_milli) for g in cluster.groups] == [
        (2, 2, "P100", 64000), (1, 2, "T4", 96000), (1, 2, "P100", 64000), (1, 8, "G3", 128000),
    ]  # fmt: skip
    assert cluster.groups[-1].memory_mib == 786432
    assert cluster.gpus_by_type() == {"P100": 6, "T4": 2, "G3": 8}
    assert load_cluster(str(nodes(tmp_path))) == cluster
    # A long node list is labelled by its types, not group by group.
    many = ClusterSpec.parse(",".join(["1x2:P100,1x2:T4"] * 5))
    assert cluster_label(many) == "10 nodes in 10 groups, GPUs P100:10,T4:10 (20 GPUs)"
    assert cluster_label(cluster) == "2x2:P100,1x2:T4,1x2:P100,1x8:G3 (16 GPUs)"


def test_real_default_pod_list_and_node_list(shared_data: Path) -> None:
    openb = shared_data / "alibaba-openb"
    if not openb.is_dir():
        pytest.skip("../shared/data/alibaba-openb is not present")
    w = load_workload(openb / "openb_pod_list_default.csv")
    assert w.metadata["rows"] == 8152
    assert len(w) + sum(w.metadata["left_out"].values()) == 8152
    assert w.metadata["left_out"]["cpu_only"] == 1088
    cluster, gpu_less = load_openb_nodes(openb / "openb_node_list_all_node.csv")
    assert (len(cluster.nodes()), gpu_less) == (1213, 310)
    # Every type a pod is restricted to is a node model, spelled the same.
    typed = load_workload(openb / "openb_pod_list_gpuspec33.csv")
    types = {j.gpu_type for j in typed.jobs} - {"any"}
    assert types and types <= set(cluster.gpus_by_type())


@pytest.mark.slow
def test_a_type_restricted_pod_runs_on_its_type(tmp_path: Path) -> None:
    # The T4 node (2 GPUs) is taken until 100 s by the first pod; the second, restricted to T4,
    # would start at once on a free P100 if its type were ignored.
    trace = pods(tmp_path, [
        "openb-pod-0001,8000,8192,2,1000,T4,LS,Succeeded,1000,1100,1000",
        "openb-pod-0002,8000,8192,1,1000,T4,LS,Succeeded,1010,1070,1010",
        "openb-pod-0003,8000,8192,1,500,,BE,Running,1020,1050,1020",
    ])  # fmt: skip
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", "sim", "--trace", str(trace),
         "--cluster-spec", str(nodes(tmp_path)), "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "1 pods ask for a share of a GPU; 0 allow several GPU types" in result.stderr
    with (out / "jobs.csv").open() as f:
        jobs = {row["job_id"]: row for row in csv.DictReader(f)}
    assert all(row["state"] == "completed" for row in jobs.values()) and len(jobs) == 3
    restricted = jobs["openb-pod-0002"]
    assert restricted["gpu_type"] == "T4"
    assert (float(restricted["start"]), float(restricted["end"])) == (100.0, 160.0)
    assert jobs["openb-pod-0003"]["gpu_type"] == "any"
