"""Pin N threads of this process to N different CPU sets and restore them.

Side by side, in one run (group ``pin+restore-N``):

* ``os-loop``    the reference (◆): what :func:`set_threads_affinity` does,
                 written with the ``os`` module -- for each thread
                 ``os.sched_getaffinity`` (its previous mask, kept for the way
                 back) then ``os.sched_setaffinity``; then the same back to the
                 previous masks.  Each call is CPython's C wrapper around one
                 system call: the floor for this work from Python;
* ``os-snapshot``  the loop a user writes by hand: a snapshot of every mask,
                 the new masks, the snapshot set back (one read fewer per
                 thread than the reference, nothing returned on the way back);
* ``ctypes-syscalls`` ``sched_setaffinity`` through ctypes on masks built
                 beforehand, one call per thread and direction, no snapshot and no
                 read-back: the bare syscalls as Python can issue them;
* ``psutil``     ``psutil.Process(tid).cpu_affinity()`` loop (snapshot + set + restore);
* ``affinity``   :func:`affinity.binding.threads.set_threads_affinity` there and back
                 (all or nothing: per thread the previous mask read and the new one
                 set, in one call into the compiled core; the previous masks returned).

* ``apply+restore`` the whole :func:`affinity.apply` (plan, snapshot of all N
                 masks, environment export, read-back) plus :meth:`Binding.restore`
                 (every mask set back), in the same process.
"""

from __future__ import annotations

import ctypes
import os
import threading

import pytest

import affinity
from affinity.binding import threads as athreads

CPUS = sorted(os.sched_getaffinity(0))
N = (4, 32)


class Parked:
    def __init__(self, n: int):
        self.stop = threading.Event()
        self.tids: list[int] = []
        lock = threading.Lock()
        ready = threading.Barrier(n + 1)

        def body():
            with lock:
                self.tids.append(threading.get_native_id())
            ready.wait()
            self.stop.wait()

        self.threads = [threading.Thread(target=body, daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()
        ready.wait()

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join()


@pytest.fixture(params=N, ids=lambda n: f"{n}threads")
def parked(request):
    p = Parked(request.param)
    yield p
    p.close()


def _targets(tids):
    return {t: frozenset({CPUS[i % len(CPUS)]}) for i, t in enumerate(tids)}


_libc = ctypes.CDLL(None, use_errno=True)
_SET_SIZE = 128  # bytes: 1024 CPUs


def _mask_buf(cpus):
    buf = (ctypes.c_ubyte * _SET_SIZE)()
    for c in cpus:
        buf[c // 8] |= 1 << (c % 8)
    return buf


def _ctypes_syscalls(pre):
    for tid, new, old in pre:
        _libc.sched_setaffinity(tid, _SET_SIZE, new)
    for tid, new, old in pre:
        _libc.sched_setaffinity(tid, _SET_SIZE, old)


def _os_swap(masks):
    """For each thread: its previous mask read, the new one set; the previous masks."""
    prev = {}
    for t, m in masks.items():
        prev[t] = os.sched_getaffinity(t)
        os.sched_setaffinity(t, m)
    return prev


def _os_loop(targets):
    _os_swap(_os_swap(targets))


def _os_snapshot(targets):
    snap = {t: os.sched_getaffinity(t) for t in targets}
    for t, m in targets.items():
        os.sched_setaffinity(t, m)
    for t, m in snap.items():
        os.sched_setaffinity(t, m)


def _psutil_loop(targets):
    import psutil

    procs = {t: psutil.Process(t) for t in targets}
    snap = {t: p.cpu_affinity() for t, p in procs.items()}
    for t, m in targets.items():
        procs[t].cpu_affinity(sorted(m))
    for t, m in snap.items():
        procs[t].cpu_affinity(m)


def _affinity(targets):
    prev = athreads.set_threads_affinity(targets)
    athreads.set_threads_affinity(prev)


@pytest.mark.parametrize("impl", ["ctypes-syscalls", "os-loop", "os-snapshot", "psutil", "affinity"])
def test_pin_and_restore(benchmark, parked, impl):
    targets = _targets(parked.tids)
    benchmark.group = f"pin+restore-{len(parked.tids)}"
    if impl == "ctypes-syscalls":
        full = _mask_buf(CPUS)
        pre = [(t, _mask_buf(m), full) for t, m in targets.items()]
        benchmark(_ctypes_syscalls, pre)
    elif impl == "os-loop":
        benchmark(_os_loop, targets)
    elif impl == "os-snapshot":
        benchmark(_os_snapshot, targets)
    elif impl == "psutil":
        pytest.importorskip("psutil")
        benchmark(_psutil_loop, targets)
    else:
        benchmark(_affinity, targets)
    for t in parked.tids:  # every implementation restores
        assert os.sched_getaffinity(t) == set(CPUS)


@pytest.mark.parametrize("impl", ["apply+restore"])
def test_apply_and_restore(benchmark, parked, impl):
    """The whole apply() + restore() in a process holding N threads: plan, snapshot
    of all N masks, environment export, read-back, then every mask restored."""
    benchmark.group = f"pin+restore-{len(parked.tids)}"

    def go():
        b = affinity.apply("granularity=fine,compact", tensorflow=False, openmp=False, blas=False)
        b.restore()

    benchmark(go)
    for t in parked.tids:
        assert os.sched_getaffinity(t) == set(CPUS)
