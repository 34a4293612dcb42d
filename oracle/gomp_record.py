"""Recording GNU libgomp on machines whose sysfs and hwloc's objects tell different
stories: AMD compute units, clusters of cores, multi-die packages.

    python -m oracle.gomp_record [--out tests/golden_gomp] [--machine NAME ...]
                                 [--torch-lib PATH/libgomp.so.1]

For each machine this writes, in the golden set's format (``tests/golden_gomp``'s
README): ``fakesys/<name>.json``, the ``/sys/devices/system`` tree as the Linux
kernel writes it for that kind of machine; ``hwloc/<name>.xml``, what hwloc
(``lstopo --input``, the hwloc 2.9 of Debian 12) makes of that very tree; and
``<name>.json``, every case run by both real libgomp builds -- Debian's GCC 12
``libgomp.so.1`` (what ``gcc -fopenmp`` links) and PyTorch's bundled GCC 8.5 one --
through the golden set's harness (``tests/golden_gomp/replay``).  Nothing here
knows how libgomp places threads: every mask is the one the library asked for.

What Linux writes, and why the kinds differ from hwloc's objects:

* **compute units** (AMD family 15h, "Bulldozer" to "Excavator"): the kernel counts
  the two cores of a compute unit as SMT siblings (``arch/x86/kernel/smpboot.c``,
  ``match_smt``: same ``cu_id``), so ``thread_siblings_list`` is the pair (and since
  Linux 4.10 ``core_id`` is the unit's); hwloc's CPUID backend makes them two
  ``Core`` objects of one thread in a ``Group`` of subtype ``ComputeUnit``
  (:func:`compute_unit_groups`), its Linux backend one core of two threads;
* **clusters** (arm64 machines described by a device tree): ``core_id`` is the
  core's number inside its cluster, so it restarts in every cluster of a package;
  ``cluster_cpus_list`` names the cluster, ``core_siblings_list`` the package, and
  the L2 cache is the cluster's;
* **dies** (multi-die packages such as Cascade Lake-AP): ``core_id`` restarts in
  every die, ``die_cpus_list`` names the die, ``core_siblings_list`` the package,
  and the L3 cache and the NUMA node are the die's.

libgomp reads only ``thread_siblings_list``, ``core_siblings_list``, the cache
``level``/``shared_cpu_list`` files and the NUMA ``cpulist`` files (GCC 12's
``config/linux/affinity.c``); a planner that follows hwloc's object names instead
(a core = its package and ``core_id``) misplaces ``cores`` on all three.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REPLAY = ROOT / "tests" / "golden_gomp" / "replay"

# --------------------------------------------------------------------- machines
#: one CPU: (os index, package, die, cluster, core_id as Linux reports it, smt group key)
Cpu = tuple[int, int, int, int, int, Any]


class Machine:
    """A machine as the kernel describes it: every CPU's ids, its SMT group (what
    ``thread_siblings_list`` lists), its caches and NUMA nodes."""

    def __init__(self, name: str, description: str, cpus: Sequence[Cpu],
                 caches: Sequence[tuple[int, str, str, Callable[[Cpu], Any]]],
                 numa: Callable[[Cpu], int], masks: Sequence[str], kind: str):
        self.name, self.description, self.kind = name, description, kind
        self.cpus = sorted(cpus)
        self.caches = caches  # (level, type, size, key: CPUs with equal keys share it)
        self.numa = numa
        self.masks = tuple(masks)

    def group(self, key: Callable[[Cpu], Any]) -> dict[int, frozenset[int]]:
        """CPU -> the CPUs whose ``key`` is the same."""
        by: dict[Any, set[int]] = {}
        for c in self.cpus:
            by.setdefault(key(c), set()).add(c[0])
        return {c[0]: frozenset(by[key(c)]) for c in self.cpus}

    @property
    def n(self) -> int:
        return len(self.cpus)


def amd_compute_units() -> Machine:
    """2 packages x 4 compute units x 2 cores, CPUs numbered in order (CPU 0 and 1: the
    first compute unit), like an Opteron 6300 scaled down: L1d per core, L1i and L2
    per compute unit, L3 per package, a NUMA node per package."""
    cpus = [(p, p // 8, 0, 0, p % 8 // 2, (p // 8, p // 2)) for p in range(16)]  # core_id: the unit's (Linux 4.10+)
    return Machine("amd_cu_2s4u2c", "2 packages x 4 compute units x 2 cores (AMD family 15h): thread_siblings "
                   "and core_id are the compute unit's; hwloc's CPUID view: a ComputeUnit group of 2 cores", cpus,
                   [(1, "Data", "16K", lambda c: c[0]), (1, "Instruction", "64K", lambda c: c[5]),
                    (2, "Unified", "2048K", lambda c: c[5]), (3, "Unified", "8192K", lambda c: c[1])],
                   lambda c: c[1], ["0-7", "1-6", "0,2,4,6,8,10,12,14", "3-12"], "compute units")


def arm_clusters() -> Machine:
    """2 packages x 2 clusters x 4 cores, one thread each, core_id restarting in every
    cluster (an arm64 device tree): L1 per core, L2 per cluster, L3 per package,
    a NUMA node per package."""
    cpus = [(p, p // 8, 0, p // 4, p % 4, p) for p in range(16)]
    return Machine("cluster_2s2k4c", "2 packages x 2 clusters x 4 cores (arm64, device tree): core_id "
                   "restarts in every cluster, L2 per cluster", cpus,
                   [(1, "Data", "64K", lambda c: c[0]), (1, "Instruction", "64K", lambda c: c[0]),
                    (2, "Unified", "2048K", lambda c: c[3]), (3, "Unified", "16384K", lambda c: c[1])],
                   lambda c: c[1], ["0-5", "2-9", "0,4,8,12", "6-13"], "clusters")


def multi_die() -> Machine:
    """2 packages x 2 dies x 4 cores x 2 threads, Linux numbering (siblings i and
    i+16), core_id restarting in every die (Cascade Lake-AP): L1/L2 per core, L3
    and a NUMA node per die."""
    cpus = []
    for t in range(2):
        for d in range(4):  # global die number: package d // 2
            for c in range(4):
                p = t * 16 + d * 4 + c
                cpus.append((p, d // 2, d % 2, 0, c, (d, c)))
    return Machine("die_2s2d4c2t", "2 packages x 2 dies x 4 cores x 2 threads (Cascade Lake-AP): core_id "
                   "restarts in every die, L3 and NUMA node per die", cpus,
                   [(1, "Data", "32K", lambda c: c[5]), (1, "Instruction", "32K", lambda c: c[5]),
                    (2, "Unified", "1024K", lambda c: c[5]), (3, "Unified", "16384K", lambda c: (c[1], c[2]))],
                   lambda c: c[1] * 2 + c[2], ["0-7,16-23", "2-5,18-21", "0-15", "4-11,20-27"], "dies")


MACHINES: dict[str, Callable[[], Machine]] = {
    "amd_cu_2s4u2c": amd_compute_units, "cluster_2s2k4c": arm_clusters, "die_2s2d4c2t": multi_die}


# ------------------------------------------------------------------ the sysfs tree
def cpulist(cpus: Iterable[int]) -> str:
    ids = sorted(set(cpus))
    out, i = [], 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out)


def cpumap(cpus: Iterable[int], nbits: int) -> str:
    """The kernel's ``%*pb``: 32-bit hex groups, most significant first."""
    v = sum(1 << c for c in cpus)
    groups = []
    for k in range((nbits + 31) // 32):
        width = 8 if k < nbits // 32 else (nbits % 32 + 3) // 4
        groups.append(f"{(v >> (32 * k)) & 0xFFFFFFFF:0{width}x}")
    return ",".join(reversed(groups))


def linux_tree(m: Machine) -> dict[str, str]:
    """The ``/sys/devices/system`` files of ``m`` as Linux writes them (paths relative to it)."""
    n, files = m.n, {}
    smt = m.group(lambda c: c[5])
    pkg = m.group(lambda c: c[1])
    die = m.group(lambda c: (c[1], c[2]))
    cluster = m.group(lambda c: (c[1], c[3]))
    lists = {"thread_siblings": smt, "core_cpus": smt, "core_siblings": pkg, "package_cpus": pkg,
             "die_cpus": die, "cluster_cpus": cluster}
    shared_by = [(m.group(key), list(dict.fromkeys(key(o) for o in m.cpus))) for _, _, _, key in m.caches]
    for c in m.cpus:
        p, base = c[0], f"cpu/cpu{c[0]}"
        files[f"{base}/online"] = "1\n"
        for k, v in (("physical_package_id", c[1]), ("die_id", c[2]), ("cluster_id", c[3]), ("core_id", c[4])):
            files[f"{base}/topology/{k}"] = f"{v}\n"
        for name, table in lists.items():
            files[f"{base}/topology/{name}"] = cpumap(table[p], n) + "\n"
            files[f"{base}/topology/{name}_list"] = cpulist(table[p]) + "\n"
        for k, (level, typ, size, key) in enumerate(m.caches):
            shared, ids = shared_by[k][0][p], shared_by[k][1]  # (a cache's id: its number among its kind's)
            d = f"{base}/cache/index{k}"
            files.update({f"{d}/level": f"{level}\n", f"{d}/type": f"{typ}\n", f"{d}/size": f"{size}\n",
                          f"{d}/shared_cpu_list": cpulist(shared) + "\n",
                          f"{d}/shared_cpu_map": cpumap(shared, n) + "\n", f"{d}/coherency_line_size": "64\n",
                          f"{d}/ways_of_associativity": "16\n", f"{d}/physical_line_partition": "1\n",
                          f"{d}/number_of_sets": "64\n", f"{d}/id": f"{ids.index(key(c))}\n"})
    every = cpulist(c[0] for c in m.cpus)
    files.update({"cpu/online": every + "\n", "cpu/possible": every + "\n", "cpu/present": every + "\n",
                  "cpu/offline": "\n", "cpu/kernel_max": "8191\n"})
    nodes: dict[int, list[int]] = {}
    for c in m.cpus:
        nodes.setdefault(m.numa(c), []).append(c[0])
    ids = sorted(nodes)
    for node, cpus in sorted(nodes.items()):
        d = f"node/node{node}"
        files[f"{d}/cpulist"] = cpulist(cpus) + "\n"
        files[f"{d}/cpumap"] = cpumap(cpus, n) + "\n"
        files[f"{d}/distance"] = " ".join("10" if o == node else "21" for o in ids) + "\n"
        files[f"{d}/meminfo"] = (f"Node {node} MemTotal:       16777216 kB\nNode {node} MemFree:        16000000 kB\n"
                                 f"Node {node} MemUsed:          777216 kB\n")
    for k in ("online", "possible", "has_cpu", "has_memory", "has_normal_memory"):
        files[f"node/{k}"] = cpulist(ids) + "\n"
    return files


def materialize(files: dict[str, str], root: Path) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def hwloc_xml(files: dict[str, str], n: int) -> str:
    """What hwloc (``lstopo --input DIR``) makes of the tree: the machine as an hwloc
    user sees it (``/proc/cpuinfo`` holds only ``processor`` lines: no x86 ids, so
    hwloc builds it from the sysfs tree alone)."""
    with tempfile.TemporaryDirectory(prefix="gomp-record-fsroot-") as tmp:
        root = Path(tmp)
        materialize(files, root / "sys" / "devices" / "system")
        (root / "proc").mkdir()
        (root / "proc" / "cpuinfo").write_text("".join(f"processor\t: {p}\n\n" for p in range(n)))
        r = subprocess.run(["lstopo-no-graphics", "--input", str(root), "--of", "xml", "-"],
                           capture_output=True, text=True, check=True,
                           env={**os.environ, "HWLOC_COMPONENTS": "linux,-x86"})
    # (the host that ran lstopo is no part of the machine)
    return "".join(line + "\n" for line in r.stdout.splitlines()
                   if not any(f'name="{k}"' in line for k in ("OSRelease", "OSVersion", "HostName", "ProcessName")))


def compute_unit_groups(xml: str) -> str:
    """hwloc's XML with every two-thread core made what hwloc's CPUID backend
    reports for an AMD compute unit: a ``Group`` of subtype ``ComputeUnit`` holding
    one ``Core`` per thread (numbered in its package, as that backend numbers
    them), each under its own L1d.  hwloc keeps no group of the same CPUs as a
    cache (it merges them on load, ``dont_merge`` or not), so the unit's own L1i and
    L2 are left out of this XML (the sysfs tree keeps them; the L3 that libgomp's
    ``ll_caches`` reads stays).  The Linux backend, reading the tree, makes each unit
    one core of two threads (Linux's siblings): ``<name>.linux.xml``; the planner
    must read both as libgomp does."""
    import xml.etree.ElementTree as ET

    root = ET.fromstring(xml)
    parent = {c: p for p in root.iter() for c in p}
    gp = max(int(e.get("gp_index", 0)) for e in root.iter("object"))
    for pkg in [e for e in root.iter("object") if e.get("type") == "Package"]:
        number = 0
        for core in [e for e in pkg.iter("object") if e.get("type") == "Core"]:
            kids = [e for e in core if e.tag == "object"]
            top = core  # the unit's caches above the core (same CPUs) go with it
            while parent[top].get("type") in ("L2Cache", "L1iCache") and parent[top].get("cpuset") == core.get("cpuset"):
                top = parent[top]
            gp += 1
            group = ET.Element("object", {**{k: v for k, v in core.attrib.items() if k != "os_index"},
                                          "type": "Group", "gp_index": str(gp), "subtype": "ComputeUnit",
                                          "kind": "1000"})  # HWLOC_GROUP_KIND_AMD_COMPUTE_UNIT
            for l1 in kids:  # L1d > PU: becomes L1d > Core > PU
                pu = next(e for e in l1 if e.tag == "object")
                gp += 1
                one = ET.Element("object", {**pu.attrib, "type": "Core", "os_index": str(number),
                                            "gp_index": str(gp)})
                number += 1
                l1.remove(pu)
                one.append(pu)
                l1.append(one)
                group.append(l1)
            above = parent[top]
            at = list(above).index(top)
            above.remove(top)
            above.insert(at, group)
    head = xml[:xml.index("<topology")]
    return head + ET.tostring(root, encoding="unicode") + "\n"


# ----------------------------------------------------------------------- cases
def cases(m: Machine) -> list[dict[str, Any]]:
    """The settings run on ``m``: the abstract names (the ones that read the
    topology) under every policy and many team sizes, counted names, the default list,
    process masks that cut through compute units, clusters and dies, and a few
    explicit lists and ``GOMP_CPU_AFFINITY`` for contrast."""
    out: list[dict[str, Any]] = []
    n = m.n

    def add(section: str, env: dict[str, str], mask: str | None = None) -> None:
        case: dict[str, Any] = {"section": section, "env": env,
                                "threads": int(env["OMP_NUM_THREADS"]) if "OMP_NUM_THREADS" in env else None}
        if mask is not None:
            case["initial_mask"] = mask
        out.append(case)

    counts = sorted({1, 2, 3, 4, 5, 7, 8, 9, n // 2, n, n + 3})
    for places in ("threads", "cores", "sockets", "ll_caches", "numa_domains"):
        for bind in (None, "close", "spread", "master"):
            for t in [*counts, None]:
                env = {"OMP_PLACES": places}
                if bind:
                    env["OMP_PROC_BIND"] = bind
                if t is not None:
                    env["OMP_NUM_THREADS"] = str(t)
                add("abstract_places", env)
    for places in ("cores(3)", "cores(5)", "threads(4)", "sockets(1)", "ll_caches(2)", "numa_domains(2)"):
        for t in (None, 2, 5, 9):
            env = {"OMP_PLACES": places, "OMP_PROC_BIND": "spread"}
            if t is not None:
                env["OMP_NUM_THREADS"] = str(t)
            add("abstract_places_count", env)
    for bind in ("true", "close", "spread", "master", "close,spread", "spread,close"):
        for t in (None, 3, 6, n):
            env = {"OMP_PROC_BIND": bind}
            if t is not None:
                env["OMP_NUM_THREADS"] = str(t)
            add("proc_bind_only", env)
    for mask in m.masks:
        for places in ("threads", "cores", "sockets", "ll_caches", "numa_domains", None):
            for bind, t in (("close", None), ("spread", "3"), ("close", "5")):
                env = {"OMP_PROC_BIND": bind}
                if places:
                    env["OMP_PLACES"] = places
                if t:
                    env["OMP_NUM_THREADS"] = t
                add("initial_mask", env, mask)
    for places in ("{0:4}", "{0:2}:4:2", "{1},{0},{3},{2}"):
        for t in ("2", "5"):
            add("explicit_places", {"OMP_PLACES": places, "OMP_PROC_BIND": "close", "OMP_NUM_THREADS": t})
    for aff in ("0 1 2 3", f"0-{n - 1}:2", "1 0"):
        add("gomp_cpu_affinity", {"GOMP_CPU_AFFINITY": aff, "OMP_NUM_THREADS": "4"})
    return out


# ---------------------------------------------------------------------- running
def _load_replay() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gomp_replay", REPLAY / "replay.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def parse(out: str, err: str, rc: Any) -> dict[str, Any]:
    """The probe's report in the golden set's terms."""
    if rc == "timeout":
        return {"rc": "timeout"}
    r: dict[str, Any] = {"rc": rc, "init_mask": None, "num_procs": None, "max_threads": None, "proc_bind": None,
                         "nthreads": None, "num_places": None, "places": [], "masks": None, "place_nums": None,
                         "partitions": None}
    rows: dict[int, dict[str, str]] = {}
    for line in out.splitlines():
        f = line.split(" ")
        key = f[0]
        if key == "INIT_MASK":
            r["init_mask"] = cpulist(int(x) for x in f[1].split(",")) if len(f) > 1 and f[1] else ""
        elif key in ("NUM_PROCS", "MAX_THREADS", "PROC_BIND", "NTHREADS", "NUM_PLACES"):
            r[key.lower()] = int(f[1])
        elif key == "PLACE":
            r["places"].append(cpulist(int(x) for x in f[2].split(",")) if len(f) > 2 and f[2] else "")
        elif key == "T":
            rows[int(f[1])] = dict(x.split("=", 1) for x in f[2:])
    if r["nthreads"] is not None and len(rows) == r["nthreads"]:
        ordered = [rows[t] for t in range(r["nthreads"])]
        r["masks"] = [cpulist(int(x) for x in t["mask"].split(",")) if t["mask"] else "" for t in ordered]
        r["place_nums"] = [int(t["place"]) for t in ordered]
        r["partitions"] = [cpulist(int(x) for x in t["part"].split(",")) if t.get("part") else ""
                           for t in ordered]
    r["warnings"] = list(dict.fromkeys(line for line in err.splitlines() if line.startswith("libgomp:")))
    return r


RESULT_KEYS = ("rc", "init_mask", "num_procs", "max_threads", "proc_bind", "nthreads", "num_places", "places",
               "masks", "place_nums", "partitions", "warnings")


def run_case(probe: str, build_dir: str, tree: str, n: int, case: dict[str, Any]) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMP_", "GOMP_", "KMP_", "FAKE_")) and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
    env.update({"LD_PRELOAD": f"{build_dir}/libgompsys.so {build_dir}/libfakeaff.so", "FAKE_NCPUS": str(n),
                "FAKE_SYSFS_DIR": tree, "GOMP_SPINCOUNT": "0", "PROBE_NO_CAPTURE": "1"})
    if case.get("initial_mask"):
        env["FAKE_INITIAL_MASK"] = case["initial_mask"]
    env.update(case["env"])
    try:
        p = subprocess.run([probe], env=env, capture_output=True, text=True, timeout=20)
        return parse(p.stdout, p.stderr, p.returncode)
    except subprocess.TimeoutExpired:
        return parse("", "", "timeout")


def record(m: Machine, out: Path, torch_lib: str | None) -> dict[str, Any]:
    """Run every case of ``m`` with both builds; write the three files; return the stats."""
    files = linux_tree(m)
    replay = _load_replay()
    replay.HERE = str(REPLAY)
    tmp = Path(tempfile.mkdtemp(prefix="gomp-record-"))
    try:
        tree = tmp / "sysfs"
        materialize(files, tree)
        builds = {"gomp12": replay.build(str(tmp / "gcc12"), None),
                  "gomp_torch": replay.build(str(tmp / "torch"), torch_lib)}
        recorded = []
        for case in cases(m):
            got = {k: run_case(probe, b, str(tree), m.n, case) for k, (b, probe) in builds.items()}
            agree = got["gomp12"] == got["gomp_torch"]
            row = {**case, "agree": agree, **got["gomp12"]}
            if not agree:
                row["by_runtime"] = {"gomp_torch": {**got["gomp_torch"], "agree": False}}
            recorded.append(row)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    (out / "fakesys").mkdir(parents=True, exist_ok=True)
    (out / "hwloc").mkdir(parents=True, exist_ok=True)
    with open(out / "fakesys" / f"{m.name}.json", "w") as f:
        json.dump({"format": "libgomp-oracle fake sysfs bundle v1",
                   "meta": {"topology": m.name, "source": "oracle/gomp_record.py (Linux's files for this kind of "
                                                           "machine)", "kind": m.kind},
                   "files": files}, f, indent=0, sort_keys=True)
    xml = hwloc_xml(files, m.n)
    if m.kind == "compute units":
        (out / "hwloc" / f"{m.name}.linux.xml").write_text(xml)
        xml = compute_unit_groups(xml)
    (out / "hwloc" / f"{m.name}.xml").write_text(xml)
    stats = {"cases": len(recorded), "agree": sum(r["agree"] for r in recorded),
             "rc_nonzero": sum(r["rc"] != 0 for r in recorded)}
    doc = {"topology": {"name": m.name, "description": m.description, "nprocs": m.n, "kind": m.kind},
           "fake_sysfs": f"fakesys/{m.name}.json", "hwloc_xml": f"hwloc/{m.name}.xml",
           "harness_env": {"LD_PRELOAD": "libgompsys.so libfakeaff.so", "FAKE_NCPUS": str(m.n),
                           "FAKE_SYSFS_DIR": f"<materialized fakesys/{m.name}.json>", "GOMP_SPINCOUNT": "0",
                           "PROBE_NO_CAPTURE": "1"},
           "primary_runtime": "gomp12",
           "runtimes": {"gomp12": "libgomp.so.1 that gcc -fopenmp links (Debian 12: GCC 12.2.0)",
                        "gomp_torch": f"{torch_lib} (PyTorch's bundled GCC 8.5 build)"},
           "recorded_by": "python -m oracle.gomp_record", "stats": stats, "cases": recorded}
    with open(out / f"{m.name}.json", "w") as f:
        f.write(json.dumps({k: v for k, v in doc.items() if k != "cases"}, indent=1)[:-2])
        f.write(',\n "cases": [\n' + ",\n".join(json.dumps(c) for c in recorded) + "\n ]\n}\n")
    return stats


def _torch_lib() -> str:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("PyTorch is not installed: give --torch-lib")
    return str(Path(list(spec.submodule_search_locations)[0]) / "lib" / "libgomp.so.1")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "tests" / "golden_gomp"))
    ap.add_argument("--machine", action="append", choices=sorted(MACHINES))
    ap.add_argument("--torch-lib", default=None)
    a = ap.parse_args(argv)
    torch_lib = a.torch_lib or _torch_lib()
    for name in a.machine or sorted(MACHINES):
        stats = record(MACHINES[name](), Path(a.out), torch_lib)
        print(f"{name}: {stats}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
