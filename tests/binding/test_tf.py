"""Real TensorFlow on this machine: pools sized as planned, workers on the planned
CPUs (read back per TID), the bind map agrees, and pinned() restores everything,
whether it is entered before TensorFlow started or after."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import affinity
from affinity.planning.envvars import worker_slots
from affinity.machine.topology import Topology

pytestmark = [
    pytest.mark.tf,
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a process mask of at least 2 CPUs"),
]

HERE = Path(__file__).resolve().parents[1] / "helpers"
CASES = [(spec, n) for spec in ("granularity=fine,compact,1,0", "scatter", "explicit,proclist=[1,0]")
         for n in (1, 2)]
_cache: dict[tuple[str, int, str], dict] = {}


def scenario(spec: str, threads: int, mode: str = "") -> dict:
    key = (spec, threads, mode)
    if key not in _cache:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "TF_NUM_", "GOMP_"))}
        r = subprocess.run([sys.executable, str(HERE / "tfscenario.py"), spec, str(threads),
                            *([mode] if mode else [])], capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        _cache[key] = json.loads(r.stdout.strip().splitlines()[-1])
    return _cache[key]


def expected(spec: str, threads: int):
    topo = Topology.from_system()
    p = affinity.plan(spec, threads=threads, topology=topo.with_allowed(os.sched_getaffinity(0)))
    return p, worker_slots(p)


def test_expected_plans_on_this_machine():
    """The planner's view of this 2-CPU machine, checked by hand against KMP semantics."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    p, slots = expected("explicit,proclist=[1,0]", 2)
    assert [sorted(s) for s in p.cpusets] == [[1], [0]] and p.inter_op_threads == 1
    p, slots = expected("granularity=fine,compact,1,0", 2)
    assert sorted(sorted(s) for s in slots) == [[cpus[0]], [cpus[1]]]
    p, slots = expected("scatter", 1)
    assert len(slots) == 1 and p.intra_op_threads == 1


@pytest.mark.parametrize("spec,threads", CASES)
def test_pools_sized_and_pinned_before_tf_started(spec, threads):
    out = scenario(spec, threads)
    p, slots = expected(spec, threads)
    st = out["before"]
    assert st["tf_state"]["counts_set"] is True
    # pool sizes as planned, as TensorFlow itself reports them
    assert out["tf_sizes"] == [p.intra_op_threads, p.inter_op_threads]
    assert len(st["tf_state"]["intra"]) == p.intra_op_threads
    assert len(st["tf_state"]["inter"]) == p.inter_op_threads
    # intra-op worker i sits on slot i, read back from the kernel per TID
    masks = {int(k): v for k, v in st["masks"].items()}
    for i, tid in enumerate(st["tf_state"]["intra"]):
        assert masks[tid] == sorted(slots[i]), (i, tid)
    union = sorted(frozenset().union(*p.cpusets))
    for tid in st["tf_state"]["inter"]:
        assert masks[tid] == union
    # the main thread is left as TensorFlow leaves it: never narrowed
    assert masks[out["pid"]] == out["initial"][str(out["pid"])]
    # the bind map says the same, with no mismatch
    rep = st["report"]
    assert rep["mismatches"] == []
    rows = {r["tid"]: r for r in rep["threads"]}
    for i, tid in enumerate(st["tf_state"]["intra"]):
        assert rows[tid]["role"] == "tf-intra" and rows[tid]["index"] == i
        assert rows[tid]["actual"] == rows[tid]["requested"] == sorted(slots[i])
        assert f"tid {tid} thread {i} [tf-intra" in st["report_text"]
    assert st["env"]["OMP_NUM_THREADS"] == str(len(slots))
    assert st["env"]["TF_NUM_INTRAOP_THREADS"] == str(p.intra_op_threads)


@pytest.mark.parametrize("spec,threads", CASES)
def test_everything_restored_after_the_block(spec, threads):
    out = scenario(spec, threads)
    initial = out["initial"]
    original = initial[str(out["pid"])]
    for stage in ("restored", "restored2", "restored3"):
        for tid, m in out[stage]["masks"].items():
            # threads that existed before keep their mask; threads born inside go back
            # to the process's original mask
            assert m == initial.get(tid, original), (stage, tid)
    assert out["restored"]["env"] == out["initial_env"]


@pytest.mark.parametrize("spec,threads", CASES)
def test_pinning_pools_of_a_running_tf(spec, threads):
    out = scenario(spec, threads)
    p, slots = expected(spec, threads)
    st = out["after"]
    assert st["tf_state"]["counts_set"] is False
    # the pools are the ones started in the first block, found again by name/creation order
    assert st["tf_state"]["intra"] == out["before"]["tf_state"]["intra"]
    assert st["tf_state"]["inter"] == out["before"]["tf_state"]["inter"]
    masks = {int(k): v for k, v in st["masks"].items()}
    for i, tid in enumerate(st["tf_state"]["intra"]):
        assert masks[tid] == sorted(slots[i % len(slots)])
    assert st["report"]["mismatches"] == []


def test_tf1_session_pools_are_pinned_on_creation():
    spec, threads = "explicit,proclist=[1,0]", 2
    out = scenario(spec, threads)
    p, _ = expected(spec, threads)
    sess = out["session"]
    st = sess["stage"]
    pins = {tid: (role, cpus) for tid, role, cpus, _ in st["pins"]}
    masks = {int(k): v for k, v in st["masks"].items()}
    assert sess["new"], "the session started no thread"
    union = sorted(frozenset().union(*p.cpusets))
    for tid in sess["new"]:
        if tid in masks:
            assert tid in pins, f"session thread {tid} was not pinned"
            assert masks[tid] == pins[tid][1]
    inter = [t for t in sess["new"] if pins.get(t, ("",))[0] == "tf-inter"]
    assert len(inter) == p.inter_op_threads  # the session's own inter-op pool
    assert all(masks[t] == union for t in inter if t in masks)


LATE = [("granularity=fine,compact,1,0", 1, "late"), ("granularity=fine,compact,1,0", 2, "late"),
        ("granularity=fine,scatter", 1, "late"), ("granularity=fine,scatter", 2, "late"),
        ("granularity=fine,scatter", 2, "late-apply"), ("granularity=fine,compact,1,0", 1, "late-apply")]


@pytest.mark.parametrize("spec,threads,mode", LATE)
def test_tf_imported_after_apply_is_sized_and_pinned(spec, threads, mode):
    """The natural order: apply()/pinned() first, ``import tensorflow`` after."""
    out = scenario(spec, threads, mode)
    p, slots = expected(spec, threads)
    # sized right after the import, before its runtime started
    assert out["sizes_after_import"] == [p.intra_op_threads, p.inter_op_threads]
    st = out["late"]
    assert st["tf_state"] is not None and st["tf_state"]["counts_set"] is True
    assert len(st["tf_state"]["intra"]) == p.intra_op_threads
    masks = {int(k): v for k, v in st["masks"].items()}
    for i, tid in enumerate(st["tf_state"]["intra"]):
        assert masks[tid] == sorted(slots[i]), (i, tid)  # read back per TID
    union = sorted(frozenset().union(*p.cpusets))
    assert all(masks[tid] == union for tid in st["tf_state"]["inter"])
    assert st["report"]["mismatches"] == []


@pytest.mark.parametrize("spec,threads,mode", LATE)
def test_tf_imported_after_apply_leaves_nothing_behind(spec, threads, mode):
    out = scenario(spec, threads, mode)
    original = out["initial"][str(out["pid"])]
    for tid, m in out["restored"]["masks"].items():
        assert m == out["initial"].get(tid, original), tid
    # byte for byte, but for what TensorFlow's import set itself
    assert out["restored"]["environ"] == {**out["initial_environ"], **out["set_by_tf_import"]}
    assert not set(out["set_by_tf_import"]) & {"OMP_NUM_THREADS", "KMP_AFFINITY", "TF_NUM_INTRAOP_THREADS"}
    assert out["restored"]["hooks"] == {"meta_path": [], "patched": []}
    assert out["hooks_before"] == {"meta_path": []}


def test_pool_sizes_of_a_runtime_not_started_are_given_back():
    """TensorFlow imported inside a block in which nothing started its runtime: the
    sizes the binding set (1, 1) used to stay, and TensorFlow then ran single-threaded
    for the rest of the process; they are put back (0, 0: TensorFlow's defaults)."""
    script = """
import json, affinity
with affinity.pinned("granularity=fine,compact", threads=1):
    import tensorflow as tf
    th = tf.config.threading
    inside = [th.get_intra_op_parallelism_threads(), th.get_inter_op_parallelism_threads()]
print(json.dumps({"inside": inside,
                  "after": [th.get_intra_op_parallelism_threads(), th.get_inter_op_parallelism_threads()]}))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "TF_NUM_", "GOMP_"))}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"inside": [1, 1], "after": [0, 0]}


def test_tf_started_inside_an_inner_block_goes_back_to_the_outer_plan():
    """Nested blocks, TensorFlow imported and started inside the inner one: both
    bindings pin its pools (their runtime-start hooks both fire).  At the inner restore
    the pools, born inside it, used to get the process's mask and stay there, the
    outer binding reporting MISMATCH that refresh() did not fix."""
    script = """
import json, os, affinity
def masks(): return {t: sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}
with affinity.pinned("explicit,proclist=[1,0],granularity=fine", threads=2) as outer:
    with affinity.pinned("explicit,proclist=[0,1],granularity=fine", threads=2) as inner:
        import tensorflow as tf
        x = tf.random.uniform((64, 64)); (x @ x).numpy()
        inner_pins = {str(t): sorted(p.cpus) for t, p in inner.pins.items() if p.role == "tf-intra"}
    after = masks()
    out = {"outer": {str(t): sorted(p.cpus) for t, p in outer.pins.items() if p.role == "tf-intra"},
           "inner": inner_pins, "after": after, "mismatches": len(outer.report().mismatches)}
print(json.dumps(out))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "TF_NUM_", "GOMP_"))}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    cpus = sorted(os.sched_getaffinity(0))[:2]
    assert sorted(out["outer"].values()) == [[c] for c in cpus] and out["outer"] != out["inner"]
    assert all(out["after"][t] == m for t, m in out["outer"].items()), out
    assert out["mismatches"] == 0
