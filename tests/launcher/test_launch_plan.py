"""The pure half of ``affinity run`` on machines we do not have: options in,
a Launch out (masks, memory policies, thread counts, environments), plus the
numactl-style reports.  No process is started here."""

from __future__ import annotations

import argparse

import pytest

from affinity.machine.cgroup import CpuQuota
from affinity.cpulist import IdList, format_list
from affinity.errors import PlanError, SpecError
from affinity.launcher.build import Context, build_launch
from affinity.launcher.numactl import hardware_text, shell_text, show_text
from affinity.launcher.options import RunOptions, options_from_args
from affinity.launcher.run import add_run_parser
from affinity.planning.envvars import BLOCKTIME_DEFAULT, DEFAULT_BLOCKTIME
from affinity.machine.topology import Topology

XEON = Topology.from_synthetic("pack:2 [numa] core:28 pu:2(indexes=2*56:1*2)")
FOUR = Topology.from_synthetic("pack:4 [numa] core:8 pu:2(indexes=2*32:1*2)")


def cpus(*ranges: tuple[int, int]) -> frozenset[int]:
    return frozenset(c for a, b in ranges for c in range(a, b + 1))


def launch(topology=XEON, ctx=None, **kw):
    kw.setdefault("command", ("prog",))
    return build_launch(RunOptions(**kw), topology, ctx or Context())


def parse(*argv: str, environ=None) -> RunOptions:
    parser = argparse.ArgumentParser(prog="affinity")
    add_run_parser(parser.add_subparsers(dest="command"))
    return options_from_args(parser.parse_args(["run", *argv]), {} if environ is None else environ)


def test_one_instance_is_the_whole_allowed_machine_one_thread_per_core():
    ln = launch()
    (inst,) = ln.instances
    assert not ln.spawn and inst.cpus == XEON.cpuset and inst.mempolicy is None
    assert inst.threads == 56 and len(inst.slots) == 56
    assert inst.slots[:2] == ({0}, {1}) and inst.slots[28] == {28}  # first PU of each core
    assert inst.env["OMP_NUM_THREADS"] == "56" == inst.env["TF_NUM_INTRAOP_THREADS"]
    assert inst.env["TF_NUM_INTEROP_THREADS"] == "2"
    assert inst.env["KMP_AFFINITY"] == "granularity=fine,proclist=[" + ",".join(
        map(str, range(56))) + "],explicit"


def test_instances_one_socket_each_memory_on_their_node():
    ln = launch(instances=2)
    assert ln.spawn
    a, b = ln.instances
    assert a.cpus == cpus((0, 27), (56, 83)) and b.cpus == cpus((28, 55), (84, 111))
    assert (a.mempolicy, a.mem_nodes, a.mem_required) == ("bind", {0}, False)
    assert (b.mempolicy, b.mem_nodes) == ("bind", {1})
    assert a.threads == b.threads == 28
    assert b.env["KMP_AFFINITY"].startswith("granularity=fine,proclist=[28,29,30,")
    assert (a.env["AFFINITY_INSTANCE"], b.env["AFFINITY_INSTANCE"]) == ("0", "1")
    four = launch(instances=4, cores_per_instance=5, log_dir="logs")
    assert [len(i.cpus) for i in four.instances] == [10] * 4
    assert [i.mem_nodes for i in four.instances] == [{0}, {0}, {1}, {1}]
    assert [i.log for i in four.instances] == [f"logs/instance-{i}.log" for i in range(4)]
    with pytest.raises(PlanError, match="--instances 3 --cores-per-instance 19: 3 shares of 19 cores"):
        launch(instances=3, cores_per_instance=19)


def test_explicit_memory_policy_wins_and_is_checked_against_mems_allowed():
    ln = launch(instances=2, mempolicy="interleave", mem_nodes=IdList.parse("all", "node"))
    assert [(i.mempolicy, i.mem_nodes, i.mem_required) for i in ln.instances] == [("interleave", {0, 1}, True)] * 2
    ctx = Context(mems_allowed=frozenset({1}))
    assert launch(ctx=ctx, mempolicy="bind", mem_nodes=IdList.parse("+0", "node")).instances[0].mem_nodes == {1}
    with pytest.raises(PlanError, match=r"--membind 0: node 0 is not allowed to this process \(Mems_allowed: 1\)"):
        launch(ctx=ctx, mempolicy="bind", mem_nodes=IdList.parse("0", "node"))
    with pytest.raises(PlanError, match="--preferred 5: no NUMA node 5 on this machine"):
        launch(mempolicy="preferred", mem_nodes=IdList.parse("5", "node"))
    assert launch(mempolicy="local").instances[0].mem_nodes == frozenset()


def test_cpu_selection():
    t = XEON.with_allowed(cpus((0, 13), (56, 69)))
    assert launch(t, physcpubind=IdList.parse("+0-1", "CPU")).instances[0].cpus == {0, 1}
    assert launch(t, physcpubind=IdList.parse("!0-12,56-69", "CPU")).instances[0].cpus == {13}
    assert launch(t, cpunodebind=IdList.parse("0", "node")).instances[0].cpus == t.allowed  # respect
    with pytest.raises(PlanError, match=r"CPU 14 is not allowed to this process \(allowed: 0-13,56-69\)"):
        launch(t, physcpubind=IdList.parse("14", "CPU"))
    with pytest.raises(PlanError, match="none of the CPUs of node 1 is allowed"):
        launch(t, cpunodebind=IdList.parse("1", "node"))
    with pytest.raises(PlanError, match=r"relative CPU index 28 is out of range: 28 CPUs are allowed "
                                        r"\(0-13,56-69\), so \+0 to \+27$"):
        launch(t, physcpubind=IdList.parse("+28", "CPU"))
    one = t.with_allowed({5})  # under taskset -c 5 it said "1 CPUs are allowed (5)"
    with pytest.raises(PlanError, match=r"relative CPU indexes 1-2 are out of range: only 1 CPU is allowed "
                                        r"\(5\), so \+0 to \+0$"):
        launch(one, physcpubind=IdList.parse("+1-2", "CPU"))
    # --norespect starts from the cgroup's cpuset
    ctx = Context(cgroup_cpus=XEON.cpuset)
    assert launch(t, ctx, norespect=True, cpunodebind=IdList.parse("1", "node")).instances[0].cpus == \
        cpus((28, 55), (84, 111))


def test_ranks_from_launcher_variables_and_with_instances():
    ctx = Context(environ={"OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"})
    ln = launch(ctx=ctx, ranks="auto")
    (inst,) = ln.instances
    assert inst.cpus == cpus((28, 41), (84, 97)) and inst.mem_nodes == {1} and inst.threads == 14
    assert ln.rank.rank == 2 and any("rank 2 of 4" in n for n in ln.notes)
    ln = launch(ranks="1/2", instances=2)
    assert [i.cpus for i in ln.instances] == [cpus((28, 41), (84, 97)), cpus((42, 55), (98, 111))]
    # each rank bound to one CPU without a variable saying so: the error says what to do
    bound = XEON.with_allowed({5})
    with pytest.raises(PlanError, match="without a variable saying so.*--bind-to none"):
        launch(bound, Context(environ=ctx.environ, cgroup_cpus=XEON.cpuset), ranks="auto")
    # ... and Open MPI's own word that it bound the rank: followed (tests/engines/test_mpi.py)
    said = Context(environ={**ctx.environ, "OMPI_MCA_orte_bound_at_launch": "1"}, cgroup_cpus=XEON.cpuset)
    assert launch(bound, said, ranks="auto").instances[0].cpus == {5}


def test_thread_counts_from_quota_environment_and_option():
    ctx = Context(quota=CpuQuota(800000, 100000, "/sys/fs/cgroup/x", 2))
    ln = launch(ctx=ctx, instances=4)
    assert [i.threads for i in ln.instances] == [2, 2, 2, 2]
    assert any("CFS quota 8 CPUs" in n and "shared by 4 processes" in n for n in ln.notes)
    assert launch(ctx=Context(environ={"OMP_NUM_THREADS": "3,2"})).instances[0].threads == 3
    assert launch(threads=5, ctx=Context(environ={"OMP_NUM_THREADS": "3"})).instances[0].threads == 5
    ln = launch(ctx=Context(environ={"OMP_NUM_THREADS": "lots"}))
    assert ln.instances[0].threads == 56 and "ignoring OMP_NUM_THREADS='lots'" in ln.warnings[0]


def test_spec_and_environment_specs():
    inst = launch(spec="granularity=core,scatter", threads=4).instances[0]
    assert inst.slots == (XEON.cores[0].cpuset, XEON.cores[28].cpuset, XEON.cores[1].cpuset,
                          XEON.cores[29].cpuset)
    env_inst = launch(ctx=Context(environ={"KMP_AFFINITY": "granularity=core,scatter"}), threads=4).instances[0]
    assert env_inst.slots == inst.slots
    with pytest.raises(SpecError):
        launch(spec="granularity=fine,sideways")
    assert launch(blocktime="7").instances[0].env["KMP_BLOCKTIME"] == "7"


def test_blocktime_default_user_value_and_none():
    # the default is the user's KMP_BLOCKTIME, else DEFAULT_BLOCKTIME: decided with the rest
    # (planning.envvars.blocktime_for, the rule apply() follows too)
    assert RunOptions().blocktime == parse("--", "p").blocktime == BLOCKTIME_DEFAULT
    assert launch().instances[0].env["KMP_BLOCKTIME"] == DEFAULT_BLOCKTIME
    assert launch(ctx=Context(environ={"KMP_BLOCKTIME": "30"})).instances[0].env["KMP_BLOCKTIME"] == "30"
    assert parse("--blocktime", "7", "--", "p", environ={"KMP_BLOCKTIME": "30"}).blocktime == "7"
    # 'none' exports none (None means the same in affinity.binding.apply.apply)
    opts = parse("--blocktime", "none", "--", "p", environ={"KMP_BLOCKTIME": "30"})
    assert opts.blocktime is None
    for inst in build_launch(opts, XEON, Context()).instances:
        assert "KMP_BLOCKTIME" not in inst.env
    assert all("KMP_BLOCKTIME" not in i.env for i in launch(blocktime=None, instances=2).instances)


def test_pin_threads_environment_follows_the_slots():
    inst = launch(pin_threads=True, threads=3, pin_skip=0x1, verbose=True).instances[0]
    assert inst.env["AFFINITY_PIN_SLOTS"] == "0;1;2"
    assert inst.env["AFFINITY_PIN_SKIP"] == "0x1" and inst.env["AFFINITY_PIN_VERBOSE"] == "1"
    assert inst.env["LD_PRELOAD"].endswith("/affinity/launcher/libaffinity_pin.so")


def test_idlist_syntax():
    assert IdList.parse("0-3,8", "CPU").ids == {0, 1, 2, 3, 8}
    assert IdList.parse("!+1", "node").inverted and IdList.parse("!+1", "node").relative
    assert IdList.parse("all", "CPU").resolve(frozenset({2, 3}), "-C") == {2, 3}
    # an inverted list that leaves nothing: said here, naming the option (issue 42: "mask  selects no PU")
    with pytest.raises(PlanError, match=r"-C !all: selects no CPU: it leaves out every CPU allowed \(2-3\)"):
        IdList.parse("!all", "CPU").resolve(frozenset({2, 3}), "-C")
    for bad in ("", "x", "3-1", "+all", "1,,2"):
        with pytest.raises(ValueError):
            IdList.parse(bad, "CPU")


def test_command_line_forms():
    o = parse("granularity=fine,compact", "--membind=0", "-C", "+0-1", "--", "prog", "-m", "1")
    assert o.spec == "granularity=fine,compact" and o.command == ("prog", "-m", "1")
    assert o.mempolicy == "bind" and o.mem_nodes.text == "0" and o.physcpubind.relative
    o = parse("-l", "--instances", "3", "--ranks", "auto", "--pin-threads", "--pin-skip", "0x3", "--", "p")
    assert (o.mempolicy, o.instances, o.ranks, o.pin_skip, o.spec) == ("local", 3, "auto", 3, None)
    with pytest.raises(SystemExit) as e:
        parse("-C", "1", "-N", "0", "--", "p")
    assert e.value.code == 2


def test_shell_text_quotes_and_chooses_the_tool():
    ln = launch(instances=2, command=("my prog", "$HOME"))
    lines = shell_text(ln).splitlines()
    assert lines[0].startswith("numactl --physcpubind=0-27,56-83 --membind=0 -- env ")
    assert lines[0].endswith(" 'my prog' '$HOME' &") and lines[-1] == "wait"
    one = shell_text(launch(physcpubind=IdList.parse("3", "CPU")))
    assert one.startswith("taskset -c 3 env ") and "'KMP_AFFINITY=granularity=fine,proclist=[3],explicit'" in one


def test_hardware_text_like_numactl(tmp_path):
    for n, (total, free, dist) in enumerate([(8 << 20, 5 << 20, "10 21"), (4 << 20, 1 << 20, "21 10")]):
        d = tmp_path / f"sys/devices/system/node/node{n}"
        d.mkdir(parents=True)
        (d / "meminfo").write_text(f"Node {n} MemTotal:  {total} kB\nNode {n} MemFree:   {free} kB\n")
        (d / "distance").write_text(dist + "\n")
    t = Topology.from_synthetic("pack:2 [numa] core:2 pu:1")
    assert hardware_text(t, str(tmp_path)) == "\n".join([
        "available: 2 nodes (0-1)",
        "node 0 cpus: 0 1", "node 0 size: 8192 MB", "node 0 free: 5120 MB",
        "node 1 cpus: 2 3", "node 1 size: 4096 MB", "node 1 free: 1024 MB",
        "node distances:", "node   0   1 ", "  0:  10  21 ", "  1:  21  10 "])
    # another machine: what the topology knows
    assert hardware_text(t, None).splitlines()[:3] == ["available: 2 nodes (0-1)", "node 0 cpus: 0 1",
                                                       f"node 0 size: {t.numa_nodes[0].memory >> 20} MB"]


def test_show_text_like_numactl():
    assert show_text(FOUR, frozenset({0, 1, 16}), "interleave", frozenset({1, 2}), frozenset(range(4))) == "\n".join([
        "policy: interleave", "preferred node: 1 (interleave next)", "interleavemask: 1 2 ",
        "interleavenode: 1", "physcpubind: 0 1 16 ", "cpubind: 0 2 ", "nodebind: 0 2 ",
        "membind: 0 1 2 3 ", "preferred: 1 2 "])
    text = show_text(FOUR, frozenset(range(64)), "bind", frozenset({3}), frozenset(range(4)))
    assert "preferred node: 3\n" in text and "membind: 3 \n" in text and "cpubind: 0 1 2 3 \n" in text
    assert format_list({0, 1}) == "0-1"


def test_an_explicit_thread_count_is_honoured_and_oversubscription_said():
    flat16 = Topology.from_synthetic("pack:1 [numa] core:16 pu:1")
    two = launch(topology=flat16, instances=2, threads=16)
    for inst in two.instances:  # 8 cores each, 16 threads asked for: 16 it is
        assert inst.threads == 16 and inst.env["OMP_NUM_THREADS"] == "16" and len(inst.slots) == 16
    assert [w for w in two.warnings if "oversubscribes" in w] == [
        "instance 0: threads=16 on 8 CPUs oversubscribes them (0-7): several threads share a CPU",
        "instance 1: threads=16 on 8 CPUs oversubscribes them (8-15): several threads share a CPU"]
    # under --ranks the messages name the rank (they said "instance 0" in every rank)
    assert [w for w in launch(topology=flat16, ranks="1/2", threads=9).warnings if "oversubscribes" in w] == [
        "rank 1: threads=9 on 8 CPUs oversubscribes them (8-15): several threads share a CPU"]
    assert [w for w in launch(topology=flat16, ranks="1/2", instances=2, threads=5).warnings
            if "oversubscribes" in w] == [
        "rank 1, instance 0: threads=5 on 4 CPUs oversubscribes them (8-11): several threads share a CPU",
        "rank 1, instance 1: threads=5 on 4 CPUs oversubscribes them (12-15): several threads share a CPU"]
    # a norespect plan's threads get CPUs outside the process mask: the warning counts those
    # (2 threads on their 2 CPUs were "--threads=2 on 1 CPU oversubscribes them (0)")
    smt = Topology.from_synthetic("pack:1 core:2 pu:2")
    out = launch(topology=smt, spec="norespect,granularity=core,compact", threads=2,
                 physcpubind=IdList.parse("0", "CPU"))
    assert [w for w in out.warnings if "oversubscribes" in w] == []
    out = launch(topology=smt, spec="norespect,granularity=core,compact", threads=5,
                 physcpubind=IdList.parse("0", "CPU"))
    assert [w for w in out.warnings if "oversubscribes" in w] == [
        "threads=5 on 4 CPUs oversubscribes them (0-3): several threads share a CPU"]
    small = Topology.from_synthetic("pack:1 core:2 pu:1")
    one = launch(topology=small, threads=4).instances[0]
    assert one.env["OMP_NUM_THREADS"] == "4" and one.threads == 4
    assert launch(topology=small, threads=2).warnings == ()


def test_slots_are_the_plans_threads_in_order():
    """--pin-threads pins creation-order thread i to the plan's set i, duplicates
    included (a granularity=core plan lists each core once per hardware thread)."""
    inst = launch(topology=FOUR, spec="compact", threads=4).instances[0]
    assert inst.slots == (FOUR.cores[0].cpuset,) * 2 + (FOUR.cores[1].cpuset,) * 2
    assert inst.env["OMP_PLACES"].count("},{") == 3


def test_memory_nodes_are_checked_like_the_api():
    with pytest.raises(PlanError, match=r"--membind 7: no NUMA node 7 on this machine \(nodes: 0-1\)"):
        launch(mempolicy="bind", mem_nodes=IdList.parse("7", "node"))


def test_norespect_reaches_the_cgroup_not_beyond():
    flat = Topology.from_synthetic("pack:1 core:4 pu:1")
    inside = launch(topology=flat, spec="norespect,granularity=fine,compact", threads=2,
                    physcpubind=IdList.parse("0", "CPU"))
    assert inside.instances[0].slots == (frozenset({0}), frozenset({1}))  # outside the mask, inside the cgroup
    with pytest.raises(PlanError, match="norespect"):
        launch(topology=flat, spec="norespect,granularity=fine,compact", threads=2,
               physcpubind=IdList.parse("0", "CPU"), ctx=Context(cgroup_cpus=frozenset({0, 1})))
