"""Every registered scheduling policy: registry, parameters, and valid allocations always."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuyard.shared.model import ANY_GPU
from gpuyard.shared.policy import PolicyError, SchedulingInput, scheduling_policies

from .views import inp, job

# --------------------------------------------------------------------------- registry


@pytest.mark.parametrize(
    "name", ["fifo", "sjf", "srtf", "las", "tiresias", "tiresias-gittins", "optimus"]
)
def test_registry_and_capacity_invariant(name: str):
    pol = scheduling_policies.create(name)
    jobs = [
        job(
            f"j{i}",
            1 + i % 3,
            running=i % 4 == 0,
            submit=float(i),
            attained_service=float(i * 37 % 500),
            executed_time=float(i * 37 % 500),
            remaining_time=float(1000 - i),
            spec={"duration": 2000.0 - i},
        )
        for i in range(40)
    ]
    out = pol.schedule(inp(jobs, gpus={"gpu": 16}, now=1000.0))
    assert sum(a.num_gpus for a in out) <= 16
    assert len({a.job_id for a in out}) == len(out)
    for a in out:
        lo, hi = next(j for j in jobs if j.job_id == a.job_id).spec.gpu_range
        assert lo <= a.num_gpus <= hi
    nxt = pol.next_decision_time(inp(jobs, gpus={"gpu": 16}, now=1000.0))
    assert nxt is None or nxt > 1000.0


def test_registry_imports_a_policy_only_when_it_is_named():
    """Listing names imports no policy; creating `fifo` imports Blox's family, not Gavel's
    programs or OR-Tools (a third of a second at every process start)."""
    code = (
        "import sys\n"
        "from gpuyard.shared.policy import scheduling_policies\n"
        "names = scheduling_policies.names()\n"
        "assert 'max_min_fairness_perf' in names and 'bftrainer' in names, names\n"
        "assert not any(m.startswith('gpuyard.policies.') for m in sys.modules), 'listed'\n"
        "scheduling_policies.create('fifo')\n"
        "print(sorted(m for m in sys.modules if m.startswith(('gpuyard.policies.', 'ortools'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    loaded = out.stdout
    assert "gpuyard.policies.blox" in loaded
    assert "gpuyard.policies.gavel" not in loaded and "ortools" not in loaded


def test_registry_rejects_unknown_params():
    with pytest.raises(PolicyError):
        scheduling_policies.create("las", {"nope": 1})
    assert scheduling_policies.create("las", {"key": "rounds"}).params.key == "rounds"


# --------------------------------------------------------------------------- property test


@st.composite
def random_inputs(draw):
    cap = {"a": draw(st.integers(0, 12)), "b": draw(st.integers(0, 12))}
    used = dict.fromkeys(cap, 0)
    jobs = []
    for i in range(draw(st.integers(0, 25))):
        n = draw(st.integers(1, 6))
        low = draw(st.integers(1, n))
        t = draw(st.sampled_from(["a", "b"]))
        run = draw(st.booleans()) and used[t] + n <= cap[t]
        used[t] += n if run else 0
        executed = draw(st.floats(0, 1e4))
        jobs.append(
            job(
                f"j{i}",
                n,
                running=run,
                gpu_type=t,
                submit=float(draw(st.integers(0, 100))),
                seq=i,
                spec={
                    "min_gpus": low,
                    "max_gpus": n + draw(st.integers(0, 3)),
                    "gpu_type": draw(st.sampled_from([ANY_GPU, t])),
                    "priority": draw(st.integers(0, 1)),
                },
                attained_service=executed * n,
                executed_time=executed,
                first_start=0.0 if executed else None,
                remaining_time=draw(st.one_of(st.none(), st.floats(1, 1e5))),
                queued_since=None if run else float(draw(st.integers(0, 5000))),
            )
        )
    return inp(jobs, gpus=cap, now=5000.0)


@pytest.mark.parametrize(
    "name", ["fifo", "sjf", "srtf", "las", "tiresias", "tiresias-gittins", "optimus"]
)
@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(data=random_inputs())
def test_allocations_always_valid(name: str, data: SchedulingInput):
    out = scheduling_policies.create(name).schedule(data)
    by_id = {j.job_id: j for j in data.jobs}
    used: dict[str, int] = {}
    assert len({a.job_id for a in out}) == len(out)
    for a in out:
        j = by_id[a.job_id]
        lo, hi = j.spec.gpu_range
        assert lo <= a.num_gpus <= hi
        assert j.spec.gpu_type in (ANY_GPU, a.gpu_type)
        if j.state == "running" and a.gpu_type != j.gpu_type:
            # only a job preempted by a more important one may restart on another type
            assert j.spec.gpu_type == ANY_GPU
        used[a.gpu_type] = used.get(a.gpu_type, 0) + a.num_gpus
    assert all(used[t] <= data.cluster.capacity.get(t, 0) for t in used)
