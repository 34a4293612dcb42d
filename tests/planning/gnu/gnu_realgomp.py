"""Running the real libgomp on a described machine (the golden set's harness,
``tests/golden_gomp/replay``): a fake ``/sys`` tree, a faked CPU count and process
mask, every thread's mask recorded.  Shared by the real-library tests and the bench."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from affinity.cpulist import format_list
from affinity.machine.topology import Topology
from affinity.planning.gnu import sysfs_view
from helpers import torch_package_dir

REPLAY = Path(__file__).resolve().parents[2] / "golden_gomp" / "replay"
TORCH_LIB = torch_package_dir() / "lib" / "libgomp.so.1"


def _replay_module() -> Any:
    spec = importlib.util.spec_from_file_location("gomp_replay", REPLAY / "replay.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tree_files(topology: Topology, online: frozenset[int] | None = None) -> dict[str, str]:
    """The sysfs files libgomp reads, written from :func:`sysfs_view` (online CPUs only)."""
    v = sysfs_view(topology)
    files = {}
    for cpu in sorted(topology.cpuset):
        files[f"cpu/cpu{cpu}/topology/thread_siblings_list"] = format_list(v.thread_siblings[cpu]) + "\n"
        files[f"cpu/cpu{cpu}/topology/core_siblings_list"] = format_list(v.core_siblings[cpu]) + "\n"
        if cpu in v.last_cache:
            files[f"cpu/cpu{cpu}/cache/index0/level"] = "1\n"
            files[f"cpu/cpu{cpu}/cache/index0/shared_cpu_list"] = f"{cpu}\n"
            files[f"cpu/cpu{cpu}/cache/index1/level"] = "3\n"
            files[f"cpu/cpu{cpu}/cache/index1/shared_cpu_list"] = format_list(v.last_cache[cpu]) + "\n"
    files["cpu/online"] = format_list(online if online is not None else topology.cpuset) + "\n"
    files["node/online"] = format_list(n for n, _ in v.numa_nodes) + "\n"
    for n, cpus in v.numa_nodes:
        files[f"node/node{n}/cpulist"] = format_list(cpus) + "\n"
    return files


class RealGomp:
    """The layers and the probe built once (per libgomp), a tree per machine."""

    def __init__(self, lib: Path | None):
        self.tmp = Path(tempfile.mkdtemp(prefix="gnu-real-"))
        self.mod = _replay_module()
        self.mod.HERE = str(REPLAY)
        self.build_dir, self.probe = self.mod.build(str(self.tmp), str(lib) if lib else None)
        self.trees: dict[str, str] = {}

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def tree(self, name: str, files: dict[str, str]) -> str:
        if name not in self.trees:
            root = self.tmp / f"sys-{name}"
            for rel, text in files.items():
                p = root / rel
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(text)
            self.trees[name] = str(root)
        return self.trees[name]

    def run(self, tree: str, ncpus: int, env: dict[str, str], mask: str | None = None,
            online: str | None = None, cpuset: str | None = None, timeout: float = 60) -> dict[str, Any]:
        e = {k: v for k, v in os.environ.items()
             if not k.startswith(("OMP_", "GOMP_", "KMP_", "FAKE_")) and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
        e.update({"LD_PRELOAD": f"{self.build_dir}/libgompsys.so {self.build_dir}/libfakeaff.so",
                  "FAKE_NCPUS": str(ncpus), "FAKE_SYSFS_DIR": tree, "GOMP_SPINCOUNT": "0",
                  "PROBE_NO_CAPTURE": "1"})
        for k, v in (("FAKE_INITIAL_MASK", mask), ("FAKE_ONLINE", online), ("FAKE_CPUSET", cpuset)):
            if v is not None:
                e[k] = v
        e.update(env)
        return self.mod.run(self.probe, e, timeout)


def gcc_libgomp_available() -> bool:
    return shutil.which("gcc") is not None and subprocess.run(
        ["gcc", "-fopenmp", "-x", "c", "-fsyntax-only", "-"], input="#include <omp.h>\n", text=True,
        capture_output=True).returncode == 0
