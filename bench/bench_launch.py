"""What ``affinity run`` costs: start-up against running the command directly,
numactl, taskset and the interpreter's own start (``python -c pass``, the
reference); the preload library's cost per pthread_create; the pure partition
of large machines.  ``make bench`` (pytest-benchmark) runs these; nothing here
asserts on time.

Start-up is measured the way launches happen in practice: **a variable of the
environment differs on every run** (hyperfine varies one, Slurm and MPI set per-job
ones, the tuner a temporary log directory), so a launch cache keyed on the whole
environment would never hit.  Two measurements:

* :func:`interleaved` (``python bench/bench_launch.py --rounds 30`` prints the table
  of bench/RESULTS.md's launcher section): every variant once per round, in a
  rotating order, each round with its own value of the changing variable; each
  variant's figure (the geometric mean of its rounds), the middle half of the rounds,
  and its time against ``python -c pass`` taken round by round (the two ran seconds
  apart, under the same load), said as every face of the package says a speed-up
  (:mod:`affinity.tuning.verdict`);
* ``test_startup`` (pytest-benchmark, group ``startup: launch /bin/true``): the same
  variants one after another, for ``make bench``'s report.

Variants: ``python -c pass`` (◆, the floor for any launcher written in Python);
``affinity run -- true`` (topology, cgroup limits, the decision, then exec: every launch
planned from scratch, there is no launch cache), with ``--instances 2`` and with
``--membind 0``; what a user would otherwise use: torch's launcher
``python -m torch.backends.xeon.run_cpu`` on the same command (it imports torch, and
runs ``lscpu``), ``taskset`` and ``numactl``, which start no Python.  Issue #36's goal:
``affinity run`` (one instance, and ``--instances 2``) within 3x ◆ and at least 10x
faster than ``run_cpu``; ``tests/launcher/test_startup.py`` guards what the launch
imports and does.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from affinity.launcher.preload import pin_library
from affinity.planning.partition import partition
from affinity.machine.topology import Topology

TRUE = shutil.which("true") or "/bin/true"
CPUS = ",".join(map(str, sorted(os.sched_getaffinity(0))))
AFFINITY = [sys.executable, "-m", "affinity", "run"]
#: the variable that differs on every run (the one hyperfine itself varies)
CHANGING = "HYPERFINE_RANDOMIZED_ENVIRONMENT_OFFSET"

#: name -> (argv, extra environment); None: ``python -c pass``
STARTUP: dict[str, tuple[list[str], dict[str, str]]] = {
    "python -c pass": ([sys.executable, "-c", "pass"], {}),
    "taskset": (["taskset", "-c", CPUS, TRUE], {}),
    "numactl": (["numactl", "-C", CPUS, "--", TRUE], {}),
    "affinity run": ([*AFFINITY, "--", TRUE], {}),
    "affinity run --instances 2": ([*AFFINITY, "--instances", "2", "--", TRUE], {}),
    "affinity run --membind 0": ([*AFFINITY, "--membind", "0", "--", TRUE], {}),
    "torch run_cpu": ([sys.executable, "-m", "torch.backends.xeon.run_cpu", "--no-python", TRUE], {}),
    "torch run_cpu --ninstances 2": ([sys.executable, "-m", "torch.backends.xeon.run_cpu", "--no-python",
                                      "--ninstances", "2", TRUE], {}),
}
REFERENCE = "python -c pass"


def _available() -> dict[str, tuple[list[str], dict[str, str]]]:
    def there(argv: list[str]) -> bool:
        if argv[0] != sys.executable:
            return shutil.which(argv[0]) is not None
        return "torch.backends" not in " ".join(argv) or importlib.util.find_spec("torch") is not None
    return {k: v for k, v in STARTUP.items() if there(v[0])}


def _once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall time and CPU time (user + system, of the command and everything it
    waited for) of one run.  CPU time is what a launcher costs the machine, and it
    barely moves when other work shares the CPUs, where wall time does."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _summary(values: list[float], ref: list[float], family: int) -> dict[str, Any]:
    """The figure of ``values`` (their geometric mean) and quartiles, its time against
    ``ref`` round by round (the ratio of the two figures, >1 slower) and the verdict
    as every face of the package says it (:func:`affinity.tuning.verdict.paired`)."""
    from affinity.tuning.verdict import geomean, paired

    q = statistics.quantiles(values, n=4)
    v = paired(ref, values, "minimize", max_rounds=None, family=family)
    return {"figure": geomean(values), "q1": q[0], "q3": q[2], "ratio": 1 / v.ratio, "verdict": v.text}


def _environment() -> dict[str, str]:
    """The launches' environment: this one with the package's bytecode compiled and
    ``PYTHONDONTWRITEBYTECODE`` dropped.  Without bytecode every launch compiles each
    module it imports: a launch then costs 5-6x ``python -c pass`` where it costs 1.9-2.1x
    (2026-11-28, 5 runs each; the "regression from 1.87x to 5.1x" issue #36 reported was
    measured so), and what a user's launch costs is the compiled one (pip compiles
    on install)."""
    import compileall

    import affinity

    compileall.compile_dir(os.path.dirname(affinity.__file__), quiet=1)
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def interleaved(rounds: int) -> dict[str, dict[str, float]]:
    """Every variant once per round (rotating order; the changing variable takes the
    round's number); per variant (:func:`_summary`): its figure, quartiles, time ratio
    to ``python -c pass`` and verdict, in wall time and (``cpu_`` keys) in CPU time."""
    variants = _available()
    names = list(variants)
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    base = _environment()
    for r in range(rounds + 1):  # round 0 warms the system's caches
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            argv, extra = variants[n]
            w, c = _once(argv, {**base, **extra, CHANGING: str(r)})
            if r:
                wall[n].append(w)
                cpu[n].append(c)
    out: dict[str, dict[str, Any]] = {}
    for n in names:
        out[n] = _summary(wall[n], wall[REFERENCE], len(names) - 1)
        out[n].update({f"cpu_{k}": v for k, v in _summary(cpu[n], cpu[REFERENCE], len(names) - 1).items()})
    return out


def table(stats: dict[str, dict[str, float]], rounds: int) -> str:
    """The markdown table of bench/RESULTS.md's launcher section."""
    ms = lambda s: f"{s * 1e3:.1f} ms"  # noqa: E731
    lines = [f"| launch `true` ({rounds} interleaved rounds, `{CHANGING}` changing) | wall: geometric mean "
             "(middle half) | wall against ◆, round by round | CPU: geometric mean (middle half) | CPU against ◆ |",
             "|---|---:|---|---:|---|"]
    for n, s in sorted(stats.items(), key=lambda kv: kv[1]["figure"]):
        ref = n == REFERENCE
        lines.append(f"| `{n}`{' ◆' if ref else ''} | {ms(s['figure'])} ({ms(s['q1'])} – {ms(s['q3'])}) | "
                     f"{'◆' if ref else s['verdict']} | "
                     f"{ms(s['cpu_figure'])} ({ms(s['cpu_q1'])} – {ms(s['cpu_q3'])}) | "
                     f"{'◆' if ref else s['cpu_verdict']} |")
    return "\n".join(lines)


def test_interleaved_startup(benchmark) -> None:
    """The interleaved measurement, short (``make bench``); its table goes into the
    benchmark's extra_info.  Asserts only what it measured, never a time."""
    benchmark.group = "startup: interleaved ratios"
    stats = {}
    benchmark.pedantic(lambda: stats.update(interleaved(5)), rounds=1, iterations=1)
    assert set(stats) == set(_available()) and stats[REFERENCE]["ratio"] == 1.0
    benchmark.extra_info["ratios"] = {n: s["ratio"] for n, s in stats.items()}
    benchmark.extra_info["cpu_ratios"] = {n: s["cpu_ratio"] for n, s in stats.items()}
    benchmark.extra_info["table"] = table(stats, 5)


@pytest.mark.parametrize("how", list(STARTUP))
def test_startup(benchmark, how):
    benchmark.group = "startup: launch /bin/true"
    if how not in _available():
        pytest.skip(f"{STARTUP[how][0][0]} is not installed")
    argv, extra = STARTUP[how]
    env = {**_environment(), **extra}
    rounds = iter(range(10**6))

    def once() -> None:
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env={**env, CHANGING: str(next(rounds))})

    benchmark.pedantic(once, rounds=15, iterations=1, warmup_rounds=1)


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


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="affinity run's start-up, interleaved, with a changing environment")
    ap.add_argument("--rounds", type=int, default=30)
    a = ap.parse_args()
    print(table(interleaved(a.rounds), a.rounds))
