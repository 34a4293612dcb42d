"""``affinity run`` in unprivileged containers (issue 14, item 4).

The launcher runs as root without ``CAP_SYS_NICE`` (Docker's default) or as a user
with no capability (``nobody``), under the seccomp filter of Docker's default
profile (every memory-policy call, ``get_mempolicy`` included, refused with
``EPERM``; tests/helpers/unprivileged.py).  What must hold there:

* a memory policy asked for explicitly stops the launch with the documented
  message (docs/launcher.md, "Containers") and nothing starts;
* with ``--membind-optional`` it is a warning and the command runs;
* several instances, whose memory binding is implicit, warn once and all run;
  an explicit one stops them all before the first starts;
* without the filter, an unprivileged user gets the mask, the memory policy
  (which needs no privilege from the kernel) and ``--pin-threads``.

The commands started are small programs every user can run (``touch``, ``sh``),
not this interpreter, which an unprivileged user may not be able to read.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from affinity.cpulist import format_list, parse_list
from helpers.launch import clean_env
from helpers.unprivileged import build_deny, shared_dir

CPUS = sorted(os.sched_getaffinity(0))
# the shell's own status ($$): the commands it runs are other processes, which the pinning
# library leaves on the plan's CPUs
REPORT = ("grep -E '^(Cpus_allowed_list|Mems_allowed_list):' /proc/$$/status; "
          "grep -w stack /proc/self/numa_maps | cut -d' ' -f2; echo \"LD_PRELOAD=$LD_PRELOAD\"")


@pytest.fixture(scope="module")
def shared():
    with shared_dir() as d:
        deny, _ = build_deny(d)
        yield {"dir": d, "deny": deny}


def run(shared, who, *args: str, deny: str | None = "docker") -> subprocess.CompletedProcess:
    cmd = [*who.prefix, sys.executable, "-m", "affinity", "run", *args]
    if deny:
        cmd = [str(shared["deny"]), deny, *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=shared["dir"],
                          env=clean_env())


def report(stdout: str) -> dict:
    out = {}
    for line in stdout.splitlines():
        if ":" in line and line.split(":")[0].endswith("_list"):
            k, v = line.split(":", 1)
            out[k] = parse_list(v.strip())
        elif line.startswith("LD_PRELOAD="):
            out["LD_PRELOAD"] = line.split("=", 1)[1]
        elif line.strip():
            out["policy"] = line.strip()
    return out


@pytest.mark.parametrize("opt", [["--membind", "0"], ["--interleave", "all"], ["--preferred", "0"],
                                 ["--localalloc"]])
def test_a_required_memory_policy_refused_stops_the_launch(shared, who, opt):
    marker = shared["dir"] / f"ran-{who.uid}-{opt[0]}"
    r = run(shared, who, *opt, "--", "touch", str(marker))
    assert r.returncode == 1, r.stderr
    assert "set_mempolicy(" in r.stderr and "Operation not permitted" in r.stderr, r.stderr
    assert "CAP_SYS_NICE" in r.stderr and "--membind-optional" in r.stderr, r.stderr
    assert "nothing was started" in r.stderr, r.stderr
    assert not marker.exists()


def test_membind_optional_is_a_warning_and_the_command_runs(shared, who):
    r = run(shared, who, "--membind", "0", "--membind-optional", "--", "sh", "-c", REPORT)
    assert r.returncode == 0, r.stderr
    assert "warning: memory policy bind:0 not applied" in r.stderr and "running without it" in r.stderr
    assert report(r.stdout)["policy"] == "default"


@pytest.mark.skipif(len(CPUS) < 2, reason="needs a process mask of at least 2 CPUs")
def test_instances_warn_once_and_all_run_when_the_container_forbids_memory_policies(shared, who):
    logs = shared["dir"] / f"logs-{who.uid}"
    r = run(shared, who, "--instances", "2", "--log-dir", str(logs), "--", "sh", "-c", REPORT)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("not applied") == 1, r.stderr  # said once
    outs = [report((logs / f"instance-{i}.log").read_text()) for i in range(2)]
    assert [o["policy"] for o in outs] == ["default", "default"]
    assert not outs[0]["Cpus_allowed_list"] & outs[1]["Cpus_allowed_list"]


@pytest.mark.skipif(len(CPUS) < 2, reason="needs a process mask of at least 2 CPUs")
def test_an_explicit_policy_for_instances_stops_them_all(shared, who):
    marker = shared["dir"] / f"ran-instances-{who.uid}"
    r = run(shared, who, "--instances", "2", "--membind", "0", "--", "touch", str(marker))
    assert r.returncode == 1, r.stderr
    assert "nothing was started" in r.stderr, r.stderr
    assert not marker.exists()


@pytest.mark.skipif(len(CPUS) < 2, reason="needs a process mask of at least 2 CPUs")
def test_mask_policy_and_pinning_library_work_without_privileges(shared, who):
    r = run(shared, who, "-C", str(CPUS[-1]), "--membind", "0", "--", "sh", "-c", REPORT, deny=None)
    assert r.returncode == 0, r.stderr
    got = report(r.stdout)
    assert got["Cpus_allowed_list"] == {CPUS[-1]}
    assert got["policy"] == "bind:0"  # set_mempolicy needs no privilege from the kernel
    r = run(shared, who, "--pin-threads", "--", "sh", "-c", REPORT, deny=None)
    assert r.returncode == 0, r.stderr
    got = report(r.stdout)
    assert got["LD_PRELOAD"].split(":")[0].endswith("libaffinity_pin.so")
    assert got["Cpus_allowed_list"] == {CPUS[0]}  # the library pinned sh to the first slot
    assert format_list(got["Cpus_allowed_list"]) == str(CPUS[0])
