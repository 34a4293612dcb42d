"""One rule for apply() and affinity run when the caller and the environment disagree
(affinity.planning.precedence): what is asked explicitly wins, OMP_NUM_THREADS sizes
the team otherwise, every replaced value is said, and so is an oversubscribed team."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest

import affinity
from affinity.launcher.build import Context, build_launch
from affinity.launcher.options import options_from_args
from affinity.machine.topology import Topology
from affinity.planning import precedence
from affinity.planning.envvars import EXPORTED_VARIABLES

HPC = {"OMP_NUM_THREADS": "8", "KMP_AFFINITY": "scatter"}  # what HPC modules set
KW = {"tensorflow": False, "openmp": False}
two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a process mask of 2 CPUs")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for k in EXPORTED_VARIABLES:
        monkeypatch.delenv(k, raising=False)


def test_the_rule():
    assert precedence.team_size(2, HPC) == (2, [])
    assert precedence.team_size(None, HPC) == (8, [])
    assert precedence.team_size(None, {"OMP_NUM_THREADS": "4,2"}) == (4, [])
    assert precedence.team_size(None, {}) == (None, [])
    assert precedence.team_size(None, {"OMP_NUM_THREADS": "x"}) == (
        None, ["ignoring OMP_NUM_THREADS='x': not a positive thread count"])
    assert precedence.replaced({"OMP_NUM_THREADS": "2", "OMP_PLACES": "{0}", "KMP_BLOCKTIME": "1"},
                               {**HPC, "KMP_BLOCKTIME": "1"}) == [
        "OMP_NUM_THREADS=8 from the environment replaced by OMP_NUM_THREADS=2"]
    assert precedence.oversubscription(2, {0, 1}) == []
    assert precedence.oversubscription(8, {0, 1}, "OMP_NUM_THREADS") == [
        "OMP_NUM_THREADS=8 on 2 CPUs oversubscribes them (0-1): several threads share a CPU"]
    assert precedence.oversubscription(3, {0}, "the runtime's default team") == [
        "the runtime's default team of 3 threads on 1 CPU oversubscribes them (0): several threads share a CPU"]


def test_a_default_team_is_not_called_omp_num_threads(monkeypatch):
    """apply() with no threads= and no OMP_NUM_THREADS: the default team (one thread
    per core, as affinity run) oversubscribes a one-CPU proclist; the warning named
    OMP_NUM_THREADS, which the user never set."""
    import warnings

    import affinity

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cpus = sorted(os.sched_getaffinity(0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with affinity.pinned(f"explicit,proclist=[{cpus[0]}]", tensorflow=False, openmp=False, blas=False,
                             torch=False) as b:
            notes = list(b.notes)
    said = [n for n in notes if "oversubscribes" in n]
    assert (said == [] if len(cpus) == 1 else
            said[0].startswith(f"the default team of {len(cpus)} threads on 1 CPU"))


def _run_launch(spec: str, threads: int | None, environ: dict[str, str]):
    from affinity.launcher.options import run_parser
    import argparse

    parser = argparse.ArgumentParser()
    run_parser(parser.add_subparsers())
    words = ["run", *( [spec] if spec else []), *(["-t", str(threads)] if threads else []), "--", "true"]
    args = parser.parse_args(words)
    topo = Topology.from_system()
    return build_launch(options_from_args(args), topo.with_allowed(frozenset(os.sched_getaffinity(0))),
                        Context(environ))


@two_cpus
def test_apply_overrides_the_environment_and_says_so_as_affinity_run_does(monkeypatch):
    for k, v in HPC.items():
        monkeypatch.setenv(k, v)
    spec = "granularity=fine,compact,1,0"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with affinity.pinned(spec, threads=2, **KW) as b:
            assert os.environ["OMP_NUM_THREADS"] == "2"
            assert os.environ["KMP_AFFINITY"] == b.env_set["KMP_AFFINITY"] != "scatter"
            assert b.env_kept == {}
            notes = [n for n in b.notes if "from the environment" in n]
            exported = dict(b.env_set)
    assert os.environ["OMP_NUM_THREADS"] == "8" and os.environ["KMP_AFFINITY"] == "scatter"  # restored
    assert notes == [f"OMP_NUM_THREADS=8 from the environment replaced by OMP_NUM_THREADS=2",
                     f"KMP_AFFINITY=scatter from the environment replaced by KMP_AFFINITY={exported['KMP_AFFINITY']}"]
    assert [str(w.message) for w in caught if "from the environment" in str(w.message)] == [
        f"affinity: {n}" for n in notes]
    # affinity run, same inputs: the same exports and the same sentences
    launch = _run_launch(spec, 2, {**os.environ})
    inst = launch.instances[0]
    assert {k: inst.env[k] for k in ("OMP_NUM_THREADS", "KMP_AFFINITY")} == {
        k: exported[k] for k in ("OMP_NUM_THREADS", "KMP_AFFINITY")}
    assert [n for n in launch.warnings if "from the environment" in n] == notes  # said, not only with -v


@two_cpus
def test_omp_num_threads_sizes_the_team_and_an_oversubscribed_one_is_said(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    cpus = len(os.sched_getaffinity(0))
    with pytest.warns(affinity.AffinityWarning, match=f"OMP_NUM_THREADS=8 on {cpus} CPUs oversubscribes"):
        with affinity.pinned("compact", **KW) as b:
            assert b.plan.threads == 8
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KMP_", "GOMP_", "TF_NUM_"))}
    r = subprocess.run([sys.executable, "-m", "affinity", "run", "--dry-run", "--", "true"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (f"affinity run: warning: OMP_NUM_THREADS=8 on {cpus} CPUs oversubscribes them"
            in r.stderr), r.stderr


@two_cpus
def test_one_thread_with_spec_none_means_one_everywhere():
    with affinity.pinned("none", threads=1, **KW) as b:
        assert os.environ["TF_NUM_INTRAOP_THREADS"] == "1" and b.intra_op_threads == 1
    launch = _run_launch("none", 1, {})
    assert launch.instances[0].env["TF_NUM_INTRAOP_THREADS"] == "1"
    # the BLAS pool is limited to the one thread too
    script = ("import numpy, affinity, threadpoolctl\n"
              "with affinity.pinned('none', threads=1, tensorflow=False):\n"
              "    print([p['num_threads'] for p in threadpoolctl.threadpool_info() if p['user_api'] == 'blas'])\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "OPENBLAS_"))}
    env["OPENBLAS_NUM_THREADS"] = "2"
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[1]", r.stderr[-2000:]


TF_RUNNING = r"""
import json, os, warnings
import tensorflow as tf
x = tf.random.uniform((128, 128))
for _ in range(3):
    (x @ x).numpy()   # TensorFlow's default pools: one intra-op worker per CPU
import affinity
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    with affinity.pinned("compact", threads=1) as b:
        rows = b.report().to_dict()["threads"]
        print(json.dumps({"intra": list(b.tf_state.intra), "rows": rows, "slot": sorted(b.slots[0])}))
"""


@pytest.mark.tf
@two_cpus
def test_tensorflow_already_running_keeps_its_workers_and_each_is_pinned():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "TF_NUM_"))}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    r = subprocess.run([sys.executable, "-c", TF_RUNNING], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    cpus = len(os.sched_getaffinity(0))
    assert len(out["intra"]) == cpus  # the pool TensorFlow started with, not the plan's one thread
    rows = {r["tid"]: r for r in out["rows"]}
    for i, tid in enumerate(out["intra"]):
        assert rows[tid]["role"] == "tf-intra" and rows[tid]["index"] == i
        assert rows[tid]["actual"] == out["slot"]
