"""Local ranks from launcher variables (and from a real mpirun), and the pure
partition of machines we do not have into disjoint shares."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from affinity.errors import PlanError
from affinity.binding.launchvars import (job_of, launcher_binding, local_rank, parse_rank, slurm_allocation,
                                         slurm_domain_cpus, slurm_step)
from affinity.binding.launchvars import read_job
from affinity.planning.decide import Request, Situation, decide, team_environ
from affinity.planning.launchers import LauncherBinding, LocalRank
from affinity.planning.partition import partition, place_rank, rank_share
from affinity.machine.topology import Topology

from helpers import golden_dir

GOLDEN = golden_dir()
XEON = "pack:2 [numa] core:28 pu:2(indexes=2*56:1*2)"  # 2x28x2, siblings i and i+56
FOUR_SOCKET = "pack:4 [numa] core:8 pu:2(indexes=2*32:1*2)"
SNC = "pack:2 group:2 [numa] core:6 pu:2(indexes=2*24:1*2)"  # sub-NUMA clustering: 2 nodes per package
KNL = "pack:1 group:4 [numa] [numa] core:17 pu:4(indexes=4*68:1*4)"  # SNC-4 flat: DDR + MCDRAM per quadrant


def cpus(*ranges: tuple[int, int]) -> frozenset[int]:
    return frozenset(c for a, b in ranges for c in range(a, b + 1))


# ---------------------------------------------------------------- detection

@pytest.mark.parametrize("env,want", [
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, (1, 4, "Open MPI")),
    ({"MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2", "PMI_RANK": "6"}, (0, 2, "MPICH")),
    ({"MV2_COMM_WORLD_LOCAL_RANK": "3", "MV2_COMM_WORLD_LOCAL_SIZE": "8"}, (3, 8, "MVAPICH2")),
    ({"PMI_LOCAL_RANK": "2", "PMI_LOCAL_SIZE": "3"}, (2, 3, "Cray PMI")),
    ({"PALS_LOCAL_RANKID": "7", "PALS_LOCAL_SIZE": "12", "PALS_RANKID": "19"}, (7, 12, "HPE Cray PALS")),
    ({"LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "8", "RANK": "13"}, (5, 8, "torchrun")),
    ({"SLURM_LOCALID": "1", "SLURM_NODEID": "2", "SLURM_STEP_TASKS_PER_NODE": "4(x2),3"},
     (1, 3, "Slurm srun")),
    ({"SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "2"}, (0, 2, "Slurm srun")),
    ({"AFFINITY_INSTANCE": "1", "AFFINITY_NUM_INSTANCES": "2"}, (1, 2, "affinity run --instances")),
])
def test_each_launcher(env, want):
    r = local_rank(env)
    assert (r.rank, r.size) == want[:2] and r.source.startswith(want[2])


def test_an_instance_of_affinity_run_is_a_bound_rank():
    """``affinity run --instances K`` binds each instance to its share and exports its
    number: ``apply(rank="auto")`` inside one plans inside that share (the tuner prints
    such a call for a split best; it used to fail: "no launcher variables found")."""
    xeon = Topology.from_synthetic(XEON)
    env = {"AFFINITY_INSTANCE": "1", "AFFINITY_NUM_INSTANCES": "2"}
    r = local_rank(env)
    b = launcher_binding(env, r)
    assert b is not None and b.launcher == "affinity run --instances"
    second = partition(xeon, 2)[1].cpus  # what affinity run gave instance 1
    share, said = place_rank(xeon.with_allowed(second), r, b)
    assert share.cpus == second and "planning inside that mask" in said


def test_precedence_and_absence():
    # mpirun inside a Slurm allocation: the MPI launcher's variables win
    env = {"SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "1",
           "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    assert (local_rank(env).rank, local_rank(env).size) == (1, 2)
    # torchrun under srun (one srun task per node): torchrun's are the local ones
    env = {"SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "1", "LOCAL_RANK": "3",
           "LOCAL_WORLD_SIZE": "4"}
    assert local_rank(env).source.startswith("torchrun")
    # a batch script (SLURM_LOCALID but no step) is one process, not a rank
    assert local_rank({"SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "4"}) is None
    assert local_rank({}) is None


def test_malformed_variables_are_named():
    with pytest.raises(PlanError, match="OMPI_COMM_WORLD_LOCAL_RANK='x' is not"):
        local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "x", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    with pytest.raises(PlanError, match=r"local rank 2 of 2 is not a valid rank \(Open MPI"):
        local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    with pytest.raises(PlanError, match="cannot read '2\\(y3\\)'"):
        local_rank({"SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "2(y3)"})
    with pytest.raises(PlanError, match="SLURM_NODEID=3 but .* lists 2 nodes"):
        local_rank({"SLURM_LOCALID": "0", "SLURM_NODEID": "3", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"})


def test_parse_rank():
    assert parse_rank("1/4", {}) == LocalRank(1, 4, "--ranks 1/4")
    assert parse_rank("auto", {"MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}).rank == 1
    with pytest.raises(PlanError, match="no launcher variables found .*OMPI_COMM_WORLD_LOCAL_RANK"):
        parse_rank("auto", {})
    with pytest.raises(PlanError, match="expected 'auto' or RANK/SIZE"):
        parse_rank("one", {})


# each process writes its own file: mpirun merges the processes' stdout in chunks, and two
# lines have come out as one
PROBE = ("import json, os; from affinity.binding.launchvars import local_rank; r = local_rank(os.environ); "
         "open(os.path.join(os.environ['RANK_OUT'], str(os.getpid())), 'w')"
         ".write(json.dumps([r.rank, r.size, r.source]))")


MPIRUN = shutil.which("mpirun.mpich") or shutil.which("mpirun")


@pytest.mark.skipif(MPIRUN is None,
                    reason="no MPI launcher installed (make sysdeps installs MPICH when run as root)")
def test_a_real_mpirun_gives_each_process_its_local_rank(tmp_path):
    r = subprocess.run([MPIRUN, "-np", "2", sys.executable, "-c", PROBE], capture_output=True,
                       text=True, timeout=120,
                       env={**__import__("os").environ, "OMPI_ALLOW_RUN_AS_ROOT": "1",
                            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "RANK_OUT": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    got = sorted(json.loads(f.read_text()) for f in tmp_path.iterdir())
    assert [(g[0], g[1]) for g in got] == [(0, 2), (1, 2)]
    assert all(g[2].startswith(("MPICH", "Open MPI")) for g in got)


# ---------------------------------------------------------------- partition

def check_disjoint(topo: Topology, shares) -> None:
    seen: set[int] = set()
    for s in shares:
        assert s.cpus, s
        assert s.cpus <= topo.allowed
        assert not (s.cpus & seen), "shares overlap"
        seen |= s.cpus


def test_xeon_two_instances_one_socket_each_with_their_siblings():
    t = Topology.from_synthetic(XEON)
    a, b = partition(t, 2)
    assert a.cpus == cpus((0, 27), (56, 83)) and a.numa_nodes == {0}
    assert b.cpus == cpus((28, 55), (84, 111)) and b.numa_nodes == {1}  # never all on node 0
    assert len(a.cores) == len(b.cores) == 28
    four = partition(t, 4)
    assert [s.cpus for s in four] == [cpus((0, 13), (56, 69)), cpus((14, 27), (70, 83)),
                                      cpus((28, 41), (84, 97)), cpus((42, 55), (98, 111))]
    assert [s.numa_nodes for s in four] == [{0}, {0}, {1}, {1}]


def test_xeon_cores_per_instance_fills_node_by_node():
    t = Topology.from_synthetic(XEON)
    shares = partition(t, 4, 10)
    assert [len(s.cores) for s in shares] == [10] * 4
    assert [s.numa_nodes for s in shares] == [{0}, {0}, {1}, {1}]
    assert shares[0].cpus == cpus((0, 9), (56, 65)) and shares[2].cpus == cpus((28, 37), (84, 93))
    # 3 shares of 18 cores: a node holds only one; the third, from both nodes' leftovers, comes last
    three = partition(t, 3, 18)
    check_disjoint(t, three)
    assert [len(s.cores) for s in three] == [18, 18, 18]
    assert [s.numa_nodes for s in three] == [{0}, {1}, {0, 1}]
    with pytest.raises(PlanError, match="3 shares of 19 cores need 57 cores, but only 56 are allowed"):
        partition(t, 3, 19)


def test_four_sockets_fewer_shares_than_nodes_take_whole_neighbouring_nodes():
    t = Topology.from_synthetic(FOUR_SOCKET)
    a, b = partition(t, 2)
    assert a.numa_nodes == {0, 1} and b.numa_nodes == {2, 3}
    three = partition(t, 3)
    assert [s.numa_nodes for s in three] == [{0, 1}, {2}, {3}]
    eight = partition(t, 8)
    assert [s.numa_nodes for s in eight] == [{0}, {0}, {1}, {1}, {2}, {2}, {3}, {3}]
    assert all(len(s.cores) == 4 and len(s.cpus) == 8 for s in eight)
    # two shares of 4 cores: one per half of the machine, not both on node 0
    assert [s.numa_nodes for s in partition(t, 2, 4)] == [{0}, {2}]


def test_snc_nodes_inside_packages():
    t = Topology.from_synthetic(SNC)
    assert len(t.numa_nodes) == 4
    shares = partition(t, 4)
    assert [s.numa_nodes for s in shares] == [{0}, {1}, {2}, {3}]
    assert all(len(s.cores) == 6 for s in shares)
    assert [s.numa_nodes for s in partition(t, 2)] == [{0, 1}, {2, 3}]  # one package each


def test_knl_quadrants_keep_four_siblings_together():
    t = Topology.from_synthetic(KNL)
    shares = partition(t, 4)
    assert all(len(s.cores) == 17 and len(s.cpus) == 68 for s in shares)
    first = shares[0]
    assert {0, 68, 136, 204} <= first.cpus and {16, 84, 152, 220} <= first.cpus
    # memory goes to the node holding the CPUs (the DDR node of the quadrant)
    assert all(len(s.numa_nodes) == 1 for s in shares)
    assert len({min(s.numa_nodes) for s in shares}) == 4
    check_disjoint(t, partition(t, 68))
    assert all(len(s.cpus) == 4 for s in partition(t, 68))


def test_core_ids_that_repeat_per_package_are_not_cpu_ids():
    # 2 packages x 4 cores x 2 PUs, "core id" 0-3 in each package, siblings i and i+8
    t = Topology.from_cpuinfo(GOLDEN / "cpuinfo" / "2s4c2t_linux.cpuinfo",
                              GOLDEN / "fakesys" / "2s4c2t_linux" / "node")
    a, b = partition(t, 2)
    assert a.cpus == {0, 1, 2, 3, 8, 9, 10, 11} and a.numa_nodes == {0}
    assert b.cpus == {4, 5, 6, 7, 12, 13, 14, 15} and b.numa_nodes == {1}
    assert [s.cpus for s in partition(t, 4)] == [{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13},
                                                 {6, 7, 14, 15}]


def test_restricted_mask_is_respected():
    t = Topology.from_synthetic(XEON).with_allowed(cpus((0, 13), (56, 69)))
    a, b = partition(t, 2)
    assert a.cpus == cpus((0, 6), (56, 62)) and b.cpus == cpus((7, 13), (63, 69))
    assert a.numa_nodes == b.numa_nodes == {0}
    # a core with only one allowed sibling still counts as a core
    t = Topology.from_synthetic(XEON).with_allowed({0, 1, 57})
    assert [s.cpus for s in partition(t, 2)] == [{0}, {1, 57}]


def test_more_shares_than_cores_split_siblings_and_too_many_fail():
    t = Topology.from_synthetic("pack:1 core:2 pu:2")
    shares = partition(t, 3)
    check_disjoint(t, shares)
    assert sorted(len(s.cpus) for s in shares) == [1, 1, 2]
    assert [len(s.cpus) for s in partition(t, 4)] == [1, 1, 1, 1]
    with pytest.raises(PlanError, match="cannot give 5 disjoint shares of cpus 0-3: only 4 PUs"):
        partition(t, 5)
    with pytest.raises(PlanError, match="at least one share"):
        partition(t, 0)
    with pytest.raises(PlanError, match="rank 2 is not in 0..1"):
        rank_share(t, 2, 2)


def test_unequal_nodes_stay_balanced():
    # a cgroup that leaves 28 cores of node 0 and 2 of node 1: the 2 join a share
    t = Topology.from_synthetic(XEON).with_allowed(cpus((0, 29)))
    shares = partition(t, 2)
    check_disjoint(t, shares)
    assert sum(len(s.cores) for s in shares) == 30
    assert max(len(s.cores) for s in shares) - min(len(s.cores) for s in shares) <= 2


SHAPES = st.tuples(st.integers(1, 4), st.integers(1, 3), st.integers(1, 6), st.integers(1, 2))


@settings(max_examples=60, deadline=None)
@given(shape=SHAPES, data=st.data())
def test_partition_properties(shape, data):
    packs, nodes, cores, pus = shape
    t = Topology.from_synthetic(f"pack:{packs} group:{nodes} [numa] core:{cores} pu:{pus}")
    if data.draw(st.booleans()):
        keep = data.draw(st.sets(st.sampled_from(sorted(t.cpuset)), min_size=1))
        t = t.with_allowed(keep)
    ncores = sum(1 for c in t.cores if c.cpuset & t.allowed)
    count = data.draw(st.integers(1, len(t.allowed)))
    shares = partition(t, count)
    assert len(shares) == count
    check_disjoint(t, shares)
    if count <= ncores:
        # whole cores, every allowed PU used
        assert frozenset().union(*(s.cpus for s in shares)) == t.allowed
        for c in t.cores:
            owners = [s.index for s in shares if s.cpus & c.cpuset]
            assert len(owners) <= 1
    for s in shares:
        assert s.numa_nodes == {t.numa_of(p).os_index for p in s.cpus}
    c = data.draw(st.integers(1, 4))
    if count * c <= ncores:
        fixed = partition(t, count, c)
        check_disjoint(t, fixed)
        assert all(len(s.cores) == c for s in fixed)


def _rank_decision(t, ranks, environ):
    return decide(Request(ranks=ranks, threads=1), Situation(topology=t, environ=environ,
                                                             job=read_job(environ, t)))


def test_a_ranks_share_for_in_process_use():
    t = Topology.from_synthetic(XEON)
    d = _rank_decision(t, "auto", {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert (d.rank.rank, d.rank.size) == (1, 2) and d.rank.source.startswith("torchrun")
    assert d.placements[0].cpus == d.placements[0].share.cpus == cpus((28, 55), (84, 111))
    d = _rank_decision(t, LocalRank(0, 4, "test"), {})
    assert d.placements[0].cpus == cpus((0, 13), (56, 69))
    with pytest.raises(PlanError, match="no launcher variables"):
        _rank_decision(t, "auto", {})


# ------------------------------------------------- Slurm's variables, launcher binding

# what srun -n 2 wrote into its tasks on the one-node Slurm of tests/engines (Slurm 22.05,
# task/affinity): automatic binding, --cpu-bind=cores, --cpu-bind=none
SRUN_AUTO = {"SLURM_LOCALID": "1", "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": "2",
             "SLURM_TASKS_PER_NODE": "2", "SLURM_CPUS_ON_NODE": "2", "SLURM_CPU_BIND": "quiet,mask_cpu:0x1,0x2",
             "SLURM_CPU_BIND_LIST": "0x1,0x2", "SLURM_CPU_BIND_TYPE": "mask_cpu:",
             "SLURM_CPU_BIND_VERBOSE": "quiet"}
SRUN_NONE = {**SRUN_AUTO, "SLURM_CPU_BIND": "quiet,none", "SLURM_CPU_BIND_LIST": "", "SLURM_CPU_BIND_TYPE": "none"}


def test_slurm_step_as_srun_writes_it():
    s = slurm_step({**SRUN_AUTO, "SLURM_CPUS_PER_TASK": "1"})
    assert (s.local_id, s.node_id, s.tasks_per_node, s.cpus_per_task) == (1, 0, (2,), 1)
    assert s.bound and s.cpu_bind_list == ({0}, {1})
    assert not slurm_step(SRUN_NONE).bound and slurm_step(SRUN_NONE).cpu_bind_list == ()
    # several nodes: counts run-length encoded, this node's picked by SLURM_NODEID
    s = slurm_step({"SLURM_LOCALID": "0", "SLURM_NODEID": "3", "SLURM_STEP_TASKS_PER_NODE": "2(x3),1"})
    assert s.tasks_per_node == (2, 2, 2, 1) and s.tasks_on_node == 1 and s.cpus_per_task is None
    # masks wider than 64 CPUs, and map_cpu's decimal ids
    s = slurm_step({**SRUN_AUTO, "SLURM_CPU_BIND_LIST": "0x10000000000000000,0x3"})
    assert s.cpu_bind_list == ({64}, {0, 1})
    s = slurm_step({**SRUN_AUTO, "SLURM_CPU_BIND_TYPE": "map_cpu:", "SLURM_CPU_BIND_LIST": "5,7"})
    assert s.cpu_bind_list == ({5}, {7})
    assert slurm_step({"SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "2"}) is None  # a batch script
    with pytest.raises(PlanError, match="SLURM_CPU_BIND_LIST='0xq' \\(mask_cpu:\\): cannot read '0xq'"):
        slurm_step({**SRUN_AUTO, "SLURM_CPU_BIND_LIST": "0xq"})
    with pytest.raises(PlanError, match="SLURM_CPUS_PER_TASK='two'"):
        slurm_step({**SRUN_AUTO, "SLURM_CPUS_PER_TASK": "two"})
    with pytest.raises(PlanError, match="cannot read '2\\(x3'"):
        slurm_step({**SRUN_AUTO, "SLURM_STEP_TASKS_PER_NODE": "2(x3"})


def test_launcher_binding_is_read_from_the_launcher_that_gave_the_rank():
    b = launcher_binding(SRUN_AUTO, local_rank(SRUN_AUTO))
    assert b == LauncherBinding("Slurm srun", "SLURM_CPU_BIND=quiet,mask_cpu:0x1,0x2", (frozenset({0}), frozenset({1})))
    assert launcher_binding(SRUN_NONE, local_rank(SRUN_NONE)) is None
    ompi = {"OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_orte_bound_at_launch": "1"}
    assert launcher_binding(ompi, local_rank(ompi)) == LauncherBinding("Open MPI", "OMPI_MCA_orte_bound_at_launch=1")
    hydra = {"MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "HYDRA_USER_PROVIDED_BINDING": "1"}
    assert launcher_binding(hydra, local_rank(hydra)).launcher.startswith("MPICH")
    # mpirun inside a bound srun step: the MPI launcher's (no) binding counts, not srun's
    inside = {**SRUN_AUTO, "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
    assert launcher_binding(inside, local_rank(inside)) is None
    assert launcher_binding(SRUN_AUTO, LocalRank(0, 2, "--ranks 0/2")) is None  # given by hand


TWO_CORES = "pack:1 [numa] core:2 pu:1"
XEON_1 = "pack:2 [numa] core:4 pu:2(indexes=2*8:1*2)"  # 2x4x2, siblings i and i+8


def test_place_rank_follows_the_launchers_mask_and_never_cuts_it_again():
    t = Topology.from_synthetic(TWO_CORES)
    r1 = local_rank(SRUN_AUTO)
    # srun bound rank 1 to CPU 1: its share is CPU 1, said so
    share, how = place_rank(t.with_allowed({1}), r1, launcher_binding(SRUN_AUTO, r1))
    assert share.cpus == {1} and share.index == 1
    assert how.startswith("Slurm srun bound local rank 1 of 2 to cpus 1 (SLURM_CPU_BIND=quiet,mask_cpu:0x1,0x2): "
                          "planning inside that mask")
    # without the launcher's word the same 1-CPU mask cannot hold 2 ranks
    with pytest.raises(PlanError, match="cannot give 2 disjoint shares of cpus 1"):
        place_rank(t.with_allowed({1}), r1)
    # srun gave both ranks the same mask (--cpu-bind=sockets): they cut it between them
    same = {**SRUN_AUTO, "SLURM_CPU_BIND_LIST": "0x3,0x3"}
    share, how = place_rank(t, r1, launcher_binding(same, r1))
    assert share.cpus == {1} and "as it bound local ranks 0-1: this rank takes share 1 of 2" in how


def test_place_rank_without_the_other_ranks_masks():
    t = Topology.from_synthetic(XEON_1)
    ompi = {"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_orte_bound_at_launch": "1"}
    r = local_rank(ompi)
    b = launcher_binding(ompi, r)
    # bound to a core (Open MPI's default for 2 ranks): planned inside that core
    share, how = place_rank(t.with_allowed({1, 9}), r, b)
    assert share.cpus == {1, 9} and len(share.cores) == 1 and "planning inside that mask" in how
    # bound to a socket: narrower than the machine, the rank's own
    share, _ = place_rank(t.with_allowed(cpus((4, 7), (12, 15))), r, b)
    assert share.cpus == cpus((4, 7), (12, 15)) and share.numa_nodes == {1}
    # "bound" to everything there is (--bind-to socket on a one-socket cgroup): cut as if unbound
    share, how = place_rank(t.with_allowed(cpus((0, 3), (8, 11))), r, b, whole=cpus((0, 3), (8, 11)))
    assert share.cpus == {2, 3, 10, 11} and "cut between the 2 ranks" in how


def test_a_ranks_share_follows_a_launchers_binding():
    t = Topology.from_synthetic(TWO_CORES)
    d = _rank_decision(t.with_allowed({1}), "auto", SRUN_AUTO)
    assert d.placements[0].cpus == {1} and d.rank.launcher == "Slurm srun"
    assert _rank_decision(t, "auto", SRUN_NONE).placements[0].cpus == {1}


def test_job_of_names_the_job_a_rank_belongs_to():
    ompi = {"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_ess_base_jobid": "7"}
    r, job = job_of(ompi, 100)
    assert r.rank == 1 and job == "Open MPI OMPI_MCA_ess_base_jobid=7"
    srun = {**SRUN_AUTO, "SLURM_JOB_ID": "12", "SLURM_STEP_ID": "0"}
    assert job_of(srun, 5)[1] == "Slurm srun SLURM_JOB_ID=12, SLURM_STEP_ID=0"
    torch = {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "abc"}
    assert job_of(torch, 5)[1] == "torchrun TORCHELASTIC_RUN_ID=abc"
    # Hydra starts a node's ranks from one proxy: the parent names the job
    hydra = {"MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
    assert job_of(hydra, 4242)[1] == "MPICH/Intel MPI (Hydra) ranks of parent process 4242"
    assert job_of({"PATH": "/bin"}, 1) is None


def test_slurm_allocation_outside_a_step():
    batch = {"SLURM_JOB_ID": "9", "SLURM_TASKS_PER_NODE": "4(x2),1", "SLURM_NODEID": "2", "SLURM_LOCALID": "0"}
    assert slurm_allocation(batch) == (1, "Slurm job 9 (SLURM_TASKS_PER_NODE=4(x2),1, SLURM_NODEID=2)")
    assert slurm_allocation({"SLURM_TASKS_PER_NODE": "2"}) is None  # no job
    with pytest.raises(PlanError, match="SLURM_NODEID=3 but SLURM_TASKS_PER_NODE='4\\(x2\\),1' lists 3 nodes"):
        slurm_allocation({**batch, "SLURM_NODEID": "3"})


def test_team_environ_sets_aside_only_what_the_launcher_set_by_itself():
    worker = {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "1", "PATH": "/bin"}
    env, said = team_environ(worker, local_rank(worker))
    assert "OMP_NUM_THREADS" not in env and env["PATH"] == "/bin" and len(said) == 1
    three = {**worker, "OMP_NUM_THREADS": "3"}
    assert team_environ(three, local_rank(three)) == (three, [])
    assert team_environ(worker, parse_rank("0/2", {}))[1] == []  # a rank given by hand: no launcher set anything
    mpi = {"MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2", "OMP_NUM_THREADS": "1"}
    assert team_environ(mpi, local_rank(mpi)) == (mpi, [])


def test_srun_domain_lists_are_read_as_slurm_reads_them():
    """map_ldom/mask_ldom (HPC audit F3): each task's locality domains, then their CPUs
    from the topology -- NUMA node d modulo (largest node index + 1), packages where the
    topology knows no NUMA node -- as Slurm's task/affinity binds them."""
    env = {**SRUN_AUTO, "SLURM_CPU_BIND_TYPE": "map_ldom:", "SLURM_CPU_BIND_LIST": "0,0x1,3"}
    s = slurm_step(env)
    assert s.bound and s.cpu_bind_list == () and s.cpu_bind_domains == ({0}, {1}, {3})
    s = slurm_step({**env, "SLURM_CPU_BIND_TYPE": "mask_ldom:", "SLURM_CPU_BIND_LIST": "0x3,2"})
    assert s.cpu_bind_domains == ({0, 1}, {1})
    # map_cpu ids are decimal unless written with 0x, as Slurm reads them
    assert slurm_step({**env, "SLURM_CPU_BIND_TYPE": "map_cpu:", "SLURM_CPU_BIND_LIST": "0x10,10"}).cpu_bind_list == (
        {16}, {10})
    with pytest.raises(PlanError, match="SLURM_CPU_BIND_LIST='0,x' \\(map_ldom:\\): cannot read 'x'"):
        slurm_step({**env, "SLURM_CPU_BIND_LIST": "0,x"})
    snc = Topology.from_synthetic(SNC)  # 4 nodes of 12 PUs
    assert slurm_domain_cpus(snc, frozenset({1})) == snc.numa_nodes[1].cpuset
    assert slurm_domain_cpus(snc, frozenset({5})) == snc.numa_nodes[1].cpuset  # 5 modulo 4 nodes
    assert slurm_domain_cpus(snc, frozenset({0, 3})) == snc.numa_nodes[0].cpuset | snc.numa_nodes[3].cpuset
    flat = Topology.from_cpuinfo(GOLDEN / "cpuinfo" / "2s4c2t_linux.cpuinfo")  # no NUMA node: packages
    assert not flat.numa_nodes
    assert slurm_domain_cpus(flat, frozenset({1})) == {4, 5, 6, 7, 12, 13, 14, 15}
    assert slurm_domain_cpus(flat, frozenset({2})) == {0, 1, 2, 3, 8, 9, 10, 11}
    r = local_rank(env)
    b = launcher_binding(env, r, snc)
    assert b.masks == (snc.numa_nodes[0].cpuset, snc.numa_nodes[1].cpuset, snc.numa_nodes[3].cpuset)
    assert launcher_binding(env, r).masks == ()  # without a topology the domains' CPUs are unknown


def test_a_listed_mask_that_does_not_hold_this_process_is_no_evidence():
    """srun listed CPU 0 for task 0, but the process runs on both CPUs (its mask was
    widened, as --norespect did): the list says nothing about it, and a mask as wide as
    the ranks' is cut between them (it used to plan both ranks on 0-1: HPC audit F1)."""
    t = Topology.from_synthetic(TWO_CORES)
    for r in (0, 1):
        env = {**SRUN_AUTO, "SLURM_LOCALID": str(r)}
        share, how = place_rank(t, local_rank(env), launcher_binding(env, local_rank(env), t), t.cpuset)
        assert share.cpus == {r} and "cut between the 2 ranks" in how
