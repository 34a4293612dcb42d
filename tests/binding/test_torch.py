"""Real PyTorch (2.13.0, CPU build, its bundled libgomp) on this machine.

Each case runs in a fresh process, so that the import order is real: torch imported
before ``apply()``/``pinned()``, or inside.  Every torch thread's mask is read back
from the kernel by TID; the pools' sizes are what torch itself reports; a thread and
a process started from the main thread get the plan's CPUs (never libgomp's one
place); restore puts every mask and the environment back exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import affinity
from affinity.cpulist import format_list, parse_list
from affinity.machine.topology import Topology
from affinity.planning.envvars import worker_slots
from affinity.planning.workers import worker_layout

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a process mask of at least 2 CPUs")

SCENARIO = r"""
import json, os, subprocess, sys, threading, warnings
order, spec, n, via = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if order == "before":
    import torch
import affinity

def masks():
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            out[t] = sorted(os.sched_getaffinity(int(t)))
        except OSError:
            pass
    return out

def names():
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as fh:
                out[t] = fh.read().strip()
        except OSError:
            pass
    return out

env0, masks0 = dict(os.environ), masks()
out = {"pid": os.getpid(), "start": masks0}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    if via == "apply":
        b = affinity.apply(spec, threads=n)
    else:
        ctx = affinity.pinned(spec, threads=n)
        b = ctx.__enter__()
    if order == "after":
        import torch
    x = torch.randn(300, 300)
    for _ in range(3):
        (x @ x).sum(); torch.nn.functional.conv2d(torch.randn(4, 3, 32, 32), torch.randn(8, 3, 3, 3))
    out["after_ops"] = masks()
    out["names"] = names()
    out["sizes"] = [torch.get_num_threads(), torch.get_num_interop_threads()]
    out["pins"] = {str(t): [p.role, sorted(p.cpus), p.index] for t, p in b.pins.items()}
    out["plan"] = [sorted(s) for s in b.plan.cpusets]
    rep = b.report().to_dict()
    out["mismatches"] = rep["mismatches"]
    out["runtimes"] = rep["openmp_runtimes"]["runtimes"]
    got = {}
    t = threading.Thread(target=lambda: got.update(m=sorted(os.sched_getaffinity(0))))
    t.start(); t.join()
    out["new_thread"] = got["m"]
    out["child_process"] = subprocess.run(["python3", "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                                          capture_output=True, text=True).stdout.strip()
    if via == "apply":
        b.restore()
    else:
        ctx.__exit__(None, None, None)
out["warnings"] = [str(w.message) for w in caught if w.category is affinity.AffinityWarning]
out["restored"] = masks()
out["env_same"] = dict(os.environ) == env0
print(json.dumps(out))
"""

CLEAN = ("OMP_", "KMP_", "GOMP_", "TF_NUM_", "AFFINITY_", "MKL_")


def run_scenario(*args: str, extra_env: dict[str, str] | None = None, script: str = SCENARIO) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEAN)}
    env.update(extra_env or {})
    r = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def expected(spec: str, threads: int):
    topo = Topology.from_system()
    return affinity.plan(spec, threads=threads, topology=topo.with_allowed(os.sched_getaffinity(0)))


SPECS = {"compact": "granularity=fine,compact,1,0", "scatter": "granularity=fine,scatter"}


@pytest.mark.parametrize("via", ["apply", "pinned"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("spec", sorted(SPECS))
@pytest.mark.parametrize("order", ["before", "after"])
def test_pools_sized_pinned_and_restored(order, spec, threads, via):
    out = run_scenario(order, SPECS[spec], str(threads), via)
    p = expected(SPECS[spec], threads)
    slots = [sorted(s) for s in worker_slots(p)]
    union = sorted(p.union)
    pid = str(out["pid"])
    assert out["plan"] == [sorted(s) for s in p.cpusets]
    # the pools' sizes from the plan, as torch reports them
    assert out["sizes"] == [p.intra_op_threads, p.inter_op_threads]
    intra = sorted((v[2], t) for t, v in out["pins"].items() if v[0] == "torch-intra")
    inter = sorted((v[2], t) for t, v in out["pins"].items() if v[0] == "torch-inter")
    assert [i for i, _ in intra] == list(range(p.intra_op_threads))
    assert [j for j, _ in inter] == list(range(p.inter_op_threads))
    # read back from the kernel per TID, after torch ran parallel ops on them
    masks = out["after_ops"]
    assert intra[0][1] == pid and masks[pid] == union  # member 0 = the main thread, on the plan's CPUs
    for i, tid in intra[1:]:
        assert masks[tid] == slots[i], (i, tid)
    for _, tid in inter:
        assert out["names"][tid] == "PTThreadPool" and masks[tid] == union
    # torch reused the pinned team: no thread started since apply() is outside the plan
    assert all(m == union or m in slots for t, m in masks.items() if t not in out["start"]), masks
    assert out["mismatches"] == []
    assert [r["bundled_by"] for r in out["runtimes"]] == ["torch"]
    # no one-CPU mask leaks: a thread and a process started from the main thread get the plan's CPUs
    assert out["new_thread"] == union and out["child_process"] == str(union)
    # restore: every thread that existed before back to its mask, the environment byte for byte
    for tid, m in out["start"].items():
        if tid in out["restored"]:
            assert out["restored"][tid] == m, tid
    assert out["env_same"]
    assert out["warnings"] == []


@pytest.mark.parametrize("variable,value", [("OMP_PROC_BIND", "close"), ("OMP_PLACES", "threads"),
                                            ("GOMP_CPU_AFFINITY", "0 1")])
@pytest.mark.parametrize("order", ["before", "after"])
def test_no_one_cpu_mask_leaks_with_libgomp_binding_set(order, variable, value):
    """The user's own binding variables make libgomp pin the main thread to one CPU as it
    loads: before apply() that is undone (and the plan sees every CPU), inside it is
    prevented; either way new threads and processes get the plan's CPUs."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    env = {variable: value if variable != "GOMP_CPU_AFFINITY" else f"{cpus[0]} {cpus[1]}"}
    out = run_scenario(order, SPECS["compact"], "2", "pinned", extra_env=env)
    union = sorted(expected(SPECS["compact"], 2).union)
    assert out["plan"] == [[c] for c in union]
    assert out["new_thread"] == union and out["child_process"] == str(union)
    main = out["pins"][str(out["pid"])]
    assert main[0] == "torch-intra" and main[1] == union
    if order == "before":  # libgomp narrowed the main thread at load; restore puts that back exactly
        assert out["start"][str(out["pid"])] == [cpus[0]]
    assert out["restored"][str(out["pid"])] == out["start"][str(out["pid"])]
    assert out["env_same"]


LATE_INTEROP = r"""
import json, warnings, torch, affinity
torch.set_num_interop_threads(3)
torch.jit.wait(torch.jit.fork(lambda x: x, torch.zeros(1)))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with affinity.pinned("compact", threads=1) as b:
        inter = sorted(t for t, p in b.pins.items() if p.role == "torch-inter")
        masks = [sorted(__import__("os").sched_getaffinity(t)) for t in inter]
        union = sorted(b.union)
print(json.dumps({"warnings": [str(w.message) for w in caught], "inter": len(inter), "masks": masks,
                  "union": union, "size": torch.get_num_interop_threads()}))
"""


def test_set_num_interop_threads_too_late_says_so_in_one_line_and_pins_what_exists():
    out = run_scenario(script=LATE_INTEROP)
    msgs = [w for w in out["warnings"] if "inter-op" in w]
    assert len(msgs) == 1 and "\n" not in msgs[0]
    assert msgs[0] == ("affinity: PyTorch's inter-op pool keeps 3 threads (set_num_interop_threads(1) refused: "
                       "parallel work already started, or it was set before); its existing threads were pinned")
    assert out["size"] == 3 and out["inter"] == 3 and out["masks"] == [out["union"]] * 3


DATALOADER = r"""
import json, os, sys
order = sys.argv[1]
if order == "before":
    import torch
import affinity

def describe(i):
    import torch
    rep = affinity.report().to_dict()
    me = [r for r in rep["threads"] if r["tid"] == os.getpid()][0]
    return json.dumps({"worker": torch.utils.data.get_worker_info().id, "pid": os.getpid(),
                       "mask": sorted(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads(),
                       "env": {k: v for k, v in os.environ.items() if k.startswith("AFFINITY_")},
                       "role": me["role"], "index": me["index"], "requested": me["requested"],
                       "mismatches": rep["mismatches"]})

manual = sys.argv[3] == "worker_init_fn"
with affinity.pinned("granularity=fine,compact,1,0", threads=int(sys.argv[2]),
                     dataloader_workers=None if manual else 2) as b:
    import torch
    from torch.utils.data import DataLoader
    extra = {"worker_init_fn": affinity.torch.worker_init_fn} if manual else {}
    got = [json.loads(x[0]) for x in DataLoader(list(range(4)), batch_size=1, num_workers=2,
                                              collate_fn=lambda xs: [describe(x) for x in xs], **extra)]
    layout = os.environ.get("AFFINITY_DATALOADER_CPUS")
print(json.dumps({"workers": got, "layout": layout, "left": "AFFINITY_DATALOADER_CPUS" in os.environ}))
"""


@pytest.mark.parametrize("order,threads,how", [("before", 1, "pinned"), ("before", 2, "pinned"),
                                               ("after", 1, "pinned"), ("after", 2, "pinned"),
                                               ("after", 2, "worker_init_fn")])
def test_dataloader_workers_each_on_their_own_cpus(order, threads, how):
    """Inside ``pinned(..., dataloader_workers=2)`` (automatic), or with
    ``worker_init_fn=affinity.torch.worker_init_fn`` inside a plain ``pinned()``."""
    out = run_scenario(order, str(threads), how, script=DATALOADER)
    layout = worker_layout(expected(SPECS["compact"], threads), 2)
    want = [sorted(s) for s in layout.cpusets]
    by_worker: dict[int, dict] = {}
    for w in out["workers"]:
        by_worker.setdefault(w["worker"], w)
        assert w == {**by_worker[w["worker"]]}  # one process per worker, the same answers
    assert sorted(by_worker) == [0, 1]
    for i, w in by_worker.items():
        assert w["mask"] == want[i] and w["requested"] == want[i]
        assert w["torch_threads"] == 1
        assert w["env"]["AFFINITY_WORKER_ID"] == str(i) and w["env"]["AFFINITY_DATALOADER_WORKERS"] == "2"
        assert parse_list(w["env"]["AFFINITY_WORKER_CPUS"]) == set(want[i])
        assert w["role"] == "dataloader-worker" and w["index"] == i and w["mismatches"] == []
    # two workers never share one CPU by inheritance: here they are on different CPUs
    assert by_worker[0]["mask"] != by_worker[1]["mask"]
    assert out["layout"] == (layout.to_env_value() if how == "pinned" else None) and not out["left"]


def test_the_readme_card_line_for_a_pytorch_user():
    """README: ``import affinity; affinity.apply("compact,1,0"); import torch`` pins torch's threads."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "import torch" in b)
    assert block.index('affinity.apply("compact,1,0")') < block.index("import torch")
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEAN)}
    r = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    p = expected("compact,1,0", None)
    rows = [line for line in r.stdout.splitlines() if "[torch-" in line]
    intra = [line for line in rows if "[torch-intra" in line]
    assert len(intra) == p.intra_op_threads and len(rows) == p.intra_op_threads + p.inter_op_threads
    slots = worker_slots(p)
    for i, s in enumerate(slots[1:], start=1):
        assert any(f"thread {i} [torch-intra python] bound to OS proc set {{{format_list(s)}}}" in line
                   for line in intra), (i, rows)
    assert "MISMATCH" not in r.stdout and "bundled by torch" in r.stdout


@pytest.mark.parametrize("blas", ["auto", "off"])
def test_the_users_thread_count_comes_back(blas):
    """pytorch.md, "Restored": ``torch.set_num_threads`` as the user left it.  The BLAS
    limiter records libgomp's count after the adapter has set the plan's, so the
    restore must undo it first (it used to put the plan's count back last: 2, not 1)."""
    script = """
import sys, json
import torch
import affinity
torch.set_num_threads(1)
with affinity.pinned("granularity=fine,scatter", threads=2, blas=(sys.argv[1] == "auto")):
    inside = torch.get_num_threads()
    torch.ones(64, 64) @ torch.ones(64, 64)
print(json.dumps({"inside": inside, "after": torch.get_num_threads()}))
"""
    assert run_scenario(blas, script=script) == {"inside": 2, "after": 1}


MORE_WORKERS = """
import os, json, sys, torch, affinity
from torch.utils.data import DataLoader, Dataset
class D(Dataset):
    def __len__(self): return 6
    def __getitem__(self, i):
        return torch.tensor([torch.utils.data.get_worker_info().id, *sorted(os.sched_getaffinity(0))])
if __name__ == "__main__":
    with affinity.pinned("compact", threads=1, dataloader_workers=1, tensorflow=False) as b:
        seen = {}
        for x in DataLoader(D(), batch_size=1, num_workers=2, multiprocessing_context=sys.argv[1]):
            row = x[0].tolist(); seen[row[0]] = row[1:]
    print(json.dumps({"workers": seen, "compute": sorted(b.plan.union)}))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a compute CPU and a worker CPU")
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_more_workers_than_planned_are_said(method, tmp_path):
    """pinned(..., dataloader_workers=1) and a DataLoader of 2 workers: the second used to
    share the first's CPUs without a word.  Forked, it is planned again from the binding
    (beside the compute thread: shared, said); spawned, it shares and says so."""
    script = tmp_path / "more.py"
    script.write_text(MORE_WORKERS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEAN)}
    r = subprocess.run([sys.executable, str(script), method], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    compute = out["compute"]
    assert out["workers"]["0"] != compute  # the planned worker: a CPU the compute thread does not use
    said = "DataLoader worker 1 of 2, where dataloader_workers=1 planned 1: "
    assert said in r.stderr
    if method == "fork":
        assert out["workers"]["1"] == compute and "planned again for 2" in r.stderr
    else:
        assert out["workers"]["1"] == out["workers"]["0"] and "it shares the CPUs of worker 0" in r.stderr


def test_workers_sharing_compute_cpus_are_a_note():
    """pytorch.md: a layout that shares compute CPUs is said so (it was only in affinity plan's output)."""
    script = """
import json, warnings, affinity
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with affinity.pinned("granularity=fine,compact", threads=THREADS, dataloader_workers=2,
                         tensorflow=False) as b:
        notes = list(b.notes)
print(json.dumps({"notes": notes, "warned": [str(w.message) for w in caught]}))
"""
    n = len(os.sched_getaffinity(0))  # a thread on every CPU: no CPU is free for the workers
    out = run_scenario(script=script.replace("THREADS", str(n)))
    shared = [x for x in out["notes"] if "fewer free CPUs than workers" in x]
    assert len(shared) == 1 and shared[0].startswith("2 DataLoader workers") and "shares compute slot" in shared[0]
    assert any("fewer free CPUs than workers" in w for w in out["warned"])
