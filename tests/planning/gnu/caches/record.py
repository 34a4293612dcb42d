"""Records what the real libgomp builds do with ``OMP_PLACES=ll_caches`` on
machines with, without and with partial cache information in sysfs
(``recorded.json`` and the ``*.xml`` files here; read by
``tests/planning/gnu/test_gnu_caches.py``).

    cd <repo> && .venv/bin/python tests/planning/gnu/caches/record.py

Needs gcc -fopenmp (Debian's libgomp), PyTorch's wheel (its bundled libgomp) and
``lstopo-no-graphics`` (hwloc 2).  For each machine one fake
``/sys/devices/system`` tree is written; libgomp reads it through the golden
set's harness (``tests/golden_gomp/replay``: ``LD_PRELOAD`` redirections, a
faked CPU count and process mask), and lstopo exports it as hwloc XML (x86
backend off, so the host's CPUID caches do not leak in) -- the same files on
both sides.  Every case is run twice and must give the same result.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parents[2])]

from gnu_realgomp import TORCH_LIB, RealGomp  # noqa: E402

#: name -> (packages, cores per package, threads per core, caches), Linux
#: numbering (CPU = thread * P * C + package * C + core); caches: "none" (no
#: cpuN/cache directory), "l3" (L1d, L1i, L2 per core, L3 per package),
#: "partial" (package 0 without cache directories, package 1 as "l3")
MACHINES = {
    "nocache_2s2c1t": (2, 2, 1, "none"),
    "l3_2s2c1t": (2, 2, 1, "l3"),
    "partial_2s2c1t": (2, 2, 1, "partial"),
    "nocache_1s4c2t": (1, 4, 2, "none"),
}

#: (env, process mask or None)
CASES = [
    ({"OMP_PLACES": "ll_caches", "OMP_NUM_THREADS": "4"}, None),
    ({"OMP_PLACES": "ll_caches", "OMP_PROC_BIND": "spread", "OMP_NUM_THREADS": "2"}, None),
    ({"OMP_PLACES": "ll_caches", "GOMP_CPU_AFFINITY": "3 1 2 0", "OMP_NUM_THREADS": "4"}, None),
    ({"OMP_PLACES": "ll_caches(2)", "OMP_PROC_BIND": "close", "OMP_NUM_THREADS": "3"}, "1-3"),
    ({"OMP_PLACES": "ll_caches", "OMP_PROC_BIND": "false"}, None),
    ({"OMP_PLACES": " LL_CACHES (3)", "OMP_PROC_BIND": "primary", "OMP_NUM_THREADS": "2"}, "2-3"),
    ({"OMP_PLACES": "ll_caches", "OMP_NUM_THREADS": "2"}, "1-2"),
    ({"OMP_PROC_BIND": "true", "OMP_NUM_THREADS": "3"}, None),
]

#: the files libgomp reads (kept in recorded.json; the rest only serves lstopo)
READ = re.compile(r"cpu/cpu\d+/topology/(thread|core)_siblings_list|cpu/cpu\d+/cache/index\d+/(level|shared_cpu_list)"
                  r"|cpu/online|node/online|node/node\d+/cpulist")


def _list(cpus) -> str:
    return ",".join(map(str, sorted(cpus)))


def _mask(cpus, n: int) -> str:
    return f"{sum(1 << c for c in cpus):0{(n + 3) // 4}x}"


def sysfs(packages: int, cores: int, smt: int, caches: str) -> tuple[dict[str, str], int]:
    """The tree as paths under /sys/devices/system, and the CPU count."""
    n = packages * cores * smt
    f: dict[str, str] = {}
    for p in range(packages):
        pkg = [t * packages * cores + p * cores + c for c in range(cores) for t in range(smt)]
        for c in range(cores):
            sib = [t * packages * cores + p * cores + c for t in range(smt)]
            levels = [(1, "Data", sib), (1, "Instruction", sib), (2, "Unified", sib), (3, "Unified", pkg)]
            if caches == "none" or (caches == "partial" and p == 0):
                levels = []
            for x in sib:
                b = f"cpu/cpu{x}/"
                f[b + "online"] = "1\n"
                for kind, cpus in (("thread_siblings", sib), ("core_siblings", pkg), ("core_cpus", sib),
                                   ("package_cpus", pkg)):
                    f[b + f"topology/{kind}_list"] = _list(cpus) + "\n"
                    f[b + f"topology/{kind}"] = _mask(cpus, n) + "\n"
                f[b + "topology/physical_package_id"] = f"{p}\n"
                f[b + "topology/core_id"] = f"{c}\n"
                for k, (level, kind, cpus) in enumerate(levels):
                    cb = b + f"cache/index{k}/"
                    f.update({cb + "level": f"{level}\n", cb + "type": kind + "\n",
                              cb + "size": f"{32 if level == 1 else 1024 * level}K\n",
                              cb + "shared_cpu_list": _list(cpus) + "\n", cb + "shared_cpu_map": _mask(cpus, n) + "\n",
                              cb + "coherency_line_size": "64\n", cb + "ways_of_associativity": "8\n",
                              cb + "number_of_sets": "64\n", cb + "physical_line_partition": "1\n", cb + "id": "0\n"})
        nb = f"node/node{p}/"
        f.update({nb + "cpulist": _list(pkg) + "\n", nb + "cpumap": _mask(pkg, n) + "\n",
                  nb + "distance": " ".join("10" if q == p else "20" for q in range(packages)) + "\n",
                  nb + "meminfo": f"Node {p} MemTotal:       16777216 kB\n"})
    every = f"0-{n - 1}\n"
    f.update({"cpu/online": every, "cpu/possible": every, "cpu/present": every, "cpu/offline": "\n",
              "cpu/kernel_max": "8191\n"})
    nodes = f"0-{packages - 1}\n" if packages > 1 else "0\n"
    for k in ("online", "possible", "has_cpu", "has_memory", "has_normal_memory"):
        f[f"node/{k}"] = nodes
    return f, n


def _write(files: dict[str, str], root: Path) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def export_xml(name: str, files: dict[str, str], hw: list[tuple[int, int, int]], tmp: Path) -> None:
    """lstopo's XML of the tree (host name and kernel lines dropped)."""
    root = tmp / f"fsroot-{name}"
    _write({"sys/devices/system/" + k: v for k, v in files.items()}, root)
    (root / "proc").mkdir()
    (root / "proc" / "cpuinfo").write_text(
        "".join(f"processor\t: {p}\nphysical id\t: {s}\ncore id\t\t: {c}\n\n" for p, s, c in hw))
    out = tmp / f"{name}.xml"
    subprocess.run(["lstopo-no-graphics", "-i", str(root), "--of", "xml", "-f", str(out)], check=True,
                   env=dict(os.environ, HWLOC_COMPONENTS="-x86"))
    keep = [ln for ln in out.read_text().splitlines(keepends=True)
            if not re.search(r'info name="(OSRelease|OSVersion|HostName|ProcessName)"', ln)]
    (HERE / f"{name}.xml").write_text("".join(keep))


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="gomp-caches-"))
    out: dict = {}
    trees = {}
    for name, (packages, cores, smt, caches) in MACHINES.items():
        files, n = sysfs(packages, cores, smt, caches)
        hw = [(t * packages * cores + p * cores + c, p, c) for p in range(packages) for c in range(cores)
              for t in range(smt)]
        export_xml(name, files, sorted(hw), tmp)
        trees[name] = (files, n)
        out[name] = {"ncpus": n, "sysfs": {k: v for k, v in sorted(files.items()) if READ.fullmatch(k)},
                     "cases": []}
    for build, lib in (("gcc12", None), ("torch", TORCH_LIB)):
        gomp = RealGomp(lib)
        try:
            for name, (files, n) in trees.items():
                tree = gomp.tree(name, files)
                for env, mask in CASES:
                    got = [gomp.run(tree, n, env, mask) for _ in range(2)]
                    keys = ("rc", "nthreads", "masks", "places", "init_mask", "warnings")
                    first, second = ({k: g.get(k) for k in keys} for g in got)
                    assert first == second, (name, env, got)
                    out[name]["cases"].append({"build": build, "env": env, "mask": mask, **first})
        finally:
            gomp.close()
    (HERE / "recorded.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
