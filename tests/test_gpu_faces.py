"""The GPU decision through every face (issue #37): ``apply(gpu=...)`` for real on this
machine with GPUs described in a copy of ``/sys`` (the bind map's GPU line, the
publication another process reads, ``reapply()`` after something moved the calling
thread), and the same bad inputs refused by ``apply()``, ``affinity run`` and
``affinity plan``: one line naming the input, nothing half-applied."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import affinity
from affinity.binding import numa, publication
from affinity.binding.apply import active_bindings
from affinity.binding.bindmap import report
from affinity.binding.threads import get_process_affinity, task_starts
from affinity.errors import PlanError
from affinity.machine.topology import GPU_SYSFS_ROOT, Topology
from affinity.tools.cli import main

from helpers.gpu_tree import write_gpus
from helpers.launch import clean_env

NODE = Topology.from_system()
CPUS = NODE.allowed
SERVER = Path(__file__).resolve().parent / "data" / "gpu" / "server-2s8g"
BUS = ["0000:17:00.0", "0000:65:00.0"]
GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                 "ZE_AFFINITY_MASK", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE")
two_cores = pytest.mark.skipif(len(NODE.cores) < 2 or not NODE.numa_nodes, reason="two ranks need two cores")


@pytest.fixture
def gpus(tmp_path, monkeypatch):
    """Two NVIDIA GPUs on this machine's first NUMA node, seen by this process's topology
    (``Topology.from_system`` loaded again with ``AFFINITY_GPU_SYSFS_ROOT``, and again
    without it after the test)."""
    node = NODE.numa_nodes[0].os_index if NODE.numa_nodes else 0
    tree = write_gpus(tmp_path / "sysfs", [(BUS[0], node), (BUS[1], node)], NODE.cpuset)
    for name in GPU_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(GPU_SYSFS_ROOT, str(tree))
    Topology.from_system(refresh=True)
    try:
        yield tree
    finally:
        monkeypatch.delenv(GPU_SYSFS_ROOT)
        Topology.from_system(refresh=True)


def _state() -> tuple:
    """What apply() may change: the active bindings, every thread's mask, the environment,
    the calling thread's memory policy."""
    return list(active_bindings()), get_process_affinity(), dict(os.environ), numa.get_membind()


def _unchanged(before: tuple, after: tuple) -> None:
    assert after[0] == before[0] and after[2:] == before[2:]
    masks_before, masks_after = before[1], after[1]
    both = masks_before.keys() & masks_after.keys()  # (a thread of an earlier test may end meanwhile)
    assert {t: masks_after[t] for t in both} == {t: masks_before[t] for t in both}


# ------------------------------------------------------------------ apply(gpu=...) for real

@two_cores
def test_apply_next_to_the_gpu_published_moved_and_reapplied(gpus):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        b = affinity.apply(rank="1/2", gpu="auto", gpu_bind="exclusive", tensorflow=False, torch=False)
    try:
        core = NODE.cores[1].cpuset & CPUS  # local rank 1: GPU 1, the node's second core
        gpu = b.decision.placements[0].gpu
        assert (gpu.device.name, gpu.cpus) == (BUS[1], core)
        assert os.sched_getaffinity(0) == core and b.membind is not None
        text = report().text()
        assert f"affinity: pid {os.getpid()} rank 1: GPU {BUS[1]} (device 1), NUMA node" in text, text
        # published for another process: the GPU with it
        start = task_starts(os.getpid(), [os.getpid()])[os.getpid()]
        data = json.loads((Path(publication.folders()[0]) / f"{os.getpid()}-{start}.json").read_text())
        assert data["plans"][-1]["gpu"]["gpu"] == BUS[1] and data["plans"][-1]["gpu"]["ordinal"] == 1
        # something puts the node's CPUs back on the calling thread (NCCL 2.29's init does): said, then mended
        os.sched_setaffinity(0, CPUS)
        moved = report().text()
        assert "1 thread(s) moved since they were pinned" in moved and "MISMATCH" in moved, moved
        assert b.reapply() == [next(t for t, p in b.pins.items() if p.role == "main")]
        assert os.sched_getaffinity(0) == core and "MISMATCH" not in report().text()
    finally:
        b.restore()


# ------------------------------------------------------------------ bad input, every face

#: (environment, apply()'s words, affinity run's words, affinity plan's words, what the one line says)
BAD = [
    pytest.param({"CUDA_VISIBLE_DEVICES": "5"}, {"rank": "0/1", "gpu": "auto"}, ["--ranks", "0/1"], ["--ranks", "1"],
                 "CUDA_VISIBLE_DEVICES=5: no GPU 5 here (2 to choose from: 0000:17:00.0, 0000:65:00.0)",
                 id="a GPU that is not there"),
    pytest.param({}, {"gpu": "0000:99:00.0"}, ["--gpu", "0000:99:00.0"], None,
                 "gpu='0000:99:00.0' is none of the GPUs this process sees", id="gpu= that is not there"),
    pytest.param({"SLURM_STEP_GPUS": "0", "CUDA_VISIBLE_DEVICES": "1"}, {"rank": "0/1", "gpu": "auto"},
                 ["--ranks", "0/1"], ["--ranks", "1"],
                 "CUDA_VISIBLE_DEVICES=1 and SLURM_STEP_GPUS=0 contradict each other: CUDA_VISIBLE_DEVICES names "
                 "GPU 0000:65:00.0, outside the GPUs Slurm gave this step (0000:17:00.0)",
                 id="visibility variables that contradict each other"),
    pytest.param({}, {"rank": "0/3", "gpu": "auto"}, ["--ranks", "0/3"], ["--ranks", "3"],
                 "3 ranks on this node but 2 NVIDIA GPUs visible (every NVIDIA GPU of the machine): more ranks "
                 "than GPUs", id="more ranks than GPUs"),
]


@two_cores
@pytest.mark.parametrize("environ, apply_words, run_words, plan_words, said", BAD)
def test_bad_input_through_every_face(gpus, tmp_path, monkeypatch, capsys, environ, apply_words, run_words,
                                      plan_words, said):
    for k, v in environ.items():
        monkeypatch.setenv(k, v)
    # apply(): refused before anything is changed
    before = _state()
    with pytest.raises(PlanError) as e:
        affinity.apply(gpu_bind="node", tensorflow=False, torch=False, **apply_words)
    assert said in str(e.value) and "\n" not in str(e.value), str(e.value)
    _unchanged(before, _state())
    # affinity run: status 1, one line, the command not started
    started = tmp_path / "started"
    r = subprocess.run([sys.executable, "-m", "affinity", "run", "--gpu-bind", "node", *run_words, "--",
                        "touch", str(started)], capture_output=True, text=True, timeout=120,
                       env=clean_env(**{GPU_SYSFS_ROOT: str(gpus)}, **environ))
    assert r.returncode == 1 and not started.exists(), r.stderr
    assert r.stderr.strip().splitlines() == [f"affinity run: error: {r.stderr.strip().split('error: ', 1)[1]}"]
    assert said in r.stderr, r.stderr
    # affinity plan: status 1, one line
    if plan_words is not None:
        assert main(["plan", *plan_words, "--gpu-bind", "node"]) == 1
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, err


def test_a_gpu_whose_node_is_outside_the_allowed_cpus(tmp_path, capsys, monkeypatch):
    """The 8-GPU server, the rank's CPUs those of socket 0, its GPU on socket 1's node:
    ``affinity run`` (the decision it would perform, ``--dry-run``) with ``--physcpubind``,
    ``affinity plan`` with srun's binding in the environment.  (This 1-node machine
    cannot put a GPU's node outside the CPUs ``apply()`` may use.)"""
    for name in GPU_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    said = ("GPU 0000:9d:00.0 is on NUMA node 1, whose CPUs 6-11,18-23 are all outside the allowed CPUs "
            "0-1,12-13")
    started = tmp_path / "started"
    r = subprocess.run([sys.executable, "-m", "affinity", "run", "--dry-run", "--topology", f"fsroot:{SERVER}",
                        "--physcpubind", "0-1,12-13", "--gpu", "4", "--gpu-bind", "node", "--", "touch",
                        str(started)], capture_output=True, text=True, timeout=120, env=clean_env())
    assert r.returncode == 1 and not started.exists() and said in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    # srun bound each of 8 tasks to cores of socket 0 (mask_cpu): task 4's GPU is on socket 1
    srun = {"SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "8", "SLURM_CPU_BIND_TYPE": "mask_cpu:",
            "SLURM_CPU_BIND": "quiet,mask_cpu:" + ",".join(["0x3003"] * 8),
            "SLURM_CPU_BIND_LIST": ",".join(["0x3003"] * 8)}
    for k, v in srun.items():
        monkeypatch.setenv(k, v)
    assert main(["plan", "--ranks", "auto", "--gpu-bind", "node", "--topology", f"fsroot:{SERVER}"]) == 1
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err
