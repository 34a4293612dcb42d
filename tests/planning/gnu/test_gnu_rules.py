"""libgomp's rules on machines beyond the golden sample (described, not measured):
cgroups and offline CPUs, NUMA inside and above packages, sparse node numbers,
hybrid cores, last-level caches smaller than a package, and the refusals."""

from __future__ import annotations

import pytest

from affinity.cpulist import format_list
from affinity.errors import PlanError
from affinity.machine.topology import Topology
from affinity.planning.gnu import plan_gomp, sysfs_view
from gnu_golden import topology


def _masks(p):
    return [format_list(s) for s in p.cpusets]


@pytest.fixture(scope="module")
def linux16():
    return topology("2s4c2t_linux")


def test_the_issue_table(linux16):
    """The differences with Intel's runtime that issue #25 lists, under libgomp's rules."""
    spread = plan_gomp({"OMP_PLACES": "cores", "OMP_PROC_BIND": "spread", "OMP_NUM_THREADS": "5"}, linux16)
    assert list(spread.place_nums) == [0, 2, 4, 6, 7]
    close = plan_gomp({"OMP_PLACES": "{0},{1},{2},{3}", "OMP_PROC_BIND": "close", "OMP_NUM_THREADS": "10"},
                      linux16)
    assert list(close.place_nums) == [0, 0, 1, 1, 2, 2, 3, 3, 0, 1]
    gca = plan_gomp({"GOMP_CPU_AFFINITY": "1 0", "OMP_NUM_THREADS": "4"}, linux16)
    assert _masks(gca) == ["1", "1", "0", "0"]
    inter = plan_gomp({"OMP_PLACES": "cores", "OMP_NUM_THREADS": "2", "OMP_PROC_BIND": "close"},
                      topology("doc_2s4c2t_interleaved"))
    pkgs = {inter.places[0] <= p.cpuset for p in topology("doc_2s4c2t_interleaved").packages}
    assert len({min(s) % 2 for s in inter.cpusets}) == 2 and pkgs == {True, False}
    assert gca.init_mask == frozenset({1})  # bound at load, before any region


def test_binding_is_off_unless_asked(linux16):
    p = plan_gomp({"OMP_NUM_THREADS": "3"}, linux16)
    assert p.places is None and p.proc_bind == "false" and set(p.cpusets) == {linux16.cpuset}
    assert list(p.place_nums) == [-1, -1, -1]


def test_cgroup_cpuset_refuses_gomp_cpu_affinity_outside_it(linux16):
    t = linux16.with_allowed(range(8))  # a cpuset cgroup of CPUs 0-7
    with pytest.raises(PlanError, match="GOMP_CPU_AFFINITY.*thread 1.*CPU 9.*Thread creation failed"):
        plan_gomp({"GOMP_CPU_AFFINITY": "0 9", "OMP_NUM_THREADS": "2"}, t)
    # the first entry refused: the initial thread silently stays where it was
    p = plan_gomp({"GOMP_CPU_AFFINITY": "9 0", "OMP_NUM_THREADS": "1"}, t)
    assert p.init_mask == frozenset(range(8)) and _masks(p) == ["0-7"]
    # a taskset mask narrower than the cgroup does not stop GOMP_CPU_AFFINITY
    p = plan_gomp({"GOMP_CPU_AFFINITY": "0 5", "OMP_NUM_THREADS": "2"}, t, initial_mask={0, 1})
    assert _masks(p) == ["0", "5"]


def test_offline_cpus_are_absent_from_every_list():
    t = Topology.from_synthetic("pack:1 core:4 pu:2").with_allowed(range(8))
    view = sysfs_view(t)
    assert set(view.thread_siblings) == set(range(8))
    with pytest.raises(PlanError, match="CPU 12"):
        plan_gomp({"GOMP_CPU_AFFINITY": "0 12", "OMP_NUM_THREADS": "2"}, t)


def test_numa_inside_packages_and_sparse_node_numbers(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("".join(f"processor : {c}\nphysical id : {c // 8}\ncore id : {c % 8}\n\n"
                               for c in range(16)))
    t = Topology.from_cpuinfo(cpuinfo, numa_nodes={0: "0-3", 2: "4-7", 5: "8-11", 7: "12-15"})
    p = plan_gomp({"OMP_PLACES": "numa_domains", "OMP_PROC_BIND": "spread", "OMP_NUM_THREADS": "4"}, t)
    assert [format_list(s) for s in p.places] == ["0-3", "4-7", "8-11", "12-15"]
    assert _masks(p) == ["0-3", "4-7", "8-11", "12-15"]
    s = plan_gomp({"OMP_PLACES": "sockets"}, t)
    assert [format_list(x) for x in s.places] == ["0-7", "8-15"]


def test_numa_above_packages():
    t = Topology.from_synthetic("[numa] pack:2 core:2 pu:1")
    p = plan_gomp({"OMP_PLACES": "numa_domains"}, t)
    assert [format_list(x) for x in p.places] == ["0-3"]


def test_hybrid_cores(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    rows = [(0, 0), (1, 0), (2, 1), (3, 1), (4, 2), (5, 3), (6, 4), (7, 5)]  # 2 P-cores x 2, 4 E-cores
    cpuinfo.write_text("".join(f"processor : {c}\nphysical id : 0\ncore id : {k}\n\n" for c, k in rows))
    t = Topology.from_cpuinfo(cpuinfo)
    p = plan_gomp({"OMP_PLACES": "cores", "OMP_PROC_BIND": "spread", "OMP_NUM_THREADS": "3"}, t)
    assert [format_list(x) for x in p.places] == ["0-1", "2-3", "4", "5", "6", "7"]
    assert _masks(p) == ["0-1", "4", "6"]


def test_ll_caches_smaller_than_a_package_give_one_place():
    t = Topology.from_synthetic("pack:2 [numa] l3:2 core:4 pu:2")
    p = plan_gomp({"OMP_PLACES": "ll_caches", "OMP_NUM_THREADS": "4"}, t)
    assert [format_list(x) for x in p.places] == ["0-7"]  # GCC 12 reads CPU 0's list for every CPU
    q = plan_gomp({"OMP_PLACES": "ll_caches"}, t, initial_mask=range(10, 32))
    assert [format_list(x) for x in q.places] == ["10-15"]
    torch = plan_gomp({"OMP_PLACES": "ll_caches"}, t, build="torch")
    assert torch.places is None and torch.warnings == ("Invalid value for environment variable OMP_PLACES",)


def test_torch_build_never_returns_on_a_word_in_gomp_cpu_affinity(linux16):
    for value in ("x", "0-3 junk", "0:2"):
        with pytest.raises(PlanError, match="GOMP_CPU_AFFINITY.*never returns"):
            plan_gomp({"GOMP_CPU_AFFINITY": value}, linux16, build="torch")
        p = plan_gomp({"GOMP_CPU_AFFINITY": value}, linux16, build="gcc12")
        assert p.warnings == ("Invalid value for enviroment variable GOMP_CPU_AFFINITY",)
    p = plan_gomp({"GOMP_CPU_AFFINITY": "1,,2", "OMP_NUM_THREADS": "3"}, linux16, build="torch")
    assert _masks(p) == ["1", "0", "2"]


def test_explicit_lists(linux16):
    p = plan_gomp({"OMP_PLACES": "{6:2}:4:-2"}, linux16)
    assert [format_list(x) for x in p.places] == ["6-7", "4-5", "2-3", "0-1"]
    p = plan_gomp({"OMP_PLACES": "{0:4,!2},{4:4},!{4:4}"}, linux16)
    assert [format_list(x) for x in p.places] == ["0-1,3"]
    p = plan_gomp({"OMP_PLACES": "{0:2}:2:-2"}, linux16)
    assert p.places is None
    assert p.warnings == ("Logical CPU number 0+-2 out of range",
                          "Invalid value for environment variable OMP_PLACES")


def test_thread_limit_and_num_threads_lists(linux16):
    p = plan_gomp({"OMP_NUM_THREADS": "8,2", "OMP_THREAD_LIMIT": "3"}, linux16)
    assert p.threads == 3 and p.max_threads == 8
    p = plan_gomp({"OMP_THREAD_LIMIT": "0"}, linux16)
    assert p.threads == 16 and p.warnings == ("Invalid value for environment variable OMP_THREAD_LIMIT",)


def test_unknown_build(linux16):
    with pytest.raises(PlanError, match="unknown libgomp build 'gcc4'"):
        plan_gomp({}, linux16, build="gcc4")


def test_torch_build_crashes_on_a_threads_count_inside_a_core(linux16):
    """Measured with PyTorch's libgomp: OMP_PLACES=threads(3) on 2-way SMT is a SIGSEGV at load."""
    with pytest.raises(PlanError, match=r"OMP_PLACES='threads\(3\)'.*SIGSEGV"):
        plan_gomp({"OMP_PLACES": "threads(3)"}, linux16, build="torch")
    assert _masks(plan_gomp({"OMP_PLACES": "threads(3)", "OMP_NUM_THREADS": "3"}, linux16)) == ["0", "8", "1"]
    assert [format_list(p) for p in plan_gomp({"OMP_PLACES": "threads(4)"}, linux16, build="torch").places] \
        == ["0", "8", "1", "9"]
    # GCC 8 reads a missing number as 0
    assert [format_list(p) for p in plan_gomp({"OMP_PLACES": "{,1}"}, linux16, build="torch").places] == ["0-1"]
    assert [format_list(p) for p in plan_gomp({"OMP_PLACES": "{0:4:}"}, linux16, build="torch").places] == ["0"]


def test_a_description_without_caches_has_one_per_package(tmp_path):
    """A cpuinfo file says nothing of caches: one per package is taken (an hwloc
    description without caches is a machine without cache files: test_gnu_caches.py)."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("".join(f"processor : {c}\nphysical id : {c // 4}\ncore id : {c % 4}\n\n" for c in range(8)))
    t = Topology.from_cpuinfo(cpuinfo)
    assert [format_list(p) for p in plan_gomp({"OMP_PLACES": "ll_caches"}, t, initial_mask=range(2, 8)).places] \
        == ["2-3"]
