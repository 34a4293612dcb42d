"""A real OpenMP program, compiled for the tests, under libgomp or Intel's libiomp5.

``build(kind, dst)`` compiles ``report()`` -- each member of a parallel region
writes its TID and the CPU mask it reads from the kernel -- into a shared
library linked to that runtime, and returns its path.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SOURCE = r"""
#define _GNU_SOURCE
#include <omp.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Every member of one parallel region reports its TID and its mask (bit c = CPU c). */
int report(int *tids, unsigned long *masks, int max)
{
    int n = 0;
#pragma omp parallel
    {
        int i = omp_get_thread_num();
        if (i < max) {
            cpu_set_t s;
            CPU_ZERO(&s);
            sched_getaffinity(0, sizeof s, &s);
            unsigned long m = 0;
            for (int c = 0; c < 64; c++)
                if (CPU_ISSET(c, &s))
                    m |= 1UL << c;
            tids[i] = (int)syscall(SYS_gettid);
            masks[i] = m;
        }
#pragma omp single
        n = omp_get_num_threads();
    }
    return n;
}
"""


def iomp5_dir() -> Path:
    """Where the intel-openmp wheel put libiomp5.so (``<prefix>/lib``)."""
    for base in (Path(sys.prefix), Path(sys.base_prefix)):
        if (base / "lib" / "libiomp5.so").exists():
            return base / "lib"
    raise FileNotFoundError("libiomp5.so not found: install the 'intel-openmp' wheel (test extra)")


def build(kind: str, dst: Path) -> Path:
    src = dst / "omp_report.c"
    src.write_text(SOURCE)
    out = dst / f"libompreport_{kind}.so"
    if kind == "libgomp":
        cmd = ["gcc", "-O2", "-fPIC", "-shared", "-fopenmp", str(src), "-o", str(out)]
        subprocess.run(cmd, check=True)
    elif kind == "libiomp5":
        # gcc only supplies omp.h and GOMP_* calls; Intel's runtime implements that ABI
        obj = dst / "omp_report.o"
        subprocess.run(["gcc", "-O2", "-fPIC", "-fopenmp", "-c", str(src), "-o", str(obj)], check=True)
        lib = iomp5_dir()
        subprocess.run(["gcc", "-shared", str(obj), "-o", str(out), f"-L{lib}", "-liomp5",
                        f"-Wl,-rpath,{lib}"], check=True)
    else:
        raise ValueError(kind)
    return out


MAIN_SOURCE = r"""
#define _GNU_SOURCE
#include <omp.h>
#include <sched.h>
#include <stdio.h>

/* Prints "thread cpu,cpu,..." for every member of one parallel region. */
int main(void)
{
#pragma omp parallel
    {
        cpu_set_t s;
        CPU_ZERO(&s);
        sched_getaffinity(0, sizeof s, &s);
        char buf[1024];
        int n = 0;
        for (int c = 0; c < CPU_SETSIZE && n < 1000; c++)
            if (CPU_ISSET(c, &s))
                n += snprintf(buf + n, sizeof buf - n, n ? ",%d" : "%d", c);
#pragma omp critical
        printf("%d %s\n", omp_get_thread_num(), buf);
    }
    return 0;
}
"""


def build_program(kind: str, dst: Path) -> Path:
    """An executable printing every OpenMP thread's mask, linked to ``kind``."""
    src = dst / "omp_main.c"
    src.write_text(MAIN_SOURCE)
    out = dst / f"omp_main_{kind}"
    if kind == "libgomp":
        subprocess.run(["gcc", "-O2", "-fopenmp", str(src), "-o", str(out)], check=True)
    elif kind == "libiomp5":
        obj = dst / "omp_main.o"
        subprocess.run(["gcc", "-O2", "-fopenmp", "-c", str(src), "-o", str(obj)], check=True)
        lib = iomp5_dir()
        subprocess.run(["gcc", str(obj), "-o", str(out), f"-L{lib}", "-liomp5", f"-Wl,-rpath,{lib}"],
                       check=True)
    else:
        raise ValueError(kind)
    return out


def run_program(exe: Path, env: dict[str, str]) -> tuple[list[frozenset[int]], str]:
    """Run it; return the per-thread masks in thread order and its stderr."""
    r = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=60, check=True)
    rows = sorted((int(a), frozenset(int(c) for c in b.split(","))) for a, b in
                  (line.split() for line in r.stdout.splitlines()))
    return [m for _, m in rows], r.stderr
