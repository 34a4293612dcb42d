"""A live job for ``affinity doctor`` to look at: a child process that reproduces one
placement failure for real and waits until its standard input is closed.

``job(**what)`` starts it (with ``prefix``: under ``taskset``, in a cgroup...) and
returns the process and what it said of itself (its PID, its threads' TIDs)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

SCRIPT = r"""
import ctypes, hashlib, json, os, sys, threading
what = json.loads(sys.argv[1])
for lib in what.get("load", []):
    ctypes.CDLL(lib)                          # an OpenMP runtime mapped, as a library would load it
if what.get("membind") is not None:           # memory bound to one node, then allocated
    from affinity.binding import numa
    numa.set_membind({what["membind"]}, "bind")
    block = bytearray(what.get("mib", 64) << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
if what.get("apply") is not None:
    import warnings
    import affinity
    warnings.simplefilter("ignore")
    binding = affinity.apply(**what["apply"])
if what.get("import_torch"):
    import torch
    x = torch.randn(256, 256)
    for _ in range(4):
        x @ x                                 # the first parallel regions
data = b"x" * (1 << 20)
def spin():
    while True:
        hashlib.sha256(data).digest()       # releases the GIL: each thread is runnable on its own
busy = [threading.Thread(target=spin, daemon=True) for _ in range(what.get("busy", 0))]
for t in busy:
    t.start()
idle = threading.Event()
later = [threading.Thread(target=idle.wait, daemon=True) for _ in range(what.get("idle", 0))]
for t in later:
    t.start()
kids = [__import__("subprocess").Popen(["sleep", "600"]) for _ in range(what.get("children", 0))]
if what.get("move_to") is not None:           # the threads moved (after the memory was placed)
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), set(what["move_to"]))
if what.get("reset_main"):                    # something puts the whole mask back on the main thread
    os.sched_setaffinity(0, os.sched_getaffinity(0) | set(what["reset_main"]))
print(json.dumps({"pid": os.getpid(), "busy": [t.native_id for t in busy], "idle": [t.native_id for t in later],
                  "children": [k.pid for k in kids]}), flush=True)
sys.stdin.readline()
for k in kids:
    k.kill()
    k.wait()
"""


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without thread or placement variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMP_", "KMP_", "GOMP_", "TF_NUM_", "MKL_", "AFFINITY_", "LD_PRELOAD"))}
    env.update(extra)
    return env


@contextlib.contextmanager
def job(prefix: Sequence[str] = (), env: dict[str, str] | None = None, **what: object) -> Iterator[dict]:
    """A running job (see :data:`SCRIPT` for ``what``), stopped when the block ends;
    yields what it printed (``pid``, ``busy``/``idle`` TIDs, ``children``) and ``proc``."""
    p = subprocess.Popen([*prefix, sys.executable, "-c", SCRIPT, json.dumps(what)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env if env is not None else clean_env())
    try:
        line = p.stdout.readline()
        if not line:
            raise RuntimeError(f"the job did not start: {p.stderr.read()[-3000:]}")
        yield {**json.loads(line), "proc": p}
    finally:
        with contextlib.suppress(OSError):
            p.stdin.close()
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        p.stdout.close()
        p.stderr.close()


def torch_libgomp() -> str:
    """PyTorch's bundled libgomp, found without importing torch (helpers.torch_package_dir)."""
    from helpers import torch_package_dir

    return str(torch_package_dir() / "lib" / "libgomp.so.1")


def quota_cgroup(quota_us: int, period_us: int = 100000) -> tuple[Path, list[str]] | None:
    """A fresh cgroup (v1 ``cpu``, or v2 with the cpu controller) under this process's
    own, with a CFS quota, and the command prefix that starts a process in it; None
    where this user cannot make one (not root, no writable hierarchy)."""
    own = {c: path for line in Path("/proc/self/cgroup").read_text().splitlines()
           for _, ctrls, path in [line.split(":", 2)] for c in (ctrls.split(",") if ctrls else [""])}
    for fstype, top, name in _mounts():
        if fstype == "cgroup" and "cpu" in name.split(",") and "cpu" in own:
            d = top / own["cpu"].lstrip("/") / f"affinity-doctor-{os.getpid()}"
            files = {"cpu.cfs_period_us": str(period_us), "cpu.cfs_quota_us": str(quota_us)}
        elif fstype == "cgroup2" and "" in own:
            d = top / own[""].lstrip("/") / f"affinity-doctor-{os.getpid()}"
            files = {"cpu.max": f"{quota_us} {period_us}"}
        else:
            continue
        try:
            d.mkdir()
        except OSError:
            continue
        try:
            for f, v in files.items():
                (d / f).write_text(v)
        except OSError:
            d.rmdir()
            continue
        return d, ["sh", "-c", f'echo $$ > {d}/cgroup.procs && exec "$@"', "sh"]
    return None


def _mounts() -> list[tuple[str, Path, str]]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        f = line.split()
        sep = f.index("-")
        if f[sep + 1] in ("cgroup", "cgroup2") and f[3] == "/":
            out.append((f[sep + 1], Path(f[4]), f[sep + 3]))
    return out


def allowed_cpus() -> frozenset[int]:
    """What a process started here may use, as the doctor reads it: its cgroup's cpuset
    on this machine's CPUs (every CPU without one)."""
    from affinity.machine import cgroup
    from affinity.machine.topology import Topology

    machine = Topology.from_system().cpuset
    return (cgroup.cpuset_cpus() or machine) & machine or machine
