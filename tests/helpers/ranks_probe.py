"""Shared by tests/engines: a probe each rank of a real job runs, and the checks
of what the ranks of one job got.

The probe (``probe_command(outdir, mode)``) runs inside a rank started by srun,
mpirun or torchrun.  Depending on ``mode`` it first places itself
(``apply``: ``affinity.apply(rank="auto")``) or is placed by ``affinity run
--ranks auto`` around it (``plain``); it then starts an OpenMP team (libgomp,
reading the plan's ``OMP_PLACES``; ``torch`` or ``apply+torch``: torch's intra-op
pool and a gloo ``all_reduce`` instead), and reads every thread's mask back from the kernel
(``/proc/self/task/*/status``) while the team is alive.  Each rank writes its own
JSON file (``rank-<pid>.json``): launchers merge the ranks' output streams.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from affinity.cpulist import parse_list

from .ompprog import SOURCE as OMP_SOURCE

#: the variables a rank's file records (launchers', the plan's, torch's)
RECORDED = ("OMPI_", "MPI_LOCAL", "PMI_", "HYDRA_", "SLURM_", "LOCAL_", "RANK", "WORLD_SIZE", "OMP_", "CUDA_", "ZE_",
            "GOMP_", "KMP_AFFINITY", "AFFINITY_", "TF_NUM_")

PROBE = r'''
import ctypes, json, os, sys

out, mode, omp_lib = sys.argv[1], sys.argv[2], sys.argv[3]
# the process mask as the launcher (or affinity run) left it, before an OpenMP runtime loads
# (libgomp pins the initial thread to its first place at load when OMP_PLACES is set)
extra = {"start_cpus": sorted(os.sched_getaffinity(0))}
if "apply" in mode:
    import affinity
    b = affinity.apply(rank="auto", tensorflow=False, blas=False)
    extra["plan"] = [sorted(s) for s in b.plan.cpusets]
    extra["notes"] = list(b.notes)
keep = None
if "torch" in mode:
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(4) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    extra["all_reduce"] = t.tolist()
    extra["world"] = [dist.get_rank(), dist.get_world_size()]
    extra["torch_threads"] = torch.get_num_threads()
    torch.matmul(torch.ones(256, 256), torch.ones(256, 256))  # the intra-op pool's threads start
    omp = []
else:
    lib = ctypes.CDLL(omp_lib)
    tids, masks = (ctypes.c_int * 64)(), (ctypes.c_ulong * 64)()
    n = lib.report(tids, masks, 64)
    omp = [[c for c in range(64) if masks[i] >> c & 1] for i in range(n)]
threads = {}
for tid in os.listdir("/proc/self/task"):
    try:
        with open(f"/proc/self/task/{tid}/status") as fh:
            threads[tid] = next(l.split(":", 1)[1].strip() for l in fh if l.startswith("Cpus_allowed_list"))
    except (OSError, StopIteration):
        pass
cpuset = cpuset_path = None  # the cgroup v1 cpuset: what Slurm's task/cgroup gave the step
try:
    for line in open("/proc/self/cgroup"):
        _, ctrls, path = line.rstrip("\n").split(":", 2)
        if "cpuset" in ctrls.split(","):
            cpuset_path = path
            cpuset = open(f"/sys/fs/cgroup/cpuset{path}/cpuset.cpus").read().strip()
except OSError:
    pass
with open("/proc/self/status") as fh:
    st = dict(l.rstrip("\n").split(":\t", 1) for l in fh if ":\t" in l)
# the memory policy of this thread, from the kernel (get_mempolicy(2): x86_64 239, aarch64 236)
import platform
nr = {"x86_64": 239, "aarch64": 236}.get(platform.machine())
policy = None
if nr is not None:
    libc = ctypes.CDLL(None, use_errno=True)
    pmode, pmask = ctypes.c_int(), (ctypes.c_ulong * 16)()
    if libc.syscall(nr, ctypes.byref(pmode), pmask, ctypes.c_ulong(1024), None, ctypes.c_ulong(0)) == 0:
        names = {0: "default", 1: "preferred", 2: "bind", 3: "interleave", 4: "local"}
        policy = [names.get(pmode.value, str(pmode.value)), [n for n in range(1024) if pmask[n // 64] >> (n % 64) & 1]]
env = {k: v for k, v in os.environ.items() if k.startswith(tuple(sys.argv[4].split(",")))}
if "torch" in mode:
    dist.barrier()
    dist.destroy_process_group()
with open(os.path.join(out, f"rank-{os.getpid()}.json"), "w") as fh:
    json.dump({"pid": os.getpid(), "cpus": st["Cpus_allowed_list"], "mems": st["Mems_allowed_list"],
               "omp": omp, "threads": threads, "env": env, "cpuset": cpuset,
               "cpuset_path": cpuset_path, "mempolicy": policy, **extra}, fh)
'''


def build_omp_lib(dst: Path) -> Path:
    """The libgomp ``report()`` library of :mod:`helpers.ompprog`."""
    (dst / "omp_report.c").write_text(OMP_SOURCE)
    lib = dst / "libompreport.so"
    subprocess.run(["gcc", "-O2", "-fPIC", "-shared", "-fopenmp", str(dst / "omp_report.c"), "-o", str(lib)],
                   check=True, timeout=120)
    return lib


def probe_command(directory: Path, outdir: Path, mode: str, omp_lib: Path | None) -> list[str]:
    """``python probe.py OUTDIR MODE OMPLIB PREFIXES`` (the script written into ``directory``)."""
    script = directory / "ranks_probe.py"
    if not script.exists():
        script.write_text(PROBE)
    outdir.mkdir(parents=True, exist_ok=True)
    return [sys.executable, str(script), str(outdir), mode, str(omp_lib or "-"), ",".join(RECORDED)]


@dataclass
class RankReport:
    pid: int
    cpus: frozenset[int]  #: the process mask
    omp: list[frozenset[int]]  #: the OpenMP team's masks, in thread order
    threads: dict[int, frozenset[int]]  #: every thread's mask, read from the kernel
    env: dict[str, str]
    extra: dict

    @property
    def places(self) -> list[frozenset[int]]:
        """``OMP_PLACES`` as the plan exported it (``{0},{2}``, ``{0,56}``, ``{4:2}``)."""
        out = []
        for body in re.findall(r"\{([^}]*)\}", self.env.get("OMP_PLACES", "")):
            if ":" in body:
                start, length = body.split(":")[:2]
                out.append(frozenset(range(int(start), int(start) + int(length))))
            else:
                out.append(frozenset(int(c) for c in body.split(",")))
        return out


def read_reports(outdir: Path, count: int) -> list[RankReport]:
    files = sorted(outdir.glob("rank-*.json"))
    assert len(files) == count, f"{len(files)} rank reports in {outdir}, expected {count}"
    reports = []
    for f in files:
        d = json.loads(f.read_text())
        reports.append(RankReport(d.pop("pid"), parse_list(d.pop("cpus")),
                                  [frozenset(m) for m in d.pop("omp")],
                                  {int(t): parse_list(m) for t, m in d.pop("threads").items()},
                                  d.pop("env"), d))
    return reports


def step_cpus(reports: list[RankReport], default: frozenset[int]) -> frozenset[int]:
    """The CPUs the job step may use: its cgroup cpuset where task/cgroup made one
    (every rank of a step has the same), else ``default``."""
    sets = {r.extra.get("cpuset") for r in reports}
    assert len(sets) == 1, f"the ranks are in different cpusets: {sets}"
    text = sets.pop()
    return parse_list(text) & default if text else default


def local_rank_of(r: RankReport) -> int:
    for var in ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "LOCAL_RANK", "SLURM_LOCALID"):
        if var in r.env:
            return int(r.env[var])
    raise AssertionError(f"no local rank variable in {sorted(r.env)}")


def check_disjoint_placed(reports: list[RankReport], allowed: frozenset[int]) -> list[frozenset[int]]:
    """Every rank on a share of its own inside ``allowed``, every thread of each rank
    inside its share, each OpenMP thread on its plan's place; the shares in local-rank
    order."""
    reports = sorted(reports, key=local_rank_of)
    shares = [r.cpus for r in reports]
    for i, a in enumerate(shares):
        assert a and a <= allowed, (i, a, allowed)
        for b in shares[i + 1:]:
            assert not a & b, f"ranks overlap: {shares}"
    for r in reports:
        assert all(m <= r.cpus for m in r.threads.values()), (r.cpus, r.threads)
        if r.omp:
            assert r.omp == r.places[:len(r.omp)], (r.omp, r.env.get("OMP_PLACES"))
            assert len(r.omp) == int(r.env["OMP_NUM_THREADS"])
    return shares
