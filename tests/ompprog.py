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
