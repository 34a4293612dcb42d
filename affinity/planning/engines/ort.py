"""ONNX Runtime's threading, in its own words (pure).

What ONNX Runtime does, as its source says (``onnxruntime/core/util/thread_utils.cc``
``ReadThreadAffinityConfig`` and ``CreateThreadPoolHelper``,
``onnxruntime/core/platform/posix/env.cc`` ``GetDefaultThreadAffinities`` and
``ThreadMain``, ``onnxruntime/core/common/threadpool.cc``):

* An intra-op pool of ``intra_op_num_threads`` counts the calling thread (the one
  that calls ``run``) as member 0 and starts ``n - 1`` threads; ``n <= 1`` starts none.
* Left at 0 (the default), ``n`` is the machine's physical cores (cpuinfo: every
  core, whatever the process mask or CPU quota), and each started thread is pinned
  to one core's PUs (the first core's entry goes to the caller and is dropped); a
  pin outside the process's CPUs fails with EINVAL and the thread floats
  (onnxruntime#8313).  Set by the user, ``n`` threads are started **unpinned**
  (onnxruntime#12819) unless ``session.intra_op_thread_affinities`` says where.
* ``session.intra_op_thread_affinities``: one entry per started thread, separated
  by ``;`` -- exactly ``n - 1`` of them (the caller gets none); an entry is either
  one range ``a-b`` or a list ``a,b,c`` (not both: ``1,3-5`` is refused); ids are
  logical processors counted **from 1** (Linux CPU ``c`` is ``c + 1``).
* The inter-op pool (``inter_op_num_threads``) exists only with
  ``execution_mode = ORT_PARALLEL`` and takes no affinities.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...cpulist import format_list, runs
from ...errors import EngineError
from ...machine.topology import Topology
from ...record import record
from ..envvars import worker_slots

__all__ = ["AFFINITY_KEY", "OrtDefault", "OrtThreading", "format_affinities", "ort_default", "ort_threading",
           "overridden", "parse_affinities"]

#: the session config key ONNX Runtime reads the intra-op pool's affinities from
AFFINITY_KEY = "session.intra_op_thread_affinities"


def format_affinities(sets: Sequence[frozenset[int]]) -> str:
    """The affinity string for the started threads' CPU sets (thread 1, 2, ...):
    ``;`` between threads; a contiguous set as ``a-b``, any other as ``a,b,c``;
    ids from 1.  :class:`EngineError` for an empty set."""
    out = []
    for i, s in enumerate(sets):
        if not s:
            raise EngineError(f"ONNX Runtime: thread {i + 1} has no CPU")
        parts = runs(s)
        if len(parts) == 1 and parts[0][0] != parts[0][1]:
            out.append(f"{parts[0][0] + 1}-{parts[0][1] + 1}")
        else:
            out.append(",".join(str(c + 1) for c in sorted(s)))
    return ";".join(out)


def parse_affinities(text: str) -> tuple[frozenset[int], ...]:
    """ONNX Runtime's reading of an affinity string, as Linux CPU ids (from 0);
    :class:`EngineError` where it refuses (its message)."""
    if not text:
        raise EngineError("ONNX Runtime: Affinity string must not be empty")
    out = []
    for entry in text.split(";"):
        interval = entry.split("-")
        if len(interval) == 2:
            lo, hi = (_id(x, entry) for x in interval)
            if lo > hi:
                raise EngineError(f"ONNX Runtime: Invalid processor interval: {entry}")
            out.append(frozenset(range(lo - 1, hi)))
        else:
            out.append(frozenset(_id(x, x) - 1 for x in entry.split(",")))
    return tuple(out)


def _id(text: str, shown: str) -> int:
    if not text.isdigit() or not text.isascii():
        raise EngineError(f"ONNX Runtime: Processor id must consist of only digits: {shown}")
    if int(text) <= 0:
        raise EngineError(f"ONNX Runtime: Processor id must start from 1: {shown}")
    return int(text)


@record
class OrtThreading:
    """What a session is given from a plan (:func:`ort_threading`)."""

    intra_op_num_threads: int
    inter_op_num_threads: int
    #: ``session.intra_op_thread_affinities``; ``None`` with one intra-op thread (no pool)
    intra_op_thread_affinities: str | None
    workers: tuple[frozenset[int], ...]  #: started thread ``j`` (1..n-1) -> its CPUs, in order
    caller: frozenset[int]  #: where the calling thread (member 0) should run: the plan's CPUs

    def config(self) -> dict[str, str]:
        """The session config entries (``add_session_config_entry``)."""
        a = self.intra_op_thread_affinities
        return {} if a is None else {AFFINITY_KEY: a}


def ort_threading(plan: Any) -> OrtThreading:
    """The plan's intra-op pool (its intra-op slots: member ``i`` on slot ``i``, the
    caller on slot 0's side of the plan) and inter-op pool size, in ONNX Runtime's
    syntax.  Both counts are set, with the affinities, so ONNX Runtime neither
    sizes the pool from the whole machine nor drops its pinning (onnxruntime#12819)."""
    slots = worker_slots(plan)
    n = len(slots)
    workers = tuple(slots[1:])
    return OrtThreading(n, max(1, int(plan.inter_op_threads)), format_affinities(workers) if workers else None,
                        workers, frozenset().union(*plan.cpusets))


@record
class OrtDefault:
    """What ONNX Runtime does with ``intra_op_num_threads = 0`` (:func:`ort_default`)."""

    threads: int  #: the pool's size, the caller included: the machine's physical cores
    workers: tuple[frozenset[int], ...]  #: started thread ``j`` -> the core's PUs it is pinned to
    outside: tuple[int, ...]  #: started threads whose core is outside the process's CPUs (pin fails)


def ort_default(topology: Topology) -> OrtDefault:
    """ONNX Runtime's default pool on ``topology``: one member per physical core of
    the machine (``topology.allowed`` does not count: cpuinfo reads every core),
    started thread ``j`` pinned to core ``j``'s PUs."""
    cores = topology.cores
    workers = tuple(c.cpuset for c in cores[1:])
    outside = tuple(j + 1 for j, w in enumerate(workers) if not w & topology.allowed)
    return OrtDefault(len(cores), workers, outside)


def overridden(topology: Topology, threading: OrtThreading, quota_cpus: float | None = None) -> list[str]:
    """What the plan's threading replaces of ONNX Runtime's default on ``topology``
    (``quota_cpus``: the process's CPU quota), one note each, as for
    ``OMP_NUM_THREADS``; none where they agree."""
    d = ort_default(topology)
    notes = []
    why = []
    if d.outside:
        why.append(f"{len(d.outside)} of its threads pinned to cores outside the process's CPUs "
                   f"{format_list(topology.allowed)} (the pin fails and they float)")
    if quota_cpus is not None and d.threads > quota_cpus:
        why.append(f"{d.threads} threads under a CPU quota of {quota_cpus:g} CPUs")
    if d.threads != threading.intra_op_num_threads or why:
        notes.append(f"ONNX Runtime's default intra-op pool ({d.threads} threads: one per physical core of the "
                     f"machine{', ' + '; '.join(why) if why else ''}) replaced by the plan's "
                     f"{threading.intra_op_num_threads} threads, each pinned to its slot")
    return notes
