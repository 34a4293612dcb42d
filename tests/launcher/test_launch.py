"""``affinity run`` end to end: real child processes, their masks, memory policies
and environments read back from inside and from /proc/PID; several instances,
thread pinning of a C program, ranks under a real mpirun, cgroup limits,
a container that refuses memory policies (seccomp), usage errors."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from affinity.cpulist import format_list, parse_list
from affinity.machine.topology import Topology
from affinity.planning.partition import partition
from affinity.launcher.preload import pin_library

from helpers.ompprog import build_program
from helpers.launch import (affinity_run, clean_env, comm_of, environ_of, probe_result, status_of,
                            task_policy_of, wait_for, write_probe)
from helpers.cgroups import run_in
from helpers.pinprog import LINE, PROGRAM
from helpers import ROOT

CPUS = sorted(os.sched_getaffinity(0))
TWO = pytest.mark.skipif(len(CPUS) < 2, reason="needs a process mask of at least 2 CPUs")
NODE = 0


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> list[str]:
    return write_probe(tmp_path_factory.mktemp("probe"))


@pytest.fixture(scope="module")
def threads_program(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("threads")
    (d / "threads.c").write_text(PROGRAM)
    subprocess.run([shutil.which("gcc") or "cc", "-O1", "-pthread", str(d / "threads.c"), "-o",
                    str(d / "threads")], check=True)
    return str(d / "threads")


# ------------------------------------------------------------------ one process

@TWO
def test_exec_replaces_the_launcher_with_mask_policy_and_environment(probe):
    r = affinity_run("--", *probe)
    got = probe_result(r)
    assert got["cpus"] == set(CPUS)
    assert got["policy"] == "default"  # memory untouched unless asked
    env = got["env"]
    assert env["OMP_NUM_THREADS"] == str(len(CPUS)) == env["TF_NUM_INTRAOP_THREADS"]
    assert env["KMP_AFFINITY"] == f"granularity=fine,proclist=[{','.join(map(str, CPUS))}],explicit"
    assert env["OMP_PLACES"] == ",".join(f"{{{c}}}" for c in CPUS) and env["OMP_PROC_BIND"] == "close"
    assert env["GOMP_CPU_AFFINITY"] == " ".join(map(str, CPUS))
    assert env["KMP_BLOCKTIME"] and env["TF_NUM_INTEROP_THREADS"] == "1"
    assert r.stderr == ""


@TWO
def test_the_exec_d_process_read_from_outside(tmp_path):
    # `sleep` replaces the launcher (same PID): read its mask, policy, environment
    p = subprocess.Popen([sys.executable, "-m", "affinity", "run", "-C", str(CPUS[1]), "-m", str(NODE),
                          "--", "sleep", "60"], env=clean_env())
    try:
        wait_for(lambda: comm_of(p.pid) == "sleep", "the exec")
        st = status_of(p.pid)
        assert parse_list(st["Cpus_allowed_list"]) == {CPUS[1]}
        assert task_policy_of(p.pid) == f"bind:{NODE}"
        env = environ_of(p.pid)
        assert env["KMP_AFFINITY"] == f"granularity=fine,proclist=[{CPUS[1]}],explicit"
        assert env["OMP_NUM_THREADS"] == "1"
    finally:
        p.kill()
        p.wait()
    assert p.returncode == -signal.SIGKILL  # the status is the command's own


def test_exit_status_is_the_commands():
    assert affinity_run("--", "sh", "-c", "exit 42").returncode == 42


@TWO
def test_spec_threads_and_options_after_the_spec(probe):
    got = probe_result(affinity_run("granularity=fine,proclist=[1,0],explicit", "-t", "2", "--", *probe))
    assert got["env"]["KMP_AFFINITY"] == "granularity=fine,proclist=[1,0],explicit"
    assert got["env"]["OMP_PLACES"] == "{1},{0}"
    got = probe_result(affinity_run("compact", "-C", str(CPUS[1]), "--blocktime", "200", "--", *probe))
    assert got["cpus"] == {CPUS[1]} and got["env"]["KMP_BLOCKTIME"] == "200"
    # without a SPEC, placement variables of the environment are planned as the runtime reads them
    got = probe_result(affinity_run("--", *probe, env=clean_env(OMP_PLACES="{1},{0}", OMP_PROC_BIND="close",
                                                              OMP_NUM_THREADS="2")))
    assert got["env"]["OMP_PLACES"] == "{1},{0}" and got["env"]["OMP_NUM_THREADS"] == "2"
    # a user's KMP_BLOCKTIME is kept
    got = probe_result(affinity_run("--", *probe, env=clean_env(KMP_BLOCKTIME="30")))
    assert got["env"]["KMP_BLOCKTIME"] == "30"


def test_bad_spec_is_an_affinity_error_with_a_caret():
    r = affinity_run("granularity=fine,compactt", "--", "true")
    assert r.returncode == 1
    assert r.stderr.startswith("affinity run: error: ") and "^" in r.stderr


def test_usage_errors_exit_2_and_start_nothing(tmp_path):
    marker = tmp_path / "ran"
    for args in (["--", ], ["-m", "0", "touch", str(marker)], ["-m", "0", "-i", "0", "--", "touch", str(marker)],
                 ["--json", "--", "touch", str(marker)], ["-C", "0-", "--", "touch", str(marker)],
                 ["--instances", "0", "--", "touch", str(marker)], ["--show", "--", "true"]):
        r = affinity_run(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert "usage: affinity run [SPEC] [options] -- CMD [ARGS...]" in r.stderr
    assert not marker.exists()
    r = affinity_run("-m", "0", "touch", str(marker))
    assert "'touch' is a command, not a SPEC: put '--' before it" in r.stderr
    r = affinity_run("-m", "0", "compact", "touch", str(marker))  # after a SPEC
    assert "the command goes after '--'" in r.stderr


def test_command_not_found_or_not_executable(tmp_path):
    r = affinity_run("--", "no-such-command-xyz")
    assert r.returncode == 127 and "no-such-command-xyz: command not found" in r.stderr
    f = tmp_path / "data.txt"
    f.write_text("x")
    r = affinity_run("--", str(f))
    assert r.returncode == 126 and "not an executable file" in r.stderr


def test_affinity_errors_exit_1_naming_the_option_and_value():
    r = affinity_run("-C", "100-101", "--", "true")
    assert r.returncode == 1
    assert "--physcpubind 100-101: CPUs 100-101 do not exist on this machine" in r.stderr
    r = affinity_run("-m", "7", "--", "true")
    assert r.returncode == 1 and "--membind 7: no NUMA node 7 on this machine" in r.stderr
    r = affinity_run("--ranks", "auto", "--", "true")
    assert r.returncode == 1 and "no launcher variables found" in r.stderr


@TWO
def test_log_dir_for_one_instance(tmp_path, probe):
    r = affinity_run("--log-dir", str(tmp_path / "logs"), "--", *probe)
    assert r.returncode == 0 and r.stdout == ""
    out = json.loads((tmp_path / "logs" / "instance-0.log").read_text())
    assert parse_list(out["cpus"]) == set(CPUS)


# ------------------------------------------------------- restricted parent mask

@TWO
def test_a_restricted_parent_mask_is_respected(probe):
    pre = ("taskset", "-c", str(CPUS[1]))
    got = probe_result(affinity_run("--", *probe, pre=pre))
    assert got["cpus"] == {CPUS[1]}
    assert got["env"]["KMP_AFFINITY"] == f"granularity=fine,proclist=[{CPUS[1]}],explicit"
    assert got["env"]["OMP_NUM_THREADS"] == "1"
    # relative CPU numbers count inside the mask; CPUs outside it are refused
    assert probe_result(affinity_run("-C", "+0", "--", *probe, pre=pre))["cpus"] == {CPUS[1]}
    r = affinity_run("-C", str(CPUS[0]), "--", *probe, pre=pre)
    assert r.returncode == 1
    assert f"CPU {CPUS[0]} is not allowed to this process (allowed: {CPUS[1]})" in r.stderr
    # a node's CPUs: only those the mask allows (numactl would widen the mask here)
    assert probe_result(affinity_run("-N", str(NODE), "--", *probe, pre=pre))["cpus"] == {CPUS[1]}
    # two instances do not fit in one CPU: an error, nothing started
    r = affinity_run("--instances", "2", "--", *probe, pre=pre)
    assert r.returncode == 1 and "cannot give 2 disjoint shares" in r.stderr and r.stdout == ""
    # --norespect starts from the cgroup's CPUs instead
    got = probe_result(affinity_run("--norespect", "--", *probe, pre=pre))
    assert got["cpus"] >= {CPUS[0], CPUS[1]}


# ------------------------------------------------------------------ instances

@TWO
def test_two_instances_get_disjoint_cores_bound_memory_and_logs(tmp_path, probe):
    logs = tmp_path / "logs"
    r = affinity_run("--instances", "2", "--log-dir", str(logs), "--", *probe)
    assert r.returncode == 0, r.stderr
    outs = [json.loads((logs / f"instance-{i}.log").read_text()) for i in range(2)]
    masks = [parse_list(o["cpus"]) for o in outs]
    assert masks[0] and masks[1] and not masks[0] & masks[1]
    # the shares the planner cuts from this process's CPUs, exactly (whole cores, disjoint)
    shares = partition(Topology.from_system().with_allowed(CPUS), 2)
    assert masks == [s.cpus for s in shares] and masks[0] | masks[1] == set(CPUS)
    assert [o["policy"] for o in outs] == [f"bind:{NODE}"] * 2
    assert [o["env"]["AFFINITY_INSTANCE"] for o in outs] == ["0", "1"]
    assert all(o["env"]["AFFINITY_NUM_INSTANCES"] == "2" for o in outs)
    for o, m in zip(outs, masks):
        assert o["env"]["KMP_AFFINITY"] == f"granularity=fine,proclist=[{','.join(map(str, sorted(m)))}],explicit"
    assert outs[0]["pid"] != outs[1]["pid"]


@TWO
def test_instances_read_from_outside_while_they_run(tmp_path):
    stop = tmp_path / "stop"
    script = f'echo $$ > {tmp_path}/pid.$AFFINITY_INSTANCE; while [ ! -e {stop} ]; do sleep 0.02; done'
    p = subprocess.Popen([sys.executable, "-m", "affinity", "run", "--instances", "2", "--", "sh", "-c",
                          script], env=clean_env())
    try:
        wait_for(lambda: all((tmp_path / f"pid.{i}").exists() and (tmp_path / f"pid.{i}").read_text()
                             for i in range(2)), "both instances")
        pids = [int((tmp_path / f"pid.{i}").read_text()) for i in range(2)]
        masks = [parse_list(status_of(pid)["Cpus_allowed_list"]) for pid in pids]
        assert not masks[0] & masks[1]
        assert [task_policy_of(pid) for pid in pids] == [f"bind:{NODE}"] * 2
        assert [environ_of(pid)["AFFINITY_INSTANCE"] for pid in pids] == ["0", "1"]
        # the launcher itself is back to its own mask and policy once it has started both
        # (an instance may run before the launcher has put its own mask back: wait, no race)
        wait_for(lambda: parse_list(status_of(p.pid)["Cpus_allowed_list"]) == set(CPUS)
                 and task_policy_of(p.pid) == "default", "the launcher back on its own mask and policy")
    finally:
        stop.write_text("")
        p.wait(60)
    assert p.returncode == 0


@TWO
def test_exit_status_is_the_worst_instances():
    r = affinity_run("--instances", "2", "--", "sh", "-c", "exit $((AFFINITY_INSTANCE * 3 + 2))")
    assert r.returncode == 5
    r = affinity_run("--instances", "2", "--", "sh", "-c", 'if [ "$AFFINITY_INSTANCE" = 1 ]; then kill -9 $$; fi')
    assert r.returncode == 128 + 9


@TWO
def test_signals_are_forwarded_to_every_instance(tmp_path):
    script = f"touch {tmp_path}/started.$AFFINITY_INSTANCE; exec sleep 60"
    p = subprocess.Popen([sys.executable, "-m", "affinity", "run", "--instances", "2", "--", "sh", "-c",
                          script], env=clean_env())
    wait_for(lambda: all((tmp_path / f"started.{i}").exists() for i in range(2)), "both instances")
    p.send_signal(signal.SIGTERM)
    assert p.wait(60) == 128 + signal.SIGTERM


@TWO
def test_a_signal_while_the_instances_start_reaches_every_instance(tmp_path):
    """Instance 0 signals the launcher as soon as it runs, while the launcher may
    still be starting instance 1: the forwarding is already in place, so both
    instances end by SIGTERM and the launcher says so (it once died of the signal
    itself when it came before the handlers were set)."""
    script = (f'if [ "$AFFINITY_INSTANCE" = 0 ]; then kill -TERM $PPID; fi; '
              f'touch {tmp_path}/started.$AFFINITY_INSTANCE; exec sleep 60')
    p = subprocess.run([sys.executable, "-m", "affinity", "run", "--instances", "2", "--", "sh", "-c", script],
                       env=clean_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 128 + signal.SIGTERM, p.stderr


@TWO
def test_instances_do_not_outlive_a_killed_launcher(tmp_path):
    """SIGKILL cannot be forwarded: the kernel's parent-death signal ends the instances."""
    script = f"echo $$ > {tmp_path}/pid.$AFFINITY_INSTANCE; exec sleep 600"
    p = subprocess.Popen([sys.executable, "-m", "affinity", "run", "--instances", "2", "--", "sh", "-c",
                          script], env=clean_env())
    wait_for(lambda: all((tmp_path / f"pid.{i}").exists() and (tmp_path / f"pid.{i}").read_text()
                         for i in range(2)), "both instances")
    pids = [int((tmp_path / f"pid.{i}").read_text()) for i in range(2)]
    wait_for(lambda: all(comm_of(pid) == "sleep" for pid in pids), "both instances to exec sleep")
    p.kill()
    p.wait(60)

    def gone(pid: int) -> bool:  # exited, or a zombie waiting for init to reap it
        try:
            return status_of(pid).get("State", "").startswith("Z")
        except FileNotFoundError:
            return True

    try:
        wait_for(lambda: all(gone(pid) for pid in pids), "the instances to end after the launcher was killed",
                 limit=20)
    finally:
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


@TWO
def test_instances_dry_run_json_and_shell():
    r = affinity_run("--instances", "2", "--dry-run", "--json", "--", "prog", "--flag")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["mode"] == "spawn" and len(d["instances"]) == 2
    assert [i["argv"] for i in d["instances"]] == [["prog", "--flag"]] * 2
    assert not parse_list(d["instances"][0]["cpus"]) & parse_list(d["instances"][1]["cpus"])
    r = affinity_run("--instances", "2", "--log-dir", "L", "--dry-run", "--", "prog")
    lines = r.stdout.splitlines()
    assert lines[-1] == "wait" and all(line.endswith(" &") for line in lines[:2])
    assert lines[0].startswith(f"numactl --physcpubind={CPUS[0]} --membind={NODE} -- env ")
    assert "> L/instance-1.log 2>&1 &" in lines[1]


def test_dry_run_on_a_cpuinfo_file_takes_its_numa_nodes(tmp_path):
    """docs/index.md gives ``cpuinfo.txt --numa-nodes DIR`` as the way to describe a
    machine; ``affinity run --dry-run`` refused ``--numa-nodes``, so the preview of a
    cpuinfo file bound no memory."""
    (tmp_path / "x.cpuinfo").write_text("\n".join(f"processor\t: {p}\nphysical id\t: {p // 2}\ncore id\t\t: {p % 2}\n"
                                                 for p in range(4)))
    for n, cpus in enumerate(["0-1", "2-3"]):
        (tmp_path / "nodes" / f"node{n}").mkdir(parents=True)
        (tmp_path / "nodes" / f"node{n}" / "cpulist").write_text(cpus + "\n")
    r = affinity_run("--instances", "2", "--dry-run", "--topology", str(tmp_path / "x.cpuinfo"),
                     "--numa-nodes", str(tmp_path / "nodes"), "--", "prog")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("numactl --physcpubind=0-1 --membind=0 -- ")
    assert lines[1].startswith("numactl --physcpubind=2-3 --membind=1 -- ")
    for extra in (["--topology", "synthetic:pack:2 core:2 pu:1"], []):  # a source that says its own nodes
        r = affinity_run("--dry-run", *extra, "--numa-nodes", str(tmp_path / "nodes"), "--", "prog")
        assert r.returncode == 2 and r.stdout == "", r.stderr
        assert r.stderr.startswith(f"affinity run: error: --numa-nodes {tmp_path / 'nodes'}: goes with a cpuinfo "
                                   f"file as --topology, not with "), r.stderr


# --------------------------------------------------------------- pin-threads

@TWO
def test_pin_threads_pins_a_c_programs_pthreads_in_creation_order(threads_program):
    # slots 1, 0 (an explicit proclist): main -> {1}, then {0}, {1}, {0}, {1}
    r = affinity_run("granularity=fine,proclist=[1,0],explicit", "-t", "2", "--pin-threads", "--",
                     threads_program, "4")
    assert r.returncode == 0, r.stderr
    seen = {}
    for line in r.stdout.splitlines():
        m = LINE.match(line)
        seen[int(m.group(2))] = (int(m.group(3)), frozenset(map(int, m.group(4).split(","))))
    assert [sorted(seen[i][1]) for i in range(5)] == [[1], [0], [1], [0], [1]]
    assert r.stderr == ""


@TWO
def test_pin_threads_skip_mask_and_report(threads_program):
    r = affinity_run("-v", "--pin-threads", "--pin-skip", "0x2", "--", threads_program, "3")
    assert r.returncode == 0, r.stderr
    tids = {}
    for line in r.stdout.splitlines():
        m = LINE.match(line)
        tids[int(m.group(2))] = (int(m.group(3)), m.group(4))
    # main -> slot 0, thread 1 -> slot 1, thread 2 skipped (keeps main's), thread 3 -> slot 0
    assert [tids[i][1] for i in range(4)] == [str(CPUS[0]), str(CPUS[1]), str(CPUS[0]), str(CPUS[0])]
    assert f"tid {tids[1][0]} thread 1 bound to OS proc set {{{CPUS[1]}}}" in r.stderr
    assert f"tid {tids[2][0]} thread 2 skipped (AFFINITY_PIN_SKIP)" in r.stderr
    assert f"tid {tids[0][0]} thread 0 bound to OS proc set {{{CPUS[0]}}}" in r.stderr


@TWO
@pytest.mark.parametrize("runtime", ["libgomp", "libiomp5"])
def test_pin_threads_with_an_openmp_runtime_that_starts_after_the_pin(runtime, tmp_path):
    """The library pins the main thread to slot 0 when it loads; a runtime that starts
    later reads that slot as the process's mask.  Told to bind by KMP_AFFINITY's
    proclist, Intel's runtime then set every worker to it -- the whole team on one CPU
    (threads [0], [0]) -- and a libgomp loaded later dropped the other places with a
    warning; the runtimes are now told to bind nothing (KMP_AFFINITY=disabled,
    OMP_PROC_BIND=false, no place list), and the library's pins hold."""
    exe = build_program(runtime, tmp_path)
    r = affinity_run("-t", "2", "--pin-threads", "--", str(exe))
    assert r.returncode == 0, r.stderr
    rows = sorted(line.split() for line in r.stdout.splitlines())
    assert [row[1] for row in rows] == [str(c) for c in CPUS[:2]], r.stdout
    assert "Number of places" not in r.stderr and "OMP: Warning" not in r.stderr
    dry = affinity_run("-t", "2", "--pin-threads", "--dry-run", "--", str(exe)).stdout
    assert "KMP_AFFINITY=disabled" in dry and "OMP_PROC_BIND=false" in dry and "OMP_PLACES" not in dry


def test_pin_threads_environment(probe):
    got = probe_result(affinity_run("--pin-threads", "--", *probe, env=clean_env(LD_PRELOAD="/x/other.so")))
    assert got["env"]["LD_PRELOAD"] == f"{pin_library()}:/x/other.so"
    assert got["env"]["AFFINITY_PIN_SLOTS"] == ";".join(str(c) for c in CPUS)
    assert got["env"]["AFFINITY_PIN_SKIP"] == "0x0" and got["env"]["AFFINITY_PIN_MAIN"] == "1"
    # the library pinned the probe's own main thread (a Python program) to the first slot
    assert got["cpus"] == {CPUS[0]}
    got = probe_result(affinity_run("--pin-threads", "--no-pin-main", "--", *probe))
    assert got["env"]["AFFINITY_PIN_MAIN"] == "0"
    assert got["cpus"] == set(CPUS)  # left alone: the process mask


# ---------------------------------------------------------------------- ranks

MPIRUN = shutil.which("mpirun.mpich") or shutil.which("mpirun")  # Open MPI binds by default: tests/engines


@TWO
@pytest.mark.skipif(MPIRUN is None, reason="no MPI launcher (make sysdeps installs MPICH as root)")
def test_ranks_auto_under_a_real_mpirun(probe, tmp_path):
    env = clean_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    # each rank writes its own file: mpirun merges the ranks' stdout, and lines can interleave
    per_rank = 'exec "$@" > "$0.${PMI_RANK:-$OMPI_COMM_WORLD_RANK}"'
    r = subprocess.run([MPIRUN, "-np", "2", sys.executable, "-m", "affinity", "run", "--ranks", "auto",
                        "-v", "--", "sh", "-c", per_rank, str(tmp_path / "out"), *probe],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    outs = sorted((json.loads((tmp_path / f"out.{i}").read_text()) for i in range(2)), key=lambda o: o["cpus"])
    masks = [parse_list(o["cpus"]) for o in outs]
    assert len(masks) == 2 and not masks[0] & masks[1]
    assert [o["policy"] for o in outs] == [f"bind:{NODE}"] * 2
    assert all(o["env"]["OMP_NUM_THREADS"] == "1" for o in outs)
    # disjoint masks already show that each rank found its own; -v says where from (mpirun
    # merges the ranks' stderr in chunks, so only one message is required to be whole)
    assert re.search(r"rank [01] of 2 on this node", r.stderr), r.stderr
    assert "MPICH" in r.stderr or "Open MPI" in r.stderr


@TWO
def test_explicit_ranks(probe):
    got = [probe_result(affinity_run("--ranks", f"{i}/2", "--", *probe)) for i in range(2)]
    assert got[0]["cpus"] == {CPUS[0]} and got[1]["cpus"] == {CPUS[1]}
    assert [g["policy"] for g in got] == [f"bind:{NODE}"] * 2


# ------------------------------------------------------------ cgroup limits

@pytest.mark.parametrize("scratch_cgroup", ["cpu"], indirect=True)
def test_cfs_quota_shapes_the_default_thread_count(scratch_cgroup, probe):
    (scratch_cgroup / "cpu.cfs_period_us").write_text("100000")
    (scratch_cgroup / "cpu.cfs_quota_us").write_text("50000")
    r = run_in(scratch_cgroup, sys.executable, "-m", "affinity", "run", "-v", "--", *probe)
    got = probe_result(r)
    assert got["env"]["OMP_NUM_THREADS"] == "1" and got["env"]["TF_NUM_INTRAOP_THREADS"] == "1"
    assert got["cpus"] == set(CPUS)  # the mask is not narrowed, only the thread count
    assert "CFS quota 0.5 CPUs" in r.stderr
    # an explicit count wins
    r = run_in(scratch_cgroup, sys.executable, "-m", "affinity", "run", "-t", str(len(CPUS)), "--", *probe)
    assert probe_result(r)["env"]["OMP_NUM_THREADS"] == str(len(CPUS))


@TWO
@pytest.mark.parametrize("scratch_cgroup", ["cpuset"], indirect=True)
def test_a_cgroup_cpuset_is_the_allowed_set(scratch_cgroup, probe):
    (scratch_cgroup / "cpuset.mems").write_text((scratch_cgroup.parent / "cpuset.mems").read_text())
    (scratch_cgroup / "cpuset.cpus").write_text(str(CPUS[1]))
    for extra in ((), ("--norespect",)):
        got = probe_result(run_in(scratch_cgroup, sys.executable, "-m", "affinity", "run", *extra, "--",
                                  *probe))
        assert got["cpus"] == {CPUS[1]}
        assert got["env"]["OMP_NUM_THREADS"] == "1"


# ------------------------------------------- memory policy refused (container)

SECCOMP = r"""
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#else
#error "add this architecture"
#endif
/* what Docker's default seccomp profile does without CAP_SYS_NICE */
int main(int argc, char **argv)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_set_mempolicy, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_mbind, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
    };
    struct sock_fprog prog = {sizeof f / sizeof f[0], f};
    if (argc < 2 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
        perror("deny_mempolicy");
        return 99;
    }
    execvp(argv[1], argv + 1);
    perror("execvp");
    return 98;
}
"""


@pytest.fixture(scope="module")
def deny_mempolicy(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("seccomp")
    (d / "deny.c").write_text(SECCOMP)
    subprocess.run([shutil.which("gcc") or "cc", "-O1", str(d / "deny.c"), "-o", str(d / "deny")], check=True)
    # the filter works: set_mempolicy says EPERM under it
    r = subprocess.run([str(d / "deny"), sys.executable, "-c",
                        "import ctypes,os; l=ctypes.CDLL(None, use_errno=True); "
                        f"print(l.syscall({238 if os.uname().machine == 'x86_64' else 237}, 2, "
                        "ctypes.byref(ctypes.c_ulong(1)), 65), ctypes.get_errno())"],
                       capture_output=True, text=True, check=True)
    assert r.stdout.split() == ["-1", "1"], r.stdout
    return str(d / "deny")


def test_refused_memory_policy_is_a_clear_error_and_nothing_starts(deny_mempolicy, tmp_path):
    marker = tmp_path / "ran"
    for opt in (["--membind", "0"], ["--interleave", "all"], ["--localalloc"]):
        r = affinity_run(*opt, "--", "touch", str(marker), pre=(deny_mempolicy,))
        assert r.returncode == 1, r.stderr
        assert "set_mempolicy(" in r.stderr and "Operation not permitted" in r.stderr
        assert "--membind-optional" in r.stderr and "nothing was started" in r.stderr
        assert not marker.exists()
    # several instances: refused before the first one starts
    r = affinity_run("--instances", "2", "-m", "0", "--", "touch", str(marker), pre=(deny_mempolicy,))
    assert r.returncode == 1 and not marker.exists()


def test_membind_optional_warns_and_runs_without_it(deny_mempolicy, probe):
    r = affinity_run("--membind", "0", "--membind-optional", "--", *probe, pre=(deny_mempolicy,))
    got = probe_result(r)
    assert got["policy"] == "default"
    assert "warning: memory policy bind:0 not applied" in r.stderr and "running without it" in r.stderr


@TWO
def test_implicit_instance_binding_degrades_to_a_warning(deny_mempolicy, tmp_path, probe):
    r = affinity_run("--instances", "2", "--log-dir", str(tmp_path), "--", *probe, pre=(deny_mempolicy,))
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("not applied") == 1  # said once
    outs = [json.loads((tmp_path / f"instance-{i}.log").read_text()) for i in range(2)]
    assert [o["policy"] for o in outs] == ["default", "default"]
    assert not parse_list(outs[0]["cpus"]) & parse_list(outs[1]["cpus"])


# ----------------------------------------------------------------- the value

def test_dry_run_on_another_machine():
    xeon = "synthetic:pack:2 [numa] core:28 pu:2(indexes=2*56:1*2)"
    r = affinity_run("--topology", xeon, "--instances", "2", "--dry-run", "--json", "--", "prog")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert [i["cpus"] for i in d["instances"]] == ["0-27,56-83", "28-55,84-111"]
    assert [i["mem_nodes"] for i in d["instances"]] == ["0", "1"]
    assert [i["threads"] for i in d["instances"]] == [28, 28]
    assert d["instances"][1]["env"]["KMP_AFFINITY"].startswith("granularity=fine,proclist=[28,29,")
    r = affinity_run("--topology", xeon, "--", "prog")
    assert r.returncode == 2 and "--topology plans for another machine" in r.stderr


def test_shell_dry_run_reproduces_the_launch(probe):
    numactl = shutil.which("numactl")
    r = affinity_run("-C", str(CPUS[-1]), "-m", str(NODE), "--dry-run", "--", *probe)
    assert r.returncode == 0
    line = r.stdout.strip()
    assert line.startswith(f"numactl --physcpubind={CPUS[-1]} --membind={NODE} -- env ")
    if numactl is None:
        pytest.skip("numactl is not installed: the shell line cannot be run")
    via_shell = probe_result(subprocess.run(["sh", "-c", line], capture_output=True, text=True,
                                            env=clean_env(), timeout=60))
    direct = probe_result(affinity_run("-C", str(CPUS[-1]), "-m", str(NODE), "--", *probe))
    for k in ("cpus", "mems", "policy", "env"):
        assert via_shell[k] == direct[k], k
    assert format_list(direct["cpus"]) == str(CPUS[-1])


POOL = ("import multiprocessing as mp, os, json, sys\n"
        "def mask(_): return sorted(os.sched_getaffinity(0))\n"
        "if __name__ == '__main__':\n"
        "    with mp.get_context(sys.argv[1]).Pool(2) as p: print(json.dumps(p.map(mask, range(2))))\n")


@TWO
@pytest.mark.parametrize("method", ["spawn", "fork"])
@pytest.mark.parametrize("children", [False, True])
def test_pin_threads_and_a_multiprocessing_pool(tmp_path, children, method):
    """Spawned pool workers used to pin themselves to the first slot, every one;
    by default they now run on the plan's CPUs, and --pin-children asks for the old way.
    Forked ones (no exec: the library's constructor does not run again; PyTorch's
    DataLoader forks by default) used to stay on the forking thread's slot."""
    script = tmp_path / "pool.py"
    script.write_text(POOL)
    args = ["-t", "2", "--pin-threads"] + (["--pin-children"] if children else [])
    r = affinity_run(*args, "--", sys.executable, str(script), method)
    assert r.returncode == 0, r.stderr
    workers = json.loads(r.stdout.strip().splitlines()[-1])
    first = sorted(os.sched_getaffinity(0))[:1]
    assert workers == ([first] * 2 if children else [CPUS[:2]] * 2)


DATALOADER = """
import json, os, warnings
import torch
from torch.utils.data import DataLoader, Dataset

class Masks(Dataset):
    def __len__(self): return 4
    def __getitem__(self, i): return torch.tensor(sorted(os.sched_getaffinity(0)))

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    workers = [b.tolist() for b in DataLoader(Masks(), num_workers=2, batch_size=None)]
print(json.dumps({"main": sorted(os.sched_getaffinity(0)), "workers": workers,
                  "warned": [str(w.message) for w in caught if "suggested max number of worker" in str(w.message)]}))
"""


@TWO
@pytest.mark.torch
@pytest.mark.parametrize("main", [True, False])
def test_pin_threads_and_a_dataloader(tmp_path, main):
    """Issue #40, point 3: with --pin-threads PyTorch's DataLoader warned 'Our suggested max
    number of worker in current system is 1' -- why: the main thread holds slot 0 and torch
    counts the calling thread's CPUs; the workers get the plan's CPUs all the same, and
    --no-pin-main (the remedy docs/launcher.md gives) leaves no warning."""
    script = tmp_path / "loader.py"
    script.write_text(DATALOADER)
    args = ["granularity=fine,compact,1,0", "-t", "2", "--pin-threads"] + ([] if main else ["--no-pin-main"])
    r = affinity_run(*args, "--", sys.executable, str(script), timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["workers"] == [CPUS[:2]] * 4  # forked workers: the plan's CPUs, whatever the main thread holds
    if main:
        assert got["main"] == CPUS[:1] and len(got["warned"]) >= 1 and "current system is 1," in got["warned"][0]
    else:
        assert got["main"] == CPUS[:2] and got["warned"] == []
    doc = (ROOT / "docs" / "launcher.md").read_text()
    assert "Our suggested max number of worker in current system is 1" in doc and "--no-pin-main" in doc


@TWO
def test_apply_rank_auto_inside_an_instance(tmp_path):
    """The tuner's apply() line for a split best (rank='auto') run under the launcher's own
    --instances: each instance plans inside the share it was given (it used to raise)."""
    code = ("import affinity, json, os, sys\n"
            "b = affinity.apply('none', threads=1, rank='auto', tensorflow=False, openmp=False, blas=False)\n"
            "i = os.environ['AFFINITY_INSTANCE']\n"
            "with open(os.path.join(sys.argv[1], i + '.json'), 'w') as f:\n"  # one file each: no lines interleaved
            "    json.dump([i, sorted(os.sched_getaffinity(0)), sorted(b.plan.union)], f)\n")
    r = affinity_run("none", "-t", "1", "--instances", "2", "--", sys.executable, "-c", code, str(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = sorted(json.loads(f.read_text()) for f in tmp_path.glob("*.json"))
    assert [row[0] for row in rows] == ["0", "1"]
    assert all(row[1] == row[2] for row in rows) and rows[0][1] != rows[1][1]


IGNORES_TERM = "trap '' TERM INT HUP QUIT; echo $$ > {d}/pid.$AFFINITY_INSTANCE; exec sleep 120"


def _gone(pid: int) -> bool:  # exited, or a zombie waiting to be reaped
    try:
        return status_of(pid).get("State", "").startswith("Z")
    except FileNotFoundError:
        return True


def _two_pids(d) -> list[int]:
    wait_for(lambda: all((d / f"pid.{i}").exists() and (d / f"pid.{i}").read_text() for i in range(2)),
             "both instances")
    pids = [int((d / f"pid.{i}").read_text()) for i in range(2)]
    wait_for(lambda: all(comm_of(pid) == "sleep" for pid in pids), "both instances to exec sleep")
    return pids


@TWO
def test_an_instance_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path):
    """Issue 42, point 10: instances that ignore the forwarded SIGTERM kept the launcher
    waiting out their whole run, and it then said 0.  Now SIGKILL after
    AFFINITY_KILL_AFTER seconds (1 here), said, and the real status (128 + 9)."""
    p = subprocess.Popen([sys.executable, "-m", "affinity", "run", "--instances", "2", "--", "sh", "-c",
                          IGNORES_TERM.format(d=tmp_path)], env={**clean_env(), "AFFINITY_KILL_AFTER": "1"},
                         stderr=subprocess.PIPE, text=True)
    pids = _two_pids(tmp_path)
    try:
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 128 + signal.SIGKILL
        said = p.stderr.read()
        assert said.count("still running 1 s after SIGTERM: killed (SIGKILL)") == 2, said
        assert all(_gone(pid) for pid in pids)
    finally:
        for pid in pids:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
        if p.poll() is None:
            p.kill()


@TWO
def test_instances_ignoring_sigterm_do_not_outlive_a_killed_launcher(tmp_path):
    """The parent-death signal is SIGTERM, which they ignore: orphaned before.  The
    launcher's watchdog kills them after the grace period."""
    p = subprocess.Popen([sys.executable, "-m", "affinity", "run", "--instances", "2", "--", "sh", "-c",
                          IGNORES_TERM.format(d=tmp_path)], env={**clean_env(), "AFFINITY_KILL_AFTER": "1"})
    pids = _two_pids(tmp_path)
    # the launcher has finished starting them once it is back on its own mask (the watchdog
    # cannot know an instance whose start was cut short by the SIGKILL: see _Watchdog)
    wait_for(lambda: parse_list(status_of(p.pid)["Cpus_allowed_list"]) == set(CPUS), "the launcher to start both")
    p.kill()
    p.wait(60)
    try:
        wait_for(lambda: all(_gone(pid) for pid in pids), "the instances to end after the launcher was killed",
                 limit=30)
    finally:
        for pid in pids:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_kill_after_reads_its_variable():
    from affinity.launcher.execute import KILL_AFTER_S, kill_after

    assert kill_after({}) == KILL_AFTER_S == 10
    assert kill_after({"AFFINITY_KILL_AFTER": "2.5"}) == 2.5
    assert kill_after({"AFFINITY_KILL_AFTER": "-1"}) == kill_after({"AFFINITY_KILL_AFTER": "x"}) == KILL_AFTER_S


def test_instances_are_waited_for_without_pidfds(tmp_path, monkeypatch):
    """A kernel before Linux 5.3 has no pidfd_open: the instances are waited for by
    polling, and their statuses are the same."""
    from affinity.launcher import execute

    def no_pidfd(pid):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(execute.os, "pidfd_open", no_pidfd)
    started = [execute._Started(os.spawnvp(os.P_NOWAIT, "sh", ["sh", "-c", f"sleep 0.2; exit {c}"])) for c in (0, 3)]
    assert [p.pidfd for p in started] == [None, None]
    while started[1].poll() is None:
        started[1].wait_a_while(0.25)
    assert [p.wait() for p in started] == [0, 3]
    started[0].send_signal(signal.SIGTERM)  # reaped: nothing is sent
