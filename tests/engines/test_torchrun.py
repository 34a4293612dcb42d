"""Ranks under a real torchrun (torch 2.13.0 CPU, gloo): ``affinity run --ranks auto``
as the entry and ``affinity.apply(rank="auto")`` inside the script, each rank
initialising ``torch.distributed`` and running an ``all_reduce``; and torchrun's own
``--numa-binding``, which needs a GPU: tried as it is, then run with the GPUs'
NUMA nodes given by hand, to compare where it puts the ranks with where affinity
does."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from affinity.cpulist import format_list
from affinity.launcher.build import Context, build_launch
from affinity.machine.gpus import read_pci_gpus
from affinity.launcher.options import RunOptions
from affinity.machine.topology import Topology
from affinity.planning.gpus import gpu_binding
from affinity.planning.partition import partition
from affinity.record import replace

from helpers.launch import clean_env
from helpers.ranks_probe import local_rank_of, probe_command, read_reports

# torch is never imported here (tests/conftest.py keeps it out of the test process): the
# workers and the helper scripts import it

NODE = Topology.from_system()
CPUS = NODE.allowed
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
pytestmark = pytest.mark.skipif(len(NODE.cores) < 2, reason="two ranks need two cores")


def torchrun(*args: str, **env: str) -> subprocess.CompletedProcess:
    r = subprocess.run([*TORCHRUN, *args], capture_output=True, text=True, timeout=240, env=clean_env(**env))
    assert r.returncode == 0, f"torchrun {' '.join(args)}: rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def check_torch_ranks(reports) -> None:
    for rep in reports:
        assert rep.extra["all_reduce"] == [3.0] * 4  # 1 + 2: both ranks took part
        assert rep.extra["world"] == [int(rep.env["RANK"]), 2]


# affinity run --ranks auto as torchrun's entry: the recipe of docs/recipes.md,
# tests/engines/test_recipes.py::test_torchrun


def test_torchrun_with_apply_rank_auto_in_the_script(tmp_path):
    out = tmp_path / "out"
    torchrun(*probe_command(tmp_path, out, "apply+torch", None)[1:])  # torchrun runs the script with python
    reports = sorted(read_reports(out, 2), key=local_rank_of)
    check_torch_ranks(reports)
    plans = [frozenset().union(*map(frozenset, rep.extra["plan"])) for rep in reports]
    assert plans == [s.cpus for s in partition(NODE, 2)]
    for rep, plan, share in zip(reports, plans, partition(NODE, 2)):
        # every thread of the rank -- main, gloo's, torch's pool -- inside its share
        assert all(m <= plan for m in rep.threads.values()), (plan, rep.threads)
        # torch's intra-op pool sized from the share by apply() (affinity.binding.torch), not
        # from the OMP_NUM_THREADS=1 torchrun sets for every worker, which apply() says it set aside
        assert rep.env["OMP_NUM_THREADS"] == "1"
        assert any(n.startswith("OMP_NUM_THREADS=1 is what torchrun sets for every worker") for n in rep.extra["notes"])
        assert rep.extra["torch_threads"] == len(rep.extra["plan"]) == len(share.cores)


def test_a_torchrun_worker_is_sized_from_its_share_not_from_torchruns_default():
    """On a node larger than this one: what affinity run and apply() give a torchrun worker."""
    xeon = Topology.load("synthetic:pack:2 [numa] core:28 pu:2(indexes=2*56:1*2)")
    worker = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}  # as torchrun sets them
    ln = build_launch(RunOptions(command=("python",), ranks="auto"), xeon, Context(worker))
    assert ln.instances[0].threads == 28 and ln.instances[0].env["OMP_NUM_THREADS"] == "28"
    assert any("is what torchrun sets for every worker" in n for n in ln.notes)
    # a user's own value, an explicit count, a single worker: theirs
    for env, opts in (({**worker, "OMP_NUM_THREADS": "4"}, {}), (worker, {"threads": 1}),
                      ({**worker, "LOCAL_WORLD_SIZE": "1", "LOCAL_RANK": "0"}, {})):
        want = opts.get("threads") or int(env["OMP_NUM_THREADS"])
        assert build_launch(RunOptions(command=("python",), ranks="auto", **opts), xeon,
                            Context(env)).instances[0].threads == want


# torchrun, in one process (one torch import): first torch's own choice for GPU 0 as it is,
# then with torch's GPU lookups answered by hand (two GPUs, both on NUMA node 0) its choice
# in 'node' mode, printed; then torchrun itself, launched with that answer
WITH_GPUS_ON_NODE_0 = r"""
import json, sys
import torch
import torch.numa.binding as b
try:
    b._maybe_wrap_command_args_with_numa_binding(("true",), gpu_index=0,
                                                 numa_options=b.NumaOptions(affinity_mode=b.AffinityMode.NODE))
    bare = None
except Exception as e:
    bare = f"{type(e).__name__}: {e}"
b._get_gpu_count = lambda: 2
b._get_numa_node_index_for_gpu_index = lambda *, gpu_index: 0
node = [sorted(b._node_get_logical_cpus_to_bind_to(gpu_index=g)) for g in (0, 1)]
import os
path, os.environ["PATH"] = os.environ["PATH"], ""  # no numactl program on PATH
try:
    b._maybe_wrap_command_args_with_numa_binding(("true",), gpu_index=0,
                                                 numa_options=b.NumaOptions(affinity_mode=b.AffinityMode.NODE))
    no_numactl = None
except Exception as e:
    no_numactl = f"{type(e).__name__}: {e}"
os.environ["PATH"] = path
print("torch-numa:", json.dumps({"torch": torch.__version__, "bare": bare, "node": node, "no_numactl": no_numactl}),
      flush=True)
if len(sys.argv) > 1:
    from torch.distributed.run import main
    main(sys.argv[1:])
"""


def test_torchrun_numa_binding_needs_a_gpu_and_overlaps_where_it_runs(tmp_path):
    launcher = tmp_path / "torchrun_gpus_on_node0.py"
    launcher.write_text(WITH_GPUS_ON_NODE_0)
    one_node = len(NODE.numa_nodes) == 1  # the launch below compares on a one-node machine
    out = tmp_path / "exclusive"
    argv = [sys.executable, str(launcher)]
    if one_node:
        argv += ["--standalone", "--nproc-per-node", "2", "--numa-binding", "exclusive",
                 *probe_command(tmp_path, out, "torch", None)[1:]]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=clean_env())
    assert r.returncode == 0, r.stderr
    got = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("torch-numa: "))[12:])
    # as it is: the binding asks CUDA where GPU 0 is, and the CPU build (torch 2.13.0+cpu,
    # what make installs) has no CUDA
    assert got["torch"].endswith("+cpu"), got["torch"]
    assert got["bare"] == "AssertionError: Torch not compiled with CUDA enabled"
    # it binds through the numactl program: without one on PATH it fails (affinity binds by itself)
    assert got["no_numactl"] == "RuntimeError: numactl CLI is required for NUMA binding", got["no_numactl"]
    if not one_node:
        pytest.skip("the comparison below is for a one-node machine")
    # where it runs (the GPUs' node given): 'node' gives both ranks every CPU of the node
    assert [frozenset(n) for n in got["node"]] == [CPUS, CPUS]
    # ... and 'exclusive', really launched, splits the node's cores between the ranks
    reports = sorted(read_reports(out, 2), key=local_rank_of)
    check_torch_ranks(reports)
    for rep in reports:  # numactl --physcpubind: every thread on the rank's mask
        assert all(m == rep.cpus for m in rep.threads.values())
        # ... and nothing else: memory is left to the kernel's default policy (affinity binds it to
        # the GPU's node: test_gpu_recipes.py), the pool sized by the OMP_NUM_THREADS=1 torchrun sets
        assert rep.extra["mempolicy"] == ["default", []], rep.extra["mempolicy"]
        assert rep.env["OMP_NUM_THREADS"] == "1" and rep.extra["torch_threads"] == 1
    # on one node this is affinity's partition
    assert [rep.cpus for rep in reports] == [s.cpus for s in partition(NODE, 2)]


# each rank next to its GPU: GPUs described in a copy of /sys (this machine has none), the ranks
# bound for real by affinity run --ranks auto --gpu-bind, read back from the kernel (issue #37)

def _gpu_tree(root, cpus: str) -> None:
    """Two NVIDIA GPUs on NUMA node 0, local to ``cpus`` (what a one-node GPU server's sysfs says)."""
    for bus in ("0000:17:00.0", "0000:65:00.0"):
        d = root / "sys" / "bus" / "pci" / "devices" / bus
        d.mkdir(parents=True)
        for name, text in (("class", "0x030200"), ("vendor", "0x10de"), ("device", "0x2330"), ("numa_node", "0"),
                           ("local_cpulist", cpus)):
            (d / name).write_text(text + "\n")


@pytest.mark.parametrize("mode", ["node"])  # exclusive: docs/gpu.md's torchrun recipe (test_gpu_recipes.py)
def test_torchrun_ranks_next_to_their_gpus(tmp_path, mode):

    tree = tmp_path / "sysfs"
    _gpu_tree(tree, format_list(NODE.cpuset))
    out = tmp_path / "out"
    torchrun("-m", "affinity", "run", "--ranks", "auto", "--gpu-bind", mode, "--",
             *probe_command(tmp_path, out, "torch", None), AFFINITY_GPU_SYSFS_ROOT=str(tree))
    reports = sorted(read_reports(out, 2), key=local_rank_of)
    check_torch_ranks(reports)
    node = replace(NODE, gpus=read_pci_gpus(str(tree)))  # this machine's CPUs, the described GPUs
    for rep in reports:
        want = gpu_binding(node, mode, local_rank=local_rank_of(rep), local_size=2)
        assert rep.cpus == want.cpus  # the rank's process mask: torchrun --numa-binding's set for the mode
        assert all(m <= want.cpus for m in rep.threads.values()), rep.threads  # main, gloo's, torch's pools
        assert rep.extra["mempolicy"] == ["bind", sorted(want.mem_nodes)]  # memory on the GPU's node
        assert rep.extra["torch_threads"] == want.threads
