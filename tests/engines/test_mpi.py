"""Ranks under real MPI launchers: Open MPI's mpirun (``mpirun.openmpi``: its own
binding, ``--bind-to none``, ``--map-by``, a rankfile) and MPICH's (``mpirun.mpich``,
Hydra: no binding by default, ``-bind-to user:``), with ``affinity run --ranks auto``
and with ``affinity.apply(rank="auto")`` inside the ranks.  Each launcher is called by
its own path: the two packages fight over ``mpirun`` through update-alternatives."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys

import pytest

from affinity.cpulist import format_list
from affinity.machine.topology import Topology
from affinity.planning.partition import partition

from helpers.launch import clean_env
from helpers.ranks_probe import check_disjoint_placed, local_rank_of, probe_command, read_reports

AFFINITY_RUN = (sys.executable, "-m", "affinity", "run")
NODE = Topology.from_system()
CPUS = NODE.allowed
OPENMPI = shutil.which("mpirun.openmpi")
MPICH = shutil.which("mpirun.mpich")
# the first PU of each of the first two cores, in reverse: a placement the partition would not make
REVERSED = [min(c.cpuset) for c in reversed(NODE.cores[:2])]
pytestmark = pytest.mark.skipif(len(NODE.cores) < 2, reason="two ranks need two cores")
needs_openmpi = pytest.mark.skipif(OPENMPI is None, reason="no Open MPI (make sysdeps installs openmpi-bin as root)")
needs_mpich = pytest.mark.skipif(MPICH is None, reason="no MPICH (make sysdeps installs mpich as root)")


def launch(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env or clean_env())
    assert r.returncode == 0, f"{' '.join(argv)}: rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def as_root_flags(how: str) -> tuple[list[str], dict[str, str]]:
    """Open MPI refuses root unless told: the flag, or its two variables."""
    if how == "flag":
        return ["--allow-run-as-root"], clean_env()
    return [], clean_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


@needs_openmpi
@pytest.mark.parametrize("root", ["flag", "variables"])
def test_openmpi_bind_to_none_ranks_cut_the_node(tmp_path, omp_lib, root):
    flags, env = as_root_flags(root)
    out = tmp_path / "out"
    r = launch([OPENMPI, *flags, "-np", "2", "--bind-to", "none", *AFFINITY_RUN, "--ranks", "auto", "-v", "--",
                *probe_command(tmp_path, out, "plain", omp_lib)], env)
    shares = check_disjoint_placed(read_reports(out, 2), CPUS)
    assert shares == [s.cpus for s in partition(NODE, 2)]
    assert "Open MPI (OMPI_COMM_WORLD_LOCAL_RANK=" in r.stderr and "bound local rank" not in r.stderr


@needs_openmpi
@pytest.mark.parametrize("how", ["default", "--map-by core --bind-to core", "rankfile"])
def test_openmpi_own_binding_is_followed_and_said(tmp_path, omp_lib, how):
    out = tmp_path / "out"
    if how == "rankfile":  # rank 0 on the second core, rank 1 on the first
        rf = tmp_path / "rankfile"
        rf.write_text("".join(f"rank {i}={socket.gethostname()} slot={c}\n" for i, c in enumerate(REVERSED)))
        opts = ["--rankfile", str(rf)]
    else:
        opts = [] if how == "default" else how.split()
    r = launch([OPENMPI, "--allow-run-as-root", "-np", "2", *opts, *AFFINITY_RUN, "--ranks", "auto", "--",
                *probe_command(tmp_path, out, "plain", omp_lib)])
    reports = sorted(read_reports(out, 2), key=local_rank_of)
    shares = check_disjoint_placed(reports, CPUS)
    for i, (rep, share) in enumerate(zip(reports, shares)):
        assert rep.env["OMPI_MCA_orte_bound_at_launch"] == "1" and len(share) < len(CPUS)
        assert (f"affinity run: Open MPI bound local rank {i} of 2 to cpus {format_list(share)} "
                f"(OMPI_MCA_orte_bound_at_launch=1): planning inside that mask" in r.stderr), r.stderr
    if how == "rankfile":
        assert [min(s) for s in shares] == REVERSED


@needs_openmpi
def test_openmpi_binding_to_the_whole_node_is_cut_between_the_ranks(tmp_path, omp_lib):
    if len(NODE.packages) != 1:
        pytest.skip("--bind-to socket gives each rank the whole node only on a one-socket machine")
    out = tmp_path / "out"
    r = launch([OPENMPI, "--allow-run-as-root", "-np", "2", "--bind-to", "socket", *AFFINITY_RUN, "--ranks",
                "auto", "--", *probe_command(tmp_path, out, "plain", omp_lib)])
    shares = check_disjoint_placed(read_reports(out, 2), CPUS)
    assert shares == [s.cpus for s in partition(NODE, 2)]
    assert "all the CPUs the ranks have: cut between the 2 ranks" in r.stderr, r.stderr


@needs_openmpi
def test_openmpi_norespect_replaces_its_binding_and_says_which(tmp_path, omp_lib):
    """Open MPI binds each rank to a core; --norespect starts from the cgroup's cpuset
    and cuts it as if unbound, and says which binding it replaced, with that binding's
    own CPUs (it said 'Open MPI bound local rank 0 of 2 to cpus 0-1': HPC audit F5)."""
    out = tmp_path / "out"
    r = launch([OPENMPI, "--allow-run-as-root", "-np", "2", *AFFINITY_RUN, "--ranks", "auto", "--norespect", "--",
                *probe_command(tmp_path, out, "plain", omp_lib)])
    reports = sorted(read_reports(out, 2), key=local_rank_of)
    shares = check_disjoint_placed(reports, CPUS)
    assert shares == [s.cpus for s in partition(NODE, 2)]
    assert "bound local rank" not in r.stderr, r.stderr
    for i in range(2):
        assert (f"--norespect: starting from the cgroup's cpuset {format_list(CPUS)} in place of the binding "
                f"Open MPI gave local rank {i} of 2 (") in r.stderr, r.stderr


@needs_openmpi
def test_openmpi_unbound_ranks_without_ranks_are_warned(tmp_path, omp_lib):
    """mpirun --bind-to none without --ranks: each rank plans on the whole node, as asked,
    and each is told once that --ranks auto gives it a share of its own (HPC audit F11)."""
    r = launch([OPENMPI, "--allow-run-as-root", "-np", "2", "--bind-to", "none", *AFFINITY_RUN, "--", "true"])
    for i in range(2):
        assert r.stderr.count(f"this process is local rank {i} of 2 on this node") == 1, r.stderr
    assert r.stderr.count("--ranks auto gives each a disjoint share") == 2, r.stderr


@needs_mpich
@pytest.mark.parametrize("bind", [None, "user"])
def test_mpich_ranks_auto(tmp_path, omp_lib, bind):
    out = tmp_path / "out"
    opts = ["-bind-to", "user:" + ",".join(map(str, REVERSED))] if bind else []
    r = launch([MPICH, "-np", "2", *opts, *AFFINITY_RUN, "--ranks", "auto", "-v", "--",
                *probe_command(tmp_path, out, "plain", omp_lib)])
    shares = check_disjoint_placed(read_reports(out, 2), CPUS)
    if bind is None:  # Hydra binds nothing by default: the ranks cut the node
        assert shares == [s.cpus for s in partition(NODE, 2)]
    else:  # Hydra's user binding, in reverse, followed
        assert [min(s) for s in shares] == REVERSED
        assert "(HYDRA_USER_PROVIDED_BINDING=1): planning inside that mask" in r.stderr, r.stderr


@pytest.mark.parametrize("launcher", [
    pytest.param("openmpi", marks=needs_openmpi), pytest.param("mpich", marks=needs_mpich)])
def test_apply_rank_auto_inside_mpi_ranks(tmp_path, omp_lib, launcher):
    out = tmp_path / "out"
    argv = ([OPENMPI, "--allow-run-as-root", "--bind-to", "none"] if launcher == "openmpi" else [MPICH])
    launch([*argv, "-np", "2", *probe_command(tmp_path, out, "apply", omp_lib)])
    reports = sorted(read_reports(out, 2), key=local_rank_of)
    plans = [frozenset().union(*map(frozenset, rep.extra["plan"])) for rep in reports]
    assert plans == [s.cpus for s in partition(NODE, 2)]
    for rep, plan in zip(reports, plans):
        assert all(m <= plan for m in rep.threads.values()), (plan, rep.threads)
        assert rep.omp == rep.places[:len(rep.omp)] and frozenset().union(*rep.omp) <= plan
