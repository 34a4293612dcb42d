"""Machines whose core ids restart in every die, and the cgroup limit of
``norespect``: the planner follows what libiomp5 does (the oracle's golden
files ``tests/golden_extra/x_die_*`` cover them case by case; these are the
rules in short)."""

from __future__ import annotations

import pytest

from affinity.errors import PlanError
from affinity.machine.topology import Topology
from affinity.planning.planner import plan, plan_env
from helpers import ROOT

EXTRA = ROOT / "tests" / "golden_extra"


def _sets(p) -> list[list[int]]:
    return [sorted(s) for s in p.cpusets]


@pytest.fixture(scope="module")
def restarting() -> Topology:
    """4 packages x 2 dies x 2 NUMA nodes x 2 cores x 2 HT; the cores of each die
    numbered 0-3 (hwloc XML as lstopo writes it on such a machine)."""
    return Topology.from_xml(EXTRA / "hwloc" / "x_die_4s2d2n2c2t.xml")


def test_same_numbered_cores_of_a_package_are_one_core_to_the_runtime(restarting: Topology) -> None:
    # libiomp5 reads (physical id, core id): the cores numbered 0 in both dies of a
    # package are one core {0,1,8,9}, split by the NUMA nodes inside it
    p = plan_env({"KMP_AFFINITY": "scatter", "OMP_NUM_THREADS": "8"}, topology=restarting)
    assert _sets(p)[:5] == [[0, 1, 8, 9], [16, 17, 24, 25], [32, 33, 40, 41], [48, 49, 56, 57], [2, 3, 10, 11]]
    assert "4 sockets x 4 cores/socket x 2 NUMA domains/core x 2 threads/NUMA domain" in p.explain()
    # the same from the cpuinfo file the runtime read
    t = Topology.from_cpuinfo(EXTRA / "cpuinfo" / "x_die_4s2d2n2c2t.cpuinfo",
                              numa_nodes=EXTRA / "fakesys" / "x_die_4s2d2n2c2t" / "node")
    assert plan_env({"KMP_AFFINITY": "scatter", "OMP_NUM_THREADS": "8"}, topology=t).cpusets == p.cpusets


def test_a_die_that_cuts_the_runtimes_cores_is_no_layer(restarting: Topology) -> None:
    assert len(restarting.dies) == 8
    p = plan_env({"KMP_AFFINITY": "granularity=die,compact", "OMP_NUM_THREADS": "2"}, topology=restarting)
    assert p.warnings == ("KMP_AFFINITY: granularity setting: die does not exist in topology.  Using granularity=core instead.",)
    assert _sets(p) == [[0, 1, 8, 9], [0, 1, 8, 9]]
    q = plan_env({"KMP_HW_SUBSET": "1d", "KMP_AFFINITY": "granularity=fine,compact"}, topology=restarting)
    assert q.warnings == ("KMP_HW_SUBSET ignored: die: level not detected in machine topology.",)
    assert q.threads == 64  # the subset ignored: every proc


def test_dies_of_unique_core_ids_stay_a_layer() -> None:
    # core ids unique in the package: every die holds whole runtime cores
    t = Topology.from_synthetic("pack:2 die:2 core:4 pu:2")
    p = plan_env({"KMP_AFFINITY": "granularity=die,compact", "OMP_NUM_THREADS": "2"}, topology=t)
    assert p.warnings == () and _sets(p) == [list(range(8))] * 2


# ---------------------------------------------------------------- norespect and the cgroup


@pytest.fixture(scope="module")
def machine() -> Topology:
    return Topology.from_synthetic("pack:2 core:4 pu:2")


def test_norespect_beyond_the_cpuset_is_refused(machine: Topology) -> None:
    # the process may use CPUs 0-7 (its cgroup's cpuset): libiomp5 binds to every
    # OS proc of the machine with norespect and aborts (OMP: Error #179)
    confined = machine.with_allowed(range(8))
    for spec in ("norespect,granularity=fine,compact", "norespect,granularity=core,scatter", "norespect,none",
                 "norespect,explicit,proclist=[0]"):
        with pytest.raises(PlanError, match=r"norespect.*CPUs 8-15 are outside this process's cpuset.*Error #179"):
            plan(spec, 4, confined)
    with pytest.raises(PlanError, match="Error #179"):
        plan_env({"OMP_PLACES": "threads", "OMP_PROC_BIND": "close", "KMP_AFFINITY": "norespect"},
                 topology=confined)


def test_norespect_inside_the_cpuset_is_fine(machine: Topology) -> None:
    # a process mask narrower than the cpuset: the runtime binds outside the mask,
    # inside the cpuset -- as the real runtime does under taskset
    p = plan("norespect,granularity=fine,compact", 4, machine, initial_mask="8-11")
    assert _sets(p) == [[0], [1], [2], [3]]
    assert plan("granularity=fine,compact", 4, machine.with_allowed(range(8)), initial_mask="4-7").cpusets == \
        tuple(frozenset({c}) for c in (4, 5, 6, 7))
    # disabled binds nothing: no refusal
    d = plan("norespect,disabled", 2, machine.with_allowed(range(8)))
    assert d.affinity_type == "disabled"
