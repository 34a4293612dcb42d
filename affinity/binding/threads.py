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

import contextlib
import errno
import functools
import operator
import os
import select
from collections.abc import Iterable, Iterator, Mapping

from ..machine import _native
from ..cpulist import MAX_CPUS, check_id, check_ids, format_list
from ..errors import (AccessDenied, ArgumentTypeError, BindError, ForeignTopologyError, MaskNarrowedError,
                      NoSuchThread, PlanError, SpecError)
from ..machine.topology import Topology
from ..record import record

__all__ = [
    "TaskSample",
    "ThreadInfo",
    "current_tid",
    "get_affinity",
    "get_process_affinity",
    "list_threads",
    "set_affinity",
    "set_process_affinity",
    "set_threads_affinity",
    "task_samples",
]


@record
class ThreadInfo:
    """One thread of this process as the kernel sees it now."""

    tid: int
    name: str
    cpus: frozenset[int]
    last_cpu: int


def require_system(topology: Topology | str | os.PathLike[str] | None, what: str = "binding") -> None:
    """Refuse to bind through a topology that does not describe this machine; takes the
    forms :meth:`Topology.load` takes (``None`` and ``"system"`` are this machine; any
    other source -- a file, ``"synthetic:..."`` -- is another)."""
    if topology is None or (isinstance(topology, str) and topology == "system"):
        return
    if isinstance(topology, (str, os.PathLike)):
        source = os.fspath(topology)
    elif isinstance(topology, Topology):
        if topology.is_this_system:
            return
        source = topology.source or topology.describe()
    else:
        raise ArgumentTypeError(f"{what}: topology must be a Topology, 'system' or a topology source, not "
                                f"{type(topology).__name__}")
    raise ForeignTopologyError(
        f"{what} through topology {source!r} refused: it is not this system (hwloc would accept the "
        f"call and bind nothing); use Topology.from_system()", call=what)


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


def _no_such_cpus(e: Exception, sets: Iterable[tuple[str, frozenset[int]]]) -> None:
    """After a bind failed with ``EINVAL`` (hwloc refuses a CPU it does not know) or
    the core's ``ValueError`` (an id past the words of its masks, which no PU has):
    the first of ``sets`` (``(what, cpus)``) naming a CPU this machine does not have is
    said in the launcher's words (:meth:`Topology.check_cpus`), as a :class:`BindError`
    with ``EINVAL`` that keeps what the failed call said of the other threads ("no
    thread was changed", "undone").  Checked only once a call failed, so that a bind
    that succeeds costs no lookup, and an offline CPU the kernel would drop is not
    refused; any other failure returns (the caller re-raises)."""
    if not (isinstance(e, ValueError) or e.errno == errno.EINVAL):  # type: ignore[attr-defined]
        return
    topology = Topology.from_system()
    said = str(e)
    detail = said[said.rindex(" (") + 2:-1] if isinstance(e, BindError) and said.endswith(")") else None
    for what, cpus in sets:
        try:
            topology.check_cpus(cpus, what)
        except PlanError as missing:
            raise BindError(errno.EINVAL, getattr(e, "call", what), what, detail, message=str(missing)) from None


def _verify(requested: frozenset[int], got: frozenset[int], call: str, tid: int, strict: bool) -> None:
    if strict and got != requested:
        raise MaskNarrowedError(
            errno.EXDEV, call, f"tid={tid}, cpus={{{format_list(requested)}}}",
            message=f"{call}(tid={tid}): asked for CPUs {{{format_list(requested)}}} but the kernel "
                    f"applied {{{format_list(got)}}} (CPUs outside this process's cpuset are dropped)")


#: Linux's largest PID/TID plus one (``PID_MAX_LIMIT`` on 64-bit: 4,194,304)
PID_MAX_LIMIT = 1 << 22
#: ``pidfd_open`` flag for a thread's pidfd (Linux 6.9; ``O_EXCL``'s value)
PIDFD_THREAD = os.O_EXCL
#: at most this many more listings of ``/proc/PID/task`` while each finds a TID the others missed
_RELIST = 100


def _tid_value(tid: object, what: str) -> int:
    """``tid`` as a TID number: an integer (not a bool) >= 1 (:class:`SpecError`),
    below ``PID_MAX_LIMIT`` (beyond it no thread can exist: :class:`NoSuchThread`)."""
    if isinstance(tid, bool) or not hasattr(type(tid), "__index__"):
        shown = repr(tid) if len(repr(tid)) <= 40 else repr(tid)[:40] + "..."
        raise SpecError(f"{what}: tid {shown} is not a TID (an integer)")
    t = operator.index(tid)  # type: ignore[call-overload]
    if t <= 0:
        raise SpecError(f"{what}: tid {t} is not a TID (pass tid=None for the calling thread)")
    if t >= PID_MAX_LIMIT:
        raise _no_thread(t if t.bit_length() < 64 else f"of {t.bit_length()} bits", what,
                         f"TIDs are below {PID_MAX_LIMIT}")
    return t


def _no_thread(tid: object, what: str, why: str) -> NoSuchThread:
    return NoSuchThread(errno.ESRCH, what, f"tid={tid}", message=f"{what}(tid={tid}): no such thread ({why})")


def _foreign(tid: int, what: str) -> AccessDenied:
    return AccessDenied(errno.EPERM, what, f"tid={tid}",
                        message=f"{what}(tid={tid}): thread {tid} is not a thread of this process "
                                f"(pid {os.getpid()}); another process's thread is refused and left untouched")


def owned_tids(tids: Iterable[object], what: str, *, gone: bool = False, listed: bool = False) -> list[int | None]:
    """The one check that TIDs belong to this process: each a valid TID number of
    a live thread of this process now (the compiled core's ``tgkill(getpid(), tid,
    0)``, one system call per TID and no signal sent; ``/proc`` is read only for a
    TID that fails it, to tell another process's thread from one that is gone).

    ``gone=True``: a TID that no task holds any more (a thread that exited) comes
    back as ``None`` instead of raising; one that another process holds still raises
    -- unless ``listed``: the caller listed the TIDs from this process moments ago
    (a binding's own threads), so another process's thread under one of them is a
    thread of ours that exited and whose TID the kernel gave away meanwhile (two
    churning processes made it happen within seconds): ``None`` too.

    Raises
    ------
    SpecError
        Not a TID number (``1.5``, ``True``, ``-3``).
    AccessDenied
        (``EPERM``) the thread of another process.
    NoSuchThread
        (``ESRCH``) no thread has it (exited, or beyond ``PID_MAX_LIMIT``: ``2**40``).
    """
    out = [t if t.__class__ is int and 0 < t < PID_MAX_LIMIT else _tid_value(t, what) for t in tids]
    strangers = _native.tids_not_ours(out)
    if not strangers:
        return out
    found = {t: _elsewhere(t, what, gone, listed) for t in dict.fromkeys(strangers)}
    return [found.get(t, t) for t in out]


def _elsewhere(tid: int, what: str, gone: bool, listed: bool = False) -> int | None:
    """A TID that ``tgkill`` refused: ours after all (a thread still exiting: its
    status still names this process), another process's (:class:`AccessDenied`;
    ``None`` if ``listed``: see :func:`owned_tids`), or no task's (``None`` if
    ``gone`` allows it, else :class:`NoSuchThread`)."""
    tgid = _tgid(tid)
    if tgid == os.getpid():
        return tid
    if tgid is not None:
        if listed:
            return None
        raise _foreign(tid, what)
    if gone:
        return None
    raise _no_thread(tid, what, f"no thread {tid} in this process, pid {os.getpid()}")


def _tgid(tid: int) -> int | None:
    """The process (thread group) that task ``tid`` belongs to; None if there is no such task."""
    try:
        with open(f"/proc/{tid}/status") as fh:
            for line in fh:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


@contextlib.contextmanager
def own_thread(tid: int | None, what: str) -> Iterator[int]:
    """Check that ``tid`` is a thread of this process for the length of a call.

    A pidfd on the thread (``pidfd_open(tid, PIDFD_THREAD)``) is taken before the
    ``/proc/self/task`` check and polled after the call: a thread alive at the end
    held its TID all along, so the call reached the thread the check found.  A
    thread that exited meanwhile is reported (:class:`NoSuchThread`), since its TID
    may have gone to another process before the call.  Yields the TID (0 for the
    calling thread, which needs no check).
    """
    if tid is None or (tid.__class__ is int and tid == 0):  # 0: the kernel's "calling thread"
        yield 0
        return
    t = _tid_value(tid, what)
    fd = _pidfd(t)
    try:
        owned_tids([t], what)
        yield t
        if fd is not None and select.select([fd], [], [], 0)[0]:  # readable: the thread exited
            raise NoSuchThread(errno.ESRCH, what, f"tid={t}",
                               message=f"{what}(tid={t}): thread {t} exited during the call (its TID may "
                                       f"have been reused by another process before the call)")
    finally:
        if fd is not None:
            os.close(fd)


def _pidfd(tid: int) -> int | None:
    """A pidfd on thread ``tid`` (Linux >= 6.9), or None where the kernel has none."""
    try:
        return os.pidfd_open(tid, PIDFD_THREAD)
    except (AttributeError, OSError):
        return None  # older kernel (EINVAL), no such task (ESRCH: the check says which), no pidfd_open


def current_tid() -> int:
    """The Linux TID of the calling thread."""
    return _native.gettid()


def get_affinity(tid: int | None = None) -> frozenset[int]:
    """CPU set of the calling thread (``tid=None``) or of thread ``tid`` of this process.

    Raises
    ------
    AccessDenied
        (a ``PermissionError``, ``EPERM``) ``tid`` is another process's thread: refused.
    NoSuchThread
        (a ``ProcessLookupError``, ``ESRCH``) no thread has ``tid`` (gone, or exited
        during the call).
    SpecError
        ``tid`` is not a TID number (``1.5``, ``True``, ``-3``).
    """
    with own_thread(tid, "get_affinity") as t:
        return _native.get_thread_cpubind(t)


def set_affinity(cpus: Iterable[int], tid: int | None = None, *, topology: Topology | None = None,
                 strict: bool = False) -> frozenset[int]:
    """Bind the calling thread (or thread ``tid``) to ``cpus``; return the set read back.

    Parameters
    ----------
    cpus : iterable of int
        OS CPU ids (non-empty): a set of ints, not one int (``{0}``, not ``0``) and
        not a string (:func:`affinity.cpulist.parse_list` reads ``"0-3"``).
    tid : int, optional
        A Linux TID of this process (default: the calling thread); another
        process's TID is refused (:class:`AccessDenied`) and left untouched.
    topology : Topology or str, optional
        Must be this system's: ``Topology.from_system()``, ``"system"`` or None
        (binding through a file's or a synthetic topology is refused).
    strict : bool
        The kernel drops CPUs that exist but that the process may not use (outside
        its cpuset), as long as one is left; ``True`` turns such a silent change into
        :class:`~affinity.errors.MaskNarrowedError` (``errno.EXDEV``).  A CPU this
        machine does not have is an error either way (:class:`BindError`, ``EINVAL``).

    Returns
    -------
    frozenset of int
        The mask read back from the kernel.

    Raises
    ------
    ArgumentTypeError
        (a ``TypeError``) ``cpus`` is not a collection (one int).
    SpecError
        (a ``ValueError``) ``cpus`` empty, a string, or holding an id that is not an
        int (a float, a bool) or is out of range; ``tid`` not a TID number.
    BindError
        ``EINVAL``: a CPU this machine does not have, named with the CPUs it has.
    AccessDenied
        ``tid`` is another process's thread (``EPERM``; nothing changed), or the kernel refused.
    NoSuchThread
        ``tid`` is no thread (gone, or exited during the call).
    BindError
        Another failure of the system call (named, with its argument).
    MaskNarrowedError
        ``strict`` and the kernel applied another set.
    ForeignTopologyError
        ``topology`` does not describe this machine.
    """
    require_system(topology)
    want = _cpus(cpus, "set_affinity")
    with own_thread(tid, "set_affinity") as t:
        try:
            _native.set_thread_cpubind(want, t)
        except (BindError, ValueError) as e:
            _no_such_cpus(e, [(f"set_affinity(cpus={{{format_list(want)}}})", want)])
            raise
        got = _native.get_thread_cpubind(t)
    _verify(want, got, "set_affinity", t or current_tid(), strict)
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
        Fail (:class:`~affinity.errors.MaskNarrowedError`) where the kernel applied another
        set (dropping CPUs outside the process's cpuset), as for :func:`set_affinity`.

    Returns
    -------
    dict of int to frozenset of int
        ``{tid: mask}`` read back.  Threads created afterwards inherit from their
        creator as usual.

    Raises
    ------
    ArgumentTypeError, SpecError
        A bad ``cpus``, as for :func:`set_affinity`.
    BindError
        The system call failed (every thread keeps its previous mask); ``EINVAL`` with
        a CPU this machine does not have names it, as for :func:`set_affinity`.
    MaskNarrowedError
        ``strict`` and the kernel applied another set.
    """
    require_system(topology)
    want = _cpus(cpus, "set_process_affinity")
    try:
        _native.set_process_cpubind(want)
    except (BindError, ValueError) as e:
        _no_such_cpus(e, [(f"set_process_affinity(cpus={{{format_list(want)}}})", want)])
        raise
    got = get_process_affinity()
    for tid, s in got.items():
        _verify(want, s, "set_process_affinity", tid, strict)
    return got


def set_threads_affinity(masks: Mapping[int, Iterable[int]], *, topology: Topology | None = None,
                         listed: bool = False) -> dict[int, frozenset[int]]:
    """Bind each thread ``tid`` to ``masks[tid]``, all or nothing.

    Parameters
    ----------
    masks : mapping of int to iterable of int
        TID -> OS CPU ids; every TID must be a thread of this process (another
        process's: :class:`AccessDenied`, nothing changed).  A TID that no task
        holds is taken for a thread of ours that exited meanwhile (threads exit at
        any time, between the caller's listing and this call): it is left out,
        not an error -- so a TID that never was a thread is left out silently too
        (``set_threads_affinity({999999: {0}})`` returns ``{}``).
    topology : Topology, optional
        Must be this system's.
    listed : bool
        The TIDs were listed from this process moments ago (a binding pinning or
        restoring its own threads): one that another process holds now is a thread
        of ours that exited, its TID reused -- left out like one that is gone.

    Returns
    -------
    dict of int to frozenset of int
        The previous mask of every thread that was changed (a thread that exited
        meanwhile is left out): what a restore needs.

    Raises
    ------
    AccessDenied
        (a ``PermissionError``, ``EPERM``) a TID of another process's thread; no
        thread was changed.
    NoSuchThread
        A TID no thread can ever hold (at or beyond ``PID_MAX_LIMIT``, ``2**22``).
    SpecError, ArgumentTypeError
        A TID that is not a TID number, or a bad CPU set, as for :func:`set_affinity`.
    BindError
        The system call failed for one thread; no thread was changed (``EINVAL`` with a
        CPU this machine does not have names it, as for :func:`set_affinity`).
    ForeignTopologyError
        ``topology`` does not describe this machine.
    """
    if topology is not None:
        require_system(topology)
    pairs = []
    for t, c in zip(owned_tids(masks, "set_threads_affinity", gone=True, listed=listed), masks.values()):
        if t is None:
            continue  # exited meanwhile: left out, as the core leaves out one that exits during the call
        if c.__class__ is not frozenset or not _checked(c):
            c = _cpus(c, "set_threads_affinity", t)
        pairs.append((t, c))
    try:
        return _native.set_threads_cpubind(pairs)
    except (BindError, ValueError) as e:
        _no_such_cpus(e, ((f"set_threads_affinity(tid={t}, cpus={{{format_list(c)}}})", c) for t, c in pairs))
        raise


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
    ``/proc/PID/task``.  Raises ``FileNotFoundError`` for a process that does not exist.

    The directory is listed again until a listing shows no TID the others missed: while
    a thread exits, Linux's listing of ``/proc/PID/task`` can skip the *next* thread, a
    live one (seen here: the snapshot of :func:`affinity.apply` missed a thread next to
    one exiting, which its restore then treated as born inside the block).  A TID of a
    thread that exited between the listings may be among them, as with one listing."""
    where = f"/proc/{'self' if pid is None else pid}/task"
    seen = set(os.listdir(where))
    for _ in range(_RELIST):
        again = set(os.listdir(where))
        if again <= seen:
            break
        seen |= again
    return sorted(int(t) for t in seen)


def task_names(pid: int | None = None) -> dict[int, str]:
    """``{tid: comm}`` of every thread of process ``pid`` (default: this one); threads
    that exit while it reads are left out."""
    return {t: name for t, (name, _) in task_stats(pid).items()}


def task_starts(pid: int | None = None, tids: Iterable[int] | None = None) -> dict[int, int]:
    """``{tid: start}``: when each thread of process ``pid`` (default: this one; or
    only ``tids``) started, in clock ticks since boot (``/proc/PID/task/TID/stat``,
    field 22).  Threads that exit while it reads are left out.

    A TID names a thread only while it lives: once it exits, the kernel gives the
    number to the next thread it creates after the counter wraps (``pid_max``,
    32,768 on many machines), so a thread is a (TID, start) pair.  Two threads with
    the same TID do not start in the same tick (1/100 s): the counter wraps in between
    (unless a checkpoint/restore tool sets it back, ``/proc/sys/kernel/ns_last_pid``)."""
    return {t: start for t, (_, start) in task_stats(pid, tids).items()}


def task_stats(pid: int | None = None, tids: Iterable[int] | None = None) -> dict[int, tuple[str, int]]:
    """``{tid: (comm, start)}`` of the threads of process ``pid`` (default: this one;
    or only ``tids``), from one read of each ``/proc/PID/task/TID/stat``; threads that
    exit while it reads are left out (see :func:`task_starts`)."""
    where = "self" if pid is None else str(pid)
    out = {}
    for tid in (task_ids(pid) if tids is None else tids):
        try:  # (os.open and one read: half the cost of open(); the line is far below 4 KiB)
            fd = os.open(f"/proc/{where}/task/{tid}/stat", os.O_RDONLY | os.O_CLOEXEC)
            try:
                raw = os.read(fd, 4096)
            finally:
                os.close(fd)
        except OSError:
            continue  # exited meanwhile
        # "TID (COMM) STATE PPID ...": COMM may hold spaces and parentheses, so it
        # ends at the last ')'; STATE is field 3 and the start time field 22
        close = raw.rindex(b")")
        name = raw[raw.index(b"(") + 1:close].decode("utf-8", "surrogateescape")
        out[int(tid)] = (name, int(raw[close + 2:].split()[19]))
    return out


@record
class TaskSample:
    """One thread of any process at one moment: what :func:`task_samples` reads."""

    tid: int
    name: str
    state: str  #: ``R`` running or runnable, ``S`` sleeping, ``D`` in I/O... (``stat`` field 3)
    start: int  #: clock ticks since boot (see :func:`task_starts`)
    run_ns: int | None  #: time on a CPU so far (``schedstat``); None where the kernel keeps none
    wait_ns: int | None  #: time runnable but waiting for a CPU so far (``schedstat``: the run queue,
    #: a CFS quota's throttled periods included)
    ticks: int  #: user + system time so far, in clock ticks (``stat``)


def task_samples(pid: int | None = None, tids: Iterable[int] | None = None) -> dict[int, TaskSample]:
    """``{tid: TaskSample}`` of the threads of process ``pid`` (default: this one; or
    only ``tids``): state, CPU time and time spent waiting for a CPU, from each
    thread's ``stat`` and ``schedstat``.  Threads that exit while it reads are left
    out.  Two samples some time apart tell how much CPU each thread wanted
    (ran + waited) in between: what ``affinity doctor`` counts as runnable.

    What it cannot do: ``schedstat`` exists only on kernels built with
    ``CONFIG_SCHED_INFO`` (most distributions'); without it ``run_ns`` and
    ``wait_ns`` are None and only the state tells a runnable thread."""
    where = "self" if pid is None else str(int(pid))
    out = {}
    for tid in (task_ids(pid) if tids is None else tids):
        base = f"/proc/{where}/task/{tid}"
        try:
            with open(f"{base}/stat", "rb") as fh:
                raw = fh.read(4096)
        except OSError:
            continue  # exited meanwhile
        close = raw.rindex(b")")
        name = raw[raw.index(b"(") + 1:close].decode("utf-8", "surrogateescape")
        rest = raw[close + 2:].split()  # rest[0] is field 3 (state); field N is rest[N - 3]
        run: int | None = None
        wait: int | None = None
        try:
            with open(f"{base}/schedstat", "rb") as fh:
                words = fh.read(256).split()
            run, wait = int(words[0]), int(words[1])
        except (OSError, ValueError, IndexError):
            pass
        out[int(tid)] = TaskSample(tid=int(tid), name=name, state=rest[0].decode("ascii", "replace"),
                                   start=int(rest[19]), run_ns=run, wait_ns=wait, ticks=int(rest[11]) + int(rest[12]))
    return out
