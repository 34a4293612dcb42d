"""NUMA placement of NumPy arrays and the raw memory-policy calls, read back
from the kernel (``move_pages``, ``get_mempolicy`` with ``MPOL_F_ADDR``,
``/proc/thread-self/numa_maps``)."""

from __future__ import annotations

import errno

import numpy as np
import pytest

from affinity.machine import _native
from affinity.binding import numa
from affinity.errors import BindError, PlanError, SpecError
from affinity.machine.topology import Topology
from helpers.threads import in_thread

NODES = sorted(n.os_index for n in Topology.from_system().numa_nodes)
NODE = NODES[0]


def numa_maps_policy(addr: int) -> str:
    """The policy column of /proc/thread-self/numa_maps for the mapping holding ``addr``."""
    rows = {}
    with open("/proc/thread-self/numa_maps") as fh:
        for line in fh:
            start, *words = line.split()
            # the policy may hold a space ("prefer (many):0"); details are key=value
            policy = []
            for w in words:
                if "=" in w or w in ("heap", "stack", "huge"):
                    break
                policy.append(w)
            rows[int(start, 16)] = " ".join(policy)
    return rows[max(s for s in rows if s <= addr)]


@pytest.mark.parametrize("policy", ["bind", "interleave", "preferred"])
def test_empty_places_every_page_and_reads_back(policy):
    a = numa.empty((300, 70), np.float64, node=NODE, policy=policy)
    assert a.shape == (300, 70) and a.dtype == np.float64 and a.flags.c_contiguous
    pages = -(-a.nbytes // numa._page_size())
    assert numa.array_nodes(a) == {NODE: pages}  # every page touched, all on the node
    assert numa.array_policy(a) == numa.MemPolicy(policy, frozenset({NODE}))
    # hwloc asks for MPOL_PREFERRED_MANY even for one node, where the kernel has it
    kernel_names = {"bind": ["bind"], "interleave": ["interleave"],
                    "preferred": ["prefer", "prefer (many)"]}[policy]
    assert numa_maps_policy(a.ctypes.data) in [f"{k}:{NODE}" for k in kernel_names]
    a[:] = 1.5  # an ordinary array
    assert float(a.sum()) == 1.5 * a.size


def test_empty_without_touch_leaves_pages_unallocated_and_fortran_order():
    a = numa.empty((64, 64), "f4", node=[NODE], touch=False, order="F")
    assert a.flags.f_contiguous
    assert numa.array_nodes(a) == {-errno.ENOENT: -(-a.nbytes // numa._page_size())}
    a[0, 0] = 1  # first touch follows the area policy, whoever touches
    assert numa.array_nodes(a)[NODE] == 1


def test_empty_with_no_node_follows_the_thread_policy():
    a = in_thread(lambda: (numa.set_membind({NODE}, "interleave"), numa.empty(1000))[1])
    assert numa.array_policy(a).policy == "default"  # no area policy of its own ...
    assert set(numa.array_nodes(a)) == {NODE}  # ... but placed by the thread's interleave


def test_bind_array_on_an_existing_array_moves_and_reports():
    a = np.arange(200_000, dtype=np.int64)
    before = numa.array_nodes(a)
    assert set(before) <= set(NODES)
    got = numa.bind_array(a, NODE, "bind")
    assert got == numa.MemPolicy("bind", frozenset({NODE}))
    assert numa.array_nodes(a) == {NODE: sum(before.values())}
    view = a[::7]  # a strided view covers the same pages
    assert numa.bind_array(view, [NODE], "preferred") == numa.MemPolicy("preferred", frozenset({NODE}))


def test_bind_array_errors_name_the_call_and_nodes():
    a = np.zeros(4096)
    with pytest.raises(PlanError) as ei:  # checked before the call, as `affinity run` checks it
        numa.bind_array(a, 63)
    assert "bind_area(nodes={63}, policy=bind): no NUMA node 63 on this machine (nodes: " in str(ei.value)
    with pytest.raises(ValueError, match="no memory"):
        numa.bind_array(np.zeros(0), NODE)
    with pytest.raises(ValueError, match="negative dimension"):
        numa.empty((-1, 2))


@pytest.mark.parametrize("policy,kernel", [("bind", "bind"), ("interleave", "interleave"),
                                           ("preferred", "prefer"), ("local", "local"),
                                           ("default", "default")])
def test_raw_set_mempolicy_matches_numactl_modes(policy, kernel):
    def go():
        _native.set_mempolicy(policy, {NODE} if policy not in ("local", "default") else ())
        pol, nodes = _native.get_mempolicy()
        # a fresh mapping has no policy of its own: numa_maps shows the thread's
        buf = np.ones(10)
        return pol, nodes, numa_maps_policy(buf.ctypes.data)

    pol, nodes, shown = in_thread(go)
    assert pol == policy
    assert shown.split(":")[0] == kernel


def test_raw_set_mempolicy_errors():
    with pytest.raises(BindError) as ei:
        in_thread(lambda: _native.set_mempolicy("bind", {63}))
    assert ei.value.errno == errno.EINVAL
    assert str(ei.value) == "[Errno 22] set_mempolicy(MPOL_BIND, nodes={63}) failed: Invalid argument"
    with pytest.raises(BindError, match=r"set_mempolicy\(MPOL_INTERLEAVE, nodes=\{\}\)"):
        in_thread(lambda: _native.set_mempolicy("interleave", ()))


def test_move_pages_query_and_move_to_the_same_node():
    a = np.ones(3 * numa._page_size() // 8)
    addrs = [a.ctypes.data + i * numa._page_size() for i in range(3)]
    assert _native.move_pages(addrs) == [NODE] * 3
    assert _native.move_pages(addrs, [NODE] * 3) == [NODE] * 3
    with pytest.raises(ValueError, match="3 pages but 1 target"):
        _native.move_pages(addrs, [NODE])
    assert _native.move_pages([]) == []


@pytest.mark.parametrize("nodes,message", [
    # a string was read one character at a time: '10' bound nodes 1 and 0
    ("10", "set_membind: expected node ids, got the string '10' (parse_list reads a list's text)"),
    (str(NODE), f"set_membind: expected node ids, got the string '{NODE}'"),
    ("0-1,x", "set_membind: expected node ids, got the string '0-1,x'"),
    ([0.5], "set_membind: node id 0.5 is not an integer"),  # was node 0
    ([True], "set_membind: node id True is not an integer"),  # was node 1
    ([-1], "set_membind: node id -1 is out of range"),
])
def test_set_membind_reads_node_ids_as_every_id_is_read(nodes, message):
    with pytest.raises(SpecError) as ei:
        in_thread(lambda: numa.set_membind(nodes))
    assert str(ei.value).startswith(message)
    assert "\n" not in str(ei.value)


def test_node_ids_of_areas_and_arrays_are_checked_the_same_way():
    with pytest.raises(SpecError, match=r"^bind_area: expected node ids, got the string '0'"):
        numa.empty(10, node="0")
    with pytest.raises(SpecError, match=r"^bind_area: node id True is not an integer"):
        numa.bind_array(np.zeros(4096), True)
    with pytest.raises(SpecError, match=r"^bind_area: node id 0.5 is not an integer"):
        numa.bind_array(np.zeros(4096), [0.5], "interleave")
    # one node given as a NumPy integer is one node, as an int is
    assert numa.empty(10, node=np.int64(NODE)).shape == (10,)
