"""OpenMP runtimes already loaded in the process: found, sized and pinned from
inside their own parallel region, read back by the program's own threads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.ompprog import build, build_program, run_program

CPUS = sorted(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="needs a process mask of at least 2 CPUs")

# Runs in a fresh process per runtime (two OpenMP runtimes must not share a process).
LOW_LEVEL = r"""
import ctypes, json, os, sys
lib = ctypes.CDLL(sys.argv[1])
from affinity.binding import openmp
def members():
    tids = (ctypes.c_int * 8)(); masks = (ctypes.c_ulong * 8)()
    n = lib.report(tids, masks, 8)
    return [[tids[i], [c for c in range(64) if masks[i] >> c & 1]] for i in range(n)]
rts = openmp.loaded_runtimes()
before = members()
cpus = sorted(os.sched_getaffinity(0))
rt = rts[0]
rt.set_num_threads(2)
pinned = rt.pin_team([frozenset({cpus[1]}), frozenset({cpus[0]})])
after = members()
print(json.dumps({"runtimes": [[r.kind, r.path] for r in rts], "before": before,
                  "pinned": [[t, sorted(m)] for t, m in pinned], "after": after,
                  "max_threads": rt.max_threads(), "main": os.getpid()}))
"""


@pytest.mark.parametrize("kind", ["libgomp", "libiomp5"])
def test_pin_team_from_inside_a_region(tmp_path: Path, kind: str):
    lib = build(kind, tmp_path)
    r = subprocess.run([sys.executable, "-c", LOW_LEVEL, str(lib)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [k for k, _ in out["runtimes"]] == [kind]
    assert out["max_threads"] == 2
    # the team the program sees after pinning: member 0 on the second CPU, member 1 on the first
    assert [m for _, m in out["after"]] == [[CPUS[1]], [CPUS[0]]]
    # ... and they are the very threads our region pinned (hot team reused)
    assert [t for t, _ in out["after"]] == [t for t, _ in out["pinned"]]
    assert out["after"][0][0] == out["main"]  # member 0 is the calling thread
    assert "OMP: Warning" not in r.stderr


# ---------------------------------------------------------------------------
# The exported environment, obeyed by real runtimes in child processes

ENV_SPECS = ["explicit,proclist=[1,0]", "granularity=fine,compact", "scatter",
             "explicit,proclist=[{0,1},0]"]


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    d = tmp_path_factory.mktemp("omp")
    return {k: build_program(k, d) for k in ("libgomp", "libiomp5")}


@pytest.mark.parametrize("kind", ["libgomp", "libiomp5"])
@pytest.mark.parametrize("spec", ENV_SPECS)
def test_exported_environment_binds_children_as_planned(programs, kind, spec):
    from affinity import plan
    from affinity.planning.envvars import plan_environment
    from affinity.machine.topology import Topology

    p = plan(spec, threads=2, topology=Topology.from_system())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "GOMP_"))}
    env.update(plan_environment(p))
    masks, err = run_program(programs[kind], env)
    assert masks == list(p.cpusets)  # thread i on the plan's set i, as the runtime itself would
    assert "OMP:" not in err, err  # no warning, no error from the runtime
    if all(len(s) == 1 for s in p.cpusets):
        assert "GOMP_CPU_AFFINITY" in env
    else:
        assert "GOMP_CPU_AFFINITY" not in env  # libgomp's list cannot say "a set per thread"
