"""Which OpenMP runtimes a process runs: parsed from canned maps, then read from real
processes (PyTorch's bundled libgomp, a second libgomp beside it, Intel's libiomp5),
through ``affinity.report()`` and ``affinity show PID``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from affinity.machine import loaded as runtimes
from affinity.planning.decide import meaning_notes

MAPS = """\
7f00-7f10 r--p 00000000 fe:00 111 /venv/site-packages/torch/lib/libgomp.so.1
7f10-7f20 r-xp 00010000 fe:00 111 /venv/site-packages/torch/lib/libgomp.so.1
7f30-7f40 r-xp 00000000 fe:00 222 /usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0
7f50-7f60 r-xp 00000000 fe:00 222 /usr/lib/x86_64-linux-gnu/libgomp.so.1
7f70-7f80 r-xp 00000000 fe:00 333 /opt/intel/lib/libiomp5.so
7f90-7fa0 r-xp 00000000 fe:00 444 /venv/site-packages/sklearn/.libs/libomp-a1b2c3.so (deleted)
7fb0-7fc0 r-xp 00000000 fe:00 555 /usr/lib/libgompish.so
7fd0-7fe0 rw-p 00000000 00:00 0 [heap]
"""


def test_families_copies_and_the_warning_from_canned_maps():
    found = runtimes.parse_maps(MAPS)
    # one entry per file (inode 222 mapped under two names counts once), in address order
    assert [(r.kind, r.family) for r in found] == [("libgomp", "gnu"), ("libgomp", "gnu"),
                                                   ("libiomp5", "intel"), ("libomp", "llvm")]
    assert [r.bundled_by for r in found] == ["torch", None, None, "sklearn"]
    c = runtimes.Census(1, tuple(found))
    assert c.copies("gnu") == 2 and c.copies() == 4 and c.families == ("gnu", "intel", "llvm")
    w = c.warning()
    assert w.startswith("4 OpenMP runtimes are loaded in one process") and "pytorch#98836" in w
    assert "\n" not in w
    assert runtimes.Census(1, tuple(found[:1])).warning() is None
    assert runtimes.family_of("/x/libgomp.so.1") == ("libgomp", "gnu")
    assert runtimes.family_of("/x/libgomp-plugin-nvptx.so.1") is None


SCRIPT = r"""
import ctypes, json, os, sys
import torch
if sys.argv[1] != "-":
    ctypes.CDLL(sys.argv[1])          # a second OpenMP runtime, by its path
import affinity
rep = affinity.report()
print(json.dumps({"pid": os.getpid(), "report": rep.to_dict(), "text": rep.text()}), flush=True)
sys.stdin.readline()                  # stay alive until the test has looked at us
"""


def _system_libgomp() -> str:
    out = subprocess.run(["gcc", "-print-file-name=libgomp.so.1"], capture_output=True, text=True, check=True)
    return os.path.realpath(out.stdout.strip())


def _live(second: str):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "GOMP_"))}
    p = subprocess.Popen([sys.executable, "-c", SCRIPT, second], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    line = p.stdout.readline()
    assert line, p.stderr.read()[-3000:]
    return p, json.loads(line)


def test_torch_alone_one_bundled_libgomp_in_report_and_show():
    p, out = _live("-")
    try:
        rts = out["report"]["openmp_runtimes"]
        assert [(r["kind"], r["family"], r["bundled_by"]) for r in rts["runtimes"]] == [("libgomp", "gnu", "torch")]
        assert rts["copies"] == {"gnu": 1} and rts["warning"] is None
        assert os.path.exists(rts["runtimes"][0]["path"]) and "/torch/lib/" in rts["runtimes"][0]["path"]
        assert f"affinity: pid {out['pid']} OpenMP runtime gnu (libgomp)" in out["text"]
        # `affinity show PID` reads another process's maps
        r = subprocess.run([sys.executable, "-m", "affinity", "show", str(out["pid"]), "--json"],
                           capture_output=True, text=True, timeout=60)
        shown = json.loads(r.stdout)["openmp_runtimes"]
        assert shown["runtimes"] == rts["runtimes"]
    finally:
        p.communicate("\n", timeout=60)


def test_two_copies_of_libgomp_are_counted_and_warned():
    system = _system_libgomp()
    p, out = _live(system)
    try:
        rts = out["report"]["openmp_runtimes"]
        paths = [r["path"] for r in rts["runtimes"]]
        assert len(paths) == 2 and sum("/torch/lib/" in x for x in paths) == 1 and system in map(os.path.realpath, paths)
        assert rts["copies"] == {"gnu": 2}
        assert rts["warning"].startswith("2 OpenMP runtimes are loaded in one process")
        assert "WARNING: 2 OpenMP runtimes" in out["text"]
        r = subprocess.run([sys.executable, "-m", "affinity", "show", str(out["pid"])],
                           capture_output=True, text=True, timeout=60)
        assert "WARNING: 2 OpenMP runtimes are loaded" in r.stdout
    finally:
        p.communicate("\n", timeout=60)


def test_intel_beside_gnu():
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    p, out = _live(str(iomp))
    try:
        fams = sorted((r["family"], r["kind"]) for r in out["report"]["openmp_runtimes"]["runtimes"])
        assert fams == [("gnu", "libgomp"), ("intel", "libiomp5")]
    finally:
        p.communicate("\n", timeout=60)


APPLY_TWO = r"""
import ctypes, json, sys, warnings
import torch
ctypes.CDLL(sys.argv[1])
import affinity
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    affinity.apply("compact").restore()
print(json.dumps([str(x.message) for x in w if x.category is affinity.AffinityWarning]))
"""


def test_apply_warns_when_two_runtimes_are_loaded():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "GOMP_"))}
    r = subprocess.run([sys.executable, "-c", APPLY_TWO, _system_libgomp()], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    msgs = [m for m in json.loads(r.stdout) if "OpenMP runtimes are loaded" in m]
    assert len(msgs) == 1 and msgs[0].startswith("affinity: 2 OpenMP runtimes are loaded in one process")


MEANING = r"""
import json, sys, warnings
order, settings, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
if order == "before":
    import torch
import affinity
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    b = affinity.apply(settings, threads=n)
    if order == "after":
        import torch
    cpusets = [sorted(s) for s in b.plan.cpusets]
    b.restore()
print(json.dumps({"cpusets": cpusets,
                  "notes": [str(x.message) for x in w if "means something else" in str(x.message)]}))
"""


@pytest.mark.parametrize("order", ["before", "after", "no-torch"])
def test_settings_libgomp_reads_otherwise_are_warned(order):
    """OMP_PLACES=threads OMP_PROC_BIND=close with 3 threads on 2 CPUs: Intel's rules
    give 0 0 1, libgomp's (PyTorch's build) 0 1 0 -- said once torch's libgomp is loaded."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "GOMP_"))}
    cpus = sorted(os.sched_getaffinity(0))[:2]
    out = {}
    for n in (3, 2):
        r = subprocess.run([sys.executable, "-c", MEANING, order, "OMP_PLACES=threads OMP_PROC_BIND=close", str(n)],
                           capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        out[n] = json.loads(r.stdout)
    assert out[3]["cpusets"] == [[cpus[0]], [cpus[0]], [cpus[1]]]
    if order == "no-torch":
        assert out[3]["notes"] == []
    else:
        (note,) = out[3]["notes"]
        assert "OMP_PLACES=threads OMP_PROC_BIND=close means something else to the libgomp loaded here" in note
        assert "torch build" in note and "/torch/lib/libgomp" in note and "\n" not in note
        assert f"places 3 threads on {{{cpus[0]}}} {{{cpus[1]}}} {{{cpus[0]}}}" in note
        assert f"intel's rules, followed and pinned here, give {{{cpus[0]}}} {{{cpus[0]}}} {{{cpus[1]}}}" in note
    assert out[2]["notes"] == []  # one thread per place: both read it alike


def test_meaning_notes_for_each_family_against_the_plans_rules():
    """Pure check on a described machine (sub-NUMA clusters: libomp 19 knows no NUMA
    layer without hwloc), with the runtimes' census given."""
    import affinity

    t = affinity.Topology.from_synthetic("pack:2 group:2 [numa] core:2 pu:1")
    p = affinity.plan("OMP_PLACES=numa_domains OMP_PROC_BIND=close", threads=2, topology=t)
    llvm = runtimes.LoadedRuntime("/x/libomp.so", "libomp", "llvm", ("0", 1))
    intel = runtimes.LoadedRuntime("/x/libiomp5.so", "libiomp5", "intel", ("0", 2))
    (note,) = meaning_notes(p, runtimes.Census(None, (llvm, intel)))
    assert note == ("OMP_PLACES=numa_domains OMP_PROC_BIND=close means something else to the libomp loaded here "
                    "(/x/libomp.so, llvm's rules): it places 2 threads on {0} {1}, where intel's rules, followed "
                    "and pinned here, give {0-1} {2-3}")
    # KMP_AFFINITY alone: libgomp does not read it (and apply() pins its team itself)
    gomp = runtimes.LoadedRuntime("/x/libgomp.so.1", "libgomp", "gnu", ("0", 3))
    k = affinity.plan("granularity=fine,scatter", threads=2, topology=t)
    assert meaning_notes(k, runtimes.Census(None, (gomp,))) == []
