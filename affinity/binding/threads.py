"""CPU binding of this process's threads, each call reading back what it did.

Thin, checked wrappers over the native core:

* :func:`get_affinity` / :func:`set_affinity` -- the calling thread, or another
  thread of this process by Linux TID;
* :func:`get_process_affinity` / :func:`set_process_affinity` -- every thread,
  all or nothing (a failure leaves every thread as it was);
* :func:`set_threads_affinity` -- many threads to different sets, all or nothing;
* :func:`list_threads` -- TID, name, mask and last CPU of every thread;
* :func:`task_ids` / :func:`task_names` -- the threads of any process, from
  ``/proc/PID/task`` (the one Python reader of it; the C core lists
  ``/proc/self/task`` itself inside its all-or-nothing process bind).

Binding goes through this machine's hwloc topology only: passing a topology that
is not this system (XML, synthetic, cpuinfo) raises :class:`~affinity.errors.ForeignTopologyError`,
since hwloc would accept the call and bind nothing.
"""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..machine import _native
from ..cpulist import MAX_CPUS, check_ids, format_list
from ..errors import ForeignTopologyError, MaskNarrowedError, NoSuchThread, SpecError
from ..machine.topology import Topology

__all__ = [
    "ThreadInfo",
    "current_tid",
    "get_affinity",
    "get_process_affinity",
    "list_threads",
    "set_affinity",
    "set_process_affinity",
    "set_threads_affinity",
]


@dataclass(frozen=True)
class ThreadInfo:
    """One thread of this process as the kernel sees it now."""

    tid: int
    name: str
    cpus: frozenset[int]
    last_cpu: int


def require_system(topology: Topology | None, what: str = "binding") -> None:
    """Refuse to bind through a topology that does not describe this machine."""
    if topology is not None and not topology.is_this_system:
        raise ForeignTopologyError(
            f"{what} through topology {topology.source or topology.describe()!r} refused: it is not "
            f"this system (hwloc would accept the call and bind nothing); use Topology.from_system()",
            call=what)


def _cpus(cpus: Iterable[int], what: str, tid: int | None = None) -> frozenset[int]:
    """``cpus`` as a checked frozenset of OS CPU ids (``what``, and ``tid`` when
    given, name the caller in the error).  A frozenset of ints already checked
    once is returned as it is (:func:`_checked` remembers it)."""
    if cpus.__class__ is frozenset and _checked(cpus):
        return cpus  # type: ignore[return-value]
    where = what if tid is None else f"{what}[tid={tid}]"
    s = check_ids(cpus, "CPU", where=where)
    if not s:
        raise SpecError(f"{where}: empty CPU set")
    return s


@functools.lru_cache(maxsize=4096)
def _checked(cpus: frozenset[int]) -> bool:
    """A non-empty set of Python ints in range (what :func:`_cpus` lets through)."""
    return bool(cpus) and all(c.__class__ is int for c in cpus) and min(cpus) >= 0 and max(cpus) < MAX_CPUS


def _verify(requested: frozenset[int], got: frozenset[int], call: str, tid: int, strict: bool) -> None:
    if strict and got != requested:
        raise MaskNarrowedError(
            errno.EXDEV, call, f"tid={tid}, cpus={{{format_list(requested)}}}",
            message=f"{call}(tid={tid}): asked for CPUs {{{format_list(requested)}}} but the kernel "
                    f"applied {{{format_list(got)}}} (CPUs outside this process's cpuset are dropped)")


def current_tid() -> int:
    """The Linux TID of the calling thread."""
    return _native.gettid()


def get_affinity(tid: int | None = None) -> frozenset[int]:
    """CPU set of the calling thread (``tid=None``) or of thread ``tid`` of this process."""
    return _native.get_thread_cpubind(tid or 0)


def set_affinity(cpus: Iterable[int], tid: int | None = None, *, topology: Topology | None = None,
                 strict: bool = False) -> frozenset[int]:
    """Bind the calling thread (or thread ``tid``) to ``cpus``; return the set read back.

    Parameters
    ----------
    cpus : iterable of int
        OS CPU ids (non-empty).
    tid : int, optional
        A Linux TID of this process (default: the calling thread).
    topology : Topology, optional
        Must be this system's (binding through a file's topology is refused).
    strict : bool
        The kernel drops CPUs the process may not use; ``True`` turns such a silent
        change into :class:`~affinity.errors.MaskNarrowedError` (``errno.EXDEV``).

    Returns
    -------
    frozenset of int
        The mask read back from the kernel.

    Raises
    ------
    BindError
        The system call failed (named, with its argument); :class:`NoSuchThread`
        when the thread is gone, :class:`AccessDenied` when the kernel refused.
    MaskNarrowedError
        ``strict`` and the kernel applied another set.
    ForeignTopologyError
        ``topology`` does not describe this machine.
    """
    require_system(topology)
    want = _cpus(cpus, "set_affinity")
    _native.set_thread_cpubind(want, tid or 0)
    got = _native.get_thread_cpubind(tid or 0)
    _verify(want, got, "set_affinity", tid or current_tid(), strict)
    return got


def get_process_affinity() -> dict[int, frozenset[int]]:
    """``{tid: cpus}`` for every thread of this process."""
    out = {}
    get = _native.get_thread_cpubind
    for tid in task_ids():
        try:
            out[tid] = get(tid)
        except NoSuchThread:
            pass  # a thread that exited meanwhile is simply left out
    return out


def set_process_affinity(cpus: Iterable[int], *, topology: Topology | None = None,
                         strict: bool = False) -> dict[int, frozenset[int]]:
    """Bind every thread of the process to ``cpus``, all or nothing.

    Parameters
    ----------
    cpus : iterable of int
        OS CPU ids (non-empty).
    topology : Topology, optional
        Must be this system's.
    strict : bool
        Fail (:class:`~affinity.errors.MaskNarrowedError`) where the kernel applied another set.

    Returns
    -------
    dict of int to frozenset of int
        ``{tid: mask}`` read back.  Threads created afterwards inherit from their
        creator as usual.
    """
    require_system(topology)
    want = _cpus(cpus, "set_process_affinity")
    _native.set_process_cpubind(want)
    got = get_process_affinity()
    for tid, s in got.items():
        _verify(want, s, "set_process_affinity", tid, strict)
    return got


def set_threads_affinity(masks: Mapping[int, Iterable[int]], *, topology: Topology | None = None
                         ) -> dict[int, frozenset[int]]:
    """Bind each thread ``tid`` to ``masks[tid]``, all or nothing.

    Parameters
    ----------
    masks : mapping of int to iterable of int
        TID -> OS CPU ids.
    topology : Topology, optional
        Must be this system's.

    Returns
    -------
    dict of int to frozenset of int
        The previous mask of every thread that was changed (a thread that exited
        meanwhile is left out): what a restore needs.
    """
    if topology is not None:
        require_system(topology)
    pairs = []
    for t, c in masks.items():
        if c.__class__ is not frozenset or not _checked(c):
            c = _cpus(c, "set_threads_affinity", t)
        pairs.append((t if t.__class__ is int else int(t), c))
    return _native.set_threads_cpubind(pairs)


def list_threads() -> list[ThreadInfo]:
    """Every thread of this process: TID, name (``comm``), mask and last CPU."""
    out = []
    for tid, name in task_names().items():
        try:
            out.append(ThreadInfo(tid, name, _native.get_thread_cpubind(tid),
                                  _native.last_cpu(tid)))
        except (NoSuchThread, FileNotFoundError):
            pass  # exited meanwhile
    return out


def task_ids(pid: int | None = None) -> list[int]:
    """The TIDs of process ``pid`` (default: this one), in increasing order, from
    ``/proc/PID/task``.  Raises ``FileNotFoundError`` for a process that does not exist."""
    return sorted(int(t) for t in os.listdir(f"/proc/{'self' if pid is None else pid}/task"))


def task_names(pid: int | None = None) -> dict[int, str]:
    """``{tid: comm}`` of every thread of process ``pid`` (default: this one); threads
    that exit while it reads are left out."""
    where = "self" if pid is None else str(pid)
    out = {}
    for tid in task_ids(pid):
        try:
            with open(f"/proc/{where}/task/{tid}/comm") as fh:
                out[tid] = fh.read().strip()
        except OSError:
            pass  # exited meanwhile
    return out
