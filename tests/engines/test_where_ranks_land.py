"""Where ranks land: ``affinity plan --ranks N|auto`` before anything runs (checked
against what the ranks then really get, under sbatch and srun), and ``affinity show
--ranks`` on the live ranks of a job (MPICH, srun), read from the kernel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from affinity.cpulist import format_list, parse_list
from affinity.launcher.build import Context
from affinity.machine.topology import Topology
from affinity.planning.partition import partition
from affinity.tools.cli import main
from affinity.tools.ranks_report import plan_ranks

from helpers.launch import clean_env
from helpers.ranks_probe import check_disjoint_placed, probe_command, read_reports

AFFINITY = (sys.executable, "-m", "affinity")
NODE = Topology.from_system()
CPUS = NODE.allowed
MPICH = shutil.which("mpirun.mpich")
XEON = "synthetic:pack:2 [numa] core:4 pu:2(indexes=2*8:1*2)"
two_cores = pytest.mark.skipif(len(NODE.cores) < 2, reason="two ranks need two cores")


def affinity(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*AFFINITY, *args], capture_output=True, text=True, timeout=120, env=env or clean_env())


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """The command line in this process (the pure commands: cheap), its status and output."""
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def test_plan_ranks_is_what_affinity_run_will_do(tmp_path, capsys, monkeypatch):
    for k in set(os.environ) - set(clean_env()):  # no launcher of the test run's own
        monkeypatch.delenv(k)
    status, out, err = cli(capsys, "plan", "granularity=fine,compact,1,0", "--ranks", "4", "--topology", XEON, "--json")
    assert status == 0, err
    got = json.loads(out)
    assert got["source"] == "--ranks 4" and [g["rank"] for g in got["ranks"]] == [0, 1, 2, 3]
    for g in got["ranks"]:
        _, run, _ = cli(capsys, "run", "granularity=fine,compact,1,0", "--ranks", f"{g['rank']}/4", "--dry-run",
                        "--json", "--topology", XEON, "--", "true")
        inst = json.loads(run)["instances"][0]
        assert (g["cpus"], g["threads"], g["slots"], g["mempolicy"], g["mem_nodes"]) == \
            (inst["cpus"], inst["threads"], inst["slots"], inst["mempolicy"], inst["mem_nodes"])
    assert [g["cpus"] for g in got["ranks"]] == [format_list(s.cpus) for s in
                                                  partition(Topology.load(XEON), 4)]
    text = affinity("plan", "--ranks", "4", "--topology", XEON).stdout  # the installed command, once
    assert text.splitlines()[0] == "4 local ranks on 2 packages x 4 cores x 2 PUs (16 PUs, 2 NUMA nodes) (--ranks 4):"
    assert text.splitlines()[2].split() == ["0", "0-1,8-9", "2", "2", "bind", "0", "{0}", "{1}"]
    # the picture: each PU carries the number of the rank whose share it is
    (tmp_path / "taken.svg").mkdir()  # passes the check when the command line is read, fails at the write
    status, _, err = cli(capsys, "plan", "--ranks", "4", "--topology", XEON, "--picture", str(tmp_path / "taken.svg"))
    assert status == 1 and "cannot write the picture" in err
    svg = tmp_path / "ranks.svg"
    assert cli(capsys, "plan", "--ranks", "4", "--topology", XEON, "--picture", str(svg))[0] == 0
    drawn = {int(el.get("data-os-index")): el.get("data-threads") for el in ET.parse(svg).iter()
             if el.get("data-os-index") and el.get("data-threads") is not None}
    assert drawn == {c: str(i) for i, s in enumerate(partition(Topology.load(XEON), 4)) for c in s.cpus}
    status, _, err = cli(capsys, "plan", "--ranks", "4", "--mask", "0-3", "--topology", XEON)
    assert status == 2 and "--ranks does not go with --mask" in err
    status, _, err = cli(capsys, "plan", "--ranks", "auto", "--topology", XEON)
    assert status == 1 and "neither launcher variables nor a Slurm allocation" in err


PLAN_THEN_RUN = """#!/bin/bash
#SBATCH --ntasks=2
set -e
{affinity} plan --ranks auto --json > {plan}
srun --cpu-bind=none {affinity} run --ranks auto -- {probe}
"""


@two_cores
def test_plan_ranks_auto_in_an_allocation_before_srun_runs(slurm, omp_lib, tmp_path):
    out = tmp_path / "out"
    script = tmp_path / "job.sh"
    script.write_text(PLAN_THEN_RUN.format(affinity=" ".join(AFFINITY), plan=tmp_path / "plan.json",
                                           probe=" ".join(probe_command(tmp_path, out, "plain", omp_lib))))
    r = slurm.client("sbatch", "--wait", "-o", str(tmp_path / "job.out"), str(script), env=clean_env())
    assert r.returncode == 0, (tmp_path / "job.out").read_text() + slurm.logs()
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["source"].startswith("Slurm job ") and "SLURM_TASKS_PER_NODE=2" in plan["source"]
    shares = check_disjoint_placed(read_reports(out, 2), CPUS)
    # the preview, printed in the batch script before srun started anything, is what the tasks got
    assert [parse_list(g["cpus"]) for g in plan["ranks"]] == shares
    assert [g["threads"] for g in plan["ranks"]] == [int(rep.env["OMP_NUM_THREADS"]) for rep in
                                                      sorted(read_reports(out, 2), key=lambda x: x.env["SLURM_LOCALID"])]


@two_cores
def test_plan_ranks_auto_inside_a_bound_srun_task_shows_srun_masks(slurm, tmp_path):
    rev = [min(c.cpuset) for c in reversed(NODE.cores[:2])]  # srun's placement, not the partition's
    r = slurm.client("srun", "-n", "2", f"--cpu-bind=map_cpu:{rev[0]},{rev[1]}", "-o", str(tmp_path / "plan-%t.json"),
                     *AFFINITY, "plan", "--ranks", "auto", "--json", env=clean_env())
    assert r.returncode == 0, r.stderr
    for task in (0, 1):  # each task previews every rank: srun lists every task's mask
        got = json.loads((tmp_path / f"plan-{task}.json").read_text())
        assert [g["cpus"] for g in got["ranks"]] == [str(c) for c in rev]
        assert all("planning inside that mask" in g["notices"][0] for g in got["ranks"])


WAITER = r"""
import os, sys, threading, time
d = sys.argv[1]
stop = threading.Event()
t = threading.Thread(target=stop.wait, name="worker")
t.start()
with open(os.path.join(d, f"ready-{os.getpid()}.tmp"), "w") as fh:
    fh.write(",".join(str(c) for c in sorted(os.sched_getaffinity(0))))
os.rename(os.path.join(d, f"ready-{os.getpid()}.tmp"), os.path.join(d, f"ready-{os.getpid()}"))
end = time.monotonic() + 120
while not os.path.exists(os.path.join(d, "go")) and time.monotonic() < end:
    time.sleep(0.02)
stop.set()
"""


def live_ranks(argv: list[str], tmp_path: Path, env: dict[str, str]):
    """Start a job whose 2 ranks wait; yield their PIDs once both are up; let them end."""
    (tmp_path / "waiter.py").write_text(WAITER)
    job = subprocess.Popen([*argv, sys.executable, str(tmp_path / "waiter.py"), str(tmp_path)], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        end = time.monotonic() + 120
        while len(list(tmp_path.glob("ready-*[0-9]"))) < 2:
            assert job.poll() is None, job.stdout.read()
            assert time.monotonic() < end, "the ranks did not come up"
            time.sleep(0.02)
        return job, {int(f.name.split("-")[1]): parse_list(f.read_text()) for f in tmp_path.glob("ready-*[0-9]")}
    except BaseException:
        job.kill()
        job.wait()
        raise


def end_job(job: subprocess.Popen, tmp_path: Path) -> None:
    (tmp_path / "go").touch()
    out, _ = job.communicate(timeout=120)
    assert job.returncode == 0, out


def check_show(got: dict, masks: dict[int, frozenset[int]]) -> None:
    (job, ranks), = [(j, r) for j, r in got.items() if {x["pid"] for x in r} == set(masks)]
    assert sorted(x["rank"] for x in ranks) == [0, 1]
    for x in ranks:
        assert len(x["threads"]) >= 2  # main and the worker thread, each read from the kernel
        assert all(set(t["actual"]) == masks[x["pid"]] for t in x["threads"])


@two_cores
@pytest.mark.skipif(MPICH is None, reason="no MPICH (make sysdeps installs mpich as root)")
def test_show_ranks_of_a_live_mpich_job(tmp_path):
    job, masks = live_ranks([MPICH, "-np", "2", *AFFINITY, "run", "--ranks", "auto", "--"], tmp_path, clean_env())
    try:
        # the job of one rank's PID (other jobs of this machine are none of this test's business)
        r = affinity("show", "--ranks", str(next(iter(masks))), "--json")
        text = affinity("show", "--ranks", str(next(iter(masks))), "--picture", str(tmp_path / "ranks.svg"))
    finally:
        end_job(job, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    check_show(json.loads(r.stdout), masks)
    assert text.returncode == 0 and "the ranks' CPUs are disjoint" in text.stdout, text.stdout + text.stderr
    assert text.stdout.startswith("MPICH/Intel MPI (Hydra) ranks of parent process ")
    assert "<svg" in (tmp_path / "ranks.svg").read_text()


@two_cores
@pytest.mark.skipif(MPICH is None, reason="no MPICH (make sysdeps installs mpich as root)")
def test_show_ranks_says_when_ranks_overlap(tmp_path):
    # MPICH binds nothing: without affinity both ranks have every CPU
    job, masks = live_ranks([MPICH, "-np", "2"], tmp_path, clean_env())
    try:
        r = affinity("show", "--ranks", str(next(iter(masks))))
    finally:
        end_job(job, tmp_path)
    assert r.returncode == 1
    assert "OVERLAP: ranks 0 (pid " in r.stdout and f"share cpus {format_list(CPUS)}" in r.stdout, r.stdout


@two_cores
def test_show_ranks_of_a_live_srun_step(slurm, tmp_path):
    env = {**clean_env(), **slurm.env}
    job, masks = live_ranks(["srun", "-n", "2", *AFFINITY, "run", "--ranks", "auto", "--"], tmp_path, env)
    try:
        r = affinity("show", "--ranks", str(next(iter(masks))), "--json")
    finally:
        end_job(job, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(r.stdout)
    check_show(got, masks)
    assert list(got)[0].startswith("Slurm srun SLURM_JOB_ID=")


def test_plan_ranks_auto_from_each_source():
    xeon = Topology.load(XEON)
    # a batch script on node 1 of a 2-node allocation of 4 tasks per node
    alloc = {"SLURM_JOB_ID": "7", "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_NODEID": "1",
             "SLURM_CPU_BIND": "quiet,none"}
    plans, header = plan_ranks(xeon, "auto", ctx=Context(alloc))
    assert [p.instance.cpus for p in plans] == [s.cpus for s in partition(xeon, 4)]
    assert header.startswith("Slurm job 7 (SLURM_TASKS_PER_NODE=4(x2), SLURM_NODEID=1)")
    # inside an Open MPI rank it bound to one core: only that rank can be known
    core = xeon.cores[5].cpuset
    ompi = {"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            "OMPI_MCA_orte_bound_at_launch": "1"}
    plans, header = plan_ranks(xeon.with_allowed(core), "auto", ctx=Context(ompi, cgroup_cpus=xeon.cpuset))
    assert [(p.rank, p.instance.cpus) for p in plans] == [(1, core)]
    assert header.endswith("Open MPI bound this rank and lists no other rank's mask: this rank only")
    # inside a torchrun worker: every worker's share
    plans, _ = plan_ranks(xeon, "auto", ctx=Context({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}))
    assert [p.instance.cpus for p in plans] == [s.cpus for s in partition(xeon, 2)]
