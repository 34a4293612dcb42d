"""Topology values from hwloc XML, hwloc synthetic descriptions and cpuinfo files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from affinity.errors import FrozenInstanceError, TopologyError
from affinity.machine.topology import Topology

from helpers import golden_dir

GOLDEN = golden_dir()
MACHINES = sorted(p.stem for p in (GOLDEN / "hwloc").glob("*.xml"))


def _golden_meta(name: str) -> dict:
    with open(GOLDEN / f"{name}.json") as fh:
        d = json.load(fh)
    return {"hw_threads": d["hw_threads"], "numa_nodes": d["numa_nodes"],
            "synthetic": d["hwloc_synthetic"], "topology": d["topology"]}


def _cpuinfo_text(topo: Topology) -> tuple[str, dict[int, frozenset[int]]]:
    """Write a topology back as a cpuinfo file plus NUMA lists (the runtime's view)."""
    recs = []
    for pu in sorted(topo.pus, key=lambda p: p.os_index):
        core = topo.cores[pu.core]
        pkg = topo.packages[pu.package]
        recs.append(f"processor\t: {pu.os_index}\nphysical id\t: {pkg.os_index}\ncore id\t\t: {core.os_index}\n")
    return "\n".join(recs) + "\n", {n.os_index: n.cpuset for n in topo.numa_nodes}


@pytest.mark.parametrize("name", MACHINES)
def test_same_machine_from_three_sources_is_equal(name):
    meta = _golden_meta(name)
    xml = Topology.from_xml(GOLDEN / "hwloc" / f"{name}.xml")
    cpuinfo = Topology.from_cpuinfo(GOLDEN / "cpuinfo" / f"{name}.cpuinfo",
                                    GOLDEN / "fakesys" / name / "node")
    synthetic = Topology.from_synthetic(meta["synthetic"])
    assert xml == cpuinfo
    assert xml == synthetic
    assert hash(xml) == hash(cpuinfo) == hash(synthetic)
    assert xml.source != cpuinfo.source  # provenance kept, not compared


@pytest.mark.parametrize("name", MACHINES)
def test_golden_machine_shape_and_os_indexes(name):
    meta = _golden_meta(name)
    t = Topology.from_xml(GOLDEN / "hwloc" / f"{name}.xml")
    info = meta["topology"]
    assert len(t.pus) == info["nprocs"]
    assert len(t.packages) == info["nsockets"]
    assert len(t.cores) == info["ncores"]
    assert t.threads_per_core == info["threads_per_core"]
    assert t.allowed == t.cpuset == frozenset(range(info["nprocs"]))
    # every hw thread sits in the package/core the generator put it in, with its rank
    for os_proc, pkg, core, rank in meta["hw_threads"]:
        pu = t.pu(os_proc)
        assert t.packages[pu.package].os_index == pkg
        assert t.cores[pu.core].os_index == core
        assert t.cores[pu.core].package == pu.package
        assert pu.thread == rank
    # NUMA node cpusets as sysfs lists them
    assert sorted(sorted(n.cpuset) for n in t.numa_nodes) == sorted(meta["numa_nodes"])
    # cpusets are consistent: a package is the union of its cores
    for p in t.packages:
        assert p.cpuset == frozenset().union(*(c.cpuset for c in t.cores if c.package == p.logical_index))


def test_sibling_numbering_split_vs_adjacent():
    skx = Topology.from_xml(GOLDEN / "hwloc" / "skx8180_2s28c2t.xml")
    assert all(c.cpuset == {min(c.cpuset), min(c.cpuset) + 56} for c in skx.cores)
    doc = Topology.from_xml(GOLDEN / "hwloc" / "doc_2s2c2t.xml")
    assert [sorted(c.cpuset) for c in doc.cores] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    # the example description: siblings i and i+56
    t = Topology.from_synthetic("pack:2 core:28 pu:2(indexes=2*56:1*2)")
    assert t.describe().startswith("2 packages x 28 cores x 2 PUs")
    assert t.cores[0].cpuset == {0, 56} and t.cores[55].cpuset == {55, 111}
    assert [p.os_index for p in t.pus[:4]] == [0, 56, 1, 57]


def test_os_index_and_logical_index_are_kept_apart():
    # Intel's verbose example: package 0 core ids 0,1,2,3 are procs {0,8},{4,12},{2,10},{6,14};
    # hwloc orders cores by cpuset, so core id 2 comes before core id 1.
    t = Topology.from_xml(GOLDEN / "hwloc" / "doc_2s4c2t_interleaved.xml")
    pkg0 = [c for c in t.cores if c.package == 0]
    assert [c.os_index for c in pkg0] == [0, 2, 1, 3]
    assert [c.logical_index for c in pkg0] == [0, 1, 2, 3]
    assert [sorted(c.cpuset) for c in pkg0] == [[0, 8], [2, 10], [4, 12], [6, 14]]
    assert t.pu(4).logical_index == 4 and t.pu(8).logical_index == 1
    assert t.packages[1].cpuset == frozenset(range(1, 16, 2))
    assert t.core_of(12).os_index == 1 and t.package_of(13).os_index == 1
    assert t.numa_of(3).os_index == 1


@pytest.mark.parametrize("desc", [
    "pack:2 [numa] core:4 pu:2",
    "pack:2 [numa] core:3 pu:4(indexes=4*6:1*4)",
    "pack:2 group:2 [numa] core:3 pu:2(indexes=2*12:1*2)",  # SNC-2, siblings i, i+12
    "[numa] pack:4 core:2 pu:1",  # one NUMA node over several packages
    "pack:1 [numa] core:68 pu:4(indexes=4*68:1*4)",  # KNL-like, siblings i, i+68, ...
    "pack:2 [numa] core:2(indexes=0,4,8,12) pu:2",  # sparse core ids
])
def test_cpuinfo_export_roundtrip(tmp_path: Path, desc: str):
    """Any machine written as the runtime's cpuinfo file + NUMA lists reads back equal."""
    t = Topology.from_synthetic(desc)
    text, nodes = _cpuinfo_text(t)
    f = tmp_path / "cpuinfo"
    f.write_text(text)
    back = Topology.from_cpuinfo(f, nodes)
    assert back == t


def test_snc_interleaved_numbering_matches_hwloc_order(tmp_path: Path):
    # SNC-2 where the two NUMA nodes of a package interleave their CPU numbers:
    # hwloc numbers the cores of node 0 first; the cpuinfo path must do the same.
    t = Topology.from_synthetic(
        "pack:1 group:2 [numa] core:2 pu:1(indexes=0,2,1,3)")
    assert [sorted(n.cpuset) for n in t.numa_nodes] == [[0, 2], [1, 3]]
    assert [c.os_index for c in t.cores] == [0, 1, 2, 3]
    assert [p.os_index for p in t.pus] == [0, 2, 1, 3]
    text, nodes = _cpuinfo_text(t)
    (tmp_path / "c").write_text(text)
    assert Topology.from_cpuinfo(tmp_path / "c", nodes) == t


def test_cpuinfo_real_proc_format_and_thread_id(tmp_path: Path):
    f = tmp_path / "cpuinfo"
    f.write_text(
        "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Xeon: fast\nphysical id\t: 0\n"
        "siblings\t: 2\ncore id\t\t: 0\nthread id\t: 1\nflags\t\t: fpu vme\n\n"
        "processor\t: 1\nphysical id\t: 0\ncore id\t\t: 0\nthread id\t: 0\nnode_0 id\t: 3\n\n")
    t = Topology.from_cpuinfo(f)
    assert len(t.cores) == 1 and t.cores[0].cpuset == {0, 1}
    # explicit thread ids win over OS order
    assert t.pu(1).thread == 0 and t.pu(0).thread == 1
    assert t.numa_nodes == ()  # none given
    assert [g.kind for g in t.groups] == ["node0"] and t.groups[0].os_index == 3


def test_this_machine_cpuinfo_parses():
    t = Topology.from_cpuinfo("/proc/cpuinfo")
    assert len(t.pus) >= 1
    assert t.cpuset <= Topology.from_system().cpuset


@pytest.mark.parametrize("text,line,needle", [
    ("physical id : 0\n", 1, "before any 'processor'"),
    ("processor : 0\ncore id : x\n", 2, "non-negative integer"),
    ("processor : 0\n\nprocessor : 0\n", 3, "listed twice"),
    ("processor : 0\ncore id : 1\ncore id : 2\n", 3, "given twice"),
    ("processor : 0\nthis line has no colon\n", 2, "expected 'name : value'"),
])
def test_cpuinfo_errors_name_file_and_line(tmp_path: Path, text: str, line: int, needle: str):
    f = tmp_path / "bad.cpuinfo"
    f.write_text(text)
    with pytest.raises(TopologyError) as ei:
        Topology.from_cpuinfo(f)
    assert ei.value.line == line and ei.value.source == str(f)
    assert str(ei.value).startswith(f"{f}:{line}: ") and needle in str(ei.value)


def test_cpuinfo_numa_list_must_name_known_cpus(tmp_path: Path):
    f = tmp_path / "c"
    f.write_text("processor : 0\n\nprocessor : 1\n")
    with pytest.raises(TopologyError, match="NUMA node 1 lists cpus 7"):
        Topology.from_cpuinfo(f, {0: "0-1", 1: [7]})
    with pytest.raises(TopologyError, match="no 'processor' records"):
        (tmp_path / "empty").write_text("model name : x\n")
        Topology.from_cpuinfo(tmp_path / "empty")


def test_xml_errors(tmp_path: Path):
    bad = tmp_path / "bad.xml"
    bad.write_text('<?xml version="1.0"?>\n<topology>\n  <object type="Machine">\n</topology>\n')
    with pytest.raises(TopologyError) as ei:
        Topology.from_xml(bad)
    assert ei.value.source == str(bad) and ei.value.line == 4
    other = tmp_path / "other.xml"
    other.write_text('<?xml version="1.0"?>\n<html/>\n')
    with pytest.raises(TopologyError, match="not an hwloc <topology>"):
        Topology.from_xml(other)
    with pytest.raises(TopologyError, match="no such file"):
        Topology.from_xml(tmp_path / "missing.xml")


def test_synthetic_error_names_description():
    with pytest.raises(TopologyError, match=r"synthetic:pack:2 bogus:3: hwloc_topology_set_synthetic"):
        Topology.from_synthetic("pack:2 bogus:3")


def test_values_are_immutable_and_hashable():
    t = Topology.from_synthetic("pack:2 [numa] core:2 pu:2")
    with pytest.raises(FrozenInstanceError):
        t.allowed = frozenset()  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        t.pus[0].os_index = 3  # type: ignore[misc]
    assert {t: 1}[Topology.from_synthetic("pack:2 [numa] core:2 pu:2")] == 1


def test_with_allowed_restricts_but_knows_the_machine():
    t = Topology.from_synthetic("pack:2 [numa] core:4 pu:2")
    r = t.with_allowed({0, 1, 2, 99})
    assert r.allowed == {0, 1, 2} and r.cpuset == t.cpuset and r != t
    assert "3 allowed" in r.describe()
    with pytest.raises(TopologyError, match="selects no PU"):
        t.with_allowed({100})


def test_load_dispatch_and_json(tmp_path: Path):
    x = Topology.load(str(GOLDEN / "hwloc" / "2s4c2t_linux.xml"))
    c = Topology.load(GOLDEN / "cpuinfo" / "2s4c2t_linux.cpuinfo", GOLDEN / "fakesys" / "2s4c2t_linux" / "node")
    s = Topology.load("synthetic:" + _golden_meta("2s4c2t_linux")["synthetic"])
    assert x == c == s
    assert Topology.load(x) is x
    d = json.loads(x.to_json())
    assert d["allowed"] == "0-15" and len(d["pus"]) == 16 and d["cores"][1]["cpuset"] == "1,9"
    assert d["numa_nodes"][1]["cpuset"] == "4-7,12-15"
    tree = x.tree()
    assert "Package P#1 L#1" in tree and "Core P#3 L#7: PU P#7 L#14, PU P#15 L#15" in tree


@pytest.mark.parametrize("kind", ["xml", "json", "synthetic", "system"])
def test_load_refuses_numa_nodes_where_the_source_says_its_own(kind: str, tmp_path: Path):
    """numa_nodes goes with a cpuinfo file; with an XML or JSON file it was dropped without
    a word, and the plan used the file's nodes, not the ones the caller gave."""
    xml = GOLDEN / "hwloc" / "2s4c2t_linux.xml"
    if kind == "json":
        (tmp_path / "t.json").write_text(Topology.from_xml(str(xml)).to_json())
    src = {"xml": str(xml), "json": str(tmp_path / "t.json"),
           "synthetic": "synthetic:pack:2 core:2 pu:1", "system": None}[kind]
    nodes = GOLDEN / "fakesys" / "2s4c2t_linux" / "node"
    with pytest.raises(TopologyError, match=r"numa_nodes goes with a cpuinfo file, not with "):
        Topology.load(src, nodes)
    assert Topology.load(src) is not None


def test_system_topology_is_cached_and_knows_this_process():
    import os

    a = Topology.from_system()
    assert a is Topology.from_system()
    assert a.is_this_system
    assert a.allowed == frozenset(os.sched_getaffinity(0)) & a.cpuset
    assert len(a.pus) == os.cpu_count()
    b = Topology.from_system(refresh=True)
    assert b == a and b is not a


def test_refresh_reloads_what_this_process_may_use():
    import os

    from affinity.binding import threads

    start = Topology.from_system()
    if len(start.allowed) < 2:
        pytest.skip("needs a process mask of at least 2 CPUs")
    first = min(start.allowed)
    before = threads.get_process_affinity()
    try:
        threads.set_process_affinity({first})
        assert Topology.from_system().allowed == start.allowed  # cached: as it was at first load
        narrowed = Topology.from_system(refresh=True)
        assert narrowed.allowed == {first}  # reloaded: what the process may use now
    finally:
        threads.set_threads_affinity(before)
    assert Topology.from_system(refresh=True).allowed == start.allowed
    assert os.sched_getaffinity(0) == set(before[os.getpid()])


def test_cpu_lists_runs_and_round_trip():
    from affinity.cpulist import format_list, parse_list, runs

    assert runs([8, 0, 3, 1, 2, 2]) == [(0, 3), (8, 8)]
    assert runs([]) == []
    assert format_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert format_list([]) == ""
    for cpus in ({0}, {5, 7, 9}, set(range(64)) - {31}, {0, 1023}):
        assert parse_list(format_list(cpus)) == cpus
    assert parse_list("0-8:4,10") == {0, 4, 8, 10}
