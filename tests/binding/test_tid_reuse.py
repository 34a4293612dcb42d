"""A TID the kernel gives to a new thread is not the thread that had it before.

Once a thread exits, Linux hands its TID to the next thread it creates after the
counter wraps (``pid_max``: 32,768 here), which a service starting a thread per request
reaches within minutes.  A binding that knew threads by TID alone took such a newcomer
for the thread it replaced: :meth:`Binding.refresh` never pinned it (seen already), and
the restore gave it the old thread's mask instead of the process's.  Threads are now
known by TID and start time (``/proc/self/task/TID/stat``, field 22).

The reuse is made real here: ``/proc/sys/kernel/ns_last_pid`` (root) says which number
the kernel gives next, as checkpoint/restore tools use it.  The last test makes the
same case without root, by changing what the start time reads.
"""

from __future__ import annotations

import os
import time

import pytest

import affinity
from affinity.binding import threads
from helpers.threads import Parked

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a process mask of at least 2 CPUs")

CPUS = sorted(os.sched_getaffinity(0))
NEXT_PID = "/proc/sys/kernel/ns_last_pid"


def _quiet(spec: str) -> affinity.Binding:
    """A binding that pins nothing at apply() but refreshes new threads onto ``spec``'s CPUs."""
    return affinity.apply(spec, threads=1, tensorflow=False, openmp=False, blas=False, export=False)


def _thread_with_tid(tid: int, tries: int = 2000) -> Parked:
    """A parked thread with TID ``tid`` (that of a thread that exited), started with
    the kernel's next-number counter set just below it; raced by any other task the
    machine starts meanwhile, hence the retries."""
    deadline = time.monotonic() + 60
    while os.path.exists(f"/proc/self/task/{tid}") and time.monotonic() < deadline:
        time.sleep(0.001)  # joined in Python, the kernel task may take a moment to go
    # a start time is in clock ticks: a natural reuse comes a whole wrap of the counter
    # later, never within the tick the old thread started in, as a forced one could
    time.sleep(2 / os.sysconf("SC_CLK_TCK"))
    for _ in range(tries):
        try:
            with open(NEXT_PID, "w") as fh:
                fh.write(str(tid - 1))
        except OSError as e:
            pytest.skip(f"the kernel's next TID cannot be chosen here ({NEXT_PID}: {e.strerror}); "
                        "test_a_new_start_time_is_a_new_thread covers the rule without it")
        p = Parked().__enter__()
        if p.tid == tid:
            return p
        p.__exit__()
    pytest.fail(f"no new thread got TID {tid} in {tries} tries")


def _exited(p: Parked) -> int:
    p.__exit__()
    return p.tid


def test_a_reused_tid_is_refreshed_and_restored_as_a_new_thread():
    old = Parked().__enter__()
    os.sched_setaffinity(old.tid, {CPUS[1]})  # a mask of its own
    b = _quiet(f"explicit,proclist=[{CPUS[0]}]")
    try:
        new = _thread_with_tid(_exited(old))
        try:
            assert threads.task_starts(tids=[new.tid])[new.tid] != b._snapshot.starts[new.tid]
            assert new.tid in b.refresh()  # born inside the block: pinned onto the plan
            assert b.pins[new.tid].role == "other"
            assert os.sched_getaffinity(new.tid) == {CPUS[0]}
            b.restore()
            assert os.sched_getaffinity(new.tid) == set(CPUS)  # the process's mask, not the old thread's
        finally:
            new.__exit__()
    finally:
        b.restore()


def test_an_outer_block_restored_first_hands_down_no_mask_of_a_dead_thread():
    old = Parked().__enter__()
    os.sched_setaffinity(old.tid, {CPUS[1]})
    outer = _quiet("compact")
    new = _thread_with_tid(_exited(old))
    try:
        os.sched_setaffinity(new.tid, {CPUS[0]})
        inner = _quiet("compact")
        outer.restore()  # out of order: the inner block inherits what the outer one saved
        inner.restore()
        # the outer binding's mask for this TID was the dead thread's: the newcomer,
        # born inside the outer block, gets the process's mask at the outer apply()
        assert os.sched_getaffinity(new.tid) == set(CPUS)
    finally:
        new.__exit__()


def test_a_new_start_time_is_a_new_thread(monkeypatch):
    """The rule without root: the same TID read with another start time."""
    real = threads.task_stats
    reborn: set[int] = set()

    def task_stats(pid=None, tids=None):
        return {t: (n, s + 1 if t in reborn else s) for t, (n, s) in real(pid, tids).items()}

    monkeypatch.setattr(threads, "task_stats", task_stats)
    with Parked() as p:
        os.sched_setaffinity(p.tid, {CPUS[1]})
        b = _quiet(f"explicit,proclist=[{CPUS[0]}]")
        try:
            assert b.refresh() == []  # the same threads as at apply()
            reborn.add(p.tid)
            assert b.refresh() == [p.tid]
            assert os.sched_getaffinity(p.tid) == {CPUS[0]}
            assert b.refresh() == []  # seen now
        finally:
            b.restore()
        assert os.sched_getaffinity(p.tid) == set(CPUS)


def test_a_name_with_parentheses_and_spaces_reads_whole():
    """The name sits between the stat line's first '(' and its last ')'."""
    with Parked(name="a) b (c) 0 0") as p:
        stats = threads.task_stats()
        assert stats[p.tid][0] == "a) b (c) 0 0"
        assert threads.task_names()[p.tid] == "a) b (c) 0 0"
        # the start is read past the name: a thread starts after its process
        assert stats[p.tid][1] >= stats[os.getpid()][1]
        assert threads.task_starts(tids=[p.tid, 2 ** 22 + 1]) == {p.tid: stats[p.tid][1]}  # a gone one left out
