"""The TensorFlow workload on this machine: TensorFlow's defaults, pinned by the
recommended plan, and as two instances on disjoint cores (``affinity run
--instances 2``), each run in fresh processes.

Throughput (images/sec, higher is better) is in ``extra_info``; bench/report.py
puts the ratios in RESULTS.md.  The time pytest-benchmark records is the wall time
of a fixed amount of work (same model, batch size and number of batches per
instance), so it is comparable too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                reason="TensorFlow is not installed")

MODEL = os.environ.get("AFFINITY_BENCH_MODEL", "resnet50")
BATCH = os.environ.get("AFFINITY_BENCH_BATCH", "16")
BATCHES = os.environ.get("AFFINITY_BENCH_BATCHES", "10")


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "GOMP_", "TF_NUM_"))}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return env


def _workload(*extra):
    return [sys.executable, "-m", "affinity", "bench", "--json", "--model", MODEL, "--batch-size", BATCH,
            "--num-batches", BATCHES, "--forward-only", *extra]


def _results(stdout: str):
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def _recommended():
    from affinity.machine.topology import Topology
    from affinity.tools.workload import recommend

    return recommend(Topology.from_system())


@pytest.mark.benchmark(group="tf-workload")
@pytest.mark.parametrize("how", ["tf-defaults", "pinned", "2-instances"])
def test_tf_workload(benchmark, how, tmp_path):
    spec, n = _recommended()
    if how == "tf-defaults":
        cmd = _workload()
    elif how == "pinned":
        cmd = _workload("--pin", spec, "--threads", str(n))
    else:
        if n < 2:
            pytest.skip("needs at least 2 cores for 2 instances")
        cmd = [sys.executable, "-m", "affinity", "run", "--instances", "2", "--log-dir", str(tmp_path),
               "--", *_workload("--pin", spec)]
    out: dict = {}

    def go():
        r = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=1800)
        assert r.returncode == 0, r.stderr[-2000:]
        text = r.stdout
        if how == "2-instances":
            text = "\n".join((tmp_path / f).read_text() for f in sorted(os.listdir(tmp_path)))
        out["res"] = _results(text)

    benchmark.pedantic(go, rounds=1, iterations=1)
    res = out["res"]
    assert res, "the workload printed no result"
    benchmark.extra_info["images_per_sec"] = sum(r["images_per_sec"] for r in res)
    benchmark.extra_info["instances"] = len(res)
    benchmark.extra_info["intra_op_threads"] = [r["intra_op_threads"] for r in res]
    benchmark.extra_info["inter_op_threads"] = [r["inter_op_threads"] for r in res]
