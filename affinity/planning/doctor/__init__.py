"""``affinity doctor``'s findings: a pure function of a snapshot of live processes.

:func:`diagnose` takes a :class:`~.values.Snapshot` (what
:func:`affinity.binding.observe.observe` reads from ``/proc``, or a snapshot a test
builds from canned files) and returns a :class:`~.values.Diagnosis`: each
:class:`~.values.Finding` with its kind, severity, evidence and the exact fix (an
``affinity run`` line or an ``affinity.apply()`` call), and one line saying what was
checked.  The checks, one function each:

==================== ======= ==================================================
kind                 default what
==================== ======= ==================================================
collapsed-mask       error   an OpenMP runtime narrowed the main thread to its first
                             place (libgomp at ``import torch`` with ``OMP_PROC_BIND``
                             set), threads and children inherited it
binding-undone       error   a thread affinity bound is no longer on its set
overlap              error   placed processes whose runnable threads share CPUs
oversubscribed       error   more runnable threads than CPUs (and CFS quota) run
two-openmp-runtimes  error   two OpenMP runtimes loaded in one process
remote-memory        error   > 50% of the memory on other nodes than the threads'
                     warning (>= 20%)
host-sized-pool      warning pools sized beyond the CPUs and quota allowed
smt-shared           warning runnable threads on SMT siblings while cores idle
==================== ======= ==================================================
"""

from __future__ import annotations

from .load import capacity, host_sized_pools, oversubscribed, two_runtimes
from .masks import collapsed_masks, overlapping_processes, smt_shared, undone_bindings
from .memory import remote_memory
from .values import (Diagnosis, Finding, LoadedLibrary, ProcessState, PublishedPin, PublishedPlan, Publication,
                     Snapshot, ThreadState)

__all__ = ["Diagnosis", "Finding", "KINDS", "LoadedLibrary", "ProcessState", "PublishedPin", "PublishedPlan",
           "Publication", "Snapshot", "ThreadState", "capacity", "checked_line", "diagnose"]

#: every kind of finding, in the order they are reported
KINDS = ("collapsed-mask", "binding-undone", "overlap", "oversubscribed", "two-openmp-runtimes", "remote-memory",
         "host-sized-pool", "smt-shared")


def diagnose(snapshot: Snapshot) -> Diagnosis:
    """Every finding in ``snapshot``, errors first (then in :data:`KINDS` order), and
    the line that says what was checked."""
    collapse = collapsed_masks(snapshot)
    heirs = {pid for f in collapse for pid in f.pids[1:]}  # children that inherited a collapsed mask
    found = [*collapse, *undone_bindings(snapshot), *overlapping_processes(snapshot, skip=heirs),
             *oversubscribed(snapshot), *two_runtimes(snapshot), *remote_memory(snapshot),
             *host_sized_pools(snapshot), *smt_shared(snapshot)]
    found.sort(key=lambda f: (f.severity != "error", KINDS.index(f.kind), f.pids))
    return Diagnosis(snapshot, tuple(found), checked_line(snapshot))


def checked_line(snap: Snapshot) -> str:
    """One line: what was checked, on how much."""
    procs = snap.processes
    threads = sum(len(p.threads) for p in procs)
    runnable = sum(len(p.runnable) for p in procs)
    topo = snap.topology
    sampled = f"{runnable} runnable over {snap.interval:g} s" if snap.interval else f"{runnable} runnable"
    quota = " and CFS quota" if any(p.quota for p in procs) else ""
    smt = "" if any(len(c.cpuset) > 1 for c in topo.cores) else " (no SMT here)"
    nodes = len(topo.numa_nodes)
    runtimes = sum(len(p.runtimes) for p in procs)
    holding = sum(1 for p in procs if p.runtimes)
    loaded = f"{runtimes} loaded" + (f" in {holding} processes" if holding > 1 else "")
    published = sum(1 for p in procs if p.publication is not None)
    return (f"checked {len(procs)} process{'es' if len(procs) != 1 else ''} ({threads} thread"
            f"{'s' if threads != 1 else ''}, {sampled}) on "
            f"{topo.describe()}: masks against the CPUs allowed, runnable threads against CPUs{quota}, pool "
            f"sizes, OpenMP runtimes ({loaded}), overlap of placed processes, SMT siblings{smt}, memory "
            f"over {nodes} NUMA node{'s' if nodes != 1 else ''}, bindings published by affinity ({published})")
