"""An OpenMP runtime loaded after apply() (``import torch`` later, say).

It reads the exported environment, so its team lands where the plan says; and it
binds its primary thread -- here the main thread -- to the first place, which every
thread created afterwards inherits (the tensorflow#24172 harm).  affinity cannot stop
a runtime it did not see load from doing that, so the bind map says where it happened,
and restore() undoes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a process mask of at least 2 CPUs")

SCRIPT = r"""
import ctypes, json, os, sys, threading, warnings
sys.path.insert(0, sys.argv[3])
from pathlib import Path
from helpers.ompprog import build
import affinity

warnings.simplefilter("ignore")
lib_path = build(sys.argv[1], Path(sys.argv[2]))
mask = lambda: sorted(os.sched_getaffinity(0))
out = {"pid": os.getpid(), "start": mask()}
with affinity.pinned("granularity=fine,scatter", threads=2, tensorflow=False) as b:
    out["plan"] = [sorted(s) for s in b.plan.cpusets]
    lib = ctypes.CDLL(str(lib_path))          # loaded after apply()
    tids, masks = (ctypes.c_int * 8)(), (ctypes.c_ulong * 8)()
    n = lib.report(tids, masks, 8)
    out["team"] = [[c for c in range(64) if masks[i] >> c & 1] for i in range(n)]
    out["main_after_region"] = mask()
    # a thread created now inherits the narrowed mask; it is held alive until the bind
    # map has been read (a thread that exited before report() lists /proc/self/task
    # would leave no row to carry the note: the race this file once had)
    got, seen, done = {}, threading.Event(), threading.Event()
    def child():
        got.update(m=mask(), tid=threading.get_native_id())
        seen.set()
        done.wait(60)
    t = threading.Thread(target=child)
    t.start()
    seen.wait(60)
    try:
        out["report"] = b.report().to_dict()
        out["report_text"] = b.report().text()
    finally:
        done.set()
        t.join()
    out["new_thread"] = got["m"]
    out["new_tid"] = got["tid"]
out["main_restored"] = mask()
print(json.dumps(out))
"""


@pytest.mark.parametrize("kind", ["libgomp", "libiomp5"])
def test_a_runtime_loaded_after_apply(kind, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "GOMP_"))}
    r = subprocess.run([sys.executable, "-c", SCRIPT, kind, str(tmp_path), str(ROOT / "tests")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    # its team follows the exported environment: thread i on the plan's set i
    assert out["team"] == out["plan"]
    # ... and its primary (main) thread stays on place 0, which new threads inherit
    assert out["main_after_region"] == out["plan"][0] == out["new_thread"]
    rows = {r["tid"]: r for r in out["report"]["threads"]}
    main = rows[out["pid"]]
    assert main["mismatch"] and main["requested"] == out["start"]
    assert f"by {kind} loaded after apply()" in main["note"] and "threads it creates now inherit" in main["note"]
    # the thread created after the runtime loaded is alive in the map, with the note
    assert "inherited the main thread's mask" in (rows[out["new_tid"]]["note"] or "")
    assert "NOTE: narrowed to" in out["report_text"]
    assert out["main_restored"] == out["start"]
