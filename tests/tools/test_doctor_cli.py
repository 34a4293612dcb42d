"""``affinity doctor`` as a user runs it: two processes placed on the same CPU (two
serving instances pinned alike: vllm#43240) found with ``--json`` and exit status 1,
the same on disjoint CPUs clean with exit status 0 and one line; ranks of one job;
every process of this user; usage errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers.doctorjob import allowed_cpus, clean_env, job

from affinity.planning.doctor.values import cpus_text


def _doctor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "affinity", "doctor", *args], capture_output=True, text=True,
                          timeout=120)


def test_two_processes_on_the_same_cpu_overlap_json_and_exit_status_1():
    with job(["taskset", "-c", "0"], busy=1) as a, job(["taskset", "-c", "0"], busy=1) as b:
        r = _doctor(str(a["pid"]), str(b["pid"]), "--interval", "0.3", "--json")
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    overlap = [f for f in out["findings"] if f["kind"] == "overlap"]
    assert len(overlap) == 1 and out["errors"] >= 1
    f = overlap[0]
    assert f["severity"] == "error" and f["pids"] == [a["pid"], b["pid"]]
    assert f["summary"] == f"pids {a['pid']} and {b['pid']} (runnable threads) share CPUs {{0}}"
    assert f["evidence"][0] == f"pid {a['pid']} python: 1 runnable thread on {{0}} (mask {{0}})"
    assert f["facts"] == {"pids": [a["pid"], b["pid"]], "shared": "0"}
    # the same command twice: two instances, each on its own cores
    assert f["fix"].startswith("affinity run --instances 2 -- ") and f["fix"].endswith("(each copy on its own cores)")
    # the two busy threads on one CPU are one too many, too
    assert "oversubscribed" in [g["kind"] for g in out["findings"]]
    assert [p["pid"] for p in out["processes"]] == [a["pid"], b["pid"]]


@pytest.mark.skipif(not {0, 1} <= os.sched_getaffinity(0), reason="needs CPUs 0 and 1")
def test_the_same_on_disjoint_cpus_is_clean_in_one_line_and_exit_status_0():
    with job(["taskset", "-c", "0"], busy=1) as a, job(["taskset", "-c", "1"], busy=1) as b:
        r = _doctor(str(a["pid"]), str(b["pid"]), "--interval", "0.3")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    every = cpus_text(allowed_cpus())
    assert lines[0] == f"pid {a['pid']} python: 2 threads, 1 runnable, on {{0}} of {every}"
    assert lines[1] == f"pid {b['pid']} python: 2 threads, 1 runnable, on {{1}} of {every}"
    assert len(lines) == 3 and lines[2].startswith("no finding: checked 2 processes (4 threads, 2 runnable over ")


def test_ranks_of_one_job_sharing_a_cpu_overlap_even_idle():
    """Two Open MPI ranks, each bound to CPU 0 (a launcher's binding gone wrong), idle."""
    ranks = [clean_env(OMPI_COMM_WORLD_LOCAL_RANK=str(i), OMPI_COMM_WORLD_LOCAL_SIZE="2") for i in range(2)]
    with job(["taskset", "-c", "0"], env=ranks[0]) as a, job(["taskset", "-c", "0"], env=ranks[1]) as b:
        r = _doctor("--ranks", str(a["pid"]), "--interval", "0", "--json")
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert sorted(p["pid"] for p in out["processes"]) == sorted([a["pid"], b["pid"]])
    assert [(f["kind"], f["summary"]) for f in out["findings"]] == [
        ("overlap", f"pids {a['pid']} and {b['pid']} (ranks of one job) share CPUs {{0}}")]


def test_all_mine_reads_this_users_processes_but_itself():
    with job() as j:
        r = _doctor("--all-mine", "--interval", "0", "--json")
    assert r.returncode in (0, 1), r.stderr
    pids = {p["pid"] for p in json.loads(r.stdout)["processes"]}
    assert j["pid"] in pids and os.getpid() not in pids  # the shell (this test) it descends from is left out


@pytest.mark.parametrize("args, status, said", [
    ((), 2, "give the processes to check: PID ..., --ranks or --all-mine"),
    (("--all-mine", "1"), 2, "--all-mine takes no PID"),
    (("1", "--interval", "-1"), 2, "--interval -1: must be 0 or more seconds"),
    (("4194303",), 1, "report(pid=4194303): no process 4194303"),
])
def test_usage_errors(args, status, said):
    r = _doctor(*args)
    assert r.returncode == status and r.stdout == ""
    assert said in r.stderr
