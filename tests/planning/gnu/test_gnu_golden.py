"""The libgomp planner against the real GNU libgomp, case by case.

Every case of ``tests/golden_gomp`` (what libgomp itself did, see its README) is
planned for both builds -- ``gcc12`` (Debian's GCC 12 libgomp) and ``torch``
(PyTorch's bundled GCC 8.5 libgomp) -- and must match the record exactly: team
size, every thread's CPU set in thread order, the place list, the initial
thread's mask after load, ``omp_get_proc_bind()``, the place numbers and
partitions, ``omp_get_num_procs()``/``omp_get_max_threads()`` and the messages
(full text, in order).  Where the library hung (``rc`` "timeout") the planner must
refuse with :class:`PlanError`.  The machines are loaded from their hwloc XML
exports; the sysfs facts the planner derives from them must equal the fake
``/sys`` trees the library read.
"""

from __future__ import annotations

import json

import pytest

from affinity.planning.gnu import sysfs_view, view_from_files
from affinity.machine.topology import Topology
from gnu_golden import GOLDEN, KINDS, MACHINES, cpuinfo_topology, differences, doc, expected, topology


@pytest.mark.parametrize("machine", MACHINES)
def test_sysfs_view_matches_fake_sys(machine):
    """One derivation, checked against the files the real library read."""
    with open(GOLDEN / "fakesys" / f"{machine}.json") as f:
        files = json.load(f)["files"]
    from_files = view_from_files(files)
    derived = sysfs_view(topology(machine))
    assert dict(derived.thread_siblings) == dict(from_files.thread_siblings)
    assert dict(derived.core_siblings) == dict(from_files.core_siblings)
    assert dict(derived.last_cache) == dict(from_files.last_cache)
    assert derived.numa_nodes == from_files.numa_nodes
    assert derived.usable == from_files.usable


@pytest.mark.parametrize("source", ["xml", "cpuinfo"])
@pytest.mark.parametrize("build", ["gcc12", "torch"])
@pytest.mark.parametrize("machine", MACHINES)
def test_every_case_matches_the_real_library(machine, build, source):
    """Each machine loaded twice: its hwloc XML, and the Intel set's cpuinfo file."""
    cases = doc(machine)["cases"]
    assert len(cases) > 700
    topo = cpuinfo_topology(machine) if source == "cpuinfo" else None
    failures = []
    for i, case in enumerate(cases):
        diff = differences(machine, case, build, topo)
        if diff:
            failures.append(f"case {i} {case['section']} env={case['env']} mask={case.get('initial_mask')}: "
                            + "; ".join(f"{k}: recorded {w!r}, planned {g!r}" for k, (w, g) in diff.items()))
    assert not failures, f"{len(failures)}/{len(cases)} cases differ:\n" + "\n".join(failures[:20])


def test_the_builds_really_differ_in_the_records():
    """The torch records are not the gcc12 ones: the build switch is exercised."""
    cases = doc("2s4c2t_linux")["cases"]
    differ = [c for c in cases if expected(c, "torch") is not c]
    assert len(differ) >= 100
    assert any(expected(c, "torch")["rc"] == "timeout" for c in differ)


@pytest.mark.parametrize("runtime,build", [("gnu", "gcc12"), ("gnu-torch", "torch")])
@pytest.mark.parametrize("machine", MACHINES)
def test_every_case_through_plan_env(machine, runtime, build):
    """The public entry (``plan_env(..., runtime=...)``) gives the recorded sets too."""
    from affinity.cpulist import format_list, parse_list
    from affinity.errors import PlanError
    from affinity.planning.planner import plan_env

    bad = []
    for i, case in enumerate(doc(machine)["cases"]):
        want = expected(case, build)
        mask = case.get("initial_mask")
        try:
            p = plan_env(case["env"], topology=topology(machine), runtime=runtime,
                         initial_mask=None if mask is None else parse_list(mask))
        except PlanError:
            if want["rc"] == 0:
                bad.append(i)
            continue
        got = (p.threads, [format_list(s) for s in p.cpusets], ["libgomp: " + w for w in p.warnings])
        if want["rc"] != 0 or got != (want["nthreads"], want["masks"], want["warnings"]):
            bad.append(i)
    assert not bad, f"cases {bad[:20]} differ"


# ---- machines whose sysfs and hwloc's objects tell different stories (issue #40, point 6)

def _kind_topologies(machine):
    """The machine's XML, and for the compute units also what hwloc's Linux backend
    made of the same tree (each unit one core of two threads)."""
    out = [("xml", topology(machine))]
    linux = GOLDEN / "hwloc" / f"{machine}.linux.xml"
    if linux.exists():
        out.append(("linux xml", Topology.from_xml(linux)))
    return out


@pytest.mark.parametrize("machine", KINDS)
def test_sysfs_view_of_compute_units_clusters_and_dies_is_linuxs(machine):
    """libgomp reads thread_siblings_list: a compute unit's two cores (hwloc: a
    ComputeUnit group of one-thread cores), one core of a cluster or die whose core
    ids restart (the Topology: one 'core' per package and core id, spanning them)."""
    with open(GOLDEN / "fakesys" / f"{machine}.json") as f:
        files = json.load(f)["files"]
    from_files = view_from_files(files)
    for source, topo in _kind_topologies(machine):
        derived = sysfs_view(topo)
        assert dict(derived.thread_siblings) == dict(from_files.thread_siblings), source
        assert dict(derived.core_siblings) == dict(from_files.core_siblings), source
        assert dict(derived.last_cache) == dict(from_files.last_cache), source
        assert derived.numa_nodes == from_files.numa_nodes, source


@pytest.mark.parametrize("build", ["gcc12", "torch"])
@pytest.mark.parametrize("machine", KINDS)
def test_compute_units_clusters_and_dies_match_the_real_library(machine, build):
    """Every recorded case of both real builds, 100% (before: OMP_PLACES=cores one CPU a
    place on the compute units -- 61 of 349 cases differed --, and cores across dies or
    clusters -- 150 and 154 of gcc12's cases)."""
    cases = doc(machine)["cases"]
    assert len(cases) > 300
    for source, topo in _kind_topologies(machine):
        failures = []
        for i, case in enumerate(cases):
            diff = differences(machine, case, build, topo)
            if diff:
                failures.append(f"case {i} {case['section']} env={case['env']} mask={case.get('initial_mask')}: "
                                + "; ".join(f"{k}: recorded {w!r}, planned {g!r}" for k, (w, g) in diff.items()))
        assert not failures, f"{source}: {len(failures)}/{len(cases)} cases differ:\n" + "\n".join(failures[:20])
