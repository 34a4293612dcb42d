"""BLAS pools: limited to the intra-op count, OpenBLAS's own workers pinned by TID,
and a note for everything that could not be done (never a silent no-op)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from affinity.binding import blas

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a process mask of at least 2 CPUs")

SCRIPT = r"""
import json, os, sys, warnings
if sys.argv[1] == "hide-threadpoolctl":
    class Hide:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] == "threadpoolctl":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, Hide())
import numpy
import affinity

def masks():
    return {int(t): sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}

out = {"pid": os.getpid(), "before": masks()}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with affinity.pinned("granularity=fine,scatter", threads=2, tensorflow=False) as b:
        out["plan"] = [sorted(s) for s in b.plan.cpusets]
        out["during"] = masks()
        out["pins"] = {str(t): [p.role, p.index, sorted(p.cpus)] for t, p in b.pins.items()}
        out["report"] = b.report().to_dict()
        out["notes"] = b.notes
out["warnings"] = [str(w.message) for w in caught]
out["after"] = masks()
print(json.dumps(out))
"""


def _run(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMP_", "KMP_", "GOMP_", "OPENBLAS_", "TF_NUM_"))}
    env["OPENBLAS_NUM_THREADS"] = "2"  # a pool with one worker besides the caller, on any machine
    r = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_openblas_workers_are_pinned_to_the_plan_and_restored():
    out = _run("plain")
    workers = [t for t in out["before"] if int(t) != out["pid"]]
    assert workers, "numpy's OpenBLAS started no worker"
    # the worker is found by TID, pinned to slot 1 (the caller is member 0), and says so
    blas_pins = {t: p for t, p in out["pins"].items() if p[0] == "blas"}
    assert list(blas_pins.values()) == [["blas", 1, out["plan"][1]]], out["pins"]
    (tid,) = blas_pins
    assert out["during"][tid] == out["plan"][1]
    row = next(r for r in out["report"]["threads"] if str(r["tid"]) == tid)
    assert row["role"] == "blas" and not row["mismatch"]
    assert out["after"] == out["before"]
    assert not any("BLAS" in n for n in out["notes"]), out["notes"]


def test_without_threadpoolctl_the_binding_says_blas_was_not_limited():
    out = _run("hide-threadpoolctl")
    assert ("affinity: BLAS pools were not limited to 2 threads: threadpoolctl is not installed "
            "(pip install threadpoolctl)") in out["warnings"]
    assert not any(p[0] == "blas" for p in out["pins"].values())


def test_a_pool_that_cannot_be_pinned_from_outside_is_named():
    out = blas.BlasResult()
    blas._pin_pool({"internal_api": "mkl", "filepath": "/x/libmkl_rt.so.2", "threading_layer": "intel",
                    "num_threads": 4}, 4, [frozenset({0}), frozenset({1})], out)
    assert out.notes == ["the BLAS pool of mkl (libmkl_rt.so.2) was limited to 4 threads but its workers "
                         "were not pinned: it offers no way to pin them from outside (threading layer intel)"]
    assert not out.pinned
    # one thread (the caller) or an OpenMP team: nothing to pin here, nothing to say
    for pool in ({"internal_api": "openblas", "threading_layer": "pthreads", "filepath": "/x/l.so"},
                 {"internal_api": "openblas", "threading_layer": "openmp", "filepath": "/x/l.so"}):
        out = blas.BlasResult()
        blas._pin_pool(pool, 1 if pool["threading_layer"] == "pthreads" else 4, [frozenset({0})], out)
        assert out.notes == [] and not out.pinned
