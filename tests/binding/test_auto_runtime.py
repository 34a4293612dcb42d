"""``runtime="auto"``: plan()/plan_env()/apply() follow the rules of the OpenMP
runtime loaded in this process (affinity.binding.which).

Each case runs in a fresh process so that what is loaded is real (torch is never
imported in the test process: tests/conftest.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from affinity.machine.loaded import Census, LoadedRuntime
from affinity.binding.which import resolve_runtime
from affinity.errors import PlanError
from tests.helpers.ompprog import iomp5_dir

PLAN_AUTO = r"""
import ctypes, json, sys
if sys.argv[1] == "torch":
    import torch
elif sys.argv[1] != "none":
    ctypes.CDLL(sys.argv[1])
import affinity
from affinity.machine.loaded import census
p = affinity.plan("OMP_PLACES=threads OMP_PROC_BIND=spread", threads=3, runtime="auto")
q = affinity.plan_env({"OMP_PLACES": "threads", "OMP_NUM_THREADS": "3"}, runtime="auto")
print(json.dumps({"plan": p.runtime, "plan_env": q.runtime,
                  "families": [r.family for r in census().runtimes]}))
"""


def _system_libgomp() -> str:
    out = subprocess.run(["gcc", "-print-file-name=libgomp.so.1"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _run(code: str, *args: str) -> dict:
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("load,want,families", [
    ("torch", "gnu-torch", ["gnu"]),
    ("libiomp5", "intel", ["intel"]),
    ("libgomp", "gnu", ["gnu"]),
    ("none", "intel", []),
])
def test_plan_auto_follows_the_loaded_runtime(load, want, families):
    arg = {"libiomp5": str(iomp5_dir() / "libiomp5.so"), "libgomp": _system_libgomp()}.get(load, load)
    out = _run(PLAN_AUTO, arg)
    assert out["families"] == families
    assert out["plan"] == want and out["plan_env"] == want


def _rt(path: str, family: str, ino: int) -> LoadedRuntime:
    return LoadedRuntime(path, {"gnu": "libgomp", "intel": "libiomp5", "llvm": "libomp"}[family], family,
                         ("00:01", ino))


def test_resolution_table_from_censuses():
    torch_gomp = _rt("/v/site-packages/torch/lib/libgomp.so.1", "gnu", 1)
    sys_gomp = _rt("/usr/lib/x86_64-linux-gnu/libgomp.so.1", "gnu", 2)
    omp = _rt("/usr/lib/x86_64-linux-gnu/libomp.so.5", "llvm", 3)
    assert resolve_runtime("auto", Census(None, ())) == "intel"
    assert resolve_runtime("auto", Census(None, (omp,))) == "llvm"
    assert resolve_runtime("auto", Census(None, (torch_gomp,))) == "gnu-torch"
    assert resolve_runtime("gnu", Census(None, (omp,))) == "gnu"  # a name is never second-guessed
    with pytest.raises(PlanError, match=r"apply\(runtime='auto'\).*torch/lib/libgomp.so.1 \(gnu-torch\).*"
                                        r"libgomp.so.1 \(gnu\)"):
        resolve_runtime("auto", Census(None, (torch_gomp, sys_gomp)), caller="apply")


APPLY_TORCH = r"""
import json, os, sys, warnings
warnings.simplefilter("ignore")
import torch
import affinity
spec = "OMP_PLACES=threads OMP_PROC_BIND=spread"
b = affinity.apply(spec, threads=int(sys.argv[1]), runtime=sys.argv[2])
want = affinity.plan(spec, threads=int(sys.argv[1]), runtime="gnu-torch")
# the intra-op team but the main thread (member 0 keeps the process mask: apply()'s rule)
team = {p.index: sorted(os.sched_getaffinity(t)) for t, p in b.pins.items()
        if p.index is not None and p.role in ("openmp", "torch-intra") and t != os.getpid()}
rep = b.report()
print(json.dumps({"rules": b.plan.runtime, "plan": [sorted(c) for c in b.plan.cpusets],
                  "want": [sorted(c) for c in want.cpusets], "team": {str(k): v for k, v in team.items()},
                  "map_rules": rep.to_dict()["rules"], "text": "binding followed gnu-torch's rules" in rep.text()}))
"""


@pytest.mark.parametrize("runtime", ["auto", "gnu-torch"])
def test_apply_in_a_torch_process_pins_the_gnu_torch_plan(runtime):
    out = _run(APPLY_TORCH, "3", runtime)
    assert out["rules"] == "gnu-torch" and out["map_rules"] == "gnu-torch" and out["text"]
    assert out["plan"] == out["want"]
    assert out["team"], "no team member was pinned"
    for i, cpus in out["team"].items():
        assert cpus == out["want"][int(i)], (i, out)


def test_apply_defaults_to_intel_rules_even_in_a_torch_process():
    code = APPLY_TORCH.replace('runtime=sys.argv[2])', ')')
    out = _run(code, "3", "unused")
    assert out["rules"] == "intel" and out["map_rules"] == "intel"


TWO = r"""
import ctypes, json, sys
import torch
ctypes.CDLL(sys.argv[1])
import affinity
from affinity.errors import PlanError
out = {}
for call in ("plan", "apply"):
    try:
        getattr(affinity, call)("OMP_PLACES=threads", threads=2, runtime="auto")
        out[call] = None
    except PlanError as e:
        out[call] = str(e)
out["named"] = affinity.plan("OMP_PLACES=threads", threads=2, runtime="gnu").runtime
print(json.dumps(out))
"""


def test_auto_refuses_two_runtimes_of_different_rules_and_names_them():
    out = _run(TWO, str(iomp5_dir() / "libiomp5.so"))
    for call in ("plan", "apply"):
        assert out[call] is not None, call
        assert out[call].startswith(f"{call}(runtime='auto')")
        assert "torch/lib/libgomp.so.1 (gnu-torch)" in out[call] and "libiomp5.so (intel)" in out[call]
    assert out["named"] == "gnu"  # a name still plans
