"""What ``affinity run`` costs: start-up against running the command directly,
numactl, taskset and the interpreter's own start (``python -c pass``, the
reference); the preload library's cost per pthread_create; the pure partition
of large machines.  ``make bench`` (pytest-benchmark) runs these; nothing here
asserts on time.

Start-up rows (group ``startup: launch /bin/true``), each a fresh process per round:

* ``python -c pass`` (◆): the same interpreter starting and exiting -- the floor
  for any Python launcher;
* ``affinity run``: ``python -m affinity run -- /bin/true`` as a user runs it
  again and again: the launch remembered from the first run
  (:mod:`affinity.launcher.fastpath`), the mask set and read back, the command
  exec'd;
* ``affinity run (first)``: the same with nothing remembered
  (``AFFINITY_LAUNCH_CACHE=0``): topology, cgroup limits, plan, then exec;
* ``affinity run --pin-threads``: remembered too (it adds the preload's variables);
* ``affinity run --instances 2``: never remembered (two processes started and
  waited for, memory bound to each share's node);
* ``direct``, ``taskset``, ``numactl``: the command with no Python at all.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from affinity.launcher.preload import pin_library
from affinity.planning.ranks import partition
from affinity.machine.topology import Topology

TRUE = shutil.which("true") or "/bin/true"
CPUS = ",".join(map(str, sorted(os.sched_getaffinity(0))))


def run(cmd: list[str], **env: str) -> None:
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env={**os.environ, **env})


STARTUP = {
    "direct": [],
    "taskset": ["taskset", "-c", CPUS],
    "numactl": ["numactl", "-C", CPUS, "--"],
    "python -c pass": None,
    "affinity run": [sys.executable, "-m", "affinity", "run", "--"],
    "affinity run (first)": [sys.executable, "-m", "affinity", "run", "--"],
    "affinity run --pin-threads": [sys.executable, "-m", "affinity", "run", "--pin-threads", "--"],
    "affinity run --instances 2": [sys.executable, "-m", "affinity", "run", "--instances", "2", "--"],
}


@pytest.fixture(scope="module")
def launch_cache(tmp_path_factory) -> str:
    """A launch file of this run's own (the user's stays untouched)."""
    return str(tmp_path_factory.mktemp("xdg-cache"))


@pytest.mark.parametrize("how", list(STARTUP))
def test_startup(benchmark, how, launch_cache):
    benchmark.group = "startup: launch /bin/true"
    base = STARTUP[how]
    if base and shutil.which(base[0]) is None and base[0] != sys.executable:
        pytest.skip(f"{base[0]} is not installed")
    env = {"XDG_CACHE_HOME": launch_cache}
    if how == "affinity run (first)":
        env["AFFINITY_LAUNCH_CACHE"] = "0"
    cmd = [sys.executable, "-c", "pass"] if base is None else base + [TRUE]
    benchmark.pedantic(run, args=(cmd,), kwargs=env, rounds=15, iterations=1, warmup_rounds=1)


CREATE = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static void *nothing(void *a) { return a; }
int main(int argc, char **argv) {
    int n = atoi(argv[1]);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, nothing, NULL)) return 1;
        pthread_join(t, NULL);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%.0f\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / n);
    return 0;
}
"""


@pytest.fixture(scope="module")
def create_program(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("create")
    (d / "create.c").write_text(CREATE)
    subprocess.run(["gcc", "-O2", "-pthread", str(d / "create.c"), "-o", str(d / "create")], check=True)
    return d / "create"


@pytest.mark.parametrize("preload", [False, True], ids=["plain", "preloaded"])
def test_pthread_create_and_join(benchmark, create_program, preload):
    """ns per create+join of a thread that does nothing; with the library each
    new thread also pins itself (one sched_setaffinity)."""
    benchmark.group = "pthread_create+join x2000"
    env = {}
    if preload:
        env = {"LD_PRELOAD": str(pin_library()), "AFFINITY_PIN_SLOTS": CPUS.replace(",", ";")}
    out = {}

    def once():
        r = subprocess.run([str(create_program), "2000"], capture_output=True, text=True, check=True,
                           env={**os.environ, **env})
        out["ns"] = int(r.stdout)

    benchmark.pedantic(once, rounds=10, iterations=1, warmup_rounds=1)
    benchmark.extra_info["ns_per_thread_last_round"] = out["ns"]


@pytest.mark.parametrize("desc,count", [("pack:2 [numa] core:28 pu:2(indexes=2*56:1*2)", 8),
                                        ("pack:1 group:4 [numa] [numa] core:17 pu:4(indexes=4*68:1*4)", 68),
                                        ("pack:8 [numa] core:64 pu:2", 64)])
def test_partition(benchmark, desc, count):
    benchmark.group = "ranks: partition a node"
    topo = Topology.from_synthetic(desc)
    shares = benchmark(partition, topo, count)
    assert len(shares) == count
