"""Which OpenMP runtimes a process runs: parsed from canned maps, then read from real
processes (PyTorch's bundled libgomp, a second libgomp beside it, Intel's libiomp5),
through ``affinity.report()`` and ``affinity show PID``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from affinity.binding import runtimes

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
