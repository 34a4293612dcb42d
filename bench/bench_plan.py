"""Planner speed: ``plan()`` on 8, 112, 272 and 1024-PU machines.

Run with ``pytest bench/bench_plan.py`` (pytest-benchmark).  The machines are
built from generated ``/proc/cpuinfo`` text with one NUMA node per package
(no hwloc involved).  The first plan of a (topology, process mask, subset)
builds and caches the runtime's topology table; the benchmark measures the
planner as it is used -- repeated plans on one topology -- and, separately,
the cold first plan.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from affinity.planner import plan, plan_env
from affinity.topology import Topology

MACHINES = {
    8: (1, 4, 2),       # 1 package x 4 cores x 2 threads
    112: (2, 28, 2),    # Xeon Platinum 8180-like
    272: (1, 68, 4),    # KNL-like
    1024: (8, 64, 2),   # 8 packages x 64 cores x 2 threads
}
SPECS = {
    "compact": ("granularity=fine,compact", None),
    "scatter": ("scatter", None),
    "places": ("OMP_PLACES=cores OMP_PROC_BIND=spread", None),
    "balanced": ("granularity=fine,balanced", None),
}


def build(S: int, C: int, T: int) -> Topology:
    """A machine of S packages x C cores x T threads, Linux numbering."""
    rows = [(t * S * C + s * C + c, s, c) for t in range(T) for s in range(S) for c in range(C)]
    text = "\n".join(f"processor\t: {p}\nphysical id\t: {s}\ncore id\t\t: {c}\n" for p, s, c in sorted(rows)) + "\n"
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


@pytest.mark.parametrize("spec", sorted(SPECS))
@pytest.mark.parametrize("npus", sorted(MACHINES))
def test_plan_speed(benchmark, npus: int, spec: str) -> None:
    t = topology(npus)
    s, threads = SPECS[spec]
    p = benchmark(plan, s, threads, t)
    assert p.threads == npus
    if os.environ.get("AFFINITY_BENCH_ASSERT", "1") == "1" and benchmark.stats:
        # the target: well under a millisecond per call on 1024 PUs
        assert benchmark.stats.stats.median < 1e-3


@pytest.mark.parametrize("npus", sorted(MACHINES))
def test_plan_env_malformed_speed(benchmark, npus: int) -> None:
    t = topology(npus)
    env = {"KMP_AFFINITY": "granularity=fine,compakt,scatter,1", "OMP_NUM_THREADS": "7"}
    p = benchmark(plan_env, env, topology=t)
    assert p.warnings


@pytest.mark.parametrize("npus", sorted(MACHINES))
def test_first_plan_speed(benchmark, npus: int) -> None:
    """Cold: a new Topology value each round (builds the runtime's table)."""
    S, C, T = MACHINES[npus]

    def setup():
        return (build(S, C, T),), {}

    def run(t: Topology):
        return plan("granularity=fine,compact", None, t)

    p = benchmark.pedantic(run, setup=setup, rounds=3)
    assert p.threads == npus
