"""Ranks under a real Slurm (the one-node cluster of ``conftest.slurm``): srun and
sbatch jobs whose tasks run ``affinity run --ranks auto`` or
``affinity.apply(rank="auto")``, every task's thread masks read back from the
kernel inside the job."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from affinity.cpulist import format_list
from affinity.machine.topology import Topology
from affinity.binding.launchvars import local_rank
from affinity.planning.partition import partition

from helpers.launch import clean_env
from helpers.ranks_probe import check_disjoint_placed, local_rank_of, probe_command, read_reports, step_cpus

AFFINITY_RUN = (sys.executable, "-m", "affinity", "run")
NODE = Topology.from_system()
CPUS = NODE.allowed
pytestmark = pytest.mark.skipif(len(NODE.cores) < 2, reason="two ranks need two cores")


def srun(slurm, *args: str) -> object:
    r = slurm.client("srun", *args, env=clean_env())
    assert r.returncode == 0, f"srun {' '.join(args)}: rc={r.returncode}\n{r.stdout}\n{r.stderr}\n{slurm.logs()}"
    return r


def test_srun_ranks_auto_gives_each_task_a_disjoint_share_with_its_plan(slurm, omp_lib, tmp_path):
    out = tmp_path / "out"
    r = srun(slurm, "-n", "2", "--cpu-bind=none", *AFFINITY_RUN, "--ranks", "auto", "-v", "--",
             *probe_command(tmp_path, out, "plain", omp_lib))
    reports = read_reports(out, 2)
    shares = check_disjoint_placed(reports, CPUS)
    if slurm.cgroup:  # task/cgroup put the step in a cpuset of its own
        assert all("/job_" in rep.extra["cpuset_path"] and "/step_0" in rep.extra["cpuset_path"] for rep in reports)
    # srun bound nothing: the tasks cut the step's CPUs the way the pure partition says
    assert shares == [s.cpus for s in partition(NODE.with_allowed(step_cpus(reports, CPUS)), 2)]
    for rep in reports:
        i = local_rank_of(rep)
        assert rep.env["SLURM_CPU_BIND_TYPE"] == "none"
        assert (f"rank {i} of 2 on this node (Slurm srun (SLURM_LOCALID={i}, SLURM_STEP_TASKS_PER_NODE=2))"
                in r.stderr), r.stderr


def srun_mask(env: dict[str, str], local_id: int) -> frozenset[int]:
    """The CPUs srun's SLURM_CPU_BIND_LIST gives task ``local_id`` (read here on its own:
    hex masks for mask_cpu, CPU ids for map_cpu)."""
    item = env["SLURM_CPU_BIND_LIST"].split(",")[local_id]
    if env["SLURM_CPU_BIND_TYPE"].startswith("map_cpu"):
        return frozenset({int(item)})
    return frozenset(c for c in CPUS if int(item, 16) >> c & 1)


@pytest.mark.parametrize("bind", ["(Slurm's automatic binding)", "--cpu-bind=cores", "--cpu-bind=map_cpu:{rev}"])
def test_srun_binding_is_followed_never_fought_and_said(slurm, omp_lib, tmp_path, bind):
    out = tmp_path / "out"
    # map_cpu in reverse order: srun's placement differs from the partition affinity would make
    bind = bind.format(rev=",".join(str(min(c.cpuset)) for c in reversed(NODE.cores[:2])))
    r = srun(slurm, "-n", "2", *([bind] if bind.startswith("--") else []), *AFFINITY_RUN, "--ranks", "auto",
             "--", *probe_command(tmp_path, out, "plain", omp_lib))
    reports = read_reports(out, 2)
    shares = check_disjoint_placed(reports, CPUS)
    for rep, share in zip(sorted(reports, key=local_rank_of), shares):
        i = local_rank_of(rep)
        slurm_mask = srun_mask(rep.env, i)
        assert rep.env["SLURM_CPU_BIND_TYPE"] in ("mask_cpu:", "map_cpu:") and slurm_mask < CPUS  # srun bound
        assert share == slurm_mask  # ... and affinity planned inside exactly that
        said = (f"affinity run: Slurm srun bound local rank {i} of 2 to cpus {format_list(slurm_mask)} "
                f"(SLURM_CPU_BIND={rep.env['SLURM_CPU_BIND']}): planning inside that mask, not cutting the node "
                f"again")
        assert said in r.stderr, r.stderr
    if "map_cpu" in bind:
        assert shares == [s.cpus for s in reversed(partition(NODE.with_allowed(shares[0] | shares[1]), 2))]


@pytest.mark.parametrize("bind", ["--cpu-bind=cores", "--cpu-bind=map_cpu:{rev}"])
def test_srun_norespect_cuts_the_step_as_if_unbound(slurm, omp_lib, tmp_path, bind):
    """--norespect replaces srun's binding: the tasks cut the cgroup's cpuset as with
    --cpu-bind=none (they both planned on it, each 'bound by srun to' all of it: HPC
    audit F1), and each says which binding it replaced, with that binding's CPUs."""
    out = tmp_path / "out"
    bind = bind.format(rev=",".join(str(min(c.cpuset)) for c in reversed(NODE.cores[:2])))
    r = srun(slurm, "-n", "2", bind, *AFFINITY_RUN, "--ranks", "auto", "--norespect", "--",
             *probe_command(tmp_path, out, "plain", omp_lib))
    reports = read_reports(out, 2)
    shares = check_disjoint_placed(reports, CPUS)
    assert shares == [s.cpus for s in partition(NODE.with_allowed(step_cpus(reports, CPUS)), 2)]
    assert "bound local rank" not in r.stderr, r.stderr
    for rep in reports:
        i = local_rank_of(rep)
        mask = srun_mask(rep.env, i)
        assert (f"in place of the binding Slurm srun gave local rank {i} of 2 ({'CPU' if len(mask) == 1 else 'CPUs'} "
                f"{format_list(mask)}, SLURM_CPU_BIND={rep.env['SLURM_CPU_BIND']}): rank {i} of 2 on this node"
                in r.stderr), r.stderr


@pytest.mark.skipif(len(NODE.numa_nodes) != 1, reason="one NUMA domain: map_ldom:0,0 gives both tasks the node")
@pytest.mark.parametrize("bind", ["map_ldom:0,0", "mask_ldom:0x1,0x1"])
def test_srun_tasks_on_one_numa_domain_cut_it(slurm, omp_lib, tmp_path, bind):
    """srun's domain lists as srun writes them: both tasks on domain 0 (here the whole
    node), which they cut between them, saying so (HPC audit F3)."""
    out = tmp_path / "out"
    r = srun(slurm, "-n", "2", f"--cpu-bind={bind}", *AFFINITY_RUN, "--ranks", "auto", "--",
             *probe_command(tmp_path, out, "plain", omp_lib))
    reports = read_reports(out, 2)
    shares = check_disjoint_placed(reports, CPUS)
    assert {rep.env["SLURM_CPU_BIND_TYPE"] for rep in reports} == {bind.split(":")[0] + ":"}
    assert shares == [s.cpus for s in partition(NODE.with_allowed(step_cpus(reports, CPUS)), 2)]
    assert "as it bound local ranks 0-1: this rank takes share 1 of 2 of that mask" in r.stderr, r.stderr


def test_srun_tasks_without_ranks_are_warned(slurm):
    """srun --cpu-bind=none without --ranks: each task plans on the whole step, as asked,
    and is told once that --ranks auto gives it a share of its own (HPC audit F11)."""
    r = srun(slurm, "-n", "2", "--cpu-bind=none", *AFFINITY_RUN, "--", "true")
    for i in range(2):
        assert r.stderr.count(f"(SLURM_LOCALID={i}, SLURM_STEP_TASKS_PER_NODE=2): this process is local rank {i} "
                              f"of 2 on this node") == 1, r.stderr
    r = srun(slurm, "-n", "1", "--cpu-bind=none", *AFFINITY_RUN, "--", "true")
    assert "--ranks auto" not in r.stderr, r.stderr


@pytest.mark.skipif(len(NODE.packages) != 1, reason="one socket: srun gives both tasks the whole node")
@pytest.mark.parametrize("bind", ["sockets", "rank"])
def test_srun_binding_without_a_mask_of_its_own(slurm, omp_lib, tmp_path, bind):
    """--cpu-bind=sockets: srun lists the same mask for both tasks, which cut it between
    them; --cpu-bind=rank: srun lists no mask, each task's own is planned inside."""
    out = tmp_path / "out"
    r = srun(slurm, "-n", "2", f"--cpu-bind={bind}", *AFFINITY_RUN, "--ranks", "auto", "--",
             *probe_command(tmp_path, out, "plain", omp_lib))
    reports = read_reports(out, 2)
    shares = check_disjoint_placed(reports, CPUS)
    step = step_cpus(reports, CPUS)
    if bind == "sockets":
        assert all(srun_mask(rep.env, i) == step for rep in reports for i in (0, 1))  # one mask, twice
        assert shares == [s.cpus for s in partition(NODE.with_allowed(step), 2)]
        assert "as it bound local ranks 0-1: this rank takes share 1 of 2 of that mask" in r.stderr, r.stderr
    else:
        assert {rep.env["SLURM_CPU_BIND_TYPE"] for rep in reports} == {"rank"}
        assert "(SLURM_CPU_BIND=quiet,rank): planning inside that mask" in r.stderr, r.stderr


@pytest.mark.parametrize("bind", ["none", "map_cpu:{rev}"])
def test_apply_rank_auto_inside_srun_tasks(slurm, omp_lib, tmp_path, bind):
    out = tmp_path / "out"
    rev = [min(c.cpuset) for c in reversed(NODE.cores[:2])]
    srun(slurm, "-n", "2", f"--cpu-bind={bind.format(rev=','.join(map(str, rev)))}",
         *probe_command(tmp_path, out, "apply", omp_lib))
    reports = sorted(read_reports(out, 2), key=local_rank_of)
    plans = [frozenset().union(*map(frozenset, rep.extra["plan"])) for rep in reports]
    if bind == "none":  # the step's CPUs cut between the tasks
        assert plans == [s.cpus for s in partition(NODE.with_allowed(step_cpus(reports, CPUS)), 2)]
    else:  # srun's binding followed: task i plans on the CPU srun gave it
        assert plans == [frozenset({c}) for c in rev]
    for rep, plan in zip(reports, plans):
        # apply() pinned the threads it knows (main, OpenMP team) inside its share; none strays
        assert all(m <= plan for m in rep.threads.values()), (plan, rep.threads)
        assert rep.omp == rep.places[:len(rep.omp)] and frozenset().union(*rep.omp) <= plan


VARS = r"""
import json, os, sys
from affinity.binding.launchvars import slurm_step
s = slurm_step(os.environ)
json.dump({"step": [s.local_id, s.node_id, list(s.tasks_per_node), s.cpus_per_task, s.cpu_bind_type,
                    [sorted(m) for m in s.cpu_bind_list]],
           "mask": sorted(os.sched_getaffinity(0)),
           "raw": {k: v for k, v in os.environ.items() if k.startswith("SLURM_")}},
          open(os.path.join(sys.argv[1], f"task-{os.getpid()}.json"), "w"))
"""


def test_slurm_variables_read_as_srun_writes_them(slurm, tmp_path):
    (tmp_path / "vars.py").write_text(VARS)
    srun(slurm, "-n", "2", "-c", "1", "--cpu-bind=cores", sys.executable, str(tmp_path / "vars.py"), str(tmp_path))
    got = sorted((json.loads(f.read_text()) for f in tmp_path.glob("task-*.json")), key=lambda g: g["step"][0])
    assert [g["step"][0] for g in got] == [0, 1]
    for g in got:
        local_id, node_id, per_node, cpt, bind_type, bind_list = g["step"]
        assert (node_id, per_node, cpt, bind_type) == (0, [2], 1, "mask_cpu:"), g["raw"]
        assert g["raw"]["SLURM_STEP_TASKS_PER_NODE"] == "2" and g["raw"]["SLURM_CPUS_PER_TASK"] == "1"
        # the mask SLURM_CPU_BIND_LIST gives this task is the one the kernel says it has
        assert bind_list[local_id] == g["mask"], g["raw"]


def test_slurm_variables_of_a_step_across_nodes(slurm, tmp_path):
    """Partition ``multi``: the real node and emulated ones (helpers.slurm); 7 tasks on 4
    nodes, block distribution: srun writes SLURM_STEP_TASKS_PER_NODE=2(x3),1."""
    (tmp_path / "vars.py").write_text(VARS)
    r = slurm.client("srun", "-p", "multi", "-N", "4", "-n", "7", "--cpu-bind=none", sys.executable,
                     str(tmp_path / "vars.py"), str(tmp_path), env=clean_env())
    assert r.returncode == 0, r.stderr + slurm.logs()
    got = [json.loads(f.read_text()) for f in tmp_path.glob("task-*.json")]
    assert len(got) == 7
    assert {g["raw"]["SLURM_STEP_TASKS_PER_NODE"] for g in got} == {"2(x3),1"}
    per_node: dict[int, list[int]] = {}
    for g in got:
        local_id, node_id, per, _, _, _ = g["step"]
        assert per == [2, 2, 2, 1]
        per_node.setdefault(node_id, []).append(local_id)
        rank = local_rank(g["raw"])  # the rank and size --ranks auto takes: this node's
        assert (rank.rank, rank.size) == (local_id, per[node_id]) and rank.launcher == "Slurm srun"
    assert {n: sorted(ids) for n, ids in per_node.items()} == {0: [0, 1], 1: [0, 1], 2: [0, 1], 3: [0]}


JOB = """#!/bin/bash
#SBATCH --ntasks=2
#SBATCH --job-name=affinity-engines
set -e
srun --cpu-bind=none {run} --ranks auto -- {probe_none}
srun {run} --ranks auto -- {probe_bound}
"""


def test_sbatch_job_script_runs_both_steps(slurm, omp_lib, tmp_path):
    run = " ".join(AFFINITY_RUN)
    none, bound = tmp_path / "none", tmp_path / "bound"
    script = tmp_path / "job.sh"
    script.write_text(JOB.format(run=run, probe_none=" ".join(probe_command(tmp_path, none, "plain", omp_lib)),
                                 probe_bound=" ".join(probe_command(tmp_path, bound, "plain", omp_lib))))
    r = slurm.client("sbatch", "--wait", "-o", str(tmp_path / "job.out"), str(script), env=clean_env())
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert r.returncode == 0, f"{r.stdout}{r.stderr}\n--- job output\n{log}\n{slurm.logs()}"
    assert r.stdout.startswith("Submitted batch job")
    free = check_disjoint_placed(read_reports(none, 2), CPUS)
    assert free == [s.cpus for s in partition(NODE.with_allowed(step_cpus(read_reports(none, 2), CPUS)), 2)]
    bound_shares = check_disjoint_placed(read_reports(bound, 2), CPUS)
    assert all(len(s) < len(CPUS) for s in bound_shares)
    assert "planning inside that mask" in log  # the bound step said it followed srun
    for rep in read_reports(none, 2) + read_reports(bound, 2):
        assert rep.env["SLURM_JOB_NAME"] == "affinity-engines"


def test_the_cluster_is_this_machine(slurm):
    """What the fixture configured: Slurm's node is this machine, bound through cgroups
    where this container lets slurmd make them."""
    assert slurm.cpus == len(NODE.cpuset)
    conf = Path(slurm.env["SLURM_CONF"]).read_text()
    if slurm.cgroup:
        assert "TaskPlugin=task/affinity,task/cgroup" in conf and "ProctrackType=proctrack/cgroup" in conf
    else:
        assert "TaskPlugin=task/affinity\n" in conf and "ProctrackType=proctrack/linuxproc" in conf
