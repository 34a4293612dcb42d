"""A spec in Intel's words under libgomp's rules: the plan is exact (libgomp never
reads ``KMP_AFFINITY``, so nothing is bound), and now it says so, in the planner
(:func:`affinity.planning.planner.unread`), ``affinity plan``, ``affinity run`` and
``apply()`` -- a new user's ``apply("compact,1,0", runtime="auto")`` after
``import torch`` used to bind nothing without a word."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest

import affinity
from affinity import Topology
from affinity.planning.planner import unread

XEON = Topology.from_synthetic("pack:2 [numa] core:4 pu:2")


@pytest.mark.parametrize("runtime", ["gnu", "gnu-torch"])
def test_intel_words_under_libgomp_are_said_and_change_nothing(runtime):
    said = unread("granularity=fine,compact,1,0", runtime)
    assert said == [f"KMP_AFFINITY=granularity=fine,compact,1,0 is not read by the {runtime} runtime, which "
                    f"places threads by GOMP_CPU_AFFINITY, OMP_PLACES, OMP_PROC_BIND alone: it changes "
                    f"nothing in this plan"]
    with pytest.warns(affinity.AffinityWarning) as caught:  # affinity.plan() said nothing of it
        p = affinity.plan("granularity=fine,compact,1,0", threads=4, topology=XEON, runtime=runtime)
    assert [str(w.message) for w in caught] == ["affinity: " + said[0]]
    assert caught[0].filename == __file__  # the caller's line
    assert p.affinity_type == "disabled" and set(p.cpusets) == {XEON.cpuset} and p.warnings == ()
    mixed = unread("KMP_AFFINITY=scatter KMP_HW_SUBSET=1s OMP_PLACES=cores", runtime)
    assert [w.split(" ", 1)[0] for w in mixed] == ["KMP_AFFINITY=scatter", "KMP_HW_SUBSET=1s"]


@pytest.mark.parametrize("spec,runtime", [("compact", "intel"), ("OMP_PLACES=cores OMP_PROC_BIND=close", "gnu"),
                                          ("OMP_PLACES=cores", "intel"), (None, "gnu"), ("scatter", "llvm")])
def test_words_the_runtime_reads_say_nothing(spec, runtime):
    assert unread(spec, runtime) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        affinity.plan(spec, 2, XEON, runtime=runtime)


def test_affinity_plan_prints_it():
    r = subprocess.run([sys.executable, "-m", "affinity", "plan", "compact", "--runtime", "gnu",
                        "--topology", "synthetic:pack:2 [numa] core:4 pu:2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "warning: KMP_AFFINITY=compact is not read by the gnu runtime" in r.stdout


def test_affinity_plan_compare_and_json_say_it():
    """``--compare`` (what recipes.md recommends for "where will PyTorch's threads land?")
    and ``--json`` dropped it."""
    base = [sys.executable, "-m", "affinity", "plan", "scatter", "-t", "3", "--runtime", "gnu-torch",
            "--topology", "synthetic:pack:1 core:4 pu:1"]
    r = subprocess.run(base + ["--compare", "intel"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "warning (gnu-torch): KMP_AFFINITY=scatter is not read by the gnu-torch runtime" in r.stdout
    assert "warning (intel)" not in r.stdout
    r = subprocess.run(base + ["--compare", "intel", "--json"], capture_output=True, text=True)
    d = json.loads(r.stdout)
    assert [w.split(" ", 1)[0] for w in d["plan"]["unread"]] == ["KMP_AFFINITY=scatter"]
    assert d["compare"]["unread"] == []
    r = subprocess.run(base + ["--json"], capture_output=True, text=True)
    assert [w.split(" ", 1)[0] for w in json.loads(r.stdout)["unread"]] == ["KMP_AFFINITY=scatter"]


@pytest.mark.parametrize("spec", [None, "compact"])
def test_affinity_run_warns(spec):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "GOMP_"))}
    r = subprocess.run([sys.executable, "-m", "affinity", "run", *([spec] if spec else []), "--runtime", "gnu",
                        "--dry-run", "--", "true"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    want = "granularity=fine,compact,1,0" if spec is None else spec
    assert f"warning: planner: KMP_AFFINITY={want} is not read by the gnu runtime" in r.stderr
    assert ("(the default spec" in r.stderr) == (spec is None)


def test_apply_warns(monkeypatch):
    for k in [k for k in os.environ if k.startswith(("OMP_", "KMP_", "GOMP_"))]:
        monkeypatch.delenv(k)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with affinity.pinned("compact,1,0", runtime="gnu", tensorflow=False, torch=False) as b:
            notes = list(b.notes)
    assert any("KMP_AFFINITY=compact,1,0 is not read by the gnu runtime" in n for n in notes)
    assert any(issubclass(w.category, affinity.AffinityWarning) and "is not read by the gnu runtime"
               in str(w.message) for w in caught)
