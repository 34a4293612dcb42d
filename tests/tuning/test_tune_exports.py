"""The tune result's environment block: only what the program's framework reads, never
``PYTHONPATH`` (``affinity run``'s PyTorch hook lives inside the package), no
``TF_NUM_*`` for a PyTorch program, and ``affinity=none`` said as no binding (the audit
saw ``PYTHONPATH=.../affinity/launcher/torchboot``, ``TF_NUM_*`` for a PyTorch program
and ``KMP_AFFINITY=...proclist=[{0,1},{0,1}]`` for ``affinity=none``)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

import affinity
from affinity.machine.topology import Topology
from affinity.tools.tune_cli import add_tune_parser
from affinity.tools.tune_command import _Setup
from affinity.tuning import forms

PACKAGE = os.path.dirname(os.path.abspath(affinity.__file__))
TWO = Topology.from_synthetic("pack:1 core:2 pu:1")
XEON = Topology.from_synthetic("pack:2 [numa] core:4 pu:2")
CONFIGS = [{"affinity": "none"}, {"affinity": "compact", "threads": 2}, {"affinity": "scatter", "torch_threads": 2,
           "interop": 2, "dataloader_workers": 1}, {"affinity": "compact", "intra": 2, "inter": 1, "blocktime": 0},
           {"threads": 4, "instances": 2}]


@pytest.mark.parametrize("topology", [TWO, XEON], ids=["2cpu", "xeon"])
@pytest.mark.parametrize("frameworks", [None, {"torch"}, {"tensorflow"}, {"torch", "tensorflow"}])
def test_no_form_overwrites_pythonpath_or_points_into_the_package(topology, frameworks):
    for cfg in CONFIGS:
        if int(cfg.get("instances", 1)) > len(topology.cores):
            continue
        exp = forms.exports(cfg, topology, frameworks)
        assert "PYTHONPATH" not in exp.env and "AFFINITY_TORCH_INTEROP_THREADS" not in exp.env, (cfg, exp.env)
        assert not any(PACKAGE in v for v in exp.env.values()), (cfg, exp.env)
        assert PACKAGE not in forms.export_lines(exp)
    assert "PYTHONPATH" not in forms.environment({"affinity": "compact"}, TWO)  # the library's own result too


def test_a_pytorch_program_gets_what_libgomp_reads_and_nothing_of_tensorflow():
    exp = forms.exports({"affinity": "compact", "threads": 2}, TWO, {"torch"})
    assert list(exp.env) == ["OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND", "GOMP_CPU_AFFINITY"]
    assert not any(k.startswith(("TF_", "KMP_")) for k in exp.env)
    # what the launcher's hook does and no variable can: said, not exported
    assert any("import torch" in n and "first place" in n for n in exp.notes)
    exp = forms.exports({"threads": 1, "interop": 2, "dataloader_workers": 3}, TWO, {"torch"})
    assert exp.env["AFFINITY_DATALOADER_WORKERS"] == "3"  # the program reads it (num_workers)
    assert any("torch.set_num_interop_threads(2)" in n for n in exp.notes)
    # torch's own parameters say it is PyTorch, whatever the files said
    assert not any(k.startswith("TF_") for k in forms.exports({"torch_threads": 2}, TWO).env)


def test_a_tensorflow_program_keeps_its_pools_and_both_openmp_families():
    env = forms.exports({"affinity": "compact", "intra": 2, "inter": 1}, TWO, {"tensorflow"}).env
    assert env["TF_NUM_INTRAOP_THREADS"] == "2" and env["TF_NUM_INTEROP_THREADS"] == "1"
    assert {"KMP_AFFINITY", "KMP_BLOCKTIME", "OMP_PLACES", "GOMP_CPU_AFFINITY"} <= set(env)


def test_an_unknown_program_gets_every_runtimes_variables_and_a_note_saying_so():
    exp = forms.exports({"affinity": "compact"}, TWO)
    assert {"KMP_AFFINITY", "OMP_PLACES", "TF_NUM_INTRAOP_THREADS"} <= set(exp.env)
    assert any("neither torch nor tensorflow" in n for n in exp.notes)
    assert forms.export_lines(exp).startswith("# the command's files import neither")


@pytest.mark.parametrize("frameworks,want", [
    (None, {"KMP_AFFINITY": "none", "OMP_PROC_BIND": "false"}),
    ({"torch"}, {"OMP_PROC_BIND": "false"}),
    ({"tensorflow"}, {"KMP_AFFINITY": "none", "OMP_PROC_BIND": "false"}),
])
def test_affinity_none_is_no_binding(frameworks, want):
    for topology in (TWO, XEON):
        env = forms.exports({"affinity": "none", "threads": 2}, topology, frameworks).env
        assert {k: env.get(k) for k in ("KMP_AFFINITY", "OMP_PLACES", "OMP_PROC_BIND", "GOMP_CPU_AFFINITY")} == \
            {"KMP_AFFINITY": None, "OMP_PLACES": None, "GOMP_CPU_AFFINITY": None, **want}
        assert env["OMP_NUM_THREADS"] == "2"
    env = forms.environment({"affinity": "none"}, TWO)  # the library's result: no proclist either
    assert "proclist" not in env["KMP_AFFINITY"] and "OMP_PLACES" not in env
    assert forms.exports({"affinity": "disabled"}, TWO).env["KMP_AFFINITY"] == "disabled"
    assert forms.exports({"affinity": "granularity=core,none"}, XEON).env["KMP_AFFINITY"] == "none"
    assert "proclist" in forms.exports({"affinity": "compact"}, TWO).env["KMP_AFFINITY"]  # a binding stays one


@pytest.mark.parametrize("texts,want", [
    (["import torch\n"], {"torch"}),
    (["import numpy as np, torch.nn as nn\n"], {"torch"}),
    (["x = 1; from tensorflow import keras"], {"tensorflow"}),
    (["def f():\n    import tensorflow as tf\n", "import torch"], {"tensorflow", "torch"}),
    (["# import torch\n", "import torchvision\n", "print('import torch')", "mytorch = 1"], set()),
])
def test_the_framework_is_read_from_the_imports(texts, want):
    assert forms.frameworks_in(texts) == want


def test_affinity_tune_prints_what_a_pytorch_program_reads(tmp_path):
    """The whole command on a PyTorch program (its file imports torch; the import is never
    run, so the test needs no torch): no ``inter`` in the default space, no
    ``TF_NUM_*``, no ``PYTHONPATH`` and, for ``affinity=none``, no binding."""
    script = tmp_path / "train.py"
    script.write_text("import os\nif os.environ.get('NEVER'):\n    import torch\nprint('1000 images/sec')\n")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "affinity", "tune", "--storage", "none", "--budget", "1", "--repeats",
                        "1", "--top", "1", "--json", "-q", "--param", "affinity=none", "--", sys.executable,
                        str(script)], capture_output=True, text=True, env=env, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["frameworks"] == ["torch"] and out["best"] == {"affinity": "none"}
    assert set(out["environment"]) == {"OMP_NUM_THREADS", "OMP_PROC_BIND"}
    assert out["environment"]["OMP_PROC_BIND"] == "false" and "PYTHONPATH" not in r.stdout
    parser = argparse.ArgumentParser()
    add_tune_parser(parser.add_subparsers())
    setup = _Setup.of(parser.parse_args(["tune", "--storage", "none", "--", sys.executable, str(script)]))
    assert "inter" not in setup.space.names and "threads" in setup.space.names
