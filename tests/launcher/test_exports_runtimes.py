"""``affinity run``'s exports obeyed by the three real OpenMP runtimes of this machine.

A C program reports which OpenMP library it loaded, its main thread's mask when
``main()`` starts (after the runtime's constructors: libgomp binds the initial
thread at load) and every thread's mask in its first parallel region.  It runs
under ``affinity run SPEC`` linked to Debian's libgomp (``gcc -fopenmp``), to
PyTorch's bundled libgomp (the venv's ``torch/lib``, GCC 8.5), to Intel's
libiomp5 (the ``intel-openmp`` wheel) and to LLVM's libomp (Debian's
``libomp5-14``, installed by ``make``).  Each runtime must put thread ``i`` on the
plan's set ``i``; for the libgomp runs the planner's ``gnu`` rules, given the
environment the program saw, must predict every mask, the load-time one included.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from helpers import torch_package_dir

from affinity.cpulist import parse_list
from affinity.machine.topology import Topology
from affinity.planning.gnu import plan_gomp
from affinity.planning.planner import plan_env
from helpers.launch import affinity_run, clean_env
from helpers.ompprog import iomp5_dir

pytestmark = pytest.mark.slow

SOURCE = r"""
#define _GNU_SOURCE
#include <link.h>
#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int lib(struct dl_phdr_info *info, size_t size, void *data) {
    if (strstr(info->dlpi_name, "gomp") || strstr(info->dlpi_name, "iomp5") || strstr(info->dlpi_name, "libomp"))
        printf("lib %s\n", info->dlpi_name);
    return 0;
}

static void mask(const char *what, int i) {
    cpu_set_t s;
    CPU_ZERO(&s);
    sched_getaffinity(0, sizeof s, &s);
    char buf[4096];
    int n = 0;
    for (int c = 0; c < CPU_SETSIZE && n < 4000; c++)
        if (CPU_ISSET(c, &s))
            n += snprintf(buf + n, sizeof buf - n, n ? ",%d" : "%d", c);
    printf("%s %d %s\n", what, i, buf);
}

int main(void) {
    static const char *vars[] = {"OMP_PLACES", "OMP_PROC_BIND", "OMP_NUM_THREADS", "GOMP_CPU_AFFINITY",
                                 "KMP_AFFINITY", NULL};
    dl_iterate_phdr(lib, NULL);
    for (int v = 0; vars[v]; v++)
        if (getenv(vars[v]))
            printf("env %s=%s\n", vars[v], getenv(vars[v]));
    mask("init", 0);
#pragma omp parallel
    {
#pragma omp critical
        mask("thread", omp_get_thread_num());
    }
    return 0;
}
"""

TORCH_LIB = torch_package_dir() / "lib"
LIBOMP = Path("/usr/lib/llvm-14/lib/libomp.so.5")
RUNTIMES = ("gcc-libgomp", "torch-libgomp", "libiomp5", "libomp")


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("exports")
    (d / "p.c").write_text(SOURCE)
    gomp = d / "p_gomp"
    subprocess.run(["gcc", "-O2", "-fopenmp", str(d / "p.c"), "-o", str(gomp)], check=True)
    subprocess.run(["gcc", "-O2", "-fopenmp", "-c", str(d / "p.c"), "-o", str(d / "p.o")], check=True)
    iomp = d / "p_iomp5"
    lib = iomp5_dir()
    subprocess.run(["gcc", str(d / "p.o"), "-o", str(iomp), f"-L{lib}", "-liomp5", f"-Wl,-rpath,{lib}"],
                   check=True)
    llvm = d / "p_libomp"
    subprocess.run(["gcc", str(d / "p.o"), "-o", str(llvm), str(LIBOMP), f"-Wl,-rpath,{LIBOMP.parent}"],
                   check=True)
    return {"gcc-libgomp": gomp, "torch-libgomp": gomp, "libiomp5": iomp, "libomp": llvm}


def _run(program, runtime: str, args: list[str], pre: tuple[str, ...] = ()) -> dict:
    env = clean_env()
    if runtime == "torch-libgomp":
        env["LD_LIBRARY_PATH"] = str(TORCH_LIB)
    r = affinity_run(*args, "--", str(program[runtime]), pre=pre, env=env)
    assert r.returncode == 0, r.stderr
    out: dict = {"env": {}, "threads": {}, "lib": [], "stderr": r.stderr}
    for line in r.stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "lib":
            out["lib"].append(rest)
        elif kind == "env":
            k, _, v = rest.partition("=")
            out["env"][k] = v
        else:
            i, cpus = rest.split()
            if kind == "init":
                out["init"] = parse_list(cpus)
            else:
                out["threads"][int(i)] = parse_list(cpus)
    out["masks"] = [out["threads"][i] for i in sorted(out["threads"])]
    return out


CASES = [
    (("granularity=fine,explicit,proclist=[1,0]", "-t", "2"), ()),
    (("granularity=fine,compact", "-t", "3"), ()),
    (("granularity=fine,scatter", "-t", "4"), ()),
    (("explicit,proclist=[{0,1},0]", "-t", "2"), ()),
    (("OMP_PLACES=threads OMP_PROC_BIND=spread", "-t", "2"), ()),
    # norespect under a narrower inherited mask: thread 1 leaves the mask
    (("granularity=fine,explicit,proclist=[0,1],norespect", "-t", "2"), ("taskset", "-c", "0")),
]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs the 2 CPUs of the test machine")
@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("args,pre", CASES, ids=[c[0][0] for c in CASES])
def test_each_runtime_binds_as_planned(program, runtime, args, pre):
    got = _run(program, runtime, list(args), pre)
    assert len(got["lib"]) == 1, got["lib"]  # one OpenMP runtime, the intended one
    want_lib = {"gcc-libgomp": "/libgomp.so.1", "torch-libgomp": str(TORCH_LIB), "libiomp5": "libiomp5.so",
                "libomp": str(LIBOMP)}
    assert want_lib[runtime] in got["lib"][0]
    topo = Topology.from_system()
    mask = frozenset(range(1)) if pre else topo.allowed
    intel = plan_env(got["env"], topology=topo, initial_mask=mask)
    assert got["masks"] == list(intel.cpusets), got  # the plan, as Intel's rules give it
    if runtime in ("gcc-libgomp", "torch-libgomp"):
        build = "torch" if runtime == "torch-libgomp" else "gcc12"
        gnu = plan_gomp(got["env"], topo, mask, build)
        assert got["masks"] == list(gnu.cpusets)
        assert got["init"] == gnu.init_mask == intel.cpusets[0]  # bound at load, before main()
        assert "libgomp:" not in got["stderr"]
    else:
        assert got["init"] == mask  # Intel's and LLVM's runtimes bind at the first region, not at load
        assert "OMP:" not in got["stderr"]


def test_a_gomp_cpu_affinity_that_hangs_pytorch_never_reaches_the_command(program):
    """PyTorch's libgomp never returns from loading on a word in GOMP_CPU_AFFINITY:
    ``affinity run`` refuses to pass one on (a one-CPU-per-thread plan replaces it)."""
    env = clean_env(GOMP_CPU_AFFINITY="0-1 junk", LD_LIBRARY_PATH=str(TORCH_LIB))
    r = affinity_run("explicit,proclist=[{0,1},0]", "-t", "2", "--", str(program["torch-libgomp"]), env=env)
    assert r.returncode == 1 and "never returns" in r.stderr and r.stdout == ""
    r = affinity_run("granularity=fine,compact", "-t", "1", "--", str(program["torch-libgomp"]), env=env,
                     timeout=30)
    assert r.returncode == 0 and "env GOMP_CPU_AFFINITY=0" in r.stdout
