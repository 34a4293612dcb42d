"""Overlapping bindings restored out of order, with real PyTorch and real DataLoaders
(issue 42, points 1, 2 and 8): what the PyTorch adapter changes -- torch's thread
count, the DataLoader iterator's ``__init__`` -- has the environment's ownership rule
(``affinity.binding.registry``: the newest active binding holding a piece puts it
back), so any order of restores leaves torch as the user had it.

One fresh process runs every case (torch starts once: ~3 s); each test reads its part.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from affinity.machine.topology import Topology
from affinity.planning.planner import plan
from affinity.planning.workers import worker_layout

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a process mask of at least 2 CPUs")

SCRIPT = r"""
import json, os, sys, threading, warnings
import torch, affinity
from affinity.binding import registry
from torch.utils.data import DataLoader

def mask(_):
    return sorted(os.sched_getaffinity(0))

def loader(**kw):
    try:
        return [x for x in DataLoader(range(4), batch_size=None, num_workers=2, **kw)]
    except Exception as e:
        return f"{type(e).__name__}: {str(e)}"

def plain():  # a DataLoader with no affinity in it: its workers must work and be left alone
    out = loader(collate_fn=mask)
    return out if isinstance(out, str) else "ok"

if __name__ == "__main__":
    warnings.simplefilter("ignore")
    out = {"n0": torch.get_num_threads(), "mask0": mask(0)}
    # point 2: b1, b2, b1.restore(), b2.restore() with torch loaded
    b1 = affinity.apply("compact", threads=1, tensorflow=False)
    b2 = affinity.apply("scatter", threads=2, tensorflow=False)
    out["inside"], out["b2_team"] = torch.get_num_threads(), b2.plan.threads
    b1.restore()
    out["b2_alone"] = torch.get_num_threads()
    b2.restore()
    out["threads_ooo"] = torch.get_num_threads()
    # point 1: the same with DataLoader layouts, then two threads overlapping
    b1 = affinity.apply("compact", threads=1, tensorflow=False, dataloader_workers=2)
    b2 = affinity.apply("compact", threads=1, tensorflow=False, dataloader_workers=2)
    out["b2_layout"] = [sorted(c) for c in b2.decision.placements[0].workers.cpusets]
    b1.restore()
    out["b2_alone_loader"] = loader(collate_fn=mask)
    b2.restore()
    out["active_ooo"] = len(registry.active())
    out["loader_ooo"] = plain()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    def block_a():
        with affinity.pinned("compact", threads=1, tensorflow=False, dataloader_workers=2):
            a_in.set(); b_in.wait()
        a_out.set()
    def block_b():
        a_in.wait()
        with affinity.pinned("compact", threads=1, tensorflow=False, dataloader_workers=2):
            b_in.set(); a_out.wait()
    ts = [threading.Thread(target=block_a), threading.Thread(target=block_b)]
    for t in ts: t.start()
    for t in ts: t.join()
    out["active_threads"] = len(registry.active())
    out["loader_threads"] = plain()
    out["threads_after_threads"] = torch.get_num_threads()
    # point 8: a spawned DataLoader after apply() (no dataloader_workers=), and forked, in one binding
    b = affinity.apply("compact", threads=1, tensorflow=False)
    out["spawned"] = loader(multiprocessing_context="spawn", worker_init_fn=affinity.torch.worker_init_fn,
                            collate_fn=mask)
    out["forked"] = loader(multiprocessing_context="fork", worker_init_fn=affinity.torch.worker_init_fn,
                           collate_fn=mask)
    b.restore()
    out["spawned_after"] = loader(multiprocessing_context="spawn", worker_init_fn=affinity.torch.worker_init_fn)
    out["threads_end"] = torch.get_num_threads()
    out["patched_end"] = hasattr(torch.utils.data.dataloader._MultiProcessingDataLoaderIter.__init__,
                                 "_affinity_patch")
    print(json.dumps(out))
"""

CLEAN = ("OMP_", "KMP_", "GOMP_", "TF_NUM_", "AFFINITY_", "MKL_")


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    script = tmp_path_factory.mktemp("overlap_torch") / "scenario.py"  # spawn needs a file to import
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEAN)}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_torch_thread_count_comes_back_whatever_the_order(outcome):
    """b1 = apply(threads=1); b2 = apply(threads=2); b1.restore(); b2.restore(): torch's
    count was 1 (b1's value, put back by b2 as its own "before"); the user's it must be."""
    # b2 is active and newest: its value (its team: torch's intra-op pool is the plan's team) stands
    # until it ends
    assert outcome["inside"] == outcome["b2_team"] == outcome["b2_alone"]
    assert outcome["threads_ooo"] == outcome["n0"]
    assert outcome["threads_after_threads"] == outcome["n0"] and outcome["threads_end"] == outcome["n0"]


def test_dataloader_patch_goes_whatever_the_order(outcome):
    """Two ``dataloader_workers=2`` bindings restored out of order (and two threads' blocks
    A in, B in, A out, B out): every later plain DataLoader raised in its workers
    ("no layout"), the patch being removed only when on top."""
    # b2 still places them, as it decided (inside b1, whose PyTorch main thread keeps b1's CPUs)
    want = outcome["b2_layout"]
    assert sorted(map(tuple, outcome["b2_alone_loader"])) == sorted(map(tuple, want * 2))
    assert outcome["active_ooo"] == 0 and outcome["loader_ooo"] == "ok"
    assert outcome["active_threads"] == 0 and outcome["loader_threads"] == "ok"
    assert outcome["patched_end"] is False


def test_spawned_dataloader_after_apply_is_placed(outcome):
    """``multiprocessing_context="spawn"`` with ``worker_init_fn=affinity.torch.worker_init_fn``
    after ``apply()`` raised "no layout" (a spawned worker has no binding); it gets the
    layout the fork gets.  After the restore there is no binding: "no layout" is right."""
    topo = Topology.from_system().with_allowed(frozenset(outcome["mask0"]))
    want = [sorted(s) for s in worker_layout(plan("compact", threads=1, topology=topo), 2).cpusets]
    assert sorted(map(tuple, outcome["spawned"])) == sorted(map(tuple, want * 2))
    assert sorted(map(tuple, outcome["forked"])) == sorted(map(tuple, want * 2))
    assert outcome["spawned_after"].startswith("PlanError") and "no layout" in outcome["spawned_after"]
