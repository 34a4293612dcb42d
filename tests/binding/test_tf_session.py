"""The design card's TF1 use with real TensorFlow (issue #40, points 1 and 2):
``b = affinity.apply(...)``, ``import tensorflow`` (or the other way round), graph
mode, ``tf.compat.v1.Session(config=b.config_proto())`` -- flat, and inside an inner
``pinned()`` block.  Every thread's mask is read back from the kernel.

Before the fix, with apply() first, the session's intra-op pool (started by the
session: graph mode never starts the eager runtime) stayed on the whole mask as
``[other python]``, ``refresh()`` "pinned" it there and the bind map saw no mismatch;
after an inner block the session's threads went back to the process's mask and the
outer binding's ``refresh()`` left them there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.tf,
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a process mask of at least 2 CPUs"),
]

HELPER = Path(__file__).resolve().parents[1] / "helpers" / "tfsession.py"
CPUS = sorted(os.sched_getaffinity(0))
_cache: dict[tuple[str, str], dict] = {}


def scenario(order: str, nesting: str) -> dict:
    if (order, nesting) not in _cache:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "TF_NUM_", "GOMP_"))}
        r = subprocess.run([sys.executable, str(HELPER), order, nesting], capture_output=True, text=True,
                           timeout=300, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        _cache[order, nesting] = json.loads(r.stdout.strip().splitlines()[-1])
    return _cache[order, nesting]


def session_pools(out: dict, stage: str) -> tuple[list[str], list[str]]:
    """The TIDs of the session's intra-op pool (unnamed threads the session started,
    in creation order) and its tf_Compute workers, from the kernel's thread list."""
    before = set(out["before_session"])
    threads = out[stage]["threads"]
    new = sorted((t for t in threads if t not in before), key=int)
    intra = [t for t in new if threads[t][0] == "python"]
    inter = [t for t in new if threads[t][0] == "tf_Compute"]
    return intra, inter


def check_on_plan(st: dict, intra: list[str], inter: list[str]) -> None:
    """Intra-op worker i on the plan's slot i, inter-op workers on its union, as the
    binding's pins say and as the kernel reports."""
    slots = st["slots"]
    pools = [t for t in st["pins"] if st["pins"][t][0] == "tf-intra"]
    assert len(pools) == st["intra_op_threads"] == 2, st["pins"]
    for t in pools:
        role, cpus, i = st["pins"][t]
        assert st["threads"][t][1] == cpus == slots[i], (t, st["threads"][t], st["pins"][t])
    # the intra-op threads the session started, when it was the one that started them
    for i, t in enumerate(intra):
        assert st["pins"].get(t, [None])[0] == "tf-intra", (t, st["pins"].get(t))
        assert st["threads"][t][1] == slots[i], (t, st["threads"][t])
    for t in inter:
        assert st["threads"][t][1] == st["union"], t
    assert st["mismatches"] == []


@pytest.mark.parametrize("order", ["apply-import", "import-apply"])
def test_a_tf1_session_under_the_binding_has_its_pools_pinned(order):
    out = scenario(order, "flat")
    intra, inter = session_pools(out, "session")
    if order == "apply-import":  # graph mode: the session itself started the intra-op pool
        assert len(intra) == 2, out["session"]["threads"]
    check_on_plan(out["session"], intra, inter)
    assert out["session"]["slots"] == [[CPUS[1]], [CPUS[0]]]  # the outer plan, proclist=[1,0]
    assert out["refreshed_tids"] == [] and out["warnings"] == []


@pytest.mark.parametrize("order", ["apply-import", "import-apply"])
def test_leaving_an_inner_block_puts_the_session_threads_back_on_the_outer_plan(order):
    out = scenario(order, "nested")
    intra, inter = session_pools(out, "inner")
    inner = out["inner"]
    assert inner["slots"] == [[CPUS[0]], [CPUS[1]]]  # the inner plan, proclist=[0,1]
    check_on_plan(inner, intra, inter)
    for stage in ("after", "refreshed"):  # after the block, and after outer.refresh()
        check_on_plan(out[stage], intra, [])
        assert out[stage]["slots"] == [[CPUS[1]], [CPUS[0]]]
        # every thread the outer binding pinned is where it says, read from the kernel
        for t, (role, cpus, _) in out[stage]["pins"].items():
            if t in out[stage]["threads"]:
                assert out[stage]["threads"][t][1] == cpus, (stage, t, role)
    assert out["refreshed_tids"] == [] and out["warnings"] == []
