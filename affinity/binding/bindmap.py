"""The bind map: every thread of a process, where it is bound and where it runs.

Read from ``/proc/<pid>/task`` (works for any process of this user), enriched
for this process by the active :class:`~affinity.binding.apply.Binding`\\ s (role and the
set each thread was asked to use).  Text lines follow the form users grep
for in Intel's verbose output::

    affinity: pid 4242 tid 4250 thread 0 [tf-intra python] bound to OS proc set {0} last ran on cpu 0 node 0

(``last ran on cpu``: where the kernel last ran the thread, a moment ago -- inside
its set, or, for a thread bound since, possibly the CPU it ran on before.)

A thread whose actual set differs from the requested one is flagged
``MISMATCH`` (and listed in :attr:`BindMap.mismatches`).
"""

from __future__ import annotations

import errno
import json
import operator
import os
from typing import Any

from ..cpulist import format_list, parse_list
from ..errors import SpecError
from ..machine import _native
from ..machine.topology import Topology
from ..record import asdict, record, replace
from . import registry
from ..machine import loaded as _loaded
from .numa import get_membind
from . import tf as _tf
from .threads import _tgid, task_ids, task_names

__all__ = ["BOUNDED_ROLES", "BindMap", "ThreadRow", "report"]

#: roles whose requested set is a bound: the engine pins the thread to CPUs of its
#: choosing among them (OpenVINO's threads: :mod:`affinity.binding.ov`)
BOUNDED_ROLES = frozenset({"ov"})


@record
class ThreadRow:
    tid: int
    name: str
    role: str
    index: int | None
    requested: frozenset[int] | None
    actual: frozenset[int]
    last_cpu: int
    node: int | None
    mempolicy: str | None  #: known for the calling thread only (Linux reads it per thread)
    note: str | None = None  #: why the actual set differs, where affinity can tell

    @property
    def mismatch(self) -> bool:
        if self.requested is None:
            return False
        if self.role in BOUNDED_ROLES:  # the engine picks a CPU among those requested
            return not self.actual <= self.requested
        return self.requested != self.actual

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["requested"] = None if self.requested is None else sorted(self.requested)
        d["actual"] = sorted(self.actual)
        d["mismatch"] = self.mismatch
        return d


@record
class BindMap:
    pid: int
    rows: tuple[ThreadRow, ...]
    mems_allowed: str
    runtimes: Any = None  #: the OpenMP runtimes loaded (:class:`~affinity.machine.loaded.Census`)
    rules: str | None = None  #: whose rules the binding's plan followed (``Plan.runtime``), if one applies
    gpu: Any = None  #: the GPU the binding placed the process next to (:class:`~affinity.planning.gpus.GpuBinding`)

    @property
    def mismatches(self) -> list[ThreadRow]:
        return [r for r in self.rows if r.mismatch]

    def text(self) -> str:
        lines = []
        for r in self.rows:
            idx = f" thread {r.index}" if r.index is not None else ""
            node = f" node {r.node}" if r.node is not None else ""
            pol = f" mempolicy {r.mempolicy}" if r.mempolicy else ""
            line = (f"affinity: pid {self.pid} tid {r.tid}{idx} [{r.role} {r.name}] bound to OS proc set "
                    f"{{{format_list(r.actual)}}} last ran on cpu {r.last_cpu}{node}{pol}")
            if r.mismatch:
                line += f" MISMATCH: requested {{{format_list(r.requested or ())}}}"
            if r.note:
                line += f" NOTE: {r.note}"
            lines.append(line)
        if self.rules is not None:
            lines.append(f"affinity: pid {self.pid} binding followed {self.rules}'s rules")
        if self.gpu is not None:
            lines.append(f"affinity: pid {self.pid} {self.gpu.describe()}")
        if self.mismatches:
            lines.append(f"affinity: pid {self.pid} {len(self.mismatches)} thread(s) moved since they were pinned "
                         f"(NCCL puts the launcher's mask back at its init): Binding.reapply() pins them again")
        if self.runtimes is not None and self.runtimes.runtimes:
            lines.append(self.runtimes.text(prefix=f"affinity: pid {self.pid} "))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "mems_allowed": self.mems_allowed,
                "threads": [r.to_dict() for r in self.rows],
                "mismatches": [r.tid for r in self.mismatches],
                "openmp_runtimes": None if self.runtimes is None else self.runtimes.to_dict(),
                "rules": self.rules, "gpu": None if self.gpu is None else self.gpu.to_dict()}

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), **kw)

    def __str__(self) -> str:
        return self.text()


def _status(pid: int, tid: int) -> dict[str, str]:
    out = {}
    with open(f"/proc/{pid}/task/{tid}/status") as fh:
        for line in fh:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def _last_cpu(pid: int, tid: int) -> int:
    with open(f"/proc/{pid}/task/{tid}/stat") as fh:
        stat = fh.read()
    # fields after the parenthesised comm; "processor" is field 39
    rest = stat[stat.rindex(")") + 2:].split()
    return int(rest[36])


def _guess_role(pid: int, tid: int, name: str) -> str:
    if tid == pid:
        return "main"
    if name == "tf_Compute":
        return "tf-inter"
    if name.startswith("tf_"):
        return "tf-other"
    if name == "PTThreadPool":  # another process's: told by name only (in-process, affinity.torch finds them)
        return "torch-inter"
    return "other"


def _environ_count(pid: int, name: str) -> int:
    """A positive count from another process's environment (0: unset or unreadable)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            items = fh.read().split(b"\0")
    except OSError:
        return 0
    prefix = name.encode() + b"="
    for item in items:
        if item.startswith(prefix):
            text = item[len(prefix):].decode(errors="replace").strip()
            return int(text) if text.isdigit() else 0
    return 0


def _outside_pools(pid: int) -> dict[int, int]:
    """TensorFlow's intra-op workers in another process (TID -> worker index), by the
    rule that finds them in this one (:func:`affinity.binding.tf.pools_of`), the
    pool's size being what TensorFlow took at start: ``TF_NUM_INTRAOP_THREADS`` from
    the process's environment, else its CPU count."""
    try:
        names = task_names(pid)
        st = _status(pid, pid)
    except (OSError, ValueError):
        return {}
    if _tf.INTER_NAME not in names.values():
        return {}
    size = _environ_count(pid, "TF_NUM_INTRAOP_THREADS") or len(parse_list(st.get("Cpus_allowed_list", "")))
    state = _tf.pools_of(names, names.get(pid, ""), size, skip=(pid,))
    return {tid: i for i, tid in enumerate(state.intra)}


def _process_id(pid: object) -> int:
    """``pid`` checked as the id of a live process (see :func:`report`)."""
    if isinstance(pid, bool) or not hasattr(type(pid), "__index__"):
        raise SpecError(f"report(pid={pid!r:.40}): a process id is an integer")
    p = operator.index(pid)  # type: ignore[call-overload]
    if p < 1:
        raise SpecError(f"report(pid={p}): a process id is 1 or more")
    tgid = _tgid(p)
    if tgid is None:
        raise FileNotFoundError(errno.ENOENT, f"report(pid={p}): no process {p}")
    if tgid != p:
        raise SpecError(f"report(pid={p}): {p} is a thread of process {tgid}, not a process: give {tgid}")
    return p


def report(pid: int | None = None, *, binding: Any = None) -> BindMap:
    """The bind map of a process: every thread, where it is bound and where it runs.

    Parameters
    ----------
    pid : int, optional
        The process (default: this one); any process of this user can be read.
    binding : Binding, optional
        For this process: whose requested sets and roles to show (default: every
        active binding, newest wins).

    Returns
    -------
    BindMap
        One row per thread; ``str()`` is the text users grep for
        (``... bound to OS proc set {...}``), ``to_json()`` the same as JSON.

    Raises
    ------
    FileNotFoundError
        No process ``pid``.
    SpecError
        ``pid`` is no process id (not an integer, below 1), or the TID of a thread
        that is not its process's first (its process is named).
    """
    me = os.getpid()
    pid = me if pid is None else _process_id(pid)
    pins: dict[int, Any] = {}
    bindings = ([binding] if binding is not None else registry.active()) if pid == me else []
    for b in bindings:
        pins.update(b.pins)
    node_of: dict[int, int] = {}
    mempolicy_self: str | None = None
    try:
        topo = Topology.from_system()
        for pu in topo.pus:
            if pu.numa is not None:
                node_of[pu.os_index] = topo.numa_nodes[pu.numa].os_index
    except Exception:  # noqa: BLE001 - the map is still useful without NUMA columns
        topo = None
    caller = None
    if pid == me:
        caller = _native.gettid()
        try:
            mempolicy_self = str(get_membind())
        except Exception:  # noqa: BLE001
            mempolicy_self = None
    outside = _outside_pools(pid) if pid != me else {}
    rows = []
    mems = ""
    for tid in task_ids(pid):
        try:
            st = _status(pid, tid)
            cpu = _last_cpu(pid, tid)
        except (OSError, ValueError, IndexError):
            continue  # exited meanwhile
        mems = st.get("Mems_allowed_list", mems)
        name = st.get("Name", "")
        actual = parse_list(st.get("Cpus_allowed_list", ""))
        pin = pins.get(tid)
        role = pin.role if pin is not None else "tf-intra" if tid in outside else _guess_role(pid, tid, name)
        requested = pin.cpus if pin is not None else (bindings[-1].main_mask if bindings and tid == pid
                                                       else None)
        rows.append(ThreadRow(tid, name, role, pin.index if pin is not None else outside.get(tid),
                              requested, actual, cpu, node_of.get(cpu),
                              mempolicy_self if tid == caller else None, getattr(pin, "note", None)))
    if bindings:
        rows = _explain_late_openmp(rows, pid, bindings[-1])
    # whose rules: the newest binding that planned (a DataLoader worker's binding carries no plan)
    rules = next((b.plan.runtime for b in reversed(bindings) if getattr(b, "plan", None) is not None), None)
    decided = next((b.decision for b in reversed(bindings) if getattr(b, "decision", None) is not None), None)
    gpu = decided.placements[0].gpu if decided is not None else None
    return BindMap(pid, tuple(rows), mems, _census(pid), rules, gpu)


def _census(pid: int) -> Any:
    try:
        return _loaded.census(pid)
    except OSError:  # exited meanwhile, or maps not readable: the rows still stand
        return None


def _explain_late_openmp(rows: list[ThreadRow], pid: int, binding: Any) -> list[ThreadRow]:
    """An OpenMP runtime loaded after apply() binds its primary thread (the main
    thread, usually) to its first place; every thread created from it afterwards
    inherits that mask (tensorflow#24172).  Say so on the rows concerned."""
    late = binding.late_openmp()
    main = next((r for r in rows if r.tid == pid), None)
    if not late or main is None or not main.mismatch or not main.actual < binding.main_mask:
        return rows
    kinds = ", ".join(sorted({rt.kind for rt in late}))
    narrowed = f"{{{format_list(main.actual)}}}"
    out = []
    for r in rows:
        if r is main:
            r = replace(r, note=f"narrowed to {narrowed} by {kinds} loaded after apply() (an OpenMP runtime "
                                f"binds its primary thread to its first place); threads it creates now "
                                f"inherit {narrowed}")
        elif r.requested is None and r.actual == main.actual:
            r = replace(r, note=f"inherited the main thread's mask {narrowed}, narrowed by {kinds}")
        out.append(r)
    return out
