"""The environment a plan exports, for child processes and runtimes not yet loaded.

One translator, :func:`plan_environment`, used by :func:`affinity.apply` and by
``affinity run``.  It says what the plan says, thread for thread, in every
runtime's language, so that a runtime started later binds thread ``i`` of its
first team to ``plan.cpusets[i]`` -- exactly what the plan (and Intel's runtime
given the original settings) does:

=========================  ====================================================
``OMP_NUM_THREADS``        the plan's team size (``plan.threads``)
``KMP_AFFINITY``           Intel/LLVM runtimes: an explicit proclist with one set
                           per thread (:meth:`~affinity.planning.planner.Plan.to_kmp_affinity`)
``OMP_PLACES``             OpenMP 4+ runtimes (libgomp): one place per thread, in
                           thread order; left out when a one-CPU-per-thread plan
                           binds outside the process mask (libgomp would cut it)
``OMP_PROC_BIND``          ``close``: thread i on place i
``GOMP_CPU_AFFINITY``      libgomp's own form, only when every thread has one CPU
                           (the rules: :mod:`affinity.planning.gnu.exports`)
``KMP_BLOCKTIME``          how long Intel/LLVM workers spin before sleeping (ms)
``KMP_WARNINGS``           ``0``: Intel/LLVM runtimes otherwise warn (#182) that
                           ``OMP_PLACES``/``OMP_PROC_BIND``/``GOMP_CPU_AFFINITY`` are
                           ignored because ``KMP_AFFINITY`` is set, though all say the
                           same thing; set it yourself to see the runtime's warnings
``TF_NUM_INTRAOP_THREADS`` TensorFlow's intra-op pool size (``plan.intra_op_threads``)
``TF_NUM_INTEROP_THREADS`` TensorFlow's inter-op pool size (``plan.inter_op_threads``)
=========================  ====================================================

The place list has one place per thread, duplicates included, because that is
the runtime's own place list for ``KMP_AFFINITY`` types: with
``granularity=core`` on a 2-way SMT machine libiomp5 lists each core once per
hardware thread and binds thread ``i`` to place ``i``.

TensorFlow's intra-op pool is not an OpenMP team: its workers get the
:func:`worker_slots`, the plan's distinct sets in thread order, one per
intra-op thread.
"""

from __future__ import annotations

import re

from ..errors import SpecError
from .gnu.exports import gomp_exports

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (affinity run's start-up)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["DEFAULT_BLOCKTIME", "EXPORTED_VARIABLES", "check_blocktime", "plan_environment", "worker_slots"]

#: what :func:`plan_environment` may set (the output side; the planner reads
#: :data:`affinity.planning.spec.SETTINGS_VARIABLES`)
EXPORTED_VARIABLES = ("OMP_NUM_THREADS", "KMP_AFFINITY", "OMP_PLACES", "OMP_PROC_BIND", "GOMP_CPU_AFFINITY",
            "KMP_BLOCKTIME", "KMP_WARNINGS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


def worker_slots(plan: Any) -> list[frozenset[int]]:
    """One CPU set per TensorFlow intra-op worker.

    The plan's distinct sets in thread order (a ``granularity=core`` plan lists
    each core once per hardware thread; a worker pool wants each core once), as
    many as ``plan.intra_op_threads``; when the plan has fewer distinct sets than
    that, its sets are used in thread order, cycling.
    """
    distinct: list[frozenset[int]] = []
    for s in plan.cpusets:
        if s not in distinct:
            distinct.append(s)
    n = int(plan.intra_op_threads)
    if len(distinct) >= n:
        return distinct[:n]
    return [plan.cpusets[i % len(plan.cpusets)] for i in range(n)]


#: the ``KMP_BLOCKTIME`` (ms) exported by default: workers sleep 1 ms after a region
#: instead of spinning 200 ms (the runtime's default), which frees the cores between
#: TensorFlow ops; ``blocktime=None`` everywhere means "export none"
DEFAULT_BLOCKTIME = "1"

#: what the Intel/LLVM runtime reads as ``KMP_BLOCKTIME``: a whole number of
#: milliseconds (LLVM 18+ also takes an ``ms``/``us`` unit), or ``infinite``/``infinity``
_BLOCKTIME_RE = re.compile(r"[0-9]{1,10}(ms|us)?|infinite|infinity", re.IGNORECASE)


def check_blocktime(value: object, what: str = "blocktime") -> str:
    """``value`` as a ``KMP_BLOCKTIME`` to export, or :class:`~affinity.errors.SpecError`
    (nothing else is exported: the value reaches child processes' environment)."""
    text = value.strip() if isinstance(value, str) else str(value) if type(value) is int else ""
    if not text.isascii() or not _BLOCKTIME_RE.fullmatch(text):
        raise SpecError(f"{what}={str(value)[:40]!r}: not a KMP_BLOCKTIME (milliseconds as a whole number, "
                        f"e.g. 0 or 200, or 'infinite')")
    return text


def plan_environment(plan: Any, *, blocktime: str | None = DEFAULT_BLOCKTIME) -> dict[str, str]:
    """The variables that make runtimes started later follow ``plan``.

    Parameters
    ----------
    plan : Plan
        What to reproduce.
    blocktime : str or None
        ``KMP_BLOCKTIME`` to export (ms or ``"infinite"``); ``None`` exports none.

    Returns
    -------
    dict of str to str
        Variable name -> value (see the module docstring for each variable).
    """
    env = {
        "OMP_NUM_THREADS": str(plan.threads),
        "KMP_AFFINITY": plan.to_kmp_affinity(),
        "KMP_WARNINGS": "0",
        "TF_NUM_INTRAOP_THREADS": str(int(plan.intra_op_threads)),
        "TF_NUM_INTEROP_THREADS": str(int(plan.inter_op_threads)),
    }
    # libgomp's variables (OMP_PLACES/OMP_PROC_BIND/GOMP_CPU_AFFINITY): planning/gnu/exports.py
    env.update(gomp_exports(plan)[0])
    if blocktime is not None:
        env["KMP_BLOCKTIME"] = check_blocktime(blocktime)
    return env
