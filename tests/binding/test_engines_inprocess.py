"""Real ONNX Runtime and OpenVINO (the project's ``engines`` extra) inside ``pinned()``.

Each case runs in a fresh process (the import order is real: the engine imported
before the binding or inside it), builds a small model there (no download:
:mod:`affinity.tools.workload_ort`), runs it, and reports every thread's mask as the
kernel has it.  The pool threads' masks must equal the plan's slots (ONNX Runtime)
or lie on the plan's CPUs (OpenVINO: it picks the CPU itself); the restore must put
every mask back and leave nothing behind (the wrapper gone, no import watch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a process mask of at least 2 CPUs"),
              pytest.mark.slow]

ORT_SCENARIO = r"""
import json, os, sys, warnings
import numpy as np
mode, order = sys.argv[1], sys.argv[2]
if order == "before":
    import onnxruntime
import affinity
from affinity.tools.workload_ort import mlp_model

def masks():
    return {int(t): sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}

start = masks()
model = mlp_model(128, 3)
x = np.ones((32, 128), np.float32)
out = {"start": {str(k): v for k, v in start.items()}}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with affinity.pinned("granularity=fine,compact", threads=len(os.sched_getaffinity(0))) as b:
        import onnxruntime as ort
        from onnxruntime.capi import onnxruntime_inference_collection as coll
        out["wrapped"] = hasattr(coll.InferenceSession.__init__, "__wrapped__")
        so = None
        if mode == "user-default":
            so = ort.SessionOptions()
        elif mode == "user-count":
            so = ort.SessionOptions()
            so.intra_op_num_threads = 3
        sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        for _ in range(5):
            sess.run(None, {"x": x})
        if so is not None:
            out["user_intra_after"] = so.intra_op_num_threads
            try:
                so.get_session_config_entry("session.intra_op_thread_affinities")
                out["user_affinity_after"] = True
            except RuntimeError:
                out["user_affinity_after"] = False
        rows = b.report().rows
        out["rows"] = [{"tid": r.tid, "role": r.role, "index": r.index,
                        "requested": sorted(r.requested) if r.requested is not None else None,
                        "actual": sorted(r.actual)} for r in rows]
        out["slots"] = [sorted(s) for s in b.slots]
        out["notes"] = list(b.notes)
    out["unwrapped"] = not hasattr(coll.InferenceSession.__init__, "__wrapped__")
    out["watches_after"] = sum(type(f).__name__ == "ImportWatch" for f in sys.meta_path)
    out["end"] = {str(k): v for k, v in masks().items()}
    out["process"] = sorted(os.sched_getaffinity(0))
print(json.dumps(out))
"""


def run_scenario(script: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ort_rows(out: dict) -> list[dict]:
    return [r for r in out["rows"] if r["role"] == "ort-intra"]


@pytest.mark.parametrize("order", ["before", "inside"])
def test_ort_session_threads_on_the_plans_slots_and_restored(order):
    out = run_scenario(ORT_SCENARIO, "ours", order)
    rows = _ort_rows(out)
    slots = out["slots"]
    assert out["wrapped"]
    assert len(rows) == len(slots) - 1  # the caller is member 0: ONNX Runtime starts n - 1 threads
    for r in rows:
        assert r["requested"] == slots[r["index"]] == r["actual"], r  # read back from the kernel
    assert out["unwrapped"] and out["watches_after"] == 0  # nothing left: wrapper and import watch gone
    for tid, mask in out["end"].items():  # threads from before: their masks; the session's: the process's
        assert mask == out["start"].get(tid, out["process"])


def test_ort_user_options_left_at_default_are_given_the_count_and_put_back():
    out = run_scenario(ORT_SCENARIO, "user-default", "before")
    rows = _ort_rows(out)
    assert len(rows) == len(out["slots"]) - 1
    assert all(r["actual"] == out["slots"][r["index"]] for r in rows)
    assert out["user_intra_after"] == 0 and out["user_affinity_after"] is False  # the user's object unchanged


def test_ort_user_count_kept_and_its_threads_pinned_despite_onnxruntime_12819():
    # a count set by the user: ONNX Runtime starts its threads unpinned (onnxruntime#12819); the
    # binding pins each by TID over the plan's slots and says the count differs from the plan's
    out = run_scenario(ORT_SCENARIO, "user-count", "before")
    rows = _ort_rows(out)
    slots = out["slots"]
    assert len(rows) == 2 and out["user_intra_after"] == 3
    assert all(r["actual"] == slots[r["index"] % len(slots)] for r in rows)
    assert any("keeps its own intra_op_num_threads=3" in n for n in out["notes"])


OV_SCENARIO = r"""
import json, os, sys, warnings
import numpy as np
order = sys.argv[1]
if order == "before":
    import openvino
import affinity

def masks():
    return {int(t): sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}

start = masks()
out = {"start": {str(k): v for k, v in start.items()}}
cpus = sorted(os.sched_getaffinity(0))
with warnings.catch_warnings(record=True):
    warnings.simplefilter("always")
    with affinity.pinned("granularity=fine,compact", threads=len(cpus) - 1) as b:
        import openvino as ov
        p = ov.opset13.parameter([32, 128], ov.Type.f32, name="x")
        w = ov.opset13.constant(np.full((128, 128), 0.01, np.float32))
        model = ov.Model([ov.opset13.relu(ov.opset13.matmul(p, w, False, False))], [p], "m")
        compiled = ov.Core().compile_model(model, "CPU")
        req = compiled.create_infer_request()
        for _ in range(10):
            req.infer({0: np.ones((32, 128), np.float32)})
        out["props"] = {k: str(compiled.get_property(k)) for k in
                        ("INFERENCE_NUM_THREADS", "NUM_STREAMS", "ENABLE_CPU_PINNING", "ENABLE_HYPER_THREADING")}
        out["union"] = sorted(b.union)
        out["notes"] = list(b.notes)
        out["main"] = sorted(os.sched_getaffinity(0))
        rows = b.report().rows
        out["rows"] = [{"tid": r.tid, "role": r.role, "actual": sorted(r.actual), "mismatch": r.mismatch}
                       for r in rows]
        out["all"] = {str(k): v for k, v in masks().items()}
    out["unwrapped"] = not hasattr(ov.Core.compile_model, "__wrapped__")
    out["watches_after"] = sum(type(f).__name__ == "ImportWatch" for f in sys.meta_path)
    out["end"] = {str(k): v for k, v in masks().items()}
    out["process"] = cpus
print(json.dumps(out))
"""


@pytest.mark.parametrize("order", ["before", "inside"])
def test_openvino_threads_on_the_plans_cpus_with_its_properties(order):
    out = run_scenario(OV_SCENARIO, order)
    n = len(out["union"])
    assert out["props"]["INFERENCE_NUM_THREADS"] == str(n) and out["props"]["NUM_STREAMS"] == "1"
    assert out["props"]["ENABLE_CPU_PINNING"] == "True"
    said = [x for x in out["notes"] if x.startswith("OpenVINO's default of ")]  # what the plan overrode
    assert len(said) == 1 and said[0].endswith(f"replaced by the plan's {n}")
    ov_rows = [r for r in out["rows"] if r["role"] == "ov"]
    assert ov_rows and not any(r["mismatch"] for r in ov_rows)
    assert all(set(r["actual"]) <= set(out["union"]) for r in ov_rows)  # on the plan's CPUs, read back
    assert out["main"] == out["process"]  # the compiling thread got its own mask back
    assert out["unwrapped"] and out["watches_after"] == 0
    for tid, mask in out["end"].items():
        assert mask == out["start"].get(tid, out["process"])
