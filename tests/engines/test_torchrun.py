"""Ranks under a real torchrun (torch 2.13.0 CPU, gloo): ``affinity run --ranks auto``
as the entry and ``affinity.apply(rank="auto")`` inside the script, each rank
initialising ``torch.distributed`` and running an ``all_reduce``; and torchrun's own
``--numa-binding``, which needs a GPU: tried as it is, then run with the GPUs'
NUMA nodes given by hand, to compare where it puts the ranks with where affinity
does."""

from __future__ import annotations

import subprocess
import sys

import pytest

from affinity.machine.topology import Topology
from affinity.planning.ranks import partition

from helpers.launch import clean_env
from helpers.ranks_probe import check_disjoint_placed, local_rank_of, probe_command, read_reports


NODE = Topology.from_system()
CPUS = NODE.allowed
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
pytestmark = pytest.mark.skipif(len(NODE.cores) < 2, reason="two ranks need two cores")


def torchrun(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([*TORCHRUN, *args], capture_output=True, text=True, timeout=240, env=clean_env())
    assert r.returncode == 0, f"torchrun {' '.join(args)}: rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def check_torch_ranks(reports) -> None:
    for rep in reports:
        assert rep.extra["all_reduce"] == [3.0] * 4  # 1 + 2: both ranks took part
        assert rep.extra["world"] == [int(rep.env["RANK"]), 2]


def test_torchrun_with_affinity_run_as_the_entry(tmp_path):
    out = tmp_path / "out"
    r = torchrun("-m", "affinity", "run", "--ranks", "auto", "-v", "--", *probe_command(tmp_path, out, "torch", None))
    reports = sorted(read_reports(out, 2), key=local_rank_of)
    shares = check_disjoint_placed(reports, CPUS)
    assert shares == [s.cpus for s in partition(NODE, 2)]
    check_torch_ranks(reports)
    for i, (rep, share) in enumerate(zip(reports, partition(NODE, 2))):
        assert f"rank {i} of 2 on this node (torchrun (LOCAL_RANK={i}, LOCAL_WORLD_SIZE=2))" in r.stderr
        # torch's intra-op pool is sized from the share (affinity run's OMP_NUM_THREADS wins
        # over the 1 torchrun sets for every worker)
        assert rep.extra["torch_threads"] == len(share.cores) == int(rep.env["OMP_NUM_THREADS"])


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
        assert rep.extra["torch_threads"] <= len(share.cores)


NUMA_BINDING_BARE = r"""
from torch.numa.binding import AffinityMode, NumaOptions, _maybe_wrap_command_args_with_numa_binding
try:
    _maybe_wrap_command_args_with_numa_binding(("true",), gpu_index=0,
                                               numa_options=NumaOptions(affinity_mode=AffinityMode.NODE))
except Exception as e:
    print(type(e).__name__, e)
"""

# torchrun with torch's GPU lookups answered by hand: two GPUs, both on NUMA node 0
WITH_GPUS_ON_NODE_0 = r"""
import sys
import torch.numa.binding as b
b._get_gpu_count = lambda: 2
b._get_numa_node_index_for_gpu_index = lambda *, gpu_index: 0
from torch.distributed.run import main
main(sys.argv[1:])
"""


def test_torchrun_numa_binding_needs_a_gpu_and_overlaps_where_it_runs(tmp_path):
    # as it is: the binding asks CUDA where GPU 0 is, and the CPU build has no CUDA
    r = subprocess.run([sys.executable, "-c", NUMA_BINDING_BARE], capture_output=True, text=True, timeout=120)
    assert "Torch not compiled with CUDA enabled" in r.stdout, r.stdout + r.stderr
    # where it runs (the GPUs' nodes given): 'node' puts every rank on the whole node,
    # 'exclusive' splits the node's cores between its GPUs' ranks
    if len(NODE.numa_nodes) > 1:
        pytest.skip("the comparison below is for a one-node machine")
    launcher = tmp_path / "torchrun_gpus_on_node0.py"
    launcher.write_text(WITH_GPUS_ON_NODE_0)
    got = {}
    for mode in ("node", "exclusive"):
        out = tmp_path / mode
        argv = [sys.executable, str(launcher), "--standalone", "--nproc-per-node", "2", "--numa-binding", mode,
                *probe_command(tmp_path, out, "torch", None)[1:]]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=clean_env())
        assert r.returncode == 0, r.stderr
        reports = sorted(read_reports(out, 2), key=local_rank_of)
        check_torch_ranks(reports)
        got[mode] = [rep.cpus for rep in reports]
        for rep in reports:  # numactl --physcpubind: every thread on the rank's mask
            assert all(m == rep.cpus for m in rep.threads.values())
    assert got["node"] == [CPUS, CPUS]  # both ranks on every CPU: they overlap
    assert got["exclusive"] == [s.cpus for s in partition(NODE, 2)]  # on one node: affinity's shares
