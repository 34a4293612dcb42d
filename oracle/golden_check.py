"""Differential check of the planner against the real OpenMP runtimes.

Usage (from the repository root)::

    python -m oracle.golden_check setup              # install runtimes, build shim + probe
    python -m oracle.golden_check generate [-m NAME ...] [--out tests/golden_extra]
    python -m oracle.golden_check compare [--dir tests/golden_extra] [-m NAME ...]
    python -m oracle.golden_check live [-m NAME ...]  # generate into a temp dir, then compare

``generate`` runs every case of ``oracle/cases.py`` on each machine of
``oracle/machines.py`` under Intel's libiomp5 (the reference) and LLVM's
libomp 19, and writes ``<dir>/<machine>.json`` in the format of the shared
golden data, with the machine's cpuinfo file, fake sysfs NUMA directory and
hwloc XML beside it.  ``compare`` plans every stored case and reports the
differences; it exits non-zero when there is one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from . import cases as cases_mod
from . import machines as machines_mod
from .runtime import DEFAULT_WORK, MachineDir, find_runtimes, run_cases

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PREFIX = re.compile(r"^OMP: (Warning|Error|Hint) #\d+: ")


def setup(work: str = DEFAULT_WORK) -> None:
    subprocess.run(["bash", os.path.join(HERE, "setup.sh")], check=True,
                   env=dict(os.environ, ORACLE_WORK=work))


def _write_json(path: str, doc: dict[str, Any]) -> None:
    with open(path, "w") as f:
        f.write("{\n")
        keys = list(doc)
        for i, k in enumerate(keys):
            sep = "," if i < len(keys) - 1 else ""
            if k == "cases":
                f.write('  "cases": [\n')
                for j, c in enumerate(doc[k]):
                    f.write("    " + json.dumps(c, separators=(",", ":")) + ("," if j < len(doc[k]) - 1 else "") + "\n")
                f.write("  ]" + sep + "\n")
            else:
                f.write("  %s: %s%s\n" % (json.dumps(k), json.dumps(doc[k]), sep))
        f.write("}\n")


def _lstopo() -> str | None:
    cand = os.path.join(DEFAULT_WORK, "x", "hwloc", "usr", "bin", "lstopo-no-graphics")
    if os.path.exists(cand):
        return cand
    return shutil.which("lstopo-no-graphics")


def _xml_ok(xml_path: str, m: Any) -> bool | None:
    lst = _lstopo()
    if not lst:
        return None
    env = dict(os.environ)
    libdir = os.path.join(DEFAULT_WORK, "x", "hwloc", "usr", "lib", "x86_64-linux-gnu")
    if os.path.isdir(libdir):
        env["LD_LIBRARY_PATH"] = libdir
    p = subprocess.run([lst, "-i", xml_path, "--of", "xml", "-"], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        return False
    import xml.etree.ElementTree as ET
    root = ET.fromstring(p.stdout)
    got: dict[tuple[int, int, int], list[int]] = {}

    def walk(node: Any, pkg: Any, die: Any, core: Any) -> None:
        for ch in node.findall("object"):
            t = ch.get("type")
            pk, di, co = pkg, die, core
            if t == "Package":
                pk = int(ch.get("os_index"))
            elif t == "Die":
                di = int(ch.get("os_index"))
            elif t == "Core":
                co = int(ch.get("os_index"))
            elif t == "PU":
                got.setdefault((pk, di or 0, co), []).append(int(ch.get("os_index")))
            walk(ch, pk, di, co)
    walk(root, None, None, None)
    exp: dict[tuple[int, int, int], list[int]] = {}
    for o, s, c, _t in m.hw_threads:
        exp.setdefault((s, m.dies.get(o, 0), c), []).append(o)
    return {k: sorted(v) for k, v in got.items()} == {k: sorted(v) for k, v in exp.items()}


def generate(names: list[str] | None, out: str, jobs: int | None, runtimes_keys: tuple[str, ...]) -> None:
    rts = find_runtimes()
    if rts is None:
        raise SystemExit("runtimes not built: run `python -m oracle.golden_check setup` first")
    keys = tuple(k for k in runtimes_keys if k in rts.probes)
    os.makedirs(out, exist_ok=True)
    for m in machines_mod.all_machines():
        if names and m.name not in names:
            continue
        t0 = time.time()
        cs = cases_mod.build_cases(m)
        mdir = MachineDir(m, out)
        res = run_cases(rts, m, cs, keys, jobs, root=out)
        xml = machines_mod.hwloc_xml(m)
        xml_rel = None
        xml_ok = None
        if xml is not None:
            os.makedirs(os.path.join(out, "hwloc"), exist_ok=True)
            xp = os.path.join(out, "hwloc", m.name + ".xml")
            with open(xp, "w") as f:
                f.write(xml)
            xml_ok = _xml_ok(xp, m)
            xml_rel = "hwloc/%s.xml" % m.name
        doc = {
            "topology": m.to_json(),
            "hw_threads_columns": ["os_proc", "physical_id", "core_id", "thread_rank_in_core"],
            "hw_threads": [list(h) for h in m.hw_threads],
            "numa_nodes": {str(k): list(v) for k, v in m.numa_nodes.items()},
            "cpuinfo_file": "cpuinfo/%s.cpuinfo" % m.name,
            "fake_sysfs_node_dir": "fakesys/%s/node" % m.name,
            "hwloc_xml": xml_rel,
            "hwloc_xml_verified": xml_ok,
            "present_procs": m.procs if m.sparse else None,
            "primary_runtime": rts.labels.get(keys[0], keys[0]),
            "runtimes": {k: rts.labels.get(k, k) for k in keys},
            "generator": "oracle/golden_check.py (planner branch); harness: shared/oracle",
            "cases": [case_record(c) for c in res],
        }
        _write_json(os.path.join(out, m.name + ".json"), doc)
        bad = sum(1 for c in res if c["rc"] != 0)
        print("[%s] %d cases (%d runtime errors) in %.0fs -> %s" % (m.name, len(res), bad, time.time() - t0,
                                                                     os.path.join(out, m.name + ".json")),
              flush=True)
        del mdir


def case_record(c: dict[str, Any]) -> dict[str, Any]:
    keep = ("section", "spec", "env", "threads", "initial_mask", "rc", "nthreads", "num_procs", "max_threads",
            "proc_bind", "num_places", "masks", "place_nums", "places", "warnings")
    e = {k: c.get(k) for k in keep if k in c}
    if isinstance(e.get("initial_mask"), str):
        from .runtime import expand_list
        e["initial_mask"] = expand_list(e["initial_mask"])
    # OS-proc sets as cpulist strings ("0-3,8"): the 272-PU machine would
    # otherwise need tens of megabytes (see decode_sets)
    from .runtime import list_text
    for key in ("masks", "places"):
        if e.get(key) is not None:
            e[key] = [list_text(m) for m in e[key]]
    others = c.get("other_runtimes")
    if others:
        e["other_runtimes"] = {k: {"agree": v["agree"], "warnings": v["warnings"], "rc": v["rc"]}
                               for k, v in others.items()}
    return e


def load_topology(golden_dir: str, doc: dict[str, Any], source: str = "cpuinfo") -> Any:
    from affinity.machine.topology import Topology
    if source == "xml":
        return Topology.from_xml(os.path.join(golden_dir, doc["hwloc_xml"]))
    return Topology.from_cpuinfo(os.path.join(golden_dir, doc["cpuinfo_file"]),
                                 numa_nodes=os.path.join(golden_dir, doc["fake_sysfs_node_dir"]))


def decode_sets(sets: Any) -> Any:
    """Golden OS-proc sets: lists of ids (shared golden data) or cpulist
    strings (tests/golden_extra) -> lists of ids."""
    if sets is None:
        return None
    from .runtime import expand_list
    return [expand_list(m) if isinstance(m, str) else m for m in sets]


def compare_case(topo: Any, case: dict[str, Any]) -> str | None:
    """None when the planner reproduces the case, else a description."""
    from affinity.errors import PlanError
    from affinity.planning.planner import plan_env
    case = dict(case, masks=decode_sets(case.get("masks")), places=decode_sets(case.get("places")))
    exp_w = [PREFIX.sub("", w) for w in case["warnings"]]
    try:
        p = plan_env(case["env"], topology=topo, initial_mask=case.get("initial_mask"))
    except PlanError as e:
        return None if case["rc"] != 0 else f"PlanError: {e}"
    if case["rc"] != 0:
        return f"runtime failed (rc={case['rc']}) but the planner planned {p.threads} threads"
    got_w: list[str] = []
    for w in p.warnings:
        if w not in got_w:
            got_w.append(w)
    problems = []
    if p.threads != case["nthreads"]:
        problems.append(f"threads {p.threads} != {case['nthreads']}")
    masks = [sorted(s) for s in p.cpusets]
    if masks != case["masks"]:
        problems.append(f"masks {_fmt(masks)} != {_fmt(case['masks'])}")
    if got_w != exp_w:
        problems.append(f"warnings {got_w} != {exp_w}")
    if case.get("places") is not None:
        places = [sorted(s) for s in p.places] if p.places else []
        if places != case["places"]:
            problems.append(f"places {_fmt(places)} != {_fmt(case['places'])}")
    return "; ".join(problems) or None


def _fmt(masks: list[list[int]] | None) -> str:
    from affinity.cpulist import format_list
    if masks is None:
        return "None"
    s = " ".join("{" + format_list(m) + "}" for m in masks)
    return s if len(s) < 300 else s[:300] + "..."


def compare(golden_dir: str, names: list[str] | None, show: int = 5, source: str = "cpuinfo") -> int:
    total = bad = 0
    for fn in sorted(os.listdir(golden_dir)):
        if not fn.endswith(".json"):
            continue
        with open(os.path.join(golden_dir, fn)) as f:
            doc = json.load(f)
        if "cases" not in doc:
            continue
        name = doc["topology"]["name"]
        if names and name not in names:
            continue
        topo = load_topology(golden_dir, doc, source)
        nbad = 0
        for c in doc["cases"]:
            total += 1
            why = compare_case(topo, c)
            if why:
                nbad += 1
                if nbad <= show:
                    print(f"  MISMATCH {name} [{c['section']}] env={c['env']} mask={c.get('initial_mask')}: {why}")
        bad += nbad
        print(f"{name}: {len(doc['cases']) - nbad}/{len(doc['cases'])} cases match")
    print(f"total: {total - bad}/{total} match")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m oracle.golden_check")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("setup")
    g = sub.add_parser("generate")
    g.add_argument("-m", "--machine", action="append")
    g.add_argument("--out", default=os.path.join(ROOT, "tests", "golden_extra"))
    g.add_argument("--jobs", type=int, default=None)
    g.add_argument("--runtimes", default="libiomp5,libomp19")
    c = sub.add_parser("compare")
    c.add_argument("--dir", default=os.path.join(ROOT, "tests", "golden_extra"))
    c.add_argument("-m", "--machine", action="append")
    c.add_argument("--show", type=int, default=5)
    c.add_argument("--source", choices=("cpuinfo", "xml"), default="cpuinfo")
    lv = sub.add_parser("live")
    lv.add_argument("-m", "--machine", action="append")
    lv.add_argument("--jobs", type=int, default=None)
    a = ap.parse_args(argv)
    if a.cmd == "setup":
        setup()
        return 0
    if a.cmd == "generate":
        generate(a.machine, a.out, a.jobs, tuple(a.runtimes.split(",")))
        return 0
    if a.cmd == "compare":
        return compare(a.dir, a.machine, a.show, a.source)
    tmp = tempfile.mkdtemp(prefix="golden-live-")
    try:
        generate(a.machine, tmp, a.jobs, ("libiomp5",))
        return compare(tmp, a.machine)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
