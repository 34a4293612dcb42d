"""Intel's and LLVM's rules against the real runtimes on the cases a differential
fuzz found wrong (libiomp5 from intel-openmp 2026.2.0 and Debian's libomp 19.1.7,
run under the oracle shim on the machines described here; each expected value is
what the runtime printed).  Classes: B (offline CPUs counted by ``__kmp_xproc``),
F (thread limits), A (proclist warning order), H (NUMA node ids with a gap)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from affinity.machine.topology import Topology
from affinity.planning.planner import plan_env

DATA = Path(__file__).parent / "data"


def _cpuinfo(tmp_path: Path, records, nodes) -> Topology:
    """A cpuinfo file of ``(processor, physical id, core id)`` records and a
    ``node/nodeN/cpulist`` tree, as the runtime read them (``KMP_CPUINFO_FILE``)."""
    text = "\n".join(f"processor\t: {p}\nphysical id\t: {s}\ncore id\t\t: {c}\n" for p, s, c in records)
    (tmp_path / "m.cpuinfo").write_text(text + "\n")
    for k, cpus in nodes.items():
        (tmp_path / "node" / f"node{k}").mkdir(parents=True)
        (tmp_path / "node" / f"node{k}" / "cpulist").write_text(",".join(map(str, cpus)) + "\n")
    return Topology.from_cpuinfo(tmp_path / "m.cpuinfo", numa_nodes=tmp_path / "node")


def _got(p):
    return p.threads, [sorted(s) for s in p.cpusets], list(p.warnings)


# ---------------------------------------------------------------------------
# F: OMP_THREAD_LIMIT, KMP_DEVICE_THREAD_LIMIT, KMP_ALL_THREADS
# ---------------------------------------------------------------------------

W96 = "Cannot form a team with {} threads, using {} instead."
#: 1 package x 2 cores x 1 thread: env -> (team, masks, warnings), both runtimes
THREAD_LIMIT = [
    ({"OMP_THREAD_LIMIT": "1", "KMP_AFFINITY": "compact"}, (1, [[0]], [W96.format(2, 1)])),
    ({"KMP_DEVICE_THREAD_LIMIT": "1", "KMP_AFFINITY": "compact"}, (1, [[0]], [W96.format(2, 1)])),
    ({"KMP_ALL_THREADS": "1", "KMP_AFFINITY": "compact"}, (1, [[0]], [W96.format(2, 1)])),
    ({"OMP_THREAD_LIMIT": "1", "OMP_PLACES": "cores", "OMP_PROC_BIND": "spread"}, (1, [[0]], [W96.format(2, 1)])),
    ({"OMP_THREAD_LIMIT": "2", "OMP_PLACES": "cores", "OMP_PROC_BIND": "spread", "OMP_NUM_THREADS": "4"},
     (2, [[0], [1]], [W96.format(4, 2)])),
    ({"OMP_THREAD_LIMIT": "1", "KMP_AFFINITY": "compact,nowarnings"}, (1, [[0]], [W96.format(2, 1)])),
    ({"OMP_THREAD_LIMIT": "1", "KMP_AFFINITY": "disabled"}, (1, [[0, 1]], [W96.format(2, 1)])),
    ({"OMP_THREAD_LIMIT": "1", "OMP_NUM_THREADS": "1"}, (1, [[0, 1]], [])),
    ({"OMP_THREAD_LIMIT": "3", "OMP_NUM_THREADS": "5"}, (3, [[0, 1]] * 3, [W96.format(5, 3)])),
    ({"OMP_NUM_THREADS": "100000", "OMP_THREAD_LIMIT": "2"}, (2, [[0, 1]] * 2, [W96.format(100000, 2)])),
    # the device limit is checked first and warns; the smaller limit wins
    ({"KMP_DEVICE_THREAD_LIMIT": "2", "OMP_THREAD_LIMIT": "1", "OMP_NUM_THREADS": "3"},
     (1, [[0, 1]], [W96.format(3, 2)])),
    ({"KMP_DEVICE_THREAD_LIMIT": "1", "OMP_THREAD_LIMIT": "2", "OMP_NUM_THREADS": "3"},
     (1, [[0, 1]], [W96.format(3, 1)])),
    ({"KMP_ALL_THREADS": "1", "KMP_DEVICE_THREAD_LIMIT": "2", "OMP_NUM_THREADS": "2"},
     (2, [[0, 1]] * 2, ["KMP_ALL_THREADS: ignored because KMP_DEVICE_THREAD_LIMIT has been defined"])),
    ({"KMP_DEVICE_THREAD_LIMIT": "ALL", "OMP_NUM_THREADS": "3"}, (2, [[0, 1]] * 2, [W96.format(3, 2)])),
    ({"KMP_DEVICE_THREAD_LIMIT": "all ", "OMP_NUM_THREADS": "3"},
     (3, [[0, 1]] * 3, ['KMP_DEVICE_THREAD_LIMIT="all ": not a number.'])),
    ({"OMP_THREAD_LIMIT": "0", "OMP_NUM_THREADS": "2"},
     (1, [[0, 1]], ['OMP_THREAD_LIMIT="0": value too small.', W96.format(2, 1)])),
    ({"OMP_THREAD_LIMIT": "abc", "OMP_NUM_THREADS": "2"}, (2, [[0, 1]] * 2, ['OMP_THREAD_LIMIT="abc": not a number.'])),
    ({"OMP_THREAD_LIMIT": "2x", "OMP_NUM_THREADS": "3"},
     (3, [[0, 1]] * 3, ['OMP_THREAD_LIMIT="2x": illegal characters.'])),
    ({"OMP_THREAD_LIMIT": "-1", "OMP_NUM_THREADS": "3"}, (3, [[0, 1]] * 3, ['OMP_THREAD_LIMIT="-1": not a number.'])),
    ({"OMP_THREAD_LIMIT": "2\t", "OMP_NUM_THREADS": "3"}, (2, [[0, 1]] * 2, [W96.format(3, 2)])),
    ({"OMP_THREAD_LIMIT": "99999999999", "OMP_NUM_THREADS": "3"},
     (3, [[0, 1]] * 3, ['OMP_THREAD_LIMIT="99999999999": value too large.'])),
    ({"KMP_DEVICE_THREAD_LIMIT": " 2 ", "OMP_NUM_THREADS": "3"}, (2, [[0, 1]] * 2, [W96.format(3, 2)])),
    ({"KMP_AFFINITY": "granularity=foo,compact", "OMP_PLACES": "bad{", "OMP_NUM_THREADS": "3", "OMP_THREAD_LIMIT": "x"},
     (3, [[0], [1], [0]], ['KMP_AFFINITY: parameter invalid, ignoring "granularity=foo".',
                           "OMP_PLACES: ignored because KMP_AFFINITY has been defined",
                           'OMP_THREAD_LIMIT="x": not a number.'])),
]


@pytest.mark.parametrize("runtime", ["intel", "llvm"])
@pytest.mark.parametrize("env,want", THREAD_LIMIT, ids=lambda v: json.dumps(v) if isinstance(v, dict) else "")
def test_thread_limits_cut_the_team_as_the_runtime_does(tmp_path, runtime, env, want):
    t = _cpuinfo(tmp_path, [(0, 0, 0), (1, 0, 1)], {0: [0, 1]})
    assert _got(plan_env(env, topology=t, runtime=runtime)) == want


@pytest.mark.parametrize("runtime,want", [
    ("intel", (3, [[0, 1]] * 3, ['OMP_THREAD_LIMIT=" 2 ": not a number.'])),  # libiomp5: no leading blank
    ("llvm", (2, [[0, 1]] * 2, [W96.format(3, 2)])),
])
def test_omp_thread_limit_with_a_leading_blank(tmp_path, runtime, want):
    t = _cpuinfo(tmp_path, [(0, 0, 0), (1, 0, 1)], {0: [0, 1]})
    assert _got(plan_env({"OMP_THREAD_LIMIT": " 2 ", "OMP_NUM_THREADS": "3"}, topology=t, runtime=runtime)) == want


# ---------------------------------------------------------------------------
# B: the runtime's CPU count (__kmp_xproc) is sysconf(_SC_NPROCESSORS_CONF)
# ---------------------------------------------------------------------------

#: 1 package x 4 cores x 2 threads with the SMT siblings 4-7 offline, process mask
#: 0-3 (the hwloc XML lstopo wrote from that /sys tree: complete_cpuset 0xff):
#: env -> (omp_get_num_procs, team, masks, warnings), both runtimes
ALL4 = [[0, 1, 2, 3]]
OFFLINE = [
    ({"KMP_AFFINITY": "disabled"}, (8, 8, ALL4 * 8, [])),
    ({"KMP_AFFINITY": "disabled", "OMP_NUM_THREADS": "3"}, (8, 3, ALL4 * 3, [])),
    ({"KMP_AFFINITY": "disabled", "OMP_THREAD_LIMIT": "5"}, (8, 5, ALL4 * 5, [W96.format(8, 5)])),
    ({"OMP_NUM_THREADS": "all", "KMP_AFFINITY": "compact"}, (4, 8, [[0], [1], [2], [3]] * 2, [])),
    ({"OMP_NUM_THREADS": "all"}, (4, 8, ALL4 * 8, [])),
    ({"KMP_DEVICE_THREAD_LIMIT": "all", "OMP_NUM_THREADS": "9"}, (4, 8, ALL4 * 8, [W96.format(9, 8)])),
    ({"KMP_AFFINITY": "compact"}, (4, 4, [[0], [1], [2], [3]], [])),
    ({"KMP_AFFINITY": "none"}, (4, 4, ALL4 * 4, [])),
]


@pytest.mark.parametrize("runtime", ["intel", "llvm"])
@pytest.mark.parametrize("env,want", OFFLINE, ids=lambda v: json.dumps(v) if isinstance(v, dict) else "")
def test_offline_cpus_count_in_the_runtimes_cpu_count(runtime, env, want):
    t = Topology.from_xml(DATA / "nosmt_4c_4offline.xml")
    assert t.offline_cpus == 4 and len(t.pus) == 4
    p = plan_env(env, topology=t, initial_mask="0-3", runtime=runtime)
    assert (p.num_procs,) + _got(p) == want


def test_offline_cpus_survive_json_and_a_narrower_mask(tmp_path):
    t = Topology.from_xml(DATA / "nosmt_4c_4offline.xml")
    (tmp_path / "t.json").write_text(t.to_json())
    back = Topology.from_json(tmp_path / "t.json")
    assert back.offline_cpus == 4 and t.with_allowed({0, 1}).offline_cpus == 4
    assert plan_env({"KMP_AFFINITY": "disabled"}, topology=back).threads == 8


def test_a_cpuinfo_file_cannot_say_which_cpus_are_offline(tmp_path):
    """/proc/cpuinfo lists online CPUs only: the plan counts those (the runtime
    would count the offline ones too; docs/semantics.md says so)."""
    t = _cpuinfo(tmp_path, [(0, 0, 0)], {0: [0]})
    assert t.offline_cpus == 0
    assert plan_env({"KMP_AFFINITY": "disabled"}, topology=t).threads == 1


# ---------------------------------------------------------------------------
# A: "Ignoring invalid OS proc ID" inside a proclist {set} comes in the order written
# ---------------------------------------------------------------------------

def _ignoring(*ids):
    return [f"Ignoring invalid OS proc ID {i}." for i in ids]


#: 1 package x 4 cores x 1 thread, process mask {0}: KMP_AFFINITY -> warnings
#: (each distinct line once, as the harness recorded them; team 1 on CPU 0)
PROCLIST_ORDER = [
    ("proclist=[{3,1},0],explicit", _ignoring(3, 1)),
    ("proclist=[{3,3,1},0],explicit", _ignoring(3, 1)),
    ("proclist=[{9,1,7},{5,0,5}],explicit", _ignoring(9, 1, 7, 5)),
    ("proclist=[{1,3,0},2],explicit", _ignoring(1, 3, 2)),
    ("proclist=[0,{7,6},{2,1}],explicit", _ignoring(7, 6, 2, 1)),
    ("granularity=core,proclist=[{3,1},{1,0}],explicit", _ignoring(3, 1)),
]


@pytest.mark.parametrize("runtime", ["intel", "llvm"])
@pytest.mark.parametrize("aff,want", PROCLIST_ORDER)
def test_proclist_set_warnings_in_the_order_written(tmp_path, runtime, aff, want):
    t = _cpuinfo(tmp_path, [(i, 0, i) for i in range(4)], {0: [0, 1, 2, 3]})
    p = plan_env({"KMP_AFFINITY": aff, "OMP_NUM_THREADS": "1"}, topology=t, initial_mask="0", runtime=runtime)
    assert (p.threads, [sorted(s) for s in p.cpusets], list(dict.fromkeys(p.warnings))) == (1, [[0]], want)


# ---------------------------------------------------------------------------
# H: NUMA node ids with a gap (libiomp5 reads node0, node1, ... and stops at the
# first missing id), under a process mask or KMP_HW_SUBSET
# ---------------------------------------------------------------------------

GAP_2S = [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]  # 2 packages x 2 cores x 1 thread
GAP_1S = [(i, 0, i) for i in range(4)]  # 1 package x 4 cores x 1 thread
NO_NUMA = ("OMP_PLACES: granularity setting: NUMA domain does not exist in topology.  "
           "Using granularity=core instead.")
#: (records, nodes, env, process mask) -> (num_procs, team, masks, warnings), from libiomp5
NUMA_GAP = [
    # no node read (node0) holds a proc of the mask: no NUMA layer at all
    ((GAP_2S, {0: [0, 1], 2: [2, 3]}, {"OMP_PLACES": "numa_domains", "OMP_PROC_BIND": "spread"}, "2-3"),
     (2, 2, [[2], [3]], [NO_NUMA])),
    # proc 2 (node3, not read) joins the first node read that holds a proc of the mask (node1)
    ((GAP_2S, {0: [0], 1: [1], 3: [2, 3]}, {"KMP_HW_SUBSET": "1s,1n", "OMP_NUM_THREADS": "3"}, "1-2"),
     (1, 3, [[1]] * 3, [])),
    ((GAP_1S, {0: [0], 1: [1], 3: [2, 3]}, {"OMP_PLACES": "numa_domains", "OMP_NUM_THREADS": "3"}, "1-3"),
     (3, 3, [[1, 2, 3]] * 3, [])),
    ((GAP_1S, {0: [0], 1: [1], 3: [2, 3]}, {"OMP_PLACES": "numa_domains", "OMP_NUM_THREADS": "3"}, "0,2-3"),
     (3, 3, [[0, 2, 3]] * 3, [])),
    # the whole machine: procs of no node read are in domain 0; rows are not re-sorted
    ((GAP_1S, {0: [0], 1: [1], 3: [2, 3]}, {"OMP_PLACES": "numa_domains"}, None),
     (4, 4, [[0], [0], [1], [2, 3]], [])),
    ((GAP_1S, {0: [0], 1: [1], 3: [2, 3]}, {"KMP_HW_SUBSET": "1n@1"}, None), (1, 1, [[1]], [])),
    # dense ids: the controls
    ((GAP_2S, {0: [0, 1], 1: [2, 3]}, {"OMP_PLACES": "numa_domains", "OMP_PROC_BIND": "spread"}, "2-3"),
     (2, 2, [[2, 3]] * 2, [])),
    ((GAP_2S, {0: [0], 1: [1], 2: [2, 3]}, {"KMP_HW_SUBSET": "1s,1n", "OMP_NUM_THREADS": "3"}, "1-2"),
     (2, 3, [[1, 2]] * 3, [])),
]


@pytest.mark.parametrize("case,want", NUMA_GAP, ids=lambda v: json.dumps(v[1:]) if isinstance(v[0], list) else "")
def test_numa_ids_with_a_gap_under_a_mask(tmp_path, case, want):
    records, nodes, env, mask = case
    t = _cpuinfo(tmp_path, records, nodes)
    p = plan_env(env, topology=t, initial_mask=mask, runtime="intel")
    assert (p.num_procs,) + _got(p) == want


# ---------------------------------------------------------------------------
# The order of the messages printed while reading the environment (G, and
# libiomp5's own order).  libomp 19 reads the variables in the environment's
# order, libiomp5 reads KMP_AFFINITY, OMP_PLACES, OMP_PROC_BIND, KMP_HW_SUBSET,
# GOMP_CPU_AFFINITY first, then the others in the environment's order; the
# planner gets the environment sorted by name (Plan.env), so the runtimes' outputs
# below are those of a sorted environment where the environment's order matters.
# ---------------------------------------------------------------------------

AFF = 'KMP_AFFINITY: parameter invalid, ignoring "granularity=foo".'
ONT = 'OMP_NUM_THREADS="0": value too small.'
OPB = 'OMP_PROC_BIND: "bad" is an invalid value; ignored.'
HW = ('KMP_HW_SUBSET: invalid value "zz", valid format is "N<item>[@N][,...][,Nt] (<item> can be S, N, L2, C, '
      'T  for Socket, NUMA Node, L2 Cache, Core, Thread)".')
GOMP = "GOMP_CPU_AFFINITY: syntax error, not using affinity."


def _ignored(name, rival):
    return f"{name}: ignored because {rival} has been defined"


MESSAGE_ORDER = [
    ({"OMP_NUM_THREADS": "0", "KMP_AFFINITY": "granularity=foo", "OMP_PROC_BIND": "bad"},
     [AFF, OPB, ONT], [AFF, ONT, OPB]),
    ({"GOMP_CPU_AFFINITY": "x", "KMP_HW_SUBSET": "zz", "OMP_PLACES": "bad{", "KMP_AFFINITY": "granularity=foo",
      "OMP_NUM_THREADS": "0"},
     [AFF, _ignored("OMP_PLACES", "GOMP_CPU_AFFINITY"), HW, GOMP, ONT],
     [GOMP, AFF, HW, ONT, _ignored("OMP_PLACES", "GOMP_CPU_AFFINITY")]),
    ({"OMP_PROC_BIND": "bad", "OMP_PLACES": "bad{", "GOMP_CPU_AFFINITY": "x"},
     [_ignored("OMP_PLACES", "GOMP_CPU_AFFINITY"), _ignored("OMP_PROC_BIND", "GOMP_CPU_AFFINITY"), GOMP],
     [GOMP, _ignored("OMP_PLACES", "GOMP_CPU_AFFINITY"), _ignored("OMP_PROC_BIND", "GOMP_CPU_AFFINITY")]),
    ({"OMP_THREAD_LIMIT": "x", "KMP_AFFINITY": "granularity=foo,compact", "OMP_PLACES": "bad{",
      "OMP_NUM_THREADS": "3", "KMP_ALL_THREADS": "y"},
     [AFF, _ignored("OMP_PLACES", "KMP_AFFINITY"), 'KMP_ALL_THREADS="y": not a number.',
      'OMP_THREAD_LIMIT="x": not a number.'],
     [AFF, 'KMP_ALL_THREADS="y": not a number.', _ignored("OMP_PLACES", "KMP_AFFINITY"),
      'OMP_THREAD_LIMIT="x": not a number.']),
]


@pytest.mark.parametrize("env,intel,llvm", MESSAGE_ORDER, ids=lambda v: json.dumps(v) if isinstance(v, dict) else "")
def test_messages_in_the_order_the_runtime_reads_the_variables(tmp_path, env, intel, llvm):
    t = _cpuinfo(tmp_path, [(0, 0, 0), (1, 0, 1)], {0: [0, 1]})
    for runtime, want in (("intel", intel), ("llvm", llvm)):
        assert list(dict.fromkeys(plan_env(env, topology=t, runtime=runtime).warnings)) == want, runtime


@pytest.mark.parametrize("attr,want", [
    ('complete_cpuset="0x000000ff"', 8),
    ('complete_cpuset="0x0000000f,0xffffffff"', 36),  # 32-bit words, the highest first
    ('complete_cpuset="0xf...f"', None),  # "every CPU": says nothing
    ("", None),
])
def test_configured_cpus_read_from_an_xml_root(attr, want):
    from affinity.machine.topology import _xml_configured

    data = f'<topology version="2.0"><object type="Machine" cpuset="0x0f" {attr}/></topology>'.encode()
    assert _xml_configured(data) == want


def test_this_system_counts_its_offline_cpus_as_sysconf_does():
    import os

    t = Topology.from_system()
    assert t.offline_cpus == max(0, os.sysconf("SC_NPROCESSORS_CONF") - len(t.pus))


@pytest.mark.parametrize("runtime", ["intel", "llvm"])
def test_a_limit_cannot_save_a_team_of_int_max(tmp_path, runtime):
    """Both runtimes crash on OMP_NUM_THREADS=2147483647 before any limit applies;
    40000 threads, which alone cannot be created, become 3 under a limit of 3."""
    from affinity.errors import PlanError

    t = _cpuinfo(tmp_path, [(0, 0, 0), (1, 0, 1)], {0: [0, 1]})
    with pytest.raises(PlanError):
        plan_env({"OMP_NUM_THREADS": "2147483647", "OMP_THREAD_LIMIT": "2"}, topology=t, runtime=runtime)
    with pytest.raises(PlanError):
        plan_env({"OMP_NUM_THREADS": "40000"}, topology=t, runtime=runtime)
    p = plan_env({"OMP_NUM_THREADS": "40000", "KMP_DEVICE_THREAD_LIMIT": "3"}, topology=t, runtime=runtime)
    assert _got(p) == (3, [[0, 1]] * 3, [W96.format(40000, 3)])


DIE = "KMP_AFFINITY: granularity setting: die does not exist in topology.  Using granularity=core instead."
NO_IDS = ["Ignoring invalid OS proc ID 7.", "No valid OS proc IDs specified - not using affinity."]
#: env -> (libiomp5, libomp 19): libiomp5 prints the messages of OMP_NUM_THREADS,
#: KMP_PLACE_THREADS and the thread limits after those of its affinity
#: initialization, libomp 19 before them (1 package x 2 cores; probed)
AFTER_INIT = [
    ({"KMP_AFFINITY": "granularity=die,scatter", "OMP_NUM_THREADS": "0"},
     [DIE, ONT], [ONT, DIE]),
    ({"KMP_AFFINITY": "granularity=die,scatter", "OMP_THREAD_LIMIT": "x"},
     [DIE, 'OMP_THREAD_LIMIT="x": not a number.'], ['OMP_THREAD_LIMIT="x": not a number.', DIE]),
    ({"KMP_AFFINITY": "proclist=[7],explicit", "KMP_PLACE_THREADS": "zz"},
     NO_IDS + [HW.replace("KMP_HW_SUBSET", "KMP_PLACE_THREADS", 1)],
     [HW.replace("KMP_HW_SUBSET", "KMP_PLACE_THREADS", 1)] + NO_IDS),
    ({"KMP_AFFINITY": "proclist=[7],explicit", "KMP_ALL_THREADS": "x", "KMP_DEVICE_THREAD_LIMIT": "2"},
     NO_IDS + [_ignored("KMP_ALL_THREADS", "KMP_DEVICE_THREAD_LIMIT")],
     [_ignored("KMP_ALL_THREADS", "KMP_DEVICE_THREAD_LIMIT")] + NO_IDS),
    ({"KMP_AFFINITY": "proclist=[7],explicit", "KMP_HW_SUBSET": "zz"}, [HW] + NO_IDS, [HW] + NO_IDS),
    ({"KMP_AFFINITY": "proclist=[7],explicit", "GOMP_CPU_AFFINITY": "x"},
     [_ignored("GOMP_CPU_AFFINITY", "KMP_AFFINITY")] + NO_IDS, [_ignored("GOMP_CPU_AFFINITY", "KMP_AFFINITY")] + NO_IDS),
]


@pytest.mark.parametrize("env,intel,llvm", AFTER_INIT, ids=lambda v: json.dumps(v) if isinstance(v, dict) else "")
def test_which_messages_come_after_the_affinity_initialization(tmp_path, env, intel, llvm):
    t = _cpuinfo(tmp_path, [(0, 0, 0), (1, 0, 1)], {0: [0, 1]})
    for runtime, want in (("intel", intel), ("llvm", llvm)):
        assert list(dict.fromkeys(plan_env(env, topology=t, runtime=runtime).warnings)) == want, runtime
