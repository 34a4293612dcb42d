"""apply() / pinned() / Binding in this process (without TensorFlow; see test_tf.py),
everything read back from the kernel and restored exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest

import affinity
from affinity.binding import numa
from affinity.planning.envvars import EXPORTED_VARIABLES, worker_slots
from affinity import plan
from affinity.errors import AffinityWarning, SpecError, UnsupportedError
from affinity.machine.topology import Topology

from helpers.ompprog import build
from helpers.threads import Parked, all_masks, restore_masks

CPUS = sorted(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="needs a process mask of at least 2 CPUs")
KW = {"tensorflow": False, "openmp": False, "blas": False}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for k in EXPORTED_VARIABLES:
        monkeypatch.delenv(k, raising=False)
    before = all_masks()
    yield
    from affinity.binding.apply import active_bindings

    assert active_bindings() == [], "a test left a binding active"
    restore_masks(before)  # belt and braces: never leak a mask into other tests


def test_env_exported_and_restored_user_values_kept(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    with affinity.pinned("explicit,proclist=[1,0]", threads=2, export="keep", **KW) as b:
        assert b.env_kept == {"OMP_NUM_THREADS": "7"}
        assert os.environ["OMP_NUM_THREADS"] == "7"  # the user's value kept, as asked
        assert os.environ["KMP_AFFINITY"] == "granularity=fine,proclist=[1,0],explicit"
        assert os.environ["OMP_PLACES"] == "{1},{0}"
        assert os.environ["TF_NUM_INTRAOP_THREADS"] == "2"
        assert os.environ["KMP_BLOCKTIME"] == "1"
    assert os.environ["OMP_NUM_THREADS"] == "7"
    assert not any(k in os.environ for k in EXPORTED_VARIABLES if k != "OMP_NUM_THREADS")
    with affinity.pinned("explicit,proclist=[1,0]", threads=2, export="override", **KW) as b:
        assert os.environ["OMP_NUM_THREADS"] == "2" and b.env_kept == {}
    assert os.environ["OMP_NUM_THREADS"] == "7"
    with affinity.pinned("explicit,proclist=[1,0]", export=False, **KW) as b:
        assert b.env_set == {} and "KMP_AFFINITY" not in os.environ


def test_threads_born_inside_go_to_the_plan_then_back_to_the_original_mask():
    original = frozenset(os.sched_getaffinity(0))
    with Parked() as old:
        os.sched_setaffinity(old.tid, {CPUS[0]})  # a pre-existing, specially pinned thread
        with affinity.pinned("explicit,proclist=[1]", threads=1, **KW) as b:
            with Parked() as young:
                assert b.refresh() == [young.tid]
                assert os.sched_getaffinity(young.tid) == {1}
                assert b.pins[young.tid].role == "other"
                b.restore()
                # pre-existing keeps its own mask; born inside goes to the original mask
                assert os.sched_getaffinity(old.tid) == {CPUS[0]}
                assert os.sched_getaffinity(young.tid) == original
        with pytest.raises(RuntimeError, match="restored"):
            b.refresh()


def test_outer_refresh_puts_back_what_an_inner_block_changed_and_leaves_the_inner_pins():
    """Nested bindings (issue #40, point 2): while an inner binding is active, the outer
    one's refresh() leaves the inner's pins alone; once the inner block is left, every
    thread is where the outer binding says, and outer.refresh() re-pins a thread of
    its own whose mask changed since (it used to return [] and leave it)."""
    with affinity.pinned(f"explicit,proclist=[{CPUS[1]}]", threads=1, **KW) as outer, Parked() as early:
        assert outer.refresh() == [early.tid]
        with affinity.pinned(f"explicit,proclist=[{CPUS[0]}]", threads=1, **KW) as inner:
            with Parked() as young:
                assert inner.refresh() == [young.tid]
                assert outer.refresh() == []  # the inner binding's set stands while it is active
                assert outer.pins[young.tid].cpus == {CPUS[1]}
                assert os.sched_getaffinity(young.tid) == {CPUS[0]}
                inner.restore()
                assert os.sched_getaffinity(young.tid) == {CPUS[1]}  # the outer binding's word
                assert outer.report().mismatches == []
                os.sched_setaffinity(early.tid, set(CPUS))  # someone else moves a thread of ours
                os.sched_setaffinity(young.tid, {CPUS[0]})
                assert outer.refresh() == sorted([early.tid, young.tid])
                assert os.sched_getaffinity(early.tid) == os.sched_getaffinity(young.tid) == {CPUS[1]}
                assert outer.refresh() == []


def test_main_thread_is_never_narrowed_and_children_inherit_its_mask():
    original = frozenset(os.sched_getaffinity(0))
    with affinity.pinned("explicit,proclist=[1]", threads=1, **KW):
        assert frozenset(os.sched_getaffinity(0)) == original
        r = subprocess.run(["grep", "Cpus_allowed_list", "/proc/self/status"], capture_output=True,
                           text=True, check=True)
        from affinity.cpulist import parse_list

        assert parse_list(r.stdout.split(":")[1]) == original


def test_nested_blocks_restore_in_order_and_on_exceptions():
    start = all_masks()
    with Parked() as w:
        with affinity.pinned("explicit,proclist=[0,1]", **KW):
            with Parked():
                pass
            mid_env = os.environ["KMP_AFFINITY"]
            with pytest.raises(ZeroDivisionError):
                with affinity.pinned("explicit,proclist=[1]", threads=1, **KW):
                    assert os.environ["KMP_AFFINITY"].endswith("proclist=[1],explicit")
                    1 / 0
            assert os.environ["KMP_AFFINITY"] == mid_env  # the inner block undid its own
        assert "KMP_AFFINITY" not in os.environ
        for tid, m in all_masks().items():
            assert m == start.get(tid, start[os.getpid()]), tid
        assert w.tid


def test_decorator_gives_each_call_its_own_binding():
    seen = []

    @affinity.pinned("explicit,proclist=[1,0]", threads=2, **KW)
    def work():
        seen.append(os.environ["OMP_PLACES"])
        return len(affinity.binding.apply.active_bindings())

    assert work() == 1 and work() == 1
    assert seen == ["{1},{0}", "{1},{0}"] and "OMP_PLACES" not in os.environ


def test_membind_auto_binds_the_calling_thread_and_is_undone():
    def go():
        before = numa.get_membind()
        with affinity.pinned("explicit,proclist=[0]", threads=1, membind="auto", **KW) as b:
            during = numa.get_membind()
            assert b.membind == during
        return before, during, numa.get_membind()

    out = {}
    t = threading.Thread(target=lambda: out.update(r=go()))
    t.start()
    t.join()
    before, during, after = out["r"]
    node = Topology.from_system().numa_of(0).os_index
    assert during == numa.MemPolicy("bind", frozenset({node}))
    assert after.policy == before.policy == "default"


def test_planner_warnings_and_strictness():
    with pytest.raises(SpecError):
        affinity.apply("compakt", strict=True, **KW)
    with pytest.warns(AffinityWarning, match='parameter invalid, ignoring "compakt"') as rec:
        with affinity.pinned("compakt", **KW) as b:  # lenient, like the runtime: warn and fall back
            assert any("compakt" in n for n in b.notes)
    assert rec[0].filename == __file__  # the warning points at the user's line
    with pytest.raises(SpecError, match="compcat") as ei:
        affinity.apply("granularity=fine,compcat", strict=True, **KW)
    assert "^" in str(ei.value)  # the caret under the bad word, as plan() shows it
    with pytest.raises(UnsupportedError, match="not this system"):
        affinity.apply("compact", topology=Topology.from_synthetic("pack:2 core:2 pu:1"), **KW)
    # the threads calls take the topology forms apply() takes ("system" raised AttributeError)
    assert affinity.threads.set_affinity(os.sched_getaffinity(0), topology="system") == os.sched_getaffinity(0)
    with pytest.raises(UnsupportedError, match="'synthetic:pack:1 core:2 pu:1' refused: it is not this system"):
        affinity.threads.set_affinity(os.sched_getaffinity(0), topology="synthetic:pack:1 core:2 pu:1")
    with pytest.raises(TypeError, match="topology must be a Topology, 'system' or a topology source, not int"):
        affinity.threads.set_affinity(os.sched_getaffinity(0), topology=3)
    with pytest.raises(ValueError, match="inter"):
        affinity.apply("compact", inter_placement="sideways", **KW)
    with pytest.raises(ValueError, match="tensorflow must be one of"):
        affinity.apply("compact", tensorflow="yes")


def test_report_of_a_binding_matches_the_kernel():
    with Parked():
        with affinity.pinned("explicit,proclist=[1,0]", threads=2, **KW) as b:
            with Parked() as y:
                b.refresh()
                bm = affinity.report()
                rows = {r.tid: r for r in bm.rows}
                assert rows[y.tid].requested == rows[y.tid].actual == frozenset({0, 1})
                assert rows[os.getpid()].role == "main" and rows[os.getpid()].mempolicy
                assert bm.mismatches == []
                os.sched_setaffinity(y.tid, {0})  # someone moves it behind our back
                bm = b.report()
                assert [r.tid for r in bm.mismatches] == [y.tid]
                assert f"tid {y.tid} [other python] bound to OS proc set {{0}}" in bm.text()
                assert "MISMATCH: requested {0-1}" in bm.text()
                assert json.loads(bm.to_json())["mismatches"] == [y.tid]


# In a fresh process: an OpenMP runtime is loaded, apply() sizes and pins its team.
OMP_APPLY = r"""
import ctypes, json, os, sys, warnings
warnings.simplefilter("ignore")
lib = ctypes.CDLL(sys.argv[1])
import affinity
def members():
    tids = (ctypes.c_int * 8)(); masks = (ctypes.c_ulong * 8)()
    n = lib.report(tids, masks, 8)
    return [[tids[i], [c for c in range(64) if masks[i] >> c & 1]] for i in range(n)]
before = members()
with affinity.pinned(sys.argv[2], threads=2, tensorflow=False) as b:
    inside = members()
    pins = [[p.tid, p.role, sorted(p.cpus), p.index] for p in b.pins.values()]
    slots = [sorted(s) for s in b.slots]
    notes = b.notes
after = members()
print(json.dumps({"before": before, "inside": inside, "after": after, "pins": pins,
                  "slots": slots, "notes": notes, "main": os.getpid()}))
"""


@pytest.mark.parametrize("kind", ["libgomp", "libiomp5"])
def test_apply_pins_a_loaded_openmp_team_and_restores_it(tmp_path: Path, kind: str):
    lib = build(kind, tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "GOMP_"))}
    r = subprocess.run([sys.executable, "-c", OMP_APPLY, str(lib), "explicit,proclist=[1,0]"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # the program's own threads read the plan from inside its parallel region
    assert [m for _, m in out["inside"]] == out["slots"] == [[1], [0]]
    roles = {tid: role for tid, role, _, _ in out["pins"]}
    assert roles[out["inside"][0][0]] == "main" and roles[out["inside"][1][0]] == "openmp"
    assert any("main thread is OpenMP team member 0" in n for n in out["notes"])
    # and get their masks back afterwards
    assert [m for _, m in out["after"]] == [m for _, m in out["before"]]


def test_blas_pools_are_limited_and_restored():
    import numpy  # noqa: F401  (loads OpenBLAS; numpy and threadpoolctl are test requirements)
    import threadpoolctl

    blas = [i for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
    if not blas:
        pytest.skip("this numpy has no BLAS thread pool to limit")
    before = [i["num_threads"] for i in blas]
    with affinity.pinned("explicit,proclist=[0]", threads=1, tensorflow=False, openmp=False, blas="auto"):
        assert all(i["num_threads"] == 1 for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas")
    assert [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"] == before


def test_worker_slots_follow_granularity():
    t = Topology.from_synthetic("pack:2 [numa] core:4 pu:2(indexes=2*8:1*2)")
    p = plan("compact", topology=t)  # granularity=core: each core listed twice
    assert p.threads == 16
    assert worker_slots(p) == [t.cores[i].cpuset for i in range(8)]
    p = plan("granularity=fine,compact", topology=t)
    assert worker_slots(p) == [frozenset({c}) for c in (0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15)]


def test_warnings_are_affinity_warnings_and_runtime_warnings():
    """What affinity applies differently from what was asked is an AffinityWarning,
    which users filtering RuntimeWarning see too."""
    with pytest.warns(RuntimeWarning) as rec:
        with affinity.pinned("granularity=fine,compcat", **KW):
            pass
    assert [type(w.message) for w in rec] == [AffinityWarning]
    assert 'ignoring "compcat"' in str(rec[0].message)

def test_rank_share_in_process(monkeypatch):
    # local rank 1 of 2 (Open MPI's variables): the plan stays inside rank 1's share
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
    from affinity.planning.partition import rank_share

    share = rank_share(Topology.from_system().with_allowed(os.sched_getaffinity(0)), 1, 2)
    with affinity.pinned("granularity=fine,compact", rank="auto", **KW) as b:
        assert frozenset().union(*b.plan.cpusets) <= share.cpus
        assert b.plan.threads == len(share.cpus)
    with affinity.pinned("granularity=fine,compact", rank="0/2", **KW) as b0:
        assert not (frozenset().union(*b0.plan.cpusets) & share.cpus)


def test_torchruns_default_team_size_is_a_note_not_a_warning(monkeypatch):
    """Under torchrun every rank gets OMP_NUM_THREADS=1 when the user set none: apply()
    sets it aside and says so in Binding.notes, without an AffinityWarning in every rank
    (it used to warn, where ``affinity run`` says it only with -v)."""
    for k, v in (("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "2"), ("OMP_NUM_THREADS", "1")):
        monkeypatch.setenv(k, v)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with affinity.pinned("granularity=fine,compact", rank="auto", **KW) as b:
            notes = list(b.notes)
    assert any(n.startswith("OMP_NUM_THREADS=1 is what torchrun sets for every worker") for n in notes)
    assert not [str(w.message) for w in caught if issubclass(w.category, AffinityWarning)]


RANK_SCRIPT = r"""
import json, os, subprocess, threading, affinity
out = {"before": sorted(os.sched_getaffinity(0))}
with affinity.pinned("granularity=fine,compact", rank="auto", tensorflow=False, openmp=False,
                     blas=False) as b:
    out["cpus"] = sorted(set().union(*b.plan.cpusets))
    out["threads"] = b.plan.threads
    out["omp"] = os.environ.get("OMP_NUM_THREADS")
    out["main"] = sorted(os.sched_getaffinity(0))
    t = threading.Thread(target=lambda: out.__setitem__("thread", sorted(os.sched_getaffinity(0))))
    t.start(); t.join()
    out["child"] = subprocess.run(["sh", "-c", "grep Cpus_allowed_list /proc/self/status"],
                                  capture_output=True, text=True).stdout.split()[-1]
out["omp_after"] = os.environ.get("OMP_NUM_THREADS")
out["after"] = sorted(os.sched_getaffinity(0))
with open(os.path.join(os.environ["RANK_OUT"], str(os.getpid())), "w") as fh:
    json.dump(out, fh)
"""


@pytest.mark.skipif(__import__("shutil").which("mpirun") is None,
                    reason="no MPI launcher (make sysdeps installs MPICH as root)")
def test_rank_auto_under_a_real_mpirun(tmp_path):
    """apply(rank="auto") in two processes started by a real mpirun: each plans inside its
    own disjoint share of this node, and restores its environment."""
    env = {k: v for k, v in os.environ.items() if k not in EXPORTED_VARIABLES}
    env.update(RANK_OUT=str(tmp_path), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    r = subprocess.run(["mpirun", "-np", "2", sys.executable, "-c", RANK_SCRIPT], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    got = [json.loads(f.read_text()) for f in sorted(tmp_path.iterdir())]
    assert len(got) == 2
    a, b = (set(g["cpus"]) for g in got)
    assert a and b and not a & b and a | b <= set(CPUS)
    assert all(g["omp"] == str(g["threads"]) and g["omp_after"] is None for g in got)
    # the calling thread, a thread it starts and a process it runs stay in the rank's share
    # (they stayed on the whole node, overlapping the other rank, unless torch was loaded)
    for g in got:
        assert g["main"] == g["thread"] == g["cpus"] and g["child"] == ",".join(map(str, g["cpus"]))
        assert g["after"] == g["before"]


def test_norespect_may_bind_outside_the_process_mask_inside_the_cgroup():
    """libiomp5 with norespect under taskset (a narrower mask, the whole cgroup) binds
    outside the mask and works; apply() plans it instead of refusing it."""
    import shutil

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or shutil.which("taskset") is None:
        pytest.skip("needs 2 CPUs and taskset")
    code = ("import affinity, json, warnings; warnings.simplefilter('ignore')\n"
            "b = affinity.apply('norespect,granularity=fine,compact', threads=2, tensorflow=False, "
            "openmp=False, blas=False)\n"
            "print(json.dumps([sorted(s) for s in b.plan.cpusets])); b.restore()")
    r = subprocess.run(["taskset", "-c", str(cpus[0]), sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(c for s in json.loads(r.stdout) for c in s) == cpus[:2]


def test_a_mistyped_type_warns_what_it_was_probably_meant_to_be():
    """apply('compakt,1,0') (issue #40, point 5): the runtime's two warnings, the second
    ("'default' type does not take any integer parameters") confusing with no word of the
    typo; each now carries its hint, the runtime's words kept."""
    with pytest.warns(AffinityWarning) as caught:
        b = affinity.apply("compakt,1,0", **KW)
    b.restore()
    said = [str(w.message) for w in caught]
    assert said[:2] == [
        'affinity: planner: KMP_AFFINITY: parameter invalid, ignoring "compakt". (did you mean "compact"?)',
        "affinity: planner: KMP_AFFINITY: 'default' type does not take any integer parameters, ignoring them. "
        "(the type is 'default' because \"compakt\" was ignored)"]
