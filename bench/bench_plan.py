"""Planner speed: ``plan()`` on 8, 112, 272 and 1024-PU machines, side by side
with what a user would otherwise run to learn the same bindings: the real
Intel runtime (libiomp5) started on that machine and asked where it put its
threads.

Machines that do not exist here are described to both sides the same way: a
generated ``/proc/cpuinfo`` file with one NUMA node per package.  The planner
reads it through :meth:`Topology.from_cpuinfo`; libiomp5 reads it through
``KMP_CPUINFO_FILE`` under the oracle's fake-kernel shim (``oracle/``, built
by ``make bench`` through ``oracle/setup.sh``), which records the masks the
runtime binds to.  Every row checks that the planner's cpusets equal the
runtime's.

Rows per machine (group ``plan-N-PUs``): ``plan(spec)`` on a Topology already
planned on (how it is used: the planner's two caches -- how the runtime read
the settings, and per Topology the runtime's table, initialization and team --
hit), the cold first plan on a fresh Topology value, the same plan computed
with no cache at all (``uncached``: what the caches save), the plan by LLVM
libomp's rules (``runtime="llvm"``), ``plan_env`` with a malformed
``KMP_AFFINITY`` (warnings and fallback), and the runtime (◆).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from affinity.planning import planner
from affinity.planning.planner import plan, plan_env
from affinity.machine.topology import Topology

ROOT = Path(__file__).resolve().parent.parent
MACHINES = {
    8: (1, 4, 2),       # 1 package x 4 cores x 2 threads
    112: (2, 28, 2),    # Xeon Platinum 8180-like
    272: (1, 68, 4),    # KNL-like
    1024: (8, 64, 2),   # 8 packages x 64 cores x 2 threads
}
SPECS = {
    "compact": {"KMP_AFFINITY": "granularity=fine,compact"},
    "scatter": {"KMP_AFFINITY": "scatter"},
    "places": {"OMP_PLACES": "cores", "OMP_PROC_BIND": "spread"},
    "balanced": {"KMP_AFFINITY": "granularity=fine,balanced"},
}
ROWS = [*(f"plan {k}" for k in SPECS), "plan compact (cold)", "plan compact (uncached)", "plan compact (llvm)",
        "plan_env malformed", "libiomp5 compact"]


def _rows(S: int, C: int, T: int) -> list[tuple[int, int, int]]:
    """(OS proc, package, core), Linux numbering: siblings p, p + S*C, ..."""
    return sorted((t * S * C + s * C + c, s, c) for t in range(T) for s in range(S) for c in range(C))


def build(S: int, C: int, T: int) -> Topology:
    """A machine of S packages x C cores x T threads, Linux numbering."""
    rows = _rows(S, C, T)
    text = "\n".join(f"processor\t: {p}\nphysical id\t: {s}\ncore id\t\t: {c}\n" for p, s, c in rows) + "\n"
    d = Path(tempfile.mkdtemp(prefix="bench-plan-"))
    f = d / f"{S}x{C}x{T}.cpuinfo"
    f.write_text(text)
    numa = {s: [p for p, s2, _c in rows if s2 == s] for s in range(S)}
    return Topology.from_cpuinfo(f, numa_nodes=numa)


_TOPOS: dict[int, Topology] = {}


def topology(npus: int) -> Topology:
    if npus not in _TOPOS:
        _TOPOS[npus] = build(*MACHINES[npus])
    return _TOPOS[npus]


def _runtime() -> Any:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from oracle.runtime import find_runtimes

    rts = find_runtimes()
    if rts is None:
        pytest.skip("the real runtime is not built: run `bash oracle/setup.sh` (make bench does)")
    return rts


def _run_libiomp5(rts: Any, npus: int, env: dict[str, str]) -> list[frozenset[int]]:
    from oracle.machines import _mk, linux_style
    from oracle.runtime import MachineDir, run_case

    m = _mk(f"bench{npus}", "", linux_style(*MACHINES[npus]))
    d = MachineDir(m)
    try:
        r = run_case(rts.probes["libiomp5"], rts.shim, d, env)
    finally:
        d.cleanup()
    assert r["rc"] == 0 and r["masks"], r.get("stderr_tail")
    return [frozenset(x) for x in r["masks"]]


@pytest.mark.parametrize("row", ROWS)
@pytest.mark.parametrize("npus", sorted(MACHINES))
def test_plan(benchmark, npus: int, row: str) -> None:
    benchmark.group = f"plan-{npus}-PUs"
    t = topology(npus)
    compact = plan_env(SPECS["compact"], topology=t)
    if row.removeprefix("plan ") in SPECS:
        env = SPECS[row.split()[1]]
        plan_env(env, topology=t)  # warm: the runtime's table is built once per Topology
        p = benchmark(plan_env, env, topology=t)
        assert p.threads == npus
    elif row == "plan compact (cold)":
        S, C, T = MACHINES[npus]
        p = benchmark.pedantic(lambda topo: plan_env(SPECS["compact"], topology=topo),
                               setup=lambda: ((build(S, C, T),), {}), rounds=15)
        assert p.cpusets == compact.cpusets
    elif row == "plan compact (uncached)":
        rules, items = planner.RUNTIMES["intel"], tuple(sorted(SPECS["compact"].items()))
        p = benchmark.pedantic(planner._run, (items, t, None, False, rules), {"cached": False}, rounds=15)
        assert p.cpusets == compact.cpusets
    elif row == "plan compact (llvm)":
        plan_env(SPECS["compact"], topology=t, runtime="llvm")
        p = benchmark(plan_env, SPECS["compact"], topology=t, runtime="llvm")
        assert p.cpusets == compact.cpusets  # no NUMA node inside a package: the runtimes agree
    elif row == "plan_env malformed":
        env = {"KMP_AFFINITY": "granularity=fine,compakt,scatter,1", "OMP_NUM_THREADS": "7"}
        p = benchmark(plan_env, env, topology=t)
        assert p.warnings
    else:
        rts = _runtime()
        out: dict[str, list[frozenset[int]]] = {}

        def run() -> None:
            out["cpusets"] = _run_libiomp5(rts, npus, SPECS["compact"])

        benchmark.pedantic(run, rounds=5 if npus < 1024 else 3, iterations=1, warmup_rounds=1)
        assert out["cpusets"] == list(compact.cpusets), "the planner disagrees with libiomp5"
