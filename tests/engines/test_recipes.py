"""docs/recipes.md, run: every code block of every recipe is read from the page and run
as written, scaled to this machine -- each substitution named below, and each one
required to match, so that a recipe that changes changes its test."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from affinity.cpulist import format_list, parse_list
from affinity.machine.topology import Topology
from affinity.planning.partition import partition

from helpers.cgroups import run_in
from helpers.launch import clean_env, probe_result, write_probe
from helpers.pinprog import LINE, PROGRAM
from helpers.ranks_probe import check_disjoint_placed, local_rank_of, probe_command, read_reports, step_cpus

ROOT = Path(__file__).resolve().parents[2]
RECIPES = (ROOT / "docs" / "recipes.md").read_text()
NODE = Topology.from_system()
CPUS = NODE.allowed
NCORES = len(NODE.cores)
XEON = "synthetic:pack:2 [numa] core:28 pu:2(indexes=2*56:1*2)"  # the recipes' 2-socket node
KNL = "synthetic:pack:1 [numa] core:68 pu:4(indexes=4*68:1*4)"  # 68 cores x 4, c c+68 c+136 c+204
BIN = str(Path(sys.executable).parent)
pytestmark = pytest.mark.skipif(NCORES < 2, reason="the recipes' ranks and instances need two cores")


def blocks(heading: str, lang: str = "bash") -> list[str]:
    """The ``lang`` code blocks of the recipe under ``## heading``."""
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", RECIPES, re.S | re.M)
    assert m, f"no recipe '## {heading}' in docs/recipes.md"
    return re.findall(rf"```{lang}\n(.*?)```", m.group(1), re.S)


def scale(text: str, subs: dict[str, str]) -> str:
    """``text`` with each key replaced by its value; every key must occur."""
    for old, new in subs.items():
        assert old in text, f"the recipe no longer says {old!r}: update its test\n{text}"
        text = text.replace(old, new)
    return text


def env(**extra: str) -> dict[str, str]:
    """The user's shell: this venv's python, affinity and torchrun first on PATH."""
    e = clean_env(**extra)
    e["PATH"] = f"{BIN}:{e.get('PATH', os.defpath)}"
    return e


def bash(script: str, cwd: Path, e: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    r = subprocess.run(["bash", "-e", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       env=e or env())
    assert r.returncode == 0, f"{script}\nrc={r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


# ----------------------------------------------------------- a Slurm of your own

def test_a_one_node_slurm_of_your_own(tmp_path):
    """``make slurm`` / ``make slurm-stop`` as the recipe writes them (issue #40, point 4):
    the documented command starts the tests' one-node Slurm, a job runs on it, and the
    daemons are gone after the stop."""
    from helpers import slurm as slurm_mod

    missing = slurm_mod.missing_tools()
    if missing or os.geteuid() != 0 or shutil.which("make") is None:
        pytest.skip(f"needs root, make and Slurm ({', '.join(missing) or 'installed'})")
    script, = blocks("A one-node Slurm to try these recipes")
    where = tmp_path / "slurm"
    probe = " ".join(write_probe(tmp_path))
    run = scale(script, {"make slurm": f"make --no-print-directory -C {ROOT} SLURM_DIR={where} slurm",
                         "build/slurm": str(where),
                         "--cpus-per-task=2": f"--cpus-per-task={len(CPUS)}",
                         "python train.py": f"{probe} > {tmp_path}/train.json"})
    try:
        r = bash(run, ROOT, env(), timeout=300)
    finally:
        state = where / "state.json"
        left = slurm_mod.Slurm.from_dict(json.loads(state.read_text())) if state.exists() else None
        if left is not None:  # the script failed before its stop: stop it here
            left.stop()
    assert "Slurm is up: node" in r.stdout and "stopped" in r.stdout, r.stdout
    assert left is None  # make slurm-stop removed the state, having ended every daemon
    got = json.loads((tmp_path / "train.json").read_text())
    assert parse_list(got["cpus"]) == CPUS  # the step's CPUs: all of this machine's
    places = re.findall(r"\{([^}]*)\}", got["env"]["OMP_PLACES"])
    assert places == [str(min(c.cpuset)) for c in NODE.cores]  # compact,1,0: one thread per core
    conf = str(next(where.glob("slurm-*/slurm.conf")))
    for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()):  # no daemon of that cluster left
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        assert f"SLURM_CONF={conf}".encode() not in environ.split(b"\0"), pid


# ----------------------------------------------------------------- Slurm, Xeon

def test_slurm_job_on_a_xeon_node(slurm, tmp_path):
    script, = blocks("A Slurm job on a 2-socket Xeon node")
    probe = " ".join(write_probe(tmp_path))
    job = tmp_path / "job.sh"
    job.write_text(scale(script, {"--cpus-per-task=112": f"--cpus-per-task={len(CPUS)}",
                                  "--threads 56": f"--threads {NCORES}",
                                  "source .venv/bin/activate": f"source {BIN}/activate",
                                  "python train.py": f"{probe} > {tmp_path}/train.json"}))
    r = slurm.client("sbatch", "--wait", "-o", str(tmp_path / "job.out"), str(job), env=env())
    assert r.returncode == 0, (tmp_path / "job.out").read_text() + slurm.logs()
    got = json.loads((tmp_path / "train.json").read_text())
    assert parse_list(got["cpus"]) == CPUS  # the process mask: the job's cpuset (respect)
    assert got["policy"] == "local"  # --localalloc
    places = [s for s in re.findall(r"\{([^}]*)\}", got["env"]["OMP_PLACES"])]
    assert places == [str(min(c.cpuset)) for c in NODE.cores]  # one thread per core, in core order
    assert got["env"]["OMP_NUM_THREADS"] == got["env"]["TF_NUM_INTRAOP_THREADS"] == str(NCORES)


PINNED_HARNESS = """
import json, os, sys
import tensorflow as tf
from affinity.binding import registry

def masks():
    out = {}
    for t in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{t}/status") as fh:
            out[t] = next(l.split(":")[1].strip() for l in fh if l.startswith("Cpus_allowed_list"))
    return out

seen = {}
def train():
    tf.linalg.matmul(tf.ones((64, 64)), tf.ones((64, 64)))
    b = registry.active()[-1]
    seen["plan"] = [sorted(c) for c in b.plan.cpusets]
    seen["pins"] = {str(t): sorted(p.cpus) for t, p in b.pins.items()}
    seen["inside"] = masks()
%s
seen["after"] = masks()
json.dump(seen, open(sys.argv[1], "w"))
"""


def test_pinned_inside_the_slurm_job(slurm, tmp_path):
    code, = blocks("A Slurm job on a 2-socket Xeon node", "python")
    (tmp_path / "snippet.py").write_text(PINNED_HARNESS % code)
    r = slurm.client("srun", "-n", "1", f"--cpus-per-task={len(CPUS)}", sys.executable, str(tmp_path / "snippet.py"),
                     str(tmp_path / "seen.json"), env=env())
    assert r.returncode == 0, r.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["plan"] == [[min(c.cpuset)] for c in NODE.cores]  # one thread per core, inside the job
    assert seen["pins"], "TensorFlow's pool threads were pinned"
    for tid, cpus in seen["pins"].items():  # the kernel agrees, inside the block ...
        assert parse_list(seen["inside"][tid]) == frozenset(cpus)
        assert parse_list(seen["after"][tid]) == CPUS  # ... and every thread is put back after it


# ------------------------------------------------------------------------ KNL

def test_knl_node(tmp_path):
    one, two = (b.replace("\\\n", " ") for b in blocks("A Xeon Phi (KNL) node, 68 cores x 4 threads"))
    dry = {"affinity run": f"affinity run --dry-run --topology '{KNL}'"}
    r = bash(scale(one, dry), tmp_path)
    assert "numactl --physcpubind=4-67 --interleave=0 " in r.stdout and "OMP_NUM_THREADS=64" in r.stdout
    assert f"'OMP_PLACES={','.join('{%d}' % c for c in range(4, 68))}'" in r.stdout, r.stdout
    r = bash(scale(two, dry), tmp_path)
    places = [*range(4, 68), *range(72, 136)]  # one thread per core first, then their second threads
    assert f"'OMP_PLACES={','.join('{%d}' % c for c in places)}'" in r.stdout, r.stdout
    probe = " ".join(write_probe(tmp_path))
    got = probe_result(bash(scale(one, {"--threads 64": "--threads 1", "+4-67": "+1-1",
                                        "python infer.py": probe}), tmp_path))
    second = sorted(CPUS)[1]
    assert got["cpus"] == {second} and got["env"]["OMP_NUM_THREADS"] == "1"
    assert got["policy"].startswith("interleave")


# --------------------------------------------------------- container, quota

@pytest.mark.parametrize("scratch_cgroup", ["cpu"], indirect=True)
def test_container_with_a_cpu_quota(scratch_cgroup, tmp_path):
    (scratch_cgroup / "cpu.cfs_period_us").write_text("100000")
    (scratch_cgroup / "cpu.cfs_quota_us").write_text("100000")  # --cpus=1
    dry, real = blocks("A container with a CPU quota")[0].strip().splitlines()
    probe = " ".join(write_probe(tmp_path))
    for line, want in ((dry, "OMP_NUM_THREADS=1"), (real, '"OMP_NUM_THREADS": "1"')):
        cmd = scale(line.split("#")[0].strip(), {"python serve.py": probe})
        r = run_in(scratch_cgroup, "env", f"PATH={BIN}:{os.environ['PATH']}", "bash", "-c", cmd)
        assert r.returncode == 0 and want in r.stdout, r.stdout + r.stderr


# ------------------------------------------------------- multi-instance

def test_multi_instance_inference(tmp_path):
    run, preview = blocks("Multi-instance inference")
    probe = " ".join(write_probe(tmp_path))
    bash(scale(run, {"--instances 4": "--instances 2", "python infer.py": probe}), tmp_path)
    got = [probe_result(subprocess.CompletedProcess([], 0, (tmp_path / "logs" / f"instance-{i}.log").read_text(), ""))
           for i in range(2)]
    assert [g["cpus"] for g in got] == [s.cpus for s in partition(NODE, 2)]
    assert all(g["policy"] == f"bind:{min(s.numa_nodes)}" for g, s in zip(got, partition(NODE, 2)))
    assert [g["env"]["AFFINITY_INSTANCE"] for g in got] == ["0", "1"]
    r = bash(scale(preview, {"node.xml": f"'{XEON}'"}), tmp_path)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("numactl")]
    shares = partition(Topology.load(XEON), 4)
    assert [ln.split()[1:3] for ln in lines] == [[f"--physcpubind={format_list(s.cpus)}",
                                                  f"--membind={format_list(s.numa_nodes)}"] for s in shares]


# ------------------------------------------------------------- ranks

def test_mpi_and_srun_ranks(slurm, omp_lib, tmp_path):
    lines = [ln for b in blocks("Horovod / MPI ranks") for ln in b.strip().splitlines()]
    assert len(lines) == 5
    launchers = {"mpirun ": f"{shutil.which('mpirun.openmpi')} --allow-run-as-root ",
                 "mpiexec.hydra ": f"{shutil.which('mpiexec.hydra')} ", "srun ": "srun "}
    for i, line in enumerate(lines):
        out = tmp_path / f"out{i}"
        probe = " ".join(probe_command(tmp_path, out, "plain", omp_lib))
        launcher = next(k for k in launchers if line.startswith(k))
        cmd = scale(line, {launcher: launchers[launcher], "python train_hvd.py": probe})
        r = bash(cmd, tmp_path, {**env(), **slurm.env})
        shares = check_disjoint_placed(read_reports(out, 2), CPUS)
        if "--norespect" in line:  # srun's binding replaced: the step's cgroup cut between the ranks
            assert "--norespect: starting from the cgroup's cpuset" in r.stderr, r.stderr
            assert shares == [s.cpus for s in partition(NODE.with_allowed(step_cpus(read_reports(out, 2), CPUS)),
                                                        2)], line
        elif "--cpu-bind=cores" in line:  # srun's own binding, followed and said
            assert "planning inside that mask" in r.stderr, r.stderr
        else:  # cut between the ranks: the node (MPI), the step's CPUs (srun)
            assert shares == [s.cpus for s in partition(NODE.with_allowed(step_cpus(read_reports(out, 2), CPUS)),
                                                        2)], line
        if "granularity=fine,compact,1,0" in line:
            assert all(rep.env["KMP_AFFINITY"].startswith("granularity=fine") for rep in read_reports(out, 2))


def test_torchrun(tmp_path):
    line, = blocks("torchrun (DistributedDataParallel on CPUs)")
    out = tmp_path / "out"
    probe = " ".join(probe_command(tmp_path, out, "torch", None))
    bash(scale(line, {"python train_ddp.py": probe}), tmp_path)
    reports = sorted(read_reports(out, 2), key=local_rank_of)
    assert check_disjoint_placed(reports, CPUS) == [s.cpus for s in partition(NODE, 2)]
    for rep, share in zip(reports, partition(NODE, 2)):
        assert rep.extra["all_reduce"] == [3.0] * 4
        assert rep.extra["torch_threads"] == len(share.cores)


def test_where_will_my_ranks_land(tmp_path):
    line, = blocks("Where will my ranks land?")
    r = bash(scale(line, {"node.xml": f"'{XEON}'"}), tmp_path)
    rows = [ln.split() for ln in r.stdout.splitlines()[2:]]
    shares = partition(Topology.load(XEON), 4)
    assert [(row[0], row[1], row[2], row[3], row[5]) for row in rows] == \
        [(str(i), format_list(s.cpus), "14", "14", format_list(s.numa_nodes)) for i, s in enumerate(shares)]


# ------------------------------------------------------ threads created later

def test_threads_a_program_creates_later(tmp_path):
    line, = blocks("Threads a program creates later")
    cc = shutil.which("cc") or shutil.which("gcc")
    (tmp_path / "solver.c").write_text(PROGRAM)
    subprocess.run([cc, "-O1", "-pthread", str(tmp_path / "solver.c"), "-o", str(tmp_path / "solver")], check=True)
    r = bash(scale(line, {"--threads 8": "--threads 2", "./solver": "./solver 2"}), tmp_path)
    got = {int(m.group(2)): parse_list(m.group(4)) for m in map(LINE.match, r.stdout.splitlines()) if m}
    slots = [frozenset({min(c.cpuset)}) for c in NODE.cores[:2]]  # scatter, one thread per core
    assert got == {0: slots[0], 1: slots[0], 2: slots[1]}  # main; skipped (main's); pinned
    assert "thread 1 skipped (AFFINITY_PIN_SKIP)" in r.stderr
