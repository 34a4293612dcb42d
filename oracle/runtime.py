"""Run the real OpenMP runtimes on an invented machine and record the bindings.

This is the differential-testing half of the planner's test suite.  It drives
the LD_PRELOAD shim and probe program of the project's shared golden-data
oracle (``shared/oracle``; ``src/fakeaff.c`` and ``src/probe.c`` here are
verbatim copies of those files, see ``oracle/README.md``) on machines that
``oracle/machines.py`` describes, and returns, per case, what the runtime
really did: team size, the per-thread OS-proc sets, the place list and the
warnings it printed.

Nothing here knows how the runtime binds threads: every result is the mask
the runtime itself handed to the (fake) kernel.

The runtimes and the shim are built by ``oracle/setup.sh`` under
``$ORACLE_WORK`` (default ``/tmp/oracle-work``); :func:`find_runtimes`
locates them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_WORK = os.environ.get("ORACLE_WORK", "/tmp/oracle-work")

BOUND_RE = re.compile(r"thread (\d+) bound to OS proc set (.*)$")
MSG_RE = re.compile(r"^OMP: (Warning|Error|Hint) #\d+: ")


@dataclass(frozen=True)
class Machine:
    """An invented machine: hardware threads and NUMA nodes.

    ``hw_threads`` rows are ``(os_proc, physical_id, core_id, rank_in_core)``;
    ``numa_nodes`` maps a node id (sysfs ``nodeN``) to its procs;
    ``present`` (optional) restricts the procs the process can see (offline
    CPUs): the fake machine then has ``max(proc)+1`` CPUs and the initial
    process mask is ``present``.  ``dies`` (optional) maps an OS proc to its
    die within its package: the runtime never sees it (the cpuinfo file has no
    die field, and a core id may repeat in every die of a package, as the
    kernel numbers cores on such machines); the hwloc XML of the machine has
    the dies, with each die's own cores.
    """

    name: str
    description: str
    hw_threads: tuple[tuple[int, int, int, int], ...]
    numa_nodes: Mapping[int, tuple[int, ...]]
    initial_masks: tuple[str, ...] = ()
    dies: Mapping[int, int] = field(default_factory=dict)

    @property
    def procs(self) -> list[int]:
        return sorted(h[0] for h in self.hw_threads)

    @property
    def ncpus(self) -> int:
        return max(self.procs) + 1

    @property
    def sparse(self) -> bool:
        return self.ncpus != len(self.hw_threads)

    def cpuinfo_text(self) -> str:
        out = []
        for os_proc, sock, core, _t in sorted(self.hw_threads):
            out.append("processor\t: %d\nphysical id\t: %d\ncore id\t\t: %d\n" % (os_proc, sock, core))
        return "\n".join(out) + "\n"

    def to_json(self) -> dict[str, Any]:
        sockets = sorted({h[1] for h in self.hw_threads})
        cores = sorted({(h[1], h[2]) for h in self.hw_threads})
        tpc = max(sum(1 for h in self.hw_threads if (h[1], h[2]) == c) for c in cores)
        return {
            "name": self.name,
            "description": self.description,
            "nprocs": len(self.hw_threads),
            "nsockets": len(sockets),
            "ncores": len(cores),
            "threads_per_core": tpc,
        }


def list_text(procs: Iterable[int]) -> str:
    ps = sorted(set(procs))
    out, i = [], 0
    while i < len(ps):
        j = i
        while j + 1 < len(ps) and ps[j + 1] == ps[j] + 1:
            j += 1
        out.append(str(ps[i]) if i == j else "%d-%d" % (ps[i], ps[j]))
        i = j + 1
    return ",".join(out)


def expand_list(s: str) -> list[int]:
    out: list[int] = []
    s = s.strip().strip("{}")
    if not s:
        return out
    for part in s.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


@dataclass
class Runtimes:
    shim: str
    probes: dict[str, str]
    labels: dict[str, str] = field(default_factory=dict)


def find_runtimes(work: str = DEFAULT_WORK) -> Runtimes | None:
    """The runtimes built by ``oracle/setup.sh`` (or the shared make_golden.sh)."""
    rj = os.path.join(work, "runtimes.json")
    shim = os.path.join(work, "build", "libfakeaff.so")
    if not (os.path.exists(rj) and os.path.exists(shim)):
        return None
    with open(rj) as f:
        rts = json.load(f)
    probes = {r["key"]: r["probe"] for r in rts if os.path.exists(r["probe"])}
    if "libiomp5" not in probes:
        return None
    return Runtimes(shim, probes, {r["key"]: r["label"] for r in rts})


class MachineDir:
    """The cpuinfo file and fake sysfs node directory of a machine, on disk."""

    def __init__(self, machine: Machine, root: str | None = None):
        self.machine = machine
        self._tmp = None
        if root is None:
            self._tmp = tempfile.mkdtemp(prefix="oracle-%s-" % machine.name)
            root = self._tmp
        self.root = root
        os.makedirs(os.path.join(root, "cpuinfo"), exist_ok=True)
        self.cpuinfo = os.path.abspath(os.path.join(root, "cpuinfo", machine.name + ".cpuinfo"))
        with open(self.cpuinfo, "w") as f:
            f.write(machine.cpuinfo_text())
        self.nodedir = os.path.abspath(os.path.join(root, "fakesys", machine.name, "node"))
        if os.path.isdir(self.nodedir):
            shutil.rmtree(self.nodedir)
        for nid, procs in sorted(machine.numa_nodes.items()):
            d = os.path.join(self.nodedir, "node%d" % nid)
            os.makedirs(d)
            with open(os.path.join(d, "cpulist"), "w") as f:
                f.write(list_text(procs) + "\n")
        if not machine.numa_nodes:
            os.makedirs(self.nodedir, exist_ok=True)

    def cleanup(self) -> None:
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)


def run_case(probe: str, shim: str, mdir: MachineDir, env_vars: Mapping[str, str],
             initial_mask: str | None = None, timeout: float = 120,
             no_capture: bool = False) -> dict[str, Any]:
    """Run the probe once; ``env_vars`` are set in their mapping order (the
    runtime reads ``environ`` in order, which matters for some warnings)."""
    m = mdir.machine
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("KMP_") or k.startswith("OMP_") or k.startswith("GOMP_")
                   or k.startswith("FAKE_") or k == "LD_PRELOAD")}
    env.update({
        "LD_PRELOAD": shim,
        "FAKE_NCPUS": str(m.ncpus),
        "KMP_TOPOLOGY_METHOD": "cpuinfo",
        "KMP_CPUINFO_FILE": mdir.cpuinfo,
        "FAKE_NODE_DIR": mdir.nodedir,
    })
    mask = initial_mask
    if mask is None and m.sparse:
        mask = list_text(m.procs)
    if mask:
        env["FAKE_INITIAL_MASK"] = mask
    for k, v in env_vars.items():
        env[k] = v
    if no_capture:
        env["PROBE_NO_CAPTURE"] = "1"
    try:
        p = subprocess.run([probe], env=env, capture_output=True, text=True, timeout=timeout)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        rc, out, err = "timeout", "", ""
    res: dict[str, Any] = {"rc": rc, "nthreads": None, "masks": None, "place_nums": None,
                           "places": [], "num_procs": None, "max_threads": None,
                           "proc_bind": None, "num_places": None}
    masks: dict[int, Any] = {}
    pnums: dict[int, int] = {}
    for line in out.splitlines():
        f = line.split(" ")
        if f[0] == "NTHREADS":
            res["nthreads"] = int(f[1])
        elif f[0] == "NUM_PROCS":
            res["num_procs"] = int(f[1])
        elif f[0] == "MAX_THREADS":
            res["max_threads"] = int(f[1])
        elif f[0] == "PROC_BIND":
            res["proc_bind"] = int(f[1])
        elif f[0] == "NUM_PLACES":
            res["num_places"] = int(f[1])
        elif f[0] == "PLACE":
            res["places"].append(expand_list(f[2] if len(f) > 2 else ""))
        elif f[0] == "T":
            t = int(f[1])
            kv = dict(x.split("=", 1) for x in f[2:])
            masks[t] = expand_list(kv["mask"]) if kv["mask"] != "ERR" else None
            pnums[t] = int(kv["place"])
    if res["nthreads"] is not None and len(masks) == res["nthreads"]:
        res["masks"] = [masks[t] for t in range(res["nthreads"])]
        res["place_nums"] = [pnums[t] for t in range(res["nthreads"])]
    msgs: list[str] = []
    infos: list[str] = []
    for line in err.splitlines():
        if MSG_RE.match(line) and line not in msgs:
            msgs.append(line)
        elif line.startswith("OMP: Info"):
            infos.append(re.sub(r"^OMP: Info #\d+: ", "", line))
    res["warnings"] = msgs
    res["infos"] = infos
    if rc != 0:
        res["stderr_tail"] = err[-2000:]
        if not no_capture and "Assertion failure" in err:
            r2 = run_case(probe, shim, mdir, env_vars, initial_mask, timeout, no_capture=True)
            if r2["rc"] == 0:
                r2["capture_aborted"] = True
                return r2
    return res


def run_cases(runtimes: Runtimes, machine: Machine, cases: Sequence[Mapping[str, Any]],
              runtime_keys: Sequence[str] = ("libiomp5",), jobs: int | None = None,
              root: str | None = None) -> list[dict[str, Any]]:
    """Run every case (``{"env": {...}, "initial_mask": "0-3" | None}``) under
    each runtime; returns one result per case with the primary (first
    runtime's) result at top level and the others under ``other_runtimes``."""
    import concurrent.futures as cf

    mdir = MachineDir(machine, root)
    try:
        work = [(i, k) for i in range(len(cases)) for k in runtime_keys]
        results: dict[tuple[int, str], dict[str, Any]] = {}
        with cf.ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 2) as ex:
            futs = {ex.submit(run_case, runtimes.probes[k], runtimes.shim, mdir,
                              cases[i]["env"], cases[i].get("initial_mask")): (i, k)
                    for i, k in work}
            for fu in cf.as_completed(futs):
                results[futs[fu]] = fu.result()
        out = []
        for i, c in enumerate(cases):
            prim = results[(i, runtime_keys[0])]
            e = dict(c)
            e.update(prim)
            others = {}
            for k in runtime_keys[1:]:
                r = results[(i, k)]
                others[k] = {"agree": r["masks"] == prim["masks"] and r["nthreads"] == prim["nthreads"],
                             "rc": r["rc"], "warnings": r["warnings"], "nthreads": r["nthreads"],
                             "masks": r["masks"]}
            if others:
                e["other_runtimes"] = others
            out.append(e)
        return out
    finally:
        if root is None:
            mdir.cleanup()
