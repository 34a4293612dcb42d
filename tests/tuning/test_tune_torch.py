"""The tuner speaks PyTorch: ``torch_threads``, ``interop`` and ``dataloader_workers``
are named parameters with the machine's meaning (seeds), checked choices, and a trial
that applies them reaches a real torch (its pool sizes read back in the trial)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from affinity.machine.topology import Topology
from affinity.tuning.config import Config
from affinity.tuning.priors import Priors
from affinity.tuning.space import KNOWN, Space, SpaceError

XEON = "package:2 [numa] core:28 pu:2"


def test_known_names_and_their_choices():
    assert {"torch_threads", "interop", "dataloader_workers"} <= set(KNOWN)
    Space.of({"torch_threads": [1, 2], "interop": [1, 2], "dataloader_workers": [0, 2, 4]})
    for bad in ({"torch_threads": [0]}, {"interop": [True]}, {"dataloader_workers": [-1]},
                {"dataloader_workers": ["2"]}):
        with pytest.raises(SpaceError):
            Space.of(bad)


def test_seeds_have_the_topologys_meaning():
    """torch_threads = the cores, interop = the packages, DataLoader workers on the SMT
    siblings the compute threads leave free (1 to 4)."""
    p = Priors(Space.of({"torch_threads": [14, 28, 56, 112], "interop": [1, 2, 4],
                         "dataloader_workers": [0, 1, 2, 4, 8]}), Topology.from_synthetic(XEON))
    assert p.seeds() == [{"torch_threads": 56, "interop": 2, "dataloader_workers": 4}]
    flat = Priors(Space.of({"dataloader_workers": [0, 1, 2]}), Topology.from_synthetic("package:1 core:8 pu:1"))
    assert flat.seeds() == [{"dataloader_workers": 1}]


def test_a_configuration_exports_what_torch_and_the_program_read():
    cfg = Config.of({"threads": 4, "torch_threads": 2, "interop": 1, "dataloader_workers": 3})
    assert cfg.team == 4
    assert cfg.env_overrides() == {"OMP_NUM_THREADS": "2", "AFFINITY_TORCH_INTEROP_THREADS": "1",
                                   "AFFINITY_DATALOADER_WORKERS": "3"}
    assert Config.of({"torch_threads": 2}).team == 2 and Config.of({"torch_threads": 2}).env_overrides() == {}


PROBE = ("import json, os, torch; print(json.dumps([torch.get_num_threads(), torch.get_num_interop_threads(), "
         "os.environ.get('AFFINITY_DATALOADER_WORKERS')]))")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a process mask of at least 2 CPUs")
def test_a_trial_reaches_torch():
    cfg = Config.of({"threads": 2, "torch_threads": 1, "interop": 2, "dataloader_workers": 2})
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "GOMP_", "AFFINITY_"))}
    words = cfg.run_options([sys.executable, "-c", PROBE]).to_words(environ)
    r = subprocess.run([sys.executable, "-m", "affinity", "run", *words], capture_output=True, text=True,
                       env=environ, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [1, 2, "2"]
