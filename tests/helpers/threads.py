"""Thread helpers shared by the tests: a parked thread with a known TID and
kernel name, a function run in a fresh thread, and every thread's mask."""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any, Callable

PR_SET_NAME = 15


def all_masks() -> dict[int, frozenset[int]]:
    """TID -> CPU mask of every thread of this process (threads that exit
    while we read are left out)."""
    out = {}
    seen = set(os.listdir("/proc/self/task"))  # listed again until none is new: while a thread
    while not (again := set(os.listdir("/proc/self/task"))) <= seen:  # exits, one listing can
        seen |= again  # skip the next thread, a live one
    for t in seen:
        try:
            out[int(t)] = frozenset(os.sched_getaffinity(int(t)))
        except OSError:
            pass
    return out


def restore_masks(before: dict[int, frozenset[int]]) -> None:
    """Put back masks saved by :func:`all_masks` (threads gone since are skipped)."""
    for t, m in before.items():
        try:
            os.sched_setaffinity(t, m)
        except OSError:
            pass


class Parked(threading.Thread):
    """A thread that parks until the ``with`` block ends; ``tid`` is its Linux
    TID, and its kernel name (``/proc/self/task/TID/comm``) is ``name`` when given."""

    def __init__(self, name: str | None = None):
        super().__init__(daemon=True)
        self.os_name = name
        self.ready, self.stop, self.tid = threading.Event(), threading.Event(), 0

    def run(self) -> None:
        if self.os_name:
            ctypes.CDLL(None).prctl(PR_SET_NAME, self.os_name.encode(), 0, 0, 0)
        self.tid = threading.get_native_id()
        self.ready.set()
        self.stop.wait()  # until the block ends, however long a loaded machine takes

    def __enter__(self) -> Parked:
        self.start()
        if not self.ready.wait(120):
            raise RuntimeError("the parked thread did not start")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.join()


def in_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a fresh thread and return its result or raise its
    exception: memory policies are per thread, so the test process's own
    policy is never changed."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["v"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            out["e"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "e" in out:
        raise out["e"]
    return out["v"]
