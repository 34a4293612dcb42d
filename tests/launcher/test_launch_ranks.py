"""``affinity run --ranks`` under launchers, built without starting anything: what
each rank gets under ``--norespect`` and srun's ``map_ldom``/``mask_ldom``, the
messages when no rank or no share can be found, and the warning for ranks started
without ``--ranks`` (HPC audit F1, F3, F5, F6, F11, F12)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from affinity.errors import PlanError
from affinity.launcher.build import Context, build_launch
from affinity.launcher.options import RunOptions, options_from_args
from affinity.launcher.run import add_run_parser
from affinity.machine.topology import Topology
from affinity.planning.launchers import BINDING_VARIABLES, LAUNCHER_VARIABLES
from affinity.tools.ranks_report import plan_ranks

TWO = Topology.from_synthetic("pack:1 [numa] core:2 pu:1")  # the audit's node: CPUs 0-1, one NUMA node
NODES2 = Topology.from_synthetic("pack:2 [numa] core:2 pu:1")  # NUMA nodes 0 (CPUs 0-1) and 1 (CPUs 2-3)


def srun_env(rank: int, size: int, bind: str) -> dict[str, str]:
    """The variables srun writes into task ``rank`` of a one-node step of ``size``
    tasks with ``--cpu-bind=BIND`` (as on the tests' Slurm 22.05: the type with its
    colon, the list alone)."""
    kind, _, lst = bind.partition(":")
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_LOCALID": str(rank), "SLURM_NODEID": "0",
           "SLURM_STEP_TASKS_PER_NODE": str(size), "SLURM_TASKS_PER_NODE": str(size),
           "SLURM_CPU_BIND": f"quiet,{bind}", "SLURM_CPU_BIND_VERBOSE": "quiet",
           "SLURM_CPU_BIND_TYPE": f"{kind}:" if lst else kind, "SLURM_CPU_BIND_LIST": lst}
    return env


def launch(topology: Topology, environ: dict[str, str], cgroup: frozenset[int] | None = None, **kw):
    kw.setdefault("command", ("prog",))
    return build_launch(RunOptions(**kw), topology, Context(environ=environ, cgroup_cpus=cgroup))


# ------------------------------------------------ F1, F5: --norespect replaces the binding

@pytest.mark.parametrize("bind,masks", [
    ("mask_cpu:0x1,0x2", [{0}, {1}]),  # --cpu-bind=cores and Slurm's automatic binding arrive so
    ("map_cpu:1,0", [{1}, {0}]),
    ("mask_cpu:0x1,0x1", [{0}, {0}]),
])
def test_norespect_under_srun_cuts_the_cgroup_between_the_ranks(bind, masks):
    """Each task inherits srun's mask; --norespect starts from the cgroup's cpuset
    (0-1) and cuts it as with --cpu-bind=none: disjoint, and said truly (before: both
    ranks on 0-1, 'srun bound local rank 0 of 2 to cpus 0-1')."""
    got = []
    for r, mask in enumerate(masks):
        ln = launch(TWO.with_allowed(mask), srun_env(r, 2, bind), TWO.cpuset, ranks="auto", norespect=True)
        (inst,) = ln.instances
        got.append(inst.cpus)
        cpus = f"CPU {min(mask)}"
        (notice,) = ln.notices
        assert notice.startswith(f"--norespect: starting from the cgroup's cpuset 0-1 in place of the binding "
                                 f"Slurm srun gave local rank {r} of 2 ({cpus}, SLURM_CPU_BIND=quiet,{bind}): "
                                 f"rank {r} of 2 on this node"), notice
        assert "to cpus 0-1" not in notice
    assert got == [{0}, {1}]  # what srun --cpu-bind=none gives


@pytest.mark.parametrize("env", [
    {"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_orte_bound_at_launch": "1"},
    {"MPI_LOCALNRANKS": "2", "HYDRA_USER_PROVIDED_BINDING": "1"},
])
def test_norespect_under_mpi_says_which_binding_it_replaced(env):
    var = "OMPI_COMM_WORLD_LOCAL_RANK" if "OMPI_COMM_WORLD_LOCAL_SIZE" in env else "MPI_LOCALRANKID"
    for r in (0, 1):
        ln = launch(TWO.with_allowed({r}), {**env, var: str(r)}, TWO.cpuset, ranks="auto", norespect=True)
        assert ln.instances[0].cpus == {r}
        (notice,) = ln.notices
        assert "in place of the binding" in notice and f"gave local rank {r} of 2 (CPU {r}, " in notice, notice
        assert "bound local rank" not in notice  # it said 'bound local rank 0 of 2 to cpus 0-1'


def test_without_norespect_the_srun_binding_is_still_followed():
    ln = launch(TWO.with_allowed({1}), srun_env(0, 2, "map_cpu:1,0"), TWO.cpuset, ranks="auto")
    assert ln.instances[0].cpus == {1} and "planning inside that mask" in ln.notices[0]


# ------------------------------------------------ F3: srun's map_ldom / mask_ldom

@pytest.mark.parametrize("bind", ["map_ldom:0,0,1,1", "mask_ldom:0x1,0x1,0x2,0x2", "map_ldom:0x0,0,1,0x1",
                                  "mask_ldom:1,1,2,2", "map_ldom:2,2,3,3"])
def test_ranks_srun_put_on_one_numa_domain_cut_it(bind):
    """srun -n 4 --cpu-bind=map_ldom:0,0,1,1 on two NUMA nodes: tasks 0 and 1 get node 0's
    CPUs, tasks 2 and 3 node 1's; each pair cuts its node (domain ids modulo the nodes, as
    Slurm's task/affinity reads them; map ids decimal unless 0x, masks hex)."""
    domain = [{0, 1}, {0, 1}, {2, 3}, {2, 3}]
    got = []
    for r in range(4):
        ln = launch(NODES2.with_allowed(domain[r]), srun_env(r, 4, bind), NODES2.cpuset, ranks="auto")
        got.append(ln.instances[0].cpus)
        assert ln.instances[0].mem_nodes == {r // 2}
        assert f"as it bound local ranks {'0-1' if r < 2 else '2-3'}: this rank takes share {r % 2} of 2" \
            in ln.notices[0], ln.notices[0]
    assert got == [{0}, {1}, {2}, {3}]


def test_a_domain_mask_over_both_nodes_is_cut_four_ways():
    for r in range(4):
        ln = launch(NODES2, srun_env(r, 4, "mask_ldom:0x3"), NODES2.cpuset, ranks="auto")
        assert ln.instances[0].cpus == {r}


def test_plan_ranks_auto_previews_the_domains():
    plans, header = plan_ranks(NODES2, "auto", ctx=Context(environ=srun_env(0, 4, "map_ldom:1,1,0,0"),
                                                           cgroup_cpus=NODES2.cpuset))
    assert [p.instance.cpus for p in plans] == [{2}, {3}, {0}, {1}]
    # a job given one CPU of each node: each domain's CPUs within the job's cgroup
    plans, _ = plan_ranks(NODES2.with_allowed({1}), "auto", ctx=Context(environ=srun_env(0, 2, "map_ldom:0,1"),
                                                                         cgroup_cpus=frozenset({1, 3})))
    assert [p.instance.cpus for p in plans] == [{1}, {3}]


def test_two_ranks_on_a_one_cpu_domain_fail_rather_than_overlap():
    """The audit's emulation: both tasks on CPU 0 of a one-node machine with
    map_ldom:0,0. They used to plan both on CPU 0, silently; now they share it, cannot
    be cut, and the error says srun put both there."""
    with pytest.raises(PlanError) as e:
        launch(TWO.with_allowed({0}), srun_env(1, 2, "map_ldom:0,0"), TWO.cpuset, ranks="auto")
    msg = str(e.value)
    assert "cannot give 2 disjoint shares of cpus 0" in msg
    assert ("this process may use only CPU 0 of the cgroup's 0-1: Slurm srun bound it there "
            "(SLURM_CPU_BIND=quiet,map_ldom:0,0) and gave local ranks 0-1 that same mask") in msg


# ------------------------------------------------ F6: no rank, said truly, plan and run agree

BATCH = {"SLURM_JOB_ID": "9", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_TASKS_PER_NODE": "2"}


def test_a_batch_script_is_no_rank_and_plan_and_run_say_the_same():
    with pytest.raises(PlanError) as e:
        launch(TWO, BATCH, ranks="auto")
    msg = str(e.value)
    assert "no launcher variables found" not in msg
    said = ("Slurm job 9 (SLURM_TASKS_PER_NODE=2, SLURM_NODEID=0): 2 tasks on this node; this process is its "
            "batch script or allocation shell (SLURM_LOCALID=0 is set without SLURM_STEP_TASKS_PER_NODE), "
            "outside any step of srun: one process, not a rank")
    assert said in msg and "srun affinity run --ranks auto" in msg and "'affinity plan --ranks auto' here" in msg
    plans, header = plan_ranks(TWO, "auto", ctx=Context(environ=BATCH))
    assert header.startswith(said) and "'affinity run --ranks auto' refuses here" in header
    assert [p.instance.cpus for p in plans] == [{0}, {1}]


def test_a_rank_variable_without_its_size_is_named():
    with pytest.raises(PlanError, match="LOCAL_RANK=1 is set without LOCAL_WORLD_SIZE: torchrun sets both in every "
                                        "rank it starts.*set LOCAL_WORLD_SIZE as well, or give --ranks RANK/SIZE"):
        launch(TWO, {"LOCAL_RANK": "1"}, ranks="auto")
    with pytest.raises(PlanError, match="LOCAL_RANK=1 is set without LOCAL_WORLD_SIZE"):
        plan_ranks(TWO, "auto", ctx=Context(environ={"LOCAL_RANK": "1"}))
    with pytest.raises(PlanError, match="no launcher variables found"):
        launch(TWO, {}, ranks="auto")


# ------------------------------------------------ F11: ranks started without --ranks

def test_ranks_started_unbound_without_ranks_are_warned_once():
    for env in (srun_env(1, 2, "none"), {"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
                {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}):
        ln = launch(TWO, env, TWO.cpuset)
        said = [w for w in ln.warnings if "--ranks auto" in w]
        assert len(said) == 1, ln.warnings
        assert ("this process is local rank 1 of 2 on this node and, without --ranks, plans on all of cpus 0-1, "
                "which other ranks plan on too: --ranks auto gives each a disjoint share (this rank's: cpus 1)") in said[0]
        assert ln.instances[0].cpus == {0, 1}  # the warning changes nothing


@pytest.mark.parametrize("env,mask,kw", [
    ({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, {0, 1}, {}),  # torchrun's single worker
    (srun_env(0, 1, "none"), {0, 1}, {}),  # one task
    (srun_env(1, 2, "mask_cpu:0x1,0x2"), {1}, {}),  # srun gave each task its own CPU
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_orte_bound_at_launch": "1"},
     {1}, {}),  # Open MPI bound each rank to a core
    (srun_env(1, 2, "none"), {0, 1}, {"ranks": "auto"}),
    (srun_env(1, 2, "none"), {0, 1}, {"ranks": "1/2"}),
    ({}, {0, 1}, {}),
    ({"SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "2", "SLURM_JOB_ID": "3"}, {0, 1}, {}),  # a batch script
])
def test_no_warning_where_no_ranks_share_cpus(env, mask, kw):
    ln = launch(TWO.with_allowed(mask), env, TWO.cpuset, **kw)
    assert not [w for w in ln.warnings if "--ranks auto" in w], ln.warnings


def test_norespect_without_ranks_under_a_binding_is_warned():
    ln = launch(TWO.with_allowed({1}), srun_env(1, 2, "mask_cpu:0x1,0x2"), TWO.cpuset, norespect=True)
    assert any("local rank 1 of 2" in w for w in ln.warnings)


def test_more_ranks_than_cpus_without_ranks_are_told_so():
    (said,) = launch(TWO, srun_env(2, 3, "none"), TWO.cpuset).warnings
    assert said.endswith("plans on all of cpus 0-1, which other ranks plan on too: there are more ranks than "
                         "these CPUs can give disjoint shares to; start fewer per node"), said


def test_explicit_ranks_under_a_launchers_binding_point_to_auto():
    env = srun_env(0, 2, "mask_cpu:0x1,0x2")  # srun's automatic binding: CPU 0 for task 0
    with pytest.raises(PlanError) as e:
        launch(TWO.with_allowed({0}), env, TWO.cpuset, ranks="0/2")
    msg = str(e.value)
    assert ("this process may use only CPU 0 of the cgroup's 0-1: Slurm srun bound it there "
            "(SLURM_CPU_BIND=quiet,mask_cpu:0x1,0x2), and --ranks 0/2 cuts that mask as if it were the node: "
            "use --ranks auto") in msg
    assert "without a variable saying so" not in msg


def test_a_binding_nobody_announced_and_cpu_lists_that_read_as_lists():
    four = Topology.from_synthetic("pack:1 [numa] core:4 pu:1")
    with pytest.raises(PlanError) as e:
        launch(four.with_allowed({0, 3}), {"MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "3"}, four.cpuset,
               ranks="auto")
    assert "may use only CPUs 0,3 of the cgroup's 0-3, and no launcher variable says it was bound" in str(e.value)


def parse(*argv: str) -> RunOptions:
    parser = argparse.ArgumentParser(prog="affinity")
    add_run_parser(parser.add_subparsers(dest="command"))
    return options_from_args(parser.parse_args(["run", *argv]), {})


@pytest.mark.parametrize("words", [("--ranks", "-1/2"), ("--ranks=-1/2",)])
def test_a_negative_rank_is_a_usage_error_that_says_so(words, capsys):
    with pytest.raises(SystemExit) as e:
        parse(*words, "--", "true")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --ranks: the rank must be >= 0, got -1 in '-1/2'" in err and "expected one argument" not in err


def test_rank_values():
    assert parse("--ranks", "1/2", "--", "p").ranks == "1/2"
    with pytest.raises(SystemExit):
        parse("--ranks", "2/2", "--", "p")
    assert parse("-t", "2", "--", "p").threads == 2
