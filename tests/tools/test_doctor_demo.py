"""``affinity doctor`` on ``make demo``'s runs (its TensorFlow and PyTorch workloads,
``--hold`` keeping them running): pinned as the demo pins them, no finding, with the
roles the process published; started without affinity in a container whose CFS quota
is 1 CPU of this machine's 2 (a cgroup made here), the findings a user wants: pools
sized to the host's CPUs, more runnable threads than the quota runs.  (Without a
quota, on this 2-CPU machine, the defaults size the pools to the 2 CPUs and the doctor
rightly finds nothing: docs/doctor.md shows it.)  The demo's models are smaller here
(small_cnn for TensorFlow, a few batches): the same code path, in seconds."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence

import pytest

from helpers.doctorjob import clean_env, quota_cgroup

from affinity import doctor
from affinity.machine.topology import Topology
from affinity.tools.workload import recommend

INTERVAL = 0.5
#: batches of 64: the intra-op pool busy through the sample (with 16, one full-suite run in
#: four saw "8 threads, 1 runnable over 0.501 s" under the quota, and no oversubscription)
TF = [sys.executable, "-m", "affinity", "bench", "--json", "--model", "small_cnn", "--batch-size", "64",
      "--num-batches", "2", "--forward-only", "--hold"]
TORCH = [sys.executable, "-m", "affinity.tools.workload_torch", "--json", "--num-batches", "2", "--hold"]
SPEC, N = recommend(Topology.from_system())
PIN = ["--pin", SPEC, "--threads", str(N)]  # what the demo pins: one thread per core
MASK = len(os.sched_getaffinity(0))  #: the defaults' pools: one thread per CPU of the mask


@contextlib.contextmanager
def holding(cmd: Sequence[str], prefix: Sequence[str] = ()) -> Iterator[int]:
    """The workload running (after its timed batches), its PID; stopped after the block."""
    env = clean_env(TF_CPP_MIN_LOG_LEVEL="3")
    p = subprocess.Popen([*prefix, *cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    try:
        line = p.stdout.readline()
        assert line, p.stderr.read()[-3000:]
        yield json.loads(line)["holding"]
    finally:
        p.stdin.close()
        p.wait(timeout=120)
        p.stdout.close()
        p.stderr.close()


def _pinned(cmd: Sequence[str], roles: set[str]) -> None:
    with holding([*cmd, *PIN]) as pid:
        found = doctor(pid, interval=INTERVAL)
    assert found.findings == (), found.text()
    p = found.snapshot.processes[0]
    assert p.publication is not None and p.publication.plans[0].threads == int(PIN[-1])
    published = {t.role for t in p.threads if t.how == "published"}
    assert roles <= published, found.text()


def _defaults_in_a_quota(cmd: Sequence[str], pool: str) -> None:
    made = quota_cgroup(100000)  # 1 CPU's worth of time every period, on 2 CPUs
    if made is None:
        pytest.skip("needs a cgroup with a CFS quota (root and a writable cgroup hierarchy)")
    try:
        with holding(cmd, made[1]) as pid:
            found = doctor(pid, interval=INTERVAL)
    finally:
        made[0].rmdir()
    pools = [f for f in found.findings if f.kind == "host-sized-pool"]
    assert len(pools) == 1, found.text()
    assert any(e.startswith(pool) for e in pools[0].evidence), pools[0].text()
    assert f"CFS quota 1 CPU ({made[0]})" in pools[0].evidence[-1]
    assert pools[0].fix.startswith("affinity run --threads 1 -- ")
    over = [f for f in found.findings if f.kind == "oversubscribed"]
    assert over and dict(over[0].facts)["capacity"] == 1, found.text()


@pytest.mark.tf
def test_pinned_tensorflow_demo_run_has_no_finding():
    _pinned(TF, {"tf-intra", "tf-inter"})


@pytest.mark.tf
def test_tensorflow_defaults_under_a_quota_have_the_findings():
    _defaults_in_a_quota(TF, f"TensorFlow intra-op pool: {MASK} threads (TF_NUM_INTRAOP_THREADS unset")


@pytest.mark.torch
def test_pinned_pytorch_demo_run_has_no_finding():
    _pinned(TORCH, {"torch-intra"})


@pytest.mark.torch
def test_pytorch_defaults_under_a_quota_have_the_findings():
    _defaults_in_a_quota(TORCH, f"libgomp's OpenMP team (PyTorch intra-op): {MASK} threads (OMP_NUM_THREADS unset")
