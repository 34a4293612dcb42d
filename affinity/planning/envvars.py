"""The environment a plan exports, for child processes and runtimes not yet loaded.

One function, :func:`plan_environment`, used by :func:`affinity.apply` and by
``affinity run``.  Every OpenMP runtime gets the same per-thread CPU sets in its
own language, and TensorFlow gets the matching pool sizes:

=========================  ====================================================
``OMP_NUM_THREADS``        one thread per worker slot
``KMP_AFFINITY``           Intel/LLVM runtimes: ``granularity=fine,explicit,proclist=[...]``
``OMP_PLACES``             OpenMP 4+ runtimes (libgomp): the slots as explicit places
``OMP_PROC_BIND``          ``close``: thread i on place i
``GOMP_CPU_AFFINITY``      libgomp's own form, only when every slot is one CPU
``KMP_BLOCKTIME``          how long Intel/LLVM workers spin before sleeping (ms)
``KMP_WARNINGS``           ``0``: Intel/LLVM runtimes otherwise warn (#182) that
                           ``OMP_PLACES``/``OMP_PROC_BIND``/``GOMP_CPU_AFFINITY`` are
                           ignored because ``KMP_AFFINITY`` is set, though all say the
                           same thing; set it yourself to see the runtime's warnings
``TF_NUM_INTRAOP_THREADS`` TensorFlow's intra-op pool size
``TF_NUM_INTEROP_THREADS`` TensorFlow's inter-op pool size
=========================  ====================================================

A *worker slot* is one CPU set per intra-op/OpenMP worker: the plan's sets in
thread order with duplicates removed (``granularity=core`` plans list each core
once per hardware thread), as many as the plan's intra-op thread count.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEFAULT_BLOCKTIME", "EXPORTED_VARIABLES", "plan_environment", "worker_slots"]

#: what :func:`plan_environment` may set (the output side; the planner reads
#: :data:`affinity.planning.spec.SETTINGS_VARIABLES`)
EXPORTED_VARIABLES = ("OMP_NUM_THREADS", "KMP_AFFINITY", "OMP_PLACES", "OMP_PROC_BIND", "GOMP_CPU_AFFINITY",
            "KMP_BLOCKTIME", "KMP_WARNINGS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


def worker_slots(plan: Any) -> list[frozenset[int]]:
    """One CPU set per intra-op/OpenMP worker (see the module docstring); when the
    plan has fewer distinct sets than workers (coarse granularity), the plan's own
    sets are used in thread order, cycling."""
    distinct: list[frozenset[int]] = []
    for s in plan.cpusets:
        if s not in distinct:
            distinct.append(s)
    n = int(plan.intra_op_threads)
    if len(distinct) >= n:
        return distinct[:n]
    return [plan.cpusets[i % len(plan.cpusets)] for i in range(n)]


def _set_text(s: frozenset[int]) -> str:
    return str(next(iter(s))) if len(s) == 1 else "{" + ",".join(map(str, sorted(s))) + "}"


#: the ``KMP_BLOCKTIME`` (ms) exported by default: workers sleep 1 ms after a region
#: instead of spinning 200 ms (the runtime's default), which frees the cores between
#: TensorFlow ops; ``blocktime=None`` everywhere means "export none"
DEFAULT_BLOCKTIME = "1"


def plan_environment(plan: Any, *, blocktime: str | None = DEFAULT_BLOCKTIME) -> dict[str, str]:
    """The variables (name -> value) that make runtimes started later follow ``plan``."""
    slots = worker_slots(plan)
    env = {
        "OMP_NUM_THREADS": str(len(slots)),
        "KMP_AFFINITY": "granularity=fine,explicit,proclist=[" + ",".join(_set_text(s) for s in slots) + "]",
        "OMP_PLACES": ",".join("{" + ",".join(map(str, sorted(s))) + "}" for s in slots),
        "OMP_PROC_BIND": "close",
        "KMP_WARNINGS": "0",
        "TF_NUM_INTRAOP_THREADS": str(int(plan.intra_op_threads)),
        "TF_NUM_INTEROP_THREADS": str(int(plan.inter_op_threads)),
    }
    if all(len(s) == 1 for s in slots):
        env["GOMP_CPU_AFFINITY"] = " ".join(str(next(iter(s))) for s in slots)
    if blocktime is not None:
        env["KMP_BLOCKTIME"] = str(blocktime)
    return env
