"""A TID must be a thread of this process (issue 24, item 3).

Before: ``set_affinity(..., tid=X)``, ``set_threads_affinity({X: ...})`` and
``get_affinity(X)`` called the kernel with any id: a child ``sleep`` was re-pinned
(as root, PID 1 too).  Now one check (``threads.owned_tids`` / ``own_thread``)
refuses another process's TID before the kernel is called, and its mask is untouched.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time

import pytest

from affinity.binding import threads
from affinity.errors import AccessDenied, AffinityError, NoSuchThread, SpecError
from helpers.threads import Parked

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a process mask of at least 2 CPUs")

CPUS = sorted(os.sched_getaffinity(0))


@pytest.fixture
def child():
    p = subprocess.Popen(["sleep", "30"])
    try:
        yield p.pid
    finally:
        p.kill()
        p.wait()


def test_another_process_is_refused_and_untouched(child):
    before = os.sched_getaffinity(child)
    assert len(before) >= 2  # so that a pin to one CPU would show
    calls = [lambda: threads.set_affinity({CPUS[0]}, tid=child),
             lambda: threads.set_threads_affinity({child: {CPUS[0]}}),
             lambda: threads.set_threads_affinity({threads.current_tid(): {CPUS[0]}, child: {CPUS[0]}}),
             lambda: threads.get_affinity(child)]
    mine = os.sched_getaffinity(0)
    for call in calls:
        with pytest.raises(AccessDenied) as ei:
            call()
        e = ei.value
        assert e.errno == errno.EPERM and f"tid={child}" in str(e) and "another process" in str(e)
        assert "\n" not in str(e)
        assert os.sched_getaffinity(child) == before  # untouched
        assert os.sched_getaffinity(0) == mine  # all or nothing: ours untouched too


def test_a_binding_s_own_tid_now_held_by_another_process_is_left_out(child):
    """A binding pins or restores TIDs it listed from this process moments ago
    (``listed=True``): a TID another process holds now is a thread of ours that
    exited, its TID reused (two churning processes made it happen: the binding's
    refresh raised AccessDenied): left out, that process untouched, ours pinned."""
    before = os.sched_getaffinity(child)
    me = threads.current_tid()
    mine = os.sched_getaffinity(0)
    try:
        old = threads.set_threads_affinity({me: {CPUS[0]}, child: {CPUS[0]}}, listed=True)
        assert set(old) == {me} and os.sched_getaffinity(0) == {CPUS[0]}
        assert os.sched_getaffinity(child) == before
    finally:
        os.sched_setaffinity(0, mine)


def test_our_threads_still_pinned():
    with Parked() as t:
        m0 = os.sched_getaffinity(t.tid)
        assert threads.set_affinity({CPUS[1]}, tid=t.tid) == {CPUS[1]}
        assert threads.get_affinity(t.tid) == {CPUS[1]}
        prev = threads.set_threads_affinity({t.tid: frozenset(m0)})
        assert prev == {t.tid: frozenset({CPUS[1]})} and os.sched_getaffinity(t.tid) == m0
    assert threads.get_affinity() == threads.get_affinity(None) == threads.get_affinity(0)


def test_a_thread_gone_is_left_out_of_a_bulk_pin_and_no_such_thread_alone():
    t = Parked()
    with t:
        tid = t.tid
    t.join()
    for _ in range(10_000):  # the kernel reaps the thread after Python's join returns
        if not os.path.exists(f"/proc/self/task/{tid}"):
            break
        time.sleep(0.001)
    if os.path.exists(f"/proc/{tid}"):  # reused at once: by another process refused, by ours pinned
        if threads._tgid(tid) != os.getpid():
            with pytest.raises(AccessDenied):
                threads.set_threads_affinity({tid: {CPUS[0]}})
        return
    assert threads.set_threads_affinity({tid: {CPUS[0]}}) == {}
    with pytest.raises(NoSuchThread):
        threads.set_affinity({CPUS[0]}, tid=tid)


@pytest.mark.parametrize("tid,cls", [(2**40, NoSuchThread), (2**22, NoSuchThread), (10**5000, NoSuchThread),
                                     (1.5, SpecError), (True, SpecError), (-1, SpecError), ("12", SpecError)],
                         ids=["2**40", "2**22", "10**5000", "1.5", "True", "-1", "str"])
def test_bad_tids_are_one_line_affinity_errors(tid, cls):
    for call in (lambda: threads.set_affinity({CPUS[0]}, tid=tid), lambda: threads.get_affinity(tid),
                 lambda: threads.set_threads_affinity({tid: {CPUS[0]}})):
        with pytest.raises(cls) as ei:
            call()
        assert isinstance(ei.value, AffinityError) and "\n" not in str(ei.value) and len(str(ei.value)) < 300


def test_the_core_tells_our_live_threads_from_any_other_task(child):
    """The ownership check's system call (tgkill(getpid(), tid, 0): no signal sent):
    our threads pass; another process (its main thread), this process's thread
    once it has exited, and a TID no task can hold (pid_max) do not."""
    from affinity.machine import _native

    with Parked() as t:
        gone = t.tid
        assert _native.tids_not_ours([threads.current_tid(), t.tid]) == []
    deadline = time.monotonic() + 10  # joined; the kernel releases the task just after
    while os.path.exists(f"/proc/self/task/{gone}") and time.monotonic() < deadline:
        time.sleep(0.001)
    never = int(open("/proc/sys/kernel/pid_max").read())  # PIDs and TIDs stay below it
    assert _native.tids_not_ours([threads.current_tid(), child, gone, never]) == [child, gone, never]
    assert threads.owned_tids([gone], "x", gone=True) == [None]
    with pytest.raises(AccessDenied):
        threads.owned_tids([threads.current_tid(), child], "x")


def test_the_docstrings_say_what_another_process_tid_raises(child):
    """The docstrings (rendered into docs/api.md) said NoSuchThread for another
    process's TID; the calls raise AccessDenied."""
    import re

    for f, call in [(threads.get_affinity, lambda: threads.get_affinity(child)),
                    (threads.set_affinity, lambda: threads.set_affinity({CPUS[0]}, tid=child)),
                    (threads.set_threads_affinity, lambda: threads.set_threads_affinity({child: {CPUS[0]}}))]:
        with pytest.raises(AccessDenied):
            call()
        doc = " ".join(f.__doc__.split())
        assert re.search(r"AccessDenied[^.]*another process", doc), f.__name__
        assert not re.search(r"another process's (TID|thread)[^.]*NoSuchThread", doc), f.__name__
    # a TID no task holds is left out of a bulk pin (taken for a thread that exited), and the docstring says so
    assert "returns ``{}``" in " ".join(threads.set_threads_affinity.__doc__.split())
