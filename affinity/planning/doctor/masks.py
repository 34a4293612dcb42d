"""Checks of where threads may run: a mask collapsed by an OpenMP runtime and
inherited, a binding undone since affinity applied it, processes overlapping, SMT
siblings shared while whole cores idle.  Pure: each is a function of a
:class:`~affinity.planning.doctor.values.Snapshot`."""

from __future__ import annotations

from collections.abc import Iterable

from ...cpulist import format_list
from ...errors import AffinityError
from ..gnu.runtime import GOMP_VARIABLES, plan_gomp
from ..planner import plan_env
from ..spec import DEFAULT_SPEC, PLACEMENT_VARIABLES
from .values import Finding, LoadedLibrary, ProcessState, Snapshot, ThreadState, cpus_text

__all__ = ["collapsed_masks", "overlapping_processes", "smt_shared", "undone_bindings"]

#: the variables with which each family of runtimes binds the thread that loads it
#: (libgomp) or that starts its first parallel region (libiomp5, libomp)
_BINDING_VARIABLES = {"gnu": tuple(v for v in GOMP_VARIABLES if v not in ("OMP_NUM_THREADS", "OMP_THREAD_LIMIT")),
                      "intel": PLACEMENT_VARIABLES, "llvm": PLACEMENT_VARIABLES}
#: threads listed by name in a finding's evidence, at most
_SHOWN = 8


def _listed(threads: Iterable[ThreadState]) -> str:
    ts = list(threads)
    more = f" and {len(ts) - _SHOWN} more" if len(ts) > _SHOWN else ""
    return ", ".join(t.label() for t in ts[:_SHOWN]) + more


def run_line(p: ProcessState, options: str = "") -> str:
    """``affinity run [options] -- CMD`` for process ``p``'s command."""
    return f"affinity run {options + ' ' if options else ''}-- {p.command()}"


# ------------------------------------------------------------------ collapsed
def _first_place(rt: LoadedLibrary, env: dict[str, str], snap: Snapshot, allowed: frozenset[int]
                 ) -> tuple[frozenset[int], str] | None:
    """(the set runtime ``rt`` binds its first thread to, when) for ``env`` in a
    process started on ``allowed``; None when it binds nothing or refuses the settings."""
    try:
        if rt.family == "gnu":
            g = plan_gomp(env, snap.topology, allowed, build="torch" if rt.bundled_by == "torch" else "gcc12")
            if g.init_mask != allowed:
                return g.init_mask, "binds the thread that loads it (import) to its first place"
            if g.proc_bind != "false" and g.cpusets:
                return g.cpusets[0], "binds its primary thread to its first place at the first parallel region"
            return None
        p = plan_env(env, topology=snap.topology, initial_mask=allowed, runtime=rt.family)
    except (AffinityError, KeyError, ValueError):
        return None  # settings the runtime would refuse: no binding to compare with
    return (p.cpusets[0], "binds its primary thread to its first place at the first parallel region") \
        if p.cpusets else None


def _collapse_cause(p: ProcessState, snap: Snapshot, main: frozenset[int]) -> tuple[list[str], set[str]]:
    """The loaded runtimes whose settings in ``p``'s environment bind the main thread
    to exactly ``main``: one line of evidence each, and the variables that did it."""
    env = p.env
    lines, names = [], set()
    for rt in p.runtimes:
        said = [k for k in _BINDING_VARIABLES.get(rt.family, ()) if k in env]
        if not said:
            continue
        first = _first_place(rt, env, snap, p.allowed)
        if first is not None and first[0] == main:
            by = f", bundled by {rt.bundled_by}" if rt.bundled_by else ""
            lines.append(f"{' '.join(f'{k}={env[k]}' for k in said)} in its environment and {rt.kind} "
                         f"({rt.path}{by}) loaded: under {rt.family}'s rules it {first[1]}, {cpus_text(first[0])}")
            names.update(said)
    return lines, names


def collapsed_masks(snap: Snapshot) -> list[Finding]:
    """A main thread an OpenMP runtime narrowed to its first place (PyTorch's libgomp
    at ``import torch`` with ``OMP_PROC_BIND`` set; libiomp5 under ``KMP_AFFINITY``
    at the first region), with the threads and child processes that inherited it.

    What it cannot do: tell a narrowing whose cause it does not know (``taskset``
    on purpose, a library's own call) from a mistake -- only a mask equal to the
    first place of a loaded runtime's settings is reported; threads that inherited
    a mask look like threads bound to it."""
    out = []
    for p in snap.processes:
        main = _narrowed_main(snap, p)
        if main is None:
            continue
        causes, names = _collapse_cause(p, snap, main.cpus)
        if causes:
            out.append(_collapse_finding(snap, p, main, causes, names))
    return out


def _narrowed_main(snap: Snapshot, p: ProcessState) -> ThreadState | None:
    """``p``'s main thread when it is kept to part of what ``p`` may use, not by
    affinity, and not as its parent's (an inherited mask is said in the parent's finding)."""
    main = p.main
    if main is None or not main.cpus < p.allowed:
        return None
    pub = p.publication.pin(main.tid, main.start) if p.publication is not None else None
    if pub is not None and pub.cpus == main.cpus:
        return None  # affinity put it there (an OpenMP team's member 0)
    parent = snap.process(p.ppid)
    if parent is not None and parent.main is not None and parent.main.cpus == main.cpus:
        return None
    return main


def _collapse_finding(snap: Snapshot, p: ProcessState, main: ThreadState, causes: list[str], names: set[str]
                      ) -> Finding:
    heirs = [t for t in p.threads if t is not main and t.cpus == main.cpus]
    kids = [c for c in _descendants(snap, p.pid) if c.main is not None and c.main.cpus == main.cpus]
    who = [w for n, w in ((len(heirs), f"{len(heirs)} thread{'s' if len(heirs) != 1 else ''}"),
                          (len(kids), f"{len(kids)} child process{'es' if len(kids) != 1 else ''}")) if n]
    evidence = [*causes, f"main thread {main.label()} on {cpus_text(main.cpus)}; the process may use "
                         f"{cpus_text(p.allowed)}"]
    if heirs:
        evidence.append(f"threads on {cpus_text(main.cpus)} too: {_listed(heirs)}")
    evidence += [f"child {c.label()} {c.name}: main thread on {cpus_text(c.main.cpus)}" for c in kids[:_SHOWN]
                 if c.main is not None]
    return Finding(
        kind="collapsed-mask", severity="error", pids=(p.pid, *(c.pid for c in kids)),
        summary=f"pid {p.pid}'s main thread was narrowed to {cpus_text(main.cpus)} of the {len(p.allowed)} CPUs it "
        f"may use{', and ' + ' and '.join(who) + ' inherited it' if who else ''}: what it starts next "
        f"inherits it too", evidence=tuple(evidence),
        fix=f"{run_line(p)} (affinity places the threads itself and gives the importing thread its mask back), "
        f"or call affinity.apply() before the import in the program; or unset {', '.join(sorted(names))}",
        facts=(("main_cpus", main.cpus), ("allowed", p.allowed), ("inherited_tids", tuple(t.tid for t in heirs)),
        ("inherited_pids", tuple(c.pid for c in kids))))


def _descendants(snap: Snapshot, pid: int) -> list[ProcessState]:
    out, todo = [], [pid]
    while todo:
        for c in snap.children(todo.pop()):
            if c not in out:
                out.append(c)
                todo.append(c.pid)
    return out


# ------------------------------------------------------------------ undone
def undone_bindings(snap: Snapshot) -> list[Finding]:
    """Threads whose mask is no longer the one affinity gave them, in a process that
    published its bindings: something set it since (NCCL's ``init_process_group``
    puts the launcher's mask back; a library's own ``sched_setaffinity``).

    What it cannot do: say who changed it; a thread the kernel narrowed when it was
    bound (CPUs outside its cpuset) reads as changed too."""
    out = []
    for p in snap.processes:
        if p.publication is None:
            continue
        moved = [t for t in p.threads if t.requested is not None and t.requested != t.cpus]
        if not moved:
            continue
        lines = [f"{t.label()} was bound to {cpus_text(t.requested)} by affinity, now on {cpus_text(t.cpus)}"
                 + (" (the whole of what the process may use: a mask put back)" if t.cpus == p.allowed else "")
                 for t in moved[:_SHOWN]]
        if len(moved) > _SHOWN:
            lines.append(f"and {len(moved) - _SHOWN} more")
        plans = p.publication.plans
        again = plans[-1].apply_call() if plans else "affinity.apply()"
        out.append(Finding(
            kind="binding-undone", severity="error", pids=(p.pid,),
            summary=f"pid {p.pid}: {len(moved)} of the {sum(1 for t in p.threads if t.requested is not None)} threads "
            f"affinity bound are no longer where it put them", evidence=tuple(lines),
            fix=f"{again} again after the call that reset them (after init_process_group for NCCL), or "
            f"binding.restore() then {again}",
            facts=(("tids", tuple(t.tid for t in moved)), ("requested", tuple(t.requested for t in moved)),
            ("now", tuple(t.cpus for t in moved)))))
    return out


# ------------------------------------------------------------------ overlap
def _bound(p: ProcessState) -> bool:
    """Its threads are kept to fewer CPUs than its cgroup lets it use (someone placed it)."""
    return bool(p.threads) and p.cpus < p.allowed


def overlapping_processes(snap: Snapshot, skip: Iterable[int] = ()) -> list[Finding]:
    """Two placed processes (each kept to part of the CPUs it may use) whose runnable
    threads share CPUs: two serving instances, ranks or DataLoader workers on the
    same cores.  Ranks of one job (``snap.peers``) overlap when their masks share a
    CPU, runnable or not.  ``skip``: processes already reported (inherited a
    collapsed mask).

    What it cannot do: processes that are not placed (the whole machine each) are
    left to the scheduler; too many runnable threads among them is
    :func:`~affinity.planning.doctor.load.oversubscribed`'s finding."""
    skip = set(skip)
    procs = [p for p in snap.processes if _bound(p) and p.pid not in skip]
    peers = {frozenset((a, b)) for group in snap.peers for a in group for b in group if a != b}
    out = []
    for i, a in enumerate(procs):
        for b in procs[i + 1:]:
            peer = frozenset((a.pid, b.pid)) in peers
            ca = a.cpus if peer else frozenset().union(*(t.cpus for t in a.runnable))
            cb = b.cpus if peer else frozenset().union(*(t.cpus for t in b.runnable))
            common = ca & cb
            if not common:
                continue
            out.append(_overlap_finding(snap, a, b, ca, cb, common, peer))
    return out


def _overlap_finding(snap: Snapshot, a: ProcessState, b: ProcessState, ca: frozenset[int], cb: frozenset[int],
                     common: frozenset[int], peer: bool) -> Finding:
    what = "ranks of one job" if peer else "runnable threads"
    ev = tuple(f"{p.label()} {p.name}: {len(p.runnable)} runnable thread{'s' if len(p.runnable) != 1 else ''} "
               f"on {cpus_text(c)} (mask {cpus_text(p.cpus)})" for p, c in ((a, ca), (b, cb)))
    if peer:
        fix = f"{run_line(a, '--ranks auto')} under the launcher (each rank on its own share)"
    elif a.cmdline == b.cmdline and a.cmdline:
        fix = f"{run_line(a, '--instances 2')} (each copy on its own cores)"
    else:
        half = _halves(snap, a.allowed | b.allowed)
        fix = (f"{run_line(a, '-C ' + format_list(half[0]))}; {run_line(b, '-C ' + format_list(half[1]))} "
               f"(disjoint CPUs)")
    return Finding(kind="overlap", severity="error", pids=(a.pid, b.pid),
                   summary=f"pids {a.pid} and {b.pid} ({what}) share CPUs {cpus_text(common)}",
                   evidence=ev + (
                       f"{len(common)} CPU{'s' if len(common) != 1 else ''} of {cpus_text(a.allowed | b.allowed)} "
                       f"shared; each is placed (kept to part of what it may use)",), fix=fix,
                   facts=(("pids", (a.pid, b.pid)), ("shared", common)))


def _halves(snap: Snapshot, cpus: frozenset[int]) -> tuple[frozenset[int], frozenset[int]]:
    """``cpus`` cut in two by whole cores (the first half of the cores, the rest)."""
    cores = sorted({snap.topology.pu(c).core for c in cpus if c in snap.topology.cpuset})
    if len(cores) < 2:
        ids = sorted(cpus)
        return frozenset(ids[:max(1, len(ids) // 2)]), frozenset(ids[max(1, len(ids) // 2):] or ids)
    first = set(cores[:len(cores) // 2])
    a = frozenset(c for c in cpus if c in snap.topology.cpuset and snap.topology.pu(c).core in first)
    return a, cpus - a


# ------------------------------------------------------------------ SMT
def smt_shared(snap: Snapshot) -> list[Finding]:
    """Runnable threads bound inside one core (its SMT siblings, or the same PU)
    while a core they may use has no runnable thread: each gets half a core, where
    a whole one is free.

    What it cannot do: threads not bound inside one core are the scheduler's to
    place (it fills idle cores first); a core counts as idle when no runnable thread
    of the snapshot is bound to it or last ran there -- other users' threads are not seen."""
    topo = snap.topology
    if all(len(c.cpuset) < 2 for c in topo.cores):
        return []
    busy, seen_cores, allowed = _runnable_by_core(snap)
    idle = [c for c in topo.cores if c.cpuset & allowed and c.logical_index not in seen_cores]
    shared = {c: ts for c, ts in busy.items() if len(ts) > 1}
    if not shared or not idle:
        return []
    ev = [f"core {c} (CPUs {format_list(topo.cores[c].cpuset)}): " + _listed(t for _, t in ts)
          for c, ts in sorted(shared.items())]
    ev.append(f"{len(idle)} core{'s' if len(idle) != 1 else ''} they may use have no runnable thread: CPUs "
              f"{format_list(frozenset().union(*(c.cpuset for c in idle)))}")
    pids = tuple(sorted({p.pid for ts in shared.values() for p, _ in ts}))
    first = snap.process(pids[0])
    n = len(set(busy) | {c.logical_index for c in idle})
    fix = (f"{run_line(first, f'--threads {n}')} ({DEFAULT_SPEC}: one thread per core, siblings left free), or "
           f"affinity.apply({DEFAULT_SPEC!r}, threads={n})") if first is not None else \
        f"affinity.apply({DEFAULT_SPEC!r})"
    return [Finding(kind="smt-shared", severity="warning", pids=pids,
                    summary=f"{sum(len(ts) for ts in shared.values())} runnable threads share "
                        f"{len(shared)} core{'s' if len(shared) != 1 else ''} (SMT siblings) while "
                        f"{len(idle)} core{'s' if len(idle) != 1 else ''} they may use stay idle", evidence=tuple(ev),
                    fix=fix,
                    facts=(("shared_cores", tuple(sorted(shared))),
                           ("idle_cores", tuple(c.logical_index for c in idle))))]


def _runnable_by_core(snap: Snapshot) -> tuple[dict[int, list[tuple[ProcessState, ThreadState]]], set[int],
                                                  set[int]]:
    """(core -> the runnable threads bound inside it, cores a runnable thread is bound
    to or last ran on, every CPU the processes may use)."""
    core_of = {pu.os_index: pu.core for pu in snap.topology.pus}
    busy: dict[int, list[tuple[ProcessState, ThreadState]]] = {}
    seen_cores: set[int] = set()
    allowed: set[int] = set()
    for p in snap.processes:
        allowed |= p.allowed
        for t in p.runnable:
            cores = {core_of[c] for c in t.cpus if c in core_of}
            if t.last_cpu in core_of:
                seen_cores.add(core_of[t.last_cpu])
            if len(cores) == 1:
                busy.setdefault(next(iter(cores)), []).append((p, t))
                seen_cores |= cores
    return busy, seen_cores, allowed
