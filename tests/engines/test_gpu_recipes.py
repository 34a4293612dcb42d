"""docs/gpu.md's recipes, run: each code block read from the page and run as written,
scaled to this machine (each substitution named, and required to match), under the
real launcher -- torchrun, Slurm's srun with GPUs in its gres.conf, Open MPI, MPICH's
Hydra -- with the GPUs described in a copy of ``/sys`` beside this machine's CPUs
(``AFFINITY_GPU_SYSFS_ROOT``).  Every rank's process mask, threads and memory policy
are read back from the kernel and compared with the one decision
(:func:`affinity.planning.gpus.gpu_binding` of the rank's own environment).  Also
``affinity show`` and ``show --ranks`` naming each rank's GPU, live."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from affinity.cpulist import format_list, parse_list
from affinity.machine.gpus import read_pci_gpus
from affinity.machine.topology import Topology
from affinity.planning.gpus import gpu_binding
from affinity.record import replace
from affinity.tools.cli import main

from helpers.gpu_tree import PVC, write_gpus
from helpers.launch import clean_env
from helpers.ranks_probe import local_rank_of, probe_command, read_reports
from helpers.slurm import GPUS
from helpers.sysfs_tree import write_tree

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "gpu.md").read_text()
NODE = Topology.from_system()
CPUS = NODE.allowed
NODE0 = NODE.numa_nodes[0].os_index if NODE.numa_nodes else 0
BIN = str(Path(sys.executable).parent)
TORCHRUN = f"{sys.executable} -m torch.distributed.run "  # (the venv's torchrun script may name another python)
OPENMPI = shutil.which("mpirun.openmpi")
HYDRA = shutil.which("mpiexec.hydra")
BUSES = [("0000:17:00.0", NODE0), ("0000:65:00.0", NODE0)]  # two NVIDIA GPUs on this machine's first node
pytestmark = pytest.mark.skipif(len(NODE.cores) < 2, reason="two ranks need two cores")


def blocks(heading: str, lang: str = "bash") -> list[str]:
    """The ``lang`` code blocks under ``### heading`` of docs/gpu.md."""
    m = re.search(rf"^### {re.escape(heading)}\n(.*?)(?=^##+ |\Z)", DOC, re.S | re.M)
    assert m, f"no recipe '### {heading}' in docs/gpu.md"
    return re.findall(rf"```{lang}\n(.*?)```", m.group(1), re.S)


def scale(text: str, subs: dict[str, str]) -> str:
    """``text`` with each key replaced by its value; every key must occur."""
    for old, new in subs.items():
        assert old in text, f"the recipe no longer says {old!r}: update its test\n{text}"
        text = text.replace(old, new)
    return text


def shell_env(tree: Path, **extra: str) -> dict[str, str]:
    """The user's shell on a GPU node: this venv first on PATH, the GPUs of ``tree``."""
    e = clean_env(AFFINITY_GPU_SYSFS_ROOT=str(tree), **extra)
    e["PATH"] = f"{BIN}:{e.get('PATH', os.defpath)}"
    return e


def bash(script: str, cwd: Path, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
    r = subprocess.run(["bash", "-e", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, f"{script}\nrc={r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def with_gpus(tree: Path) -> Topology:
    """This machine's CPUs with the GPUs of ``tree``: what ``affinity`` saw in the ranks."""
    return replace(NODE, gpus=read_pci_gpus(str(tree)))


def check_next_to_gpus(reports, tree: Path, mode: str) -> list:
    """Each rank as the decision gives it from its own environment: its process mask (as
    its program started), every thread inside it, memory bound to its GPU's node; the
    decisions returned."""
    wants = []
    for rep in sorted(reports, key=local_rank_of):
        r = local_rank_of(rep)
        want = gpu_binding(with_gpus(tree), mode, environ=rep.env, local_rank=r, local_size=len(reports))
        assert frozenset(rep.extra["start_cpus"]) == want.cpus, (r, rep.extra["start_cpus"], want)
        assert all(m <= want.cpus for m in rep.threads.values()), rep.threads
        assert rep.extra["mempolicy"] == ["bind", sorted(want.mem_nodes)]
        wants.append(want)
    return wants


@pytest.fixture
def two_gpus(tmp_path):
    return write_gpus(tmp_path / "sysfs", BUSES, NODE.cpuset)


# ------------------------------------------------------------------ torchrun

def test_torchrun(tmp_path, two_gpus):
    line, = blocks("torchrun")
    out = tmp_path / "out"
    probe = " ".join(probe_command(tmp_path, out, "torch", None))
    bash(scale(line, {"torchrun ": TORCHRUN, "--nproc-per-node 8": "--nproc-per-node 2", "python train.py": probe}),
         tmp_path, shell_env(two_gpus))
    reports = read_reports(out, 2)
    wants = check_next_to_gpus(reports, two_gpus, "exclusive")
    assert [w.device.name for w in wants] == [bus for bus, _ in BUSES]  # local rank r on GPU r
    assert [w.cpus for w in wants] == [c.cpuset & CPUS for c in NODE.cores[:2]]  # two GPUs, a core each
    for rep, want in zip(sorted(reports, key=local_rank_of), wants):
        assert rep.extra["all_reduce"] == [3.0] * 4
        assert rep.extra["torch_threads"] == want.threads  # the pool sized to its cores, not torchrun's 1


# in each rank: the recipe between what NCCL 2.29's init does to the calling thread (done here after
# gloo's init: the CPU build has no NCCL) and a read-back; rank 0 asks `affinity show` about itself
# and `affinity show --ranks` about the job while the thread is moved
APPLY_HARNESS = r'''
import json, os, subprocess, sys
import torch
import torch.distributed

_init = torch.distributed.init_process_group
seen = {}

def init_as_nccl_2_29(*args, **kwargs):
    _init(*args, **kwargs)
    os.sched_setaffinity(0, GPU_NODE_CPUS)  # NCCL 2.29.2-2.29.7 leave the caller on its GPU's node
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 0:
        show = [sys.executable, "-m", "affinity", "show"]
        seen["show"] = subprocess.run(show + [str(os.getpid())], capture_output=True, text=True).stdout
        seen["ranks"] = json.loads(subprocess.run(show + ["--ranks", str(os.getpid()), "--json"],
                                                  capture_output=True, text=True).stdout)
    torch.distributed.barrier()

torch.distributed.init_process_group = init_as_nccl_2_29
%s
torch.matmul(torch.ones(256, 256), torch.ones(256, 256))  # the intra-op pool's threads start
masks = {}
for tid in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{tid}/status") as fh:
        masks[tid] = next(l.split(":", 1)[1].strip() for l in fh if l.startswith("Cpus_allowed_list"))
torch.distributed.barrier()
json.dump({"rank": int(os.environ["LOCAL_RANK"]), "main": sorted(os.sched_getaffinity(0)), "masks": masks,
           "pins": {str(t): sorted(p.cpus) for t, p in b.pins.items()}, "gpu": b.decision.placements[0].gpu.to_dict(),
           "torch_threads": torch.get_num_threads(), **seen},
          open(os.path.join(sys.argv[1], f"rank-{os.getpid()}.json"), "w"))
torch.distributed.destroy_process_group()
'''


def test_torchrun_bound_inside_the_script(tmp_path, two_gpus):
    code, = blocks("torchrun, bound inside the script", "python")
    line, = blocks("torchrun, bound inside the script")
    script = APPLY_HARNESS.replace("GPU_NODE_CPUS", repr(set(NODE.numa_nodes[0].cpuset & CPUS) if NODE.numa_nodes
                                                        else set(CPUS)))
    (tmp_path / "train.py").write_text(script % scale(code, {'"nccl"': '"gloo"'}))
    out = tmp_path / "out"
    out.mkdir()
    bash(scale(line, {"torchrun ": TORCHRUN, "--nproc-per-node 8": "--nproc-per-node 2",
                      "train.py": f"train.py {out}"}), tmp_path, shell_env(two_gpus))
    got = sorted((json.loads(f.read_text()) for f in out.glob("rank-*.json")), key=lambda g: g["rank"])
    assert [g["rank"] for g in got] == [0, 1]
    for g in got:
        want = gpu_binding(with_gpus(two_gpus), "exclusive", local_rank=g["rank"], local_size=2)
        assert (g["gpu"]["gpu"], g["gpu"]["cpus"]) == (want.device.name, want.to_dict()["cpus"])
        # after reapply(): the calling thread back on the rank's CPUs, every pinned thread on its pin
        assert frozenset(g["main"]) == want.cpus
        for tid, cpus in g["pins"].items():  # (a thread pinned once may have ended)
            assert tid not in g["masks"] or parse_list(g["masks"][tid]) == frozenset(cpus), (tid, g)
        assert all(parse_list(m) <= want.cpus for m in g["masks"].values()), g["masks"]
        assert g["torch_threads"] == want.threads
    # while the thread was moved: another process's view of rank 0 names its GPU and the thread that moved
    show = got[0]["show"]
    assert f"rank 0: GPU {BUSES[0][0]} (device 0)" in show, show
    assert "thread(s) moved since they were pinned" in show and "MISMATCH" in show, show
    (job, ranks), = got[0]["ranks"].items()
    assert job.startswith("torchrun TORCHELASTIC_RUN_ID=")
    assert [(r["rank"], r["gpu"]["gpu"]) for r in sorted(ranks, key=lambda r: r["rank"])] == [
        (0, BUSES[0][0]), (1, BUSES[1][0])]
    assert all(r["gpu"]["how"].startswith("its binding (apply(gpu=...)") for r in ranks)


# ------------------------------------------------------------------ Slurm

def test_slurm_one_task_per_gpu(slurm, tmp_path, two_gpus, omp_lib):
    assert GPUS == len(BUSES)
    script, = blocks("Slurm, one task per GPU")
    out = tmp_path / "out"
    probe = " ".join(probe_command(tmp_path, out, "plain", omp_lib))
    (tmp_path / "job.sh").write_text(scale(script, {"--ntasks-per-node=8": "--ntasks-per-node=2",
                                                   "python train.py": probe}))
    r = slurm.client("sbatch", "--wait", "-o", str(tmp_path / "job.out"), str(tmp_path / "job.sh"),
                     env=shell_env(two_gpus))
    assert r.returncode == 0, (tmp_path / "job.out").read_text() + slurm.logs()
    reports = read_reports(out, 2)
    for rep in reports:  # what srun set, as a GPU node's Slurm sets it
        assert rep.env["SLURM_STEP_GPUS"] == rep.env["CUDA_VISIBLE_DEVICES"] == str(local_rank_of(rep))
        assert (rep.env["SLURM_JOB_GPUS"], rep.env["SLURM_GPUS_ON_NODE"]) == ("0,1", "2")
    wants = check_next_to_gpus(reports, two_gpus, "exclusive")
    assert [w.device.name for w in wants] == [bus for bus, _ in BUSES]
    # each task sees its own GPU only, and the node's cores are divided between the step's two
    assert [w.cpus for w in wants] == [c.cpuset & CPUS for c in NODE.cores[:2]]
    assert all(w.ordinal == 0 for w in wants)


# ------------------------------------------------------------------ MPI

@pytest.mark.skipif(OPENMPI is None or HYDRA is None, reason="no Open MPI or MPICH (make sysdeps installs both)")
def test_mpi(tmp_path, two_gpus, omp_lib):
    lines = [ln for b in blocks("MPI") for ln in b.strip().splitlines()]
    assert [ln.split()[0] for ln in lines] == ["mpirun", "mpiexec"]
    launchers = {"mpirun -np 8 ": f"{OPENMPI} --allow-run-as-root -np 2 ", "mpiexec -n 8 ": f"{HYDRA} -n 2 "}
    for i, line in enumerate(lines):
        out = tmp_path / f"out{i}"
        probe = " ".join(probe_command(tmp_path, out, "plain", omp_lib))
        launcher = next(k for k in launchers if line.startswith(k))
        bash(scale(line, {launcher: launchers[launcher], "python train.py": probe}), tmp_path, shell_env(two_gpus))
        reports = read_reports(out, 2)
        wants = check_next_to_gpus(reports, two_gpus, "exclusive")
        assert [w.device.name for w in wants] == [bus for bus, _ in BUSES], line
        assert [w.cpus for w in wants] == [c.cpuset & CPUS for c in NODE.cores[:2]], line
        for rep in reports:  # the libgomp team on the rank's cores
            assert rep.omp and all(m <= rep.cpus for m in rep.omp)


# ------------------------------------------------------------------ Aurora-style tiles

@pytest.mark.skipif(HYDRA is None, reason="no MPICH (make sysdeps installs it)")
def test_aurora_style_tiles(tmp_path, omp_lib):
    """Under Hydra (no PALS here), one Intel GPU of two tiles beside this machine's CPUs:
    each rank's ZE_AFFINITY_MASK is its tile, its CPUs its tile's socket, 1 thread."""
    script, = blocks("Aurora-style tiles")
    tree = write_gpus(tmp_path / "sysfs", [("0000:18:00.0", NODE0)], NODE.cpuset, PVC, tiles=2)
    out = tmp_path / "out"
    probe = " ".join(probe_command(tmp_path, out, "plain", omp_lib))
    r = bash(scale(script, {"mpiexec -n 12 --ppn 12 ": f"{HYDRA} -n 2 ", "$PALS_LOCAL_RANKID": "$MPI_LOCALRANKID",
                            "--threads 8": "--threads 1", "python train.py": probe}), tmp_path, shell_env(tree))
    reports = read_reports(out, 2)
    wants = check_next_to_gpus(reports, tree, "socket")
    for rep, want in zip(sorted(reports, key=local_rank_of), wants):
        tile = local_rank_of(rep)
        assert rep.env["ZE_AFFINITY_MASK"] == str(tile) and rep.env["ZE_FLAT_DEVICE_HIERARCHY"] == "FLAT"
        assert (want.device.name, want.ordinal) == (f"0000:18:00.0 tile {tile}", 0)
        assert want.cpus == NODE.package_of(min(CPUS)).cpuset & CPUS  # the socket's CPUs
        assert rep.env["OMP_NUM_THREADS"] == "1" and len(rep.omp) == 1
        assert f"GPU 0000:18:00.0 tile {tile} (device 0)" in r.stderr, r.stderr


def test_aurora_like_node_before_the_job(ram_path, capsys, monkeypatch):
    """The two previews of the page, on the described node make_gpu_data.py writes."""
    sys.path.insert(0, str(ROOT / "tests" / "data" / "gpu"))
    try:
        from make_gpu_data import AURORA_LIKE  # noqa: PLC0415 - the data script, not a module of the suite
    finally:
        sys.path.remove(str(ROOT / "tests" / "data" / "gpu"))
    write_tree(AURORA_LIKE, str(ram_path / "aurora-like"))
    monkeypatch.chdir(ram_path)
    monkeypatch.setenv("ZE_FLAT_DEVICE_HIERARCHY", "FLAT")
    for name in ("ZE_AFFINITY_MASK", "CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        monkeypatch.delenv(name, raising=False)
    shown = blocks("Aurora-style tiles", "console")
    assert len(shown) == 2
    for block in shown:
        command, *want = block.strip().splitlines()
        argv = command.removeprefix("$ ZE_FLAT_DEVICE_HIERARCHY=FLAT affinity ").split()
        assert main(argv) == 0
        assert capsys.readouterr().out.splitlines() == want, command


# ------------------------------------------------------------------ show --ranks, live

WAITER = r"""
import os, sys, time
d = sys.argv[1]
open(os.path.join(d, f"ready-{os.getpid()}"), "w").close()
end = time.monotonic() + 120
while not os.path.exists(os.path.join(d, "go")) and time.monotonic() < end:
    time.sleep(0.02)
"""


def show_ranks_of(argv: list[str], tmp_path: Path, env: dict[str, str]) -> dict:
    """``affinity show --ranks PID --json`` of a job of 2 waiting ranks."""
    tmp_path.mkdir()
    (tmp_path / "waiter.py").write_text(WAITER)
    job = subprocess.Popen([*argv, sys.executable, str(tmp_path / "waiter.py"), str(tmp_path)], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        while len(list(tmp_path.glob("ready-*"))) < 2:
            assert job.poll() is None, job.stdout.read()
            time.sleep(0.02)
        pid = next(tmp_path.glob("ready-*")).name.split("-")[1]
        r = subprocess.run([sys.executable, "-m", "affinity", "show", "--ranks", pid, "--json"], capture_output=True,
                           text=True, timeout=120, env=env)
    finally:
        (tmp_path / "go").touch()
        job.communicate(timeout=120)
    (_, ranks), = json.loads(r.stdout).items()
    return {x["rank"]: x for x in ranks}


@pytest.mark.skipif(HYDRA is None, reason="no MPICH (make sysdeps installs it)")
def test_show_ranks_names_each_ranks_gpu_and_the_threads_far_from_it(tmp_path, two_gpus):
    """Ranks bound by affinity run: each on its GPU's CPUs.  Ranks MPICH left on every CPU,
    GPUs whose firmware names no node and whose local CPUs are one each: the CPUs not
    next to each rank's GPU are said."""
    env = shell_env(two_gpus)
    bound = show_ranks_of([HYDRA, "-n", "2", sys.executable, "-m", "affinity", "run", "--ranks", "auto",
                           "--gpu-bind", "exclusive", "--"], tmp_path / "bound", env)
    for r, (bus, _) in enumerate(BUSES):
        assert bound[r]["gpu"] == {"gpu": bus, "gpu_numa_node": NODE0, "far": None,
                                   "how": f"every NVIDIA GPU visible: device {r} of local rank {r}"}
    one_each = [(bus, -1, NODE.cores[i].cpuset & CPUS) for i, (bus, _) in enumerate(BUSES)]
    tree = write_gpus(tmp_path / "nonuma", one_each, NODE.cpuset)
    loose = show_ranks_of([HYDRA, "-n", "2"], tmp_path / "loose", shell_env(tree))
    for r, (bus, _, near) in enumerate(one_each):
        far = CPUS - near
        assert loose[r]["gpu"]["gpu"] == bus and loose[r]["gpu"]["gpu_numa_node"] == -1
        assert loose[r]["gpu"]["far"] == (f"cpu{'s' if len(far) > 1 else ''} {format_list(far)} "
                                          f"{'are' if len(far) > 1 else 'is'} not next to GPU {bus} (its local "
                                          f"CPUs: cpus {format_list(near)})"), loose[r]
