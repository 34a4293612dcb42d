"""Shared by tests/test_launch*.py: run ``affinity run`` as users do and read
what the started process got -- from inside (a probe that reports its own
/proc/self/status, the policy of a fresh mapping in /proc/thread-self/numa_maps
and its environment) or from outside (/proc/PID of a live process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from affinity.cpulist import parse_list

ENV_PREFIXES = ("OMP_", "KMP_", "GOMP_", "TF_NUM_", "AFFINITY_", "LD_PRELOAD")

PROBE = r"""
import ctypes, json, mmap, os
st = {}
for line in open("/proc/self/status"):
    k, _, v = line.partition(":")
    st[k] = v.strip()
buf = mmap.mmap(-1, 4 * mmap.PAGESIZE)
buf[0:1] = b"x"
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
maps = {}
for line in open("/proc/thread-self/numa_maps"):
    start, *words = line.split()
    pol = []
    for w in words:
        if "=" in w or w in ("heap", "stack", "huge"):
            break
        pol.append(w)
    maps[int(start, 16)] = " ".join(pol)
policy = maps[max(s for s in maps if s <= addr)]
env = {k: v for k, v in os.environ.items() if k.startswith(%r)}
print(json.dumps({"pid": os.getpid(), "cpus": st["Cpus_allowed_list"], "mems": st["Mems_allowed_list"],
                  "policy": policy, "env": env}), flush=True)
""" % (ENV_PREFIXES,)


def write_probe(directory: Path) -> list[str]:
    p = directory / "probe.py"
    p.write_text(PROBE)
    return [sys.executable, str(p)]


def affinity_run(*args: str, pre: tuple[str, ...] = (), env: dict | None = None,
                 timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [*pre, sys.executable, "-m", "affinity", "run", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=env if env is not None else clean_env())


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without placement variables (a developer's KMP_AFFINITY
    or an MPI launcher's variables must not leak into the tests)."""
    skip = ("OMP_", "KMP_", "GOMP_", "AFFINITY_", "OMPI_", "PMI_", "MPI_LOCAL", "SLURM_", "MV2_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(skip)
           and k not in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "LD_PRELOAD")}
    env.update(extra)
    return env


def probe_result(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, f"rc={r.returncode}\nstdout={r.stdout}\nstderr={r.stderr}"
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, r.stdout
    out = json.loads(lines[0])
    out["cpus"] = parse_list(out["cpus"])
    out["mems"] = parse_list(out["mems"])
    return out


def status_of(pid: int) -> dict[str, str]:
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def environ_of(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as fh:
        items = fh.read().split(b"\0")
    return dict(i.decode().split("=", 1) for i in items if b"=" in i)


def task_policy_of(pid: int) -> str:
    """The main thread's memory policy as /proc/PID/numa_maps shows it for the
    process's stack mapping (which has no policy of its own)."""
    with open(f"/proc/{pid}/numa_maps") as fh:
        for line in fh:
            words = line.split()
            if "stack" in words:
                return words[1]
    raise AssertionError(f"no stack mapping in /proc/{pid}/numa_maps")


def wait_for(predicate, what: str, limit: float = 60.0) -> None:
    """Poll until ``predicate()`` is true (a generous limit so a slow machine only
    waits longer; no test asserts on how long anything took)."""
    end = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.02)


def comm_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return None
