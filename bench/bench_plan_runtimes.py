"""Plan time under each runtime's rules, beside the real runtime's own start-up.

Groups ``runtimes-plan-N-PUs``, one per machine (16 and 112 PUs: the recorded
libgomp machines, their fake ``/sys`` trees as libgomp read them; 1024 PUs: 8
packages x 64 cores x 2 threads, its tree written from the topology), settings
``OMP_PLACES=cores OMP_PROC_BIND=spread`` with one thread per PU:

* ``plan gnu gcc12`` / ``plan gnu torch``: :func:`affinity.planning.gnu.plan_gomp`
  (GNU libgomp's rules, GCC 12 and PyTorch's GCC 8.5 build) on a Topology
  already planned on (plans are remembered per Topology, as Intel's are);
* ``plan gnu gcc12 (cold)``: the first plan on a fresh Topology value (the sysfs
  view derived, the places built);
* ``plan intel``: today's planner (Intel's rules) on the same variables;
* ``real libgomp start-up`` ◆: Debian's libgomp started on that machine under the
  golden set's harness (``tests/golden_gomp/replay``: fake ``/sys``, fake CPU count)
  and asked where it bound its threads -- what a user would otherwise run to
  learn the placement.  Every round checks the planner's sets equal the real ones.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from affinity.cpulist import format_list
from affinity.machine.topology import Topology
from affinity.planning.gnu import plan_gomp
from affinity.planning.planner import plan_env

ROOT = Path(__file__).resolve().parent.parent
GNU_TESTS = ROOT / "tests" / "planning" / "gnu"
GOLDEN = ROOT / "tests" / "golden_gomp"
ENV = {"OMP_PLACES": "cores", "OMP_PROC_BIND": "spread"}
MACHINES = {16: "2s4c2t_linux", 112: "skx8180_2s28c2t", 1024: "pack:8 [numa] l3:1 core:64 pu:2"}
ROWS = ["plan gnu gcc12", "plan gnu torch", "plan gnu gcc12 (cold)", "plan intel", "real libgomp start-up"]

_TOPOS: dict[int, tuple[Topology, dict[str, str]]] = {}
_REAL: dict[str, object] = {}


def _machine(npus: int) -> tuple[Topology, dict[str, str]]:
    if npus not in _TOPOS:
        name = MACHINES[npus]
        if name.startswith("pack:"):
            t = Topology.from_synthetic(name)
            files = _helpers().tree_files(t)
        else:
            t = Topology.from_xml(GOLDEN / "hwloc" / f"{name}.xml")
            with open(GOLDEN / "fakesys" / f"{name}.json") as f:
                files = json.load(f)["files"]
        _TOPOS[npus] = (t, files)
    return _TOPOS[npus]


def _helpers():
    for d in (ROOT / "tests", GNU_TESTS):  # tests/helpers, and the golden harness driver
        if str(d) not in sys.path:
            sys.path.insert(0, str(d))
    import gnu_realgomp  # the golden harness driver, shared with the tests

    return gnu_realgomp


def _real():
    if "gomp" not in _REAL:
        h = _helpers()
        if not h.gcc_libgomp_available():
            pytest.skip("needs gcc -fopenmp (Debian's libgomp)")
        _REAL["gomp"] = h.RealGomp(None)
    return _REAL["gomp"]


@pytest.mark.parametrize("row", ROWS)
@pytest.mark.parametrize("npus", sorted(MACHINES))
def test_plan_runtimes(benchmark, npus: int, row: str) -> None:
    benchmark.group = f"runtimes-plan-{npus}-PUs"
    t, files = _machine(npus)
    want = plan_gomp(ENV, t)
    assert want.threads == npus
    if row.endswith("(cold)"):
        name = MACHINES[npus]

        def fresh():
            topo = Topology.from_synthetic(name) if name.startswith("pack:") else \
                Topology.from_xml(GOLDEN / "hwloc" / f"{name}.xml")
            return (ENV, topo), {}

        p = benchmark.pedantic(plan_gomp, setup=fresh, rounds=15)
        assert p.cpusets == want.cpusets
    elif row.startswith("plan gnu"):
        build = row.split()[-1]
        plan_gomp(ENV, t, build=build)
        p = benchmark(plan_gomp, ENV, t, None, build)
        assert p.cpusets == want.cpusets
    elif row == "plan intel":
        plan_env(ENV, topology=t)
        p = benchmark(plan_env, ENV, topology=t)
        assert p.threads == npus
    else:
        gomp = _real()
        tree = gomp.tree(str(npus), files)
        out: dict[str, object] = {}

        def run() -> None:
            out["r"] = gomp.run(tree, max(t.cpuset) + 1, dict(ENV), timeout=120)

        benchmark.pedantic(run, rounds=5 if npus < 1024 else 3, iterations=1, warmup_rounds=1)
        r = out["r"]
        assert r["rc"] == 0 and r["masks"] == [format_list(s) for s in want.cpusets], \
            "the planner disagrees with the real libgomp"
