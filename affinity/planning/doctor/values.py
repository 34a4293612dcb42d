"""The values ``affinity doctor`` works on: a snapshot of live processes as plain
records (what :func:`affinity.binding.observe.observe` reads from ``/proc``, or
what a test describes), a binding published by a process (:class:`Publication`),
and what the checks find (:class:`Finding`, :class:`Diagnosis`).

Nothing here reads the machine: a snapshot built by hand from canned files (a
2-node ``numa_maps``, a CFS quota) is diagnosed exactly as a live one.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from ...cpulist import format_list
from ...machine.cgroup import CpuQuota
from ...machine.procfs import NumaMemory
from ...machine.topology import Topology
from ...record import field, record

__all__ = ["Diagnosis", "Finding", "LoadedLibrary", "ProcessState", "PublishedGpu", "PublishedPin", "PublishedPlan",
           "Publication",
           "Snapshot", "ThreadState", "cpus_text"]

#: a thread is runnable when it wanted a CPU (ran or waited for one) this share of the time sampled
RUNNABLE = 0.5


def cpus_text(cpus: frozenset[int] | set[int]) -> str:
    """``{0-3,8}``: a CPU set as the bind map writes it."""
    return "{" + format_list(cpus) + "}"


@record
class PublishedPin:
    """One thread a binding of affinity placed, as the process published it."""

    tid: int
    start: int | None  #: when the thread started (clock ticks): a reused TID is another thread
    role: str
    cpus: frozenset[int]
    index: int | None = None
    note: str | None = None


@record
class PublishedGpu:
    """The GPU a binding placed the process next to (``apply(gpu=...)``), as published:
    what another process's bind map says of it (``affinity show PID``)."""

    bus_id: str
    tile: int | None
    numa_node: int  #: the GPU's ``numa_node`` (``-1``: the firmware gave none)
    ordinal: int  #: its device ordinal in the process (``cuda:N``)
    cpus: frozenset[int]  #: the CPUs the binding gave the rank for it
    text: str  #: the bind map's GPU line (:meth:`affinity.planning.gpus.GpuBinding.describe`)

    def describe(self) -> str:
        return self.text

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.bus_id, "tile": self.tile, "gpu_numa_node": self.numa_node, "ordinal": self.ordinal,
                "cpus": format_list(self.cpus), "text": self.text}


@record
class PublishedPlan:
    """One active binding of a process: its plan in words a fix can repeat."""

    rules: str | None  #: whose rules the plan followed (``intel``...); None for a DataLoader worker's
    settings: tuple[tuple[str, str], ...]  #: the plan's settings (``KMP_AFFINITY=...``)
    threads: int
    cpus: frozenset[int]  #: every CPU of the plan
    main_mask: frozenset[int]  #: the mask the main thread keeps
    membind: str | None = None  #: the memory policy set, as ``bind:0``
    gpu: PublishedGpu | None = None  #: the GPU the binding placed the process next to

    def apply_call(self) -> str:
        """The ``affinity.apply(...)`` line that makes this binding again (the team
        size as ``threads=``, not as ``OMP_NUM_THREADS``)."""
        settings = [(k, v) for k, v in self.settings if k != "OMP_NUM_THREADS"]
        spec = " ".join(f"{k}={v}" for k, v in settings)
        if len(settings) == 1 and settings[0][0] == "KMP_AFFINITY":
            spec = settings[0][1]
        words = [repr(spec)] if spec else []
        words.append(f"threads={self.threads}")
        if self.membind:
            words.append(f"membind={self.membind!r}")
        return f"affinity.apply({', '.join(words)})"


@record
class Publication:
    """What a process bound by affinity published of its bindings (the bind map's
    roles and the plans), read back by another process."""

    pid: int
    start: int  #: the process's start time: the file of a process that held the PID before is not this one's
    pins: tuple[PublishedPin, ...]
    plans: tuple[PublishedPlan, ...]
    written: float = 0.0  #: when (seconds since the epoch)
    source: str = ""  #: the file it was read from ("" for this process's own bindings)

    def pin(self, tid: int, start: int | None) -> PublishedPin | None:
        """The pin of thread ``tid`` started at ``start`` (a pin with another start is another thread's)."""
        for p in self.pins:
            if p.tid == tid and (p.start is None or start is None or p.start == start):
                return p
        return None


@record
class LoadedLibrary:
    """An OpenMP runtime mapped into a process."""

    path: str
    kind: str  #: libgomp, libiomp5, libomp
    family: str  #: gnu, intel, llvm
    bundled_by: str | None = None  #: the Python package whose wheel ships it (torch, sklearn...)


@record
class ThreadState:
    """One thread of a live process."""

    tid: int
    name: str
    role: str  #: main, torch-intra, tf-inter, openmp, dataloader-worker, other...
    how: str  #: where the role comes from: ``published`` (the process said so), ``inferred``
    #: (from its name and the libraries loaded), ``known`` (this process's own binding, or the main thread)
    cpus: frozenset[int]  #: its mask now
    last_cpu: int
    state: str = "S"  #: R (running or runnable), S, D...
    start: int | None = None
    wanted: float | None = None  #: share of the time sampled it ran or waited for a CPU (None: not sampled)
    waited: float | None = None  #: share of the time sampled it waited for a CPU
    index: int | None = None  #: pool or team member number, where known
    requested: frozenset[int] | None = None  #: the mask affinity gave it (published), if any

    @property
    def runnable(self) -> bool:
        """Wanted a CPU at least half the time sampled (or, not sampled, is runnable now)."""
        return self.wanted >= RUNNABLE if self.wanted is not None else self.state == "R"

    def label(self) -> str:
        """``4250 [torch-inter (inferred) PTThreadPool]``"""
        how = " (inferred)" if self.how == "inferred" else ""
        idx = f" {self.index}" if self.index is not None else ""
        return f"{self.tid} [{self.role}{idx}{how} {self.name}]"


@record
class ProcessState:
    """One live process: its threads, what it may use, what it loaded, where its memory is."""

    pid: int
    ppid: int
    name: str
    cmdline: tuple[str, ...]
    threads: tuple[ThreadState, ...]
    allowed: frozenset[int]  #: the CPUs its cgroup's cpuset lets it use (the machine's when none is set)
    start: int = 0
    quota: CpuQuota | None = None  #: its cgroup's CFS quota (the smallest over its ancestors)
    throttled: tuple[int, int] | None = None  #: (periods, periods throttled) of the quota's cgroup while sampled
    environ: tuple[tuple[str, str], ...] = ()  #: its thread and placement variables (OMP_, KMP_, ...)
    runtimes: tuple[LoadedLibrary, ...] = ()
    memory: NumaMemory | None = None
    publication: Publication | None = None
    role: str | None = None  #: its part in its job (``dataloader-worker``), where it can be told
    notes: tuple[str, ...] = ()  #: what could not be read, and why

    @property
    def main(self) -> ThreadState | None:
        return next((t for t in self.threads if t.tid == self.pid), None)

    @property
    def cpus(self) -> frozenset[int]:
        """Every CPU one of its threads may run on."""
        return frozenset().union(*(t.cpus for t in self.threads)) if self.threads else frozenset()

    @property
    def runnable(self) -> tuple[ThreadState, ...]:
        return tuple(t for t in self.threads if t.runnable)

    @property
    def env(self) -> dict[str, str]:
        return dict(self.environ)

    def command(self) -> str:
        """Its command line as a shell would take it (its name when it has none); a
        command too long for one line (a ``python -c`` script) is shortened to its
        program and ``...``."""
        if not self.cmdline:
            return self.name
        text = shlex.join(self.cmdline)
        if "\n" in text or len(text) > 160:
            return f"{shlex.quote(self.cmdline[0])} ... (the command of pid {self.pid})"
        return text

    def label(self) -> str:
        role = f" ({self.role})" if self.role else ""
        return f"pid {self.pid}{role}"


@record
class Snapshot:
    """Live processes at one moment, with the machine they run on."""

    topology: Topology
    processes: tuple[ProcessState, ...]
    interval: float = 0.0  #: seconds between the two samples of CPU time (0: one sample)
    roots: tuple[int, ...] = ()  #: the processes asked about (the others are their children)
    peers: tuple[frozenset[int], ...] = ()  #: PIDs known to be ranks of one job (``--ranks``)

    def process(self, pid: int) -> ProcessState | None:
        return next((p for p in self.processes if p.pid == pid), None)

    def children(self, pid: int) -> tuple[ProcessState, ...]:
        return tuple(p for p in self.processes if p.ppid == pid and p.pid != pid)

    def ancestors(self, pid: int) -> set[int]:
        out: set[int] = set()
        p = self.process(pid)
        while p is not None and p.ppid not in out and p.ppid != p.pid:
            out.add(p.ppid)
            p = self.process(p.ppid)
        return out


@record
class Finding:
    """One pathology found: what, how bad, the evidence read, and the exact fix."""

    kind: str  #: collapsed-mask, oversubscribed, host-sized-pool, two-openmp-runtimes, overlap,
    #: smt-shared, remote-memory, binding-undone
    severity: str  #: ``error`` (exit status 1) or ``warning``
    pids: tuple[int, ...]
    summary: str  #: one line
    evidence: tuple[str, ...]  #: what was read, one line each
    fix: str  #: an ``affinity run`` line or an ``affinity.apply()`` call, and what else to do
    facts: tuple[tuple[str, Any], ...] = field(default=(), compare=False)  #: the evidence as values (JSON)

    def text(self) -> str:
        lines = [f"{self.severity} {self.kind}: {self.summary}"]
        lines += [f"  evidence: {e}" for e in self.evidence]
        lines.append(f"  fix: {self.fix}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "severity": self.severity, "pids": list(self.pids), "summary": self.summary,
                "evidence": list(self.evidence), "fix": self.fix, "facts": {k: _plain(v) for k, v in self.facts}}


def _plain(v: Any) -> Any:
    """A value as JSON takes it: CPU sets as cpulists, tuples as lists."""
    if isinstance(v, frozenset):
        return format_list(v)
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return v


@record
class Diagnosis:
    """What :func:`~affinity.planning.doctor.diagnose` found in a snapshot."""

    snapshot: Snapshot
    findings: tuple[Finding, ...]
    checked: str  #: one line: what was checked (the whole answer when nothing is found)

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "error")

    @property
    def ok(self) -> bool:
        """No finding is an error (warnings allowed)."""
        return not self.errors

    def kinds(self) -> list[str]:
        return [f.kind for f in self.findings]

    def text(self) -> str:
        head = [_process_line(p, self.snapshot) for p in self.snapshot.processes]
        if not self.findings:
            return "\n".join(head + [f"no finding: {self.checked}"])
        body = [f.text() for f in self.findings]
        n_err, n_warn = len(self.errors), len(self.findings) - len(self.errors)
        tail = f"{n_err} error{'s' if n_err != 1 else ''}, {n_warn} warning{'s' if n_warn != 1 else ''} ({self.checked})"
        return "\n".join(head + body + [tail])

    def to_dict(self) -> dict[str, Any]:
        return {"processes": [_process_dict(p) for p in self.snapshot.processes],
                "interval_s": self.snapshot.interval, "checked": self.checked,
                "findings": [f.to_dict() for f in self.findings],
                "errors": len(self.errors), "warnings": len(self.findings) - len(self.errors)}

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), **kw)

    def __str__(self) -> str:
        return self.text()


def _process_line(p: ProcessState, snap: Snapshot) -> str:
    under = f", child of pid {p.ppid}" if p.pid not in snap.roots and snap.process(p.ppid) is not None else ""
    pub = ", bound by affinity (published)" if p.publication is not None else ""
    n = len(p.threads)
    return (f"pid {p.pid} {p.name}{f' ({p.role})' if p.role else ''}{under}: {n} thread{'s' if n != 1 else ''}, "
            f"{len(p.runnable)} runnable, on {cpus_text(p.cpus)} of {cpus_text(p.allowed)}{pub}")


def _process_dict(p: ProcessState) -> dict[str, Any]:
    return {"pid": p.pid, "ppid": p.ppid, "name": p.name, "cmdline": list(p.cmdline), "role": p.role,
            "allowed": format_list(p.allowed), "quota_cpus": p.quota.cpus if p.quota else None,
            "environ": dict(p.environ), "published": p.publication is not None,
            "openmp_runtimes": [{"path": r.path, "kind": r.kind, "family": r.family, "bundled_by": r.bundled_by}
                                for r in p.runtimes],
            "memory": p.memory.to_dict() if p.memory is not None else None, "notes": list(p.notes),
            "threads": [{"tid": t.tid, "name": t.name, "role": t.role, "role_from": t.how, "index": t.index,
                         "cpus": format_list(t.cpus), "last_cpu": t.last_cpu, "state": t.state,
                         "wanted": t.wanted, "waited": t.waited,
                         "requested": None if t.requested is None else format_list(t.requested)}
                        for t in p.threads]}
