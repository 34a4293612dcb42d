"""An explicit list read in the other grammar (issue 42, point 6).

libiomp5 keeps one explicit list as text and parses it when affinity initializes,
in the grammar of the binding: a typeless ``KMP_AFFINITY=proclist=[...]`` followed by
an ``OMP_PLACES`` list (which replaces it) is read as a proclist under KMP_AFFINITY's
``intel`` binding; a proclist under ``OMP_PROC_BIND=true|close|spread`` is read as a
place list.  The planner raised ``AttributeError`` / ``TypeError`` for both (and
``affinity run`` never ran the command).  Expected masks recorded with the real
runtimes (libiomp5 of intel-openmp 2026.2.0, LLVM libomp 19, through ``oracle/``) on
8 packages x 4 cores x 1 PU, OMP_NUM_THREADS=4: the planner gives the same masks, and
refuses where they abort.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import affinity
from affinity.errors import PlanError
from affinity.machine.topology import Topology

MACHINE = Topology.from_synthetic("pack:8 core:4 pu:1")
ABORTS = "aborts"
#: (environment, libiomp5's masks, libomp 19's masks) as the runtimes bound 4 threads
RECORDED = [
    ({"KMP_AFFINITY": "proclist=[0]", "OMP_PLACES": "{0,1}"}, [[0, 1]] * 4, ABORTS),
    ({"KMP_AFFINITY": "proclist=[1]", "OMP_PROC_BIND": "true"}, [[1]] * 4, [[1]] * 4),
    ({"KMP_AFFINITY": "proclist=[1,3-5]", "OMP_PROC_BIND": "true"}, ABORTS, ABORTS),
    ({"KMP_AFFINITY": "proclist=[0]", "OMP_PLACES": "{0,1},{2:2}"}, ABORTS, ABORTS),
    ({"KMP_AFFINITY": "proclist=[{1,2},3]", "OMP_PROC_BIND": "close"}, [[1, 2], [1, 2], [3], [3]],
     [[1, 2], [1, 2], [3], [3]]),
    ({"KMP_AFFINITY": "proclist=[0]", "OMP_PLACES": "{0,1}", "OMP_PROC_BIND": "close"}, [[0, 1]] * 4, ABORTS),
    ({"KMP_AFFINITY": "proclist=[0]", "OMP_PLACES": "threads"}, [[0], [1], [2], [3]], [[0], [1], [2], [3]]),
    ({"KMP_AFFINITY": "proclist=[0-3]", "OMP_PLACES": "{4}"}, [[4]] * 4, ABORTS),
    ({"KMP_AFFINITY": "proclist=[1]", "OMP_PLACES": "{2},{3}", "OMP_PROC_BIND": "spread"}, [[2], [2], [3], [3]],
     ABORTS),
    ({"KMP_AFFINITY": "granularity=fine,proclist=[{1,2},{5,6}]", "OMP_PROC_BIND": "spread"},
     [[1, 2], [1, 2], [5, 6], [5, 6]], [[1, 2], [1, 2], [5, 6], [5, 6]]),
    ({"KMP_AFFINITY": "proclist=[0,1]", "OMP_PLACES": "{0},{1}"}, [[0], [1], [0], [1]], ABORTS),
]


@pytest.mark.parametrize("runtime,column", [("intel", 1), ("llvm", 2)])
@pytest.mark.parametrize("case", range(len(RECORDED)))
def test_as_the_runtimes_bound(case, runtime, column):
    env, want = RECORDED[case][0], RECORDED[case][column]
    for call in (lambda: affinity.plan_env({**env, "OMP_NUM_THREADS": "4"}, topology=MACHINE, runtime=runtime),
                 lambda: affinity.plan(None, 4, MACHINE, strict=False, env=env, runtime=runtime)):
        if want == ABORTS:
            with pytest.raises(PlanError, match="abort"):
                call()
        else:
            assert [sorted(s) for s in call().cpusets] == want


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the proclist names CPUs 0 and 1")
@pytest.mark.parametrize("env", [{"KMP_AFFINITY": "proclist=[0]", "OMP_PLACES": "{0,1}"},
                                 {"KMP_AFFINITY": "proclist=[1]", "OMP_PROC_BIND": "true"}])
def test_affinity_run_runs_the_command(env):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "GOMP_"))}
    r = subprocess.run([sys.executable, "-m", "affinity", "run", "--", sys.executable, "-c", "print('ran')"],
                       capture_output=True, text=True, env={**base, **env, "AFFINITY_LAUNCH_CACHE": "0"},
                       timeout=120)
    assert r.returncode == 0 and r.stdout == "ran\n", r.stderr
