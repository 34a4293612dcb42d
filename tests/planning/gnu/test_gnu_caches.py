"""``OMP_PLACES=ll_caches`` and what the machine says of its caches, against the
real libgomp builds (``caches/recorded.json``, recorded by ``caches/record.py``).

GCC 12's libgomp looks for the last-level cache in ``cpu/cpuN/cache/index*``;
where no CPU of the process mask has such a directory (VMs, ARM boards without
cache data) it prints "Error reading core/socket topology", treats
``OMP_PLACES`` as unset (no binding, or ``GOMP_CPU_AFFINITY``'s list, or the
``threads`` list when ``OMP_PROC_BIND`` asks for binding).  A topology from an
hwloc source (XML, synthetic description) that lists no cache is such a machine;
a cpuinfo file says nothing of caches (``Topology.caches_known`` false) and one
cache per package is taken.  PyTorch's libgomp (GCC 8.5) does not know
``ll_caches`` at all: "Invalid value", whatever the caches.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from affinity.cpulist import format_list, parse_list
from affinity.machine.topology import Topology
from affinity.planning.gnu import plan_gomp, sysfs_view, view_from_files
from gnu_realgomp import TORCH_LIB, RealGomp, gcc_libgomp_available

HERE = Path(__file__).resolve().parent / "caches"
RECORDED = json.loads((HERE / "recorded.json").read_text())


def _cpuinfo(tmp: Path, machine: str) -> Topology:
    """The machine as a cpuinfo file (and its NUMA lists): no word of caches."""
    xml = Topology.from_xml(HERE / f"{machine}.xml")
    f = tmp / f"{machine}.cpuinfo"
    f.write_text("".join(f"processor : {u.os_index}\nphysical id : {xml.packages[u.package].os_index}\n"
                         f"core id : {xml.cores[u.core].os_index}\n\n" for u in xml.pus))
    return Topology.from_cpuinfo(f, {n.os_index: n.cpuset for n in xml.numa_nodes})


def _json(tmp: Path, topology: Topology) -> Topology:
    f = tmp / "t.json"
    f.write_text(topology.to_json())
    return Topology.from_json(f)


#: (recorded machine, how the planner is given it)
SOURCES = [
    ("nocache_2s2c1t", "xml"), ("nocache_2s2c1t", "synthetic:pack:2 [numa] core:2 pu:1"), ("nocache_2s2c1t", "json"),
    ("nocache_1s4c2t", "xml"), ("nocache_1s4c2t", "synthetic:pack:1 [numa] core:4 pu:2(indexes=2*4:1*2)"),
    ("l3_2s2c1t", "xml"), ("l3_2s2c1t", "synthetic:pack:2 [numa] l3:1 core:2 pu:1"), ("l3_2s2c1t", "json"),
    ("l3_2s2c1t", "cpuinfo"),  # no word of caches: one per package, as this machine has
    ("partial_2s2c1t", "xml"), ("partial_2s2c1t", "json"),
]


def _topology(machine: str, how: str, tmp: Path) -> Topology:
    if how.startswith("synthetic:"):
        return Topology.from_synthetic(how[len("synthetic:"):])
    if how == "cpuinfo":
        return _cpuinfo(tmp, machine)
    xml = Topology.from_xml(HERE / f"{machine}.xml")
    return _json(tmp, xml) if how == "json" else xml


def _planned(case: dict, topology: Topology) -> dict:
    mask = case["mask"]
    p = plan_gomp(case["env"], topology, None if mask is None else parse_list(mask), case["build"])
    warnings: list[str] = []
    for w in p.warnings:  # the harness records each distinct line once
        if "libgomp: " + w not in warnings:
            warnings.append("libgomp: " + w)
    return {"rc": 0, "nthreads": p.threads, "masks": [format_list(s) for s in p.cpusets],
            "places": [format_list(s) for s in p.places or ()], "init_mask": format_list(p.init_mask),
            "warnings": warnings}


@pytest.mark.parametrize("machine,how", SOURCES)
def test_plans_equal_the_real_library(machine: str, how: str, tmp_path: Path) -> None:
    topology = _topology(machine, how, tmp_path)
    cases = RECORDED[machine]["cases"]
    assert len(cases) == 16
    for case in cases:
        want = {k: case[k] for k in ("rc", "nthreads", "masks", "places", "init_mask", "warnings")}
        assert _planned(case, topology) == want, (case["build"], case["env"], case["mask"])


@pytest.mark.parametrize("machine,how", [s for s in SOURCES if s[1] != "cpuinfo"])
def test_sysfs_view_is_the_tree_libgomp_read(machine: str, how: str, tmp_path: Path) -> None:
    view = sysfs_view(_topology(machine, how, tmp_path))
    files = view_from_files(RECORDED[machine]["sysfs"])
    assert view.last_cache == files.last_cache
    assert view.thread_siblings == files.thread_siblings and view.core_siblings == files.core_siblings
    assert view.numa_nodes == files.numa_nodes


def test_what_the_recordings_show() -> None:
    """The facts of the module docstring, read off the recordings."""
    def case(machine, build, env):
        return next(c for c in RECORDED[machine]["cases"] if c["build"] == build and c["env"] == env)

    alone = {"OMP_PLACES": "ll_caches", "OMP_NUM_THREADS": "4"}
    assert case("nocache_2s2c1t", "gcc12", alone)["warnings"] == ["libgomp: Error reading core/socket topology"]
    assert case("nocache_2s2c1t", "gcc12", alone)["masks"] == ["0-3"] * 4  # not bound
    assert case("l3_2s2c1t", "gcc12", alone)["masks"] == ["0-1"] * 4  # CPU 0's L3 for every thread
    assert case("partial_2s2c1t", "gcc12", alone)["places"] == ["2-3"]  # the first CPU with cache files
    with_gca = {"OMP_PLACES": "ll_caches", "GOMP_CPU_AFFINITY": "3 1 2 0", "OMP_NUM_THREADS": "4"}
    assert case("nocache_2s2c1t", "gcc12", with_gca)["masks"] == ["3", "1", "2", "0"]
    assert case("l3_2s2c1t", "gcc12", with_gca)["masks"] == ["0-1"] * 4
    for machine in RECORDED:
        assert case(machine, "torch", alone)["warnings"] == ["libgomp: Invalid value for environment variable "
                                                             "OMP_PLACES"]


def test_caches_known_says_what_the_source_could_tell(tmp_path: Path) -> None:
    xml = Topology.from_xml(HERE / "nocache_2s2c1t.xml")
    cpuinfo = _cpuinfo(tmp_path, "nocache_2s2c1t")
    assert xml.caches == cpuinfo.caches == () and xml.caches_known and not cpuinfo.caches_known
    assert xml == cpuinfo  # the same machine: provenance is not compared
    assert _json(tmp_path, cpuinfo).caches_known is False and _json(tmp_path, xml).caches_known is True
    assert cpuinfo.with_allowed({0, 1}).caches_known is False
    # a file written before the key: an empty cache list is "not known"
    d = json.loads(xml.to_json())
    del d["caches_known"]
    (tmp_path / "old.json").write_text(json.dumps(d))
    assert Topology.from_json(tmp_path / "old.json").caches_known is False
    d["caches_known"] = "yes"
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(Exception, match="caches_known"):
        Topology.from_json(tmp_path / "bad.json")


@pytest.mark.slow
@pytest.mark.skipif(not gcc_libgomp_available(), reason="needs gcc -fopenmp (Debian's libgomp)")
@pytest.mark.parametrize("build", ["gcc12", "torch"])
def test_recordings_are_what_the_library_does(build: str) -> None:
    """The recordings still hold: each case run again, on the files libgomp reads only."""
    gomp = RealGomp(None if build == "gcc12" else TORCH_LIB)
    try:
        for machine, rec in RECORDED.items():
            tree = gomp.tree(machine, rec["sysfs"])
            for case in (c for c in rec["cases"] if c["build"] == build):
                got = gomp.run(tree, rec["ncpus"], case["env"], case["mask"])
                assert {k: got.get(k) for k in ("rc", "nthreads", "masks", "places", "init_mask", "warnings")} \
                    == {k: case[k] for k in ("rc", "nthreads", "masks", "places", "init_mask", "warnings")}, \
                    (machine, case["env"], case["mask"])
    finally:
        gomp.close()
