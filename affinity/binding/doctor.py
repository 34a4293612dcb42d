"""``affinity.doctor()``: read live processes into a snapshot (:func:`observe`) and
diagnose it (:func:`affinity.planning.doctor.diagnose`, pure).

What is read, for each process asked about and its children: every thread's mask,
last CPU, state, role (:func:`affinity.binding.bindmap.report`: as the process
published it, or inferred), CPU time and time spent waiting for a CPU, twice,
``interval`` seconds apart (:func:`affinity.binding.threads.task_samples`); the
cgroup's cpuset, CFS quota and its throttled periods meanwhile
(:mod:`affinity.machine.cgroup`); the OpenMP runtimes mapped
(:func:`affinity.machine.loaded.census`); the thread and placement variables
of its environment and where its memory is (:mod:`affinity.machine.procfs`).

What it cannot do: another process's environment is the one it was started with
(what it set in ``os.environ`` later is not seen; this process's own is read
from ``os.environ``); reading another user's process needs the rights ``ps``
and ``numa_maps`` need (what cannot be read is said in ``ProcessState.notes``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..machine import cgroup
from ..machine.procfs import children_of, read_cmdline, read_environ, read_numa_maps
from ..machine.topology import Topology
from ..planning.doctor import Diagnosis, diagnose
from ..planning.doctor.values import LoadedLibrary, ProcessState, Snapshot, ThreadState
from . import publication
from .bindmap import BindMap, ThreadRow, _process_id, report
from .threads import TaskSample, task_samples

__all__ = ["ENV_NAMES", "doctor", "observe"]

#: the variables of a process's environment a snapshot keeps: those that size or place
#: threads, and LD_PRELOAD (a preloaded OpenMP runtime)
ENV_PREFIXES = ("OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "BLIS_", "TF_NUM_", "AFFINITY_")
ENV_NAMES = ("LD_PRELOAD",)
_MAX_PROCESSES = 4096  #: the most processes one snapshot reads (a fork bomb is not read whole)


def doctor(*pids: int, interval: float = 0.5, children: bool = True, during: Callable[[], Any] | None = None,
           peers: Iterable[Iterable[int]] = ()) -> Diagnosis:
    """Check live processes against the placement failures seen in the field, and
    say the fix for each.

    Parameters
    ----------
    *pids : int
        The processes (default: this one); their child processes are read too.
    interval : float
        Seconds between the two samples of each thread's CPU time (which threads are
        runnable, and how long they waited for a CPU).
    children : bool
        Read the child processes (DataLoader workers, instances) too.
    during : callable, optional
        Run it between the two samples instead of sleeping (in-process: the work
        whose placement is checked, ``during=lambda: model(x)``).
    peers : iterable of iterables of int
        PIDs that are ranks of one job (their masks must not overlap, busy or not).

    Returns
    -------
    Diagnosis
        ``findings`` (each with ``kind``, ``severity``, ``evidence`` and ``fix``),
        ``ok`` (no error), ``text()`` and ``to_json()``.

    Raises
    ------
    FileNotFoundError
        No process of one of ``pids``.
    SpecError
        A PID that is not a process id (see :func:`affinity.report`).
    """
    return diagnose(observe(pids, interval=interval, children=children, during=during, peers=peers))


def observe(pids: Iterable[int] = (), *, interval: float = 0.5, children: bool = True,
            during: Callable[[], Any] | None = None, peers: Iterable[Iterable[int]] = (),
            skip_gone: bool = False) -> Snapshot:
    """A :class:`~affinity.planning.doctor.values.Snapshot` of processes ``pids``
    (default: this one) and their children: see :func:`doctor`.  A process that
    exits while it is read is left out; one that does not exist when it begins
    raises ``FileNotFoundError``, unless ``skip_gone`` (a list of processes read
    from ``/proc`` a moment before: ``--all-mine``)."""
    pids = list(pids)
    roots = [r for r in (_alive(p, skip_gone) for p in pids) if r is not None] if pids else [os.getpid()]
    if interval < 0:
        raise ValueError(f"doctor: interval must be >= 0 seconds, got {interval}")
    tree = _tree(roots, children)
    before = {p: _sample(p) for p in tree}
    states = _States(tree)
    t0 = time.monotonic()
    if during is not None:
        with states.in_background():
            during()
    elif interval:
        states.every(0.05, until=t0 + interval)
    elapsed = time.monotonic() - t0 if (during is not None or interval) else 0.0
    topo = Topology.from_system()
    procs: dict[int, ProcessState] = {}
    me = os.getpid()
    for r in roots:
        try:
            maps = _flatten(report(r, children=children))
        except FileNotFoundError:
            continue  # exited while it was sampled
        for bmap in maps:
            if bmap.pid == me and me not in roots:
                continue  # the process reading (a child of the shell asked about) is not the job
            if bmap.pid not in procs and len(procs) < _MAX_PROCESSES:
                procs[bmap.pid] = _process(bmap, before.get(bmap.pid), _sample(bmap.pid), elapsed, topo,
                                           states.share(bmap.pid))
    return Snapshot(topo, tuple(procs.values()), round(elapsed, 3), tuple(roots),
                    tuple(frozenset(g) for g in peers))


class _States:
    """How often each thread was found runnable (state ``R``) while sampled: the
    kernel adds a thread's wait for a CPU to its ``schedstat`` only once it gets one,
    so a thread that waited the whole interval would read as idle there."""

    def __init__(self, pids: list[int]):
        self.pids = pids
        self.seen: dict[tuple[int, int], int] = {}  #: rounds found runnable
        self.first: dict[tuple[int, int], int] = {}  #: the round it was first found in (born meanwhile)
        self.rounds = 0
        self.skip: set[int] = set()  #: the sampling thread itself

    def once(self) -> None:
        for pid in self.pids:
            try:
                found = task_samples(pid)
            except OSError:
                continue
            for tid, s in found.items():
                self.first.setdefault((pid, tid), self.rounds)
                if s.state == "R" and tid not in self.skip:
                    self.seen[(pid, tid)] = self.seen.get((pid, tid), 0) + 1
        self.rounds += 1

    def every(self, step: float, until: float) -> None:
        while True:
            self.once()
            left = until - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(step, left))

    @contextlib.contextmanager
    def in_background(self, step: float = 0.05) -> Iterator[None]:
        stop = threading.Event()

        def run() -> None:
            self.skip.add(threading.get_native_id())
            while not stop.wait(step):
                self.once()

        t = threading.Thread(target=run, name="affinity-doctor", daemon=True)
        t.start()
        try:
            yield
        finally:
            stop.set()
            t.join()

    def share(self, pid: int) -> dict[int, float] | None:
        """TID -> the share of the rounds since it was first found in which it was
        runnable (None: no round was taken)."""
        if not self.rounds:
            return None
        return {tid: n / (self.rounds - self.first[(p, tid)]) for (p, tid), n in self.seen.items() if p == pid}


def _alive(pid: int, skip_gone: bool) -> int | None:
    try:
        return _process_id(pid)
    except FileNotFoundError:
        if skip_gone:
            return None
        raise


def _tree(roots: list[int], children: bool) -> list[int]:
    out: list[int] = []
    todo = list(roots)
    while todo and len(out) < _MAX_PROCESSES:
        p = todo.pop(0)
        if p in out:
            continue
        out.append(p)
        if children:
            todo.extend(children_of(p))
    return out


def _flatten(bmap: BindMap) -> list[BindMap]:
    out = [bmap]
    for c in bmap.children:
        out += _flatten(c)
    return out


def _sample(pid: int) -> tuple[dict[int, TaskSample], tuple[int, int] | None, Any, float]:
    """Every thread's sample, the throttling of the process's quota's cgroup, the
    quota, and when (seconds since boot, as threads' start times count)."""
    try:
        threads = task_samples(pid)
    except OSError:
        threads = {}
    quota = cgroup.cpu_quota(pid=str(pid))
    with open("/proc/uptime") as fh:
        up = float(fh.read().split()[0])
    return threads, cgroup.throttling(quota.path) if quota is not None else None, quota, up


def _wanted(s0: TaskSample | None, s1: TaskSample | None, elapsed: float, up: float,
            seen_runnable: float | None) -> tuple[float | None, float | None]:
    """(share of the time sampled the thread ran or waited for a CPU, share it
    waited): between the two samples, or since it started for a thread born
    between them; at least the share of the rounds it was found runnable in."""
    if s1 is None or elapsed <= 0:
        return seen_runnable, None
    tick = os.sysconf("SC_CLK_TCK")
    if s0 is None or s0.start != s1.start:  # born meanwhile: its whole life is inside the interval
        s0 = TaskSample(tid=s1.tid, name=s1.name, state="S", start=s1.start, run_ns=0, wait_ns=0, ticks=0)
        elapsed = max(min(elapsed, up - s1.start / tick), 1 / tick)
    if None in (s0.run_ns, s1.run_ns, s0.wait_ns, s1.wait_ns):  # no schedstat: CPU time only
        wanted, waited = min(1.0, (s1.ticks - s0.ticks) / (elapsed * tick)), None
    else:
        ns = elapsed * 1e9
        waited = min(1.0, max(0.0, (s1.wait_ns - s0.wait_ns) / ns))  # type: ignore[operator]
        wanted = min(1.0, max(0.0, (s1.run_ns - s0.run_ns) / ns + waited))  # type: ignore[operator]
    return (wanted if seen_runnable is None else max(wanted, seen_runnable)), waited


def _thread(row: ThreadRow, s0: TaskSample | None, s1: TaskSample | None, elapsed: float, up: float, pub: Any,
            seen_runnable: float | None) -> ThreadState:
    wanted, waited = _wanted(s0, s1, elapsed, up, seen_runnable)
    if row.inferred:
        how = "inferred"
    elif pub is not None and pub.pin(row.tid, row.start) is not None:
        how = "published"
    else:
        how = "known" if row.role != "other" else "unknown"
    return ThreadState(tid=row.tid, name=row.name, role=row.role, how=how, cpus=row.actual, last_cpu=row.last_cpu,
                       state=s1.state if s1 is not None else "S", start=row.start,
                       wanted=None if wanted is None else round(wanted, 3),
                       waited=None if waited is None else round(waited, 3), index=row.index, requested=row.requested)


def _process(bmap: BindMap, before: Any, after: Any, elapsed: float, topo: Topology,
             runnable: dict[int, float] | None) -> ProcessState:
    pid, notes = bmap.pid, list(bmap.notes)
    s0, t0, _, _ = before if before is not None else ({}, None, None, 0.0)
    s1, t1, quota, up = after
    pub = bmap.publication if pid != os.getpid() else publication.current()
    threads = tuple(_thread(r, s0.get(r.tid), s1.get(r.tid), elapsed, up, pub,
                            None if runnable is None else runnable.get(r.tid, 0.0)) for r in bmap.rows)
    cpuset = cgroup.cpuset_cpus(pid=str(pid))
    allowed = (cpuset & topo.cpuset if cpuset else topo.cpuset) or topo.cpuset
    throttled = (t1[0] - t0[0], t1[1] - t0[1]) if t0 is not None and t1 is not None else None
    env, memory, cmd = _environ(pid, notes), None, ()
    try:
        memory = read_numa_maps(pid)
    except OSError as e:
        notes.append(f"numa_maps not read: {e.strerror or e}")
    try:
        cmd = read_cmdline(pid)
    except OSError:
        pass
    census = bmap.runtimes
    libs = tuple(LoadedLibrary(r.path, r.kind, r.family, r.bundled_by) for r in census.runtimes) if census else ()
    return ProcessState(pid=pid, ppid=bmap.ppid if bmap.ppid is not None else 0, name=bmap.name, cmdline=cmd,
                        threads=threads, allowed=allowed, start=_start(bmap), quota=quota, throttled=throttled,
                        environ=env, runtimes=libs, memory=memory, publication=pub, role=bmap.role,
                        notes=tuple(notes))


def _start(bmap: BindMap) -> int:
    main = next((r for r in bmap.rows if r.tid == bmap.pid), None)
    return main.start if main is not None and main.start is not None else 0


def _environ(pid: int, notes: list[str]) -> tuple[tuple[str, str], ...]:
    """The thread and placement variables of process ``pid`` (this process: ``os.environ`` now)."""
    try:
        env = dict(os.environ) if pid == os.getpid() else read_environ(pid)
    except OSError as e:
        notes.append(f"environment not read: {e.strerror or e}")
        return ()
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(ENV_PREFIXES) or k in ENV_NAMES))
