"""The environment a plan exports, for child processes and runtimes not yet loaded.

One translator, :func:`plan_environment`, used by :func:`affinity.apply` and by
``affinity run``.  It says what the plan says, thread for thread, in every
runtime's language, so that a runtime started later binds thread ``i`` of its
first team to ``plan.cpusets[i]`` -- exactly what the plan (and Intel's runtime
given the original settings) does:

=========================  ====================================================
``OMP_NUM_THREADS``        the plan's team size (``plan.threads``)
``KMP_AFFINITY``           Intel/LLVM runtimes: an explicit proclist with one set
                           per thread (:meth:`~affinity.planning.planner.Plan.to_kmp_affinity`);
                           where libiomp5 would not read one that long (4096 bytes),
                           CPU ranges, or no type, so that ``OMP_PLACES`` decides
``OMP_PLACES``             OpenMP 4+ runtimes (libgomp): one place per thread, in
                           thread order (with strides and repeats where the plain
                           list is too long for libiomp5); left out when a
                           one-CPU-per-thread plan binds outside the process mask
                           (libgomp would cut it)
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
from collections.abc import Mapping

from ..cpulist import format_list
from ..errors import SpecError
from .gnu.exports import gomp_exports
from .intel.limits import fits_env
from typing import Any


__all__ = ["BLOCKTIME_DEFAULT", "DEFAULT_BLOCKTIME", "EXPORTED_VARIABLES", "RUNTIMES_BIND_NOTHING",
           "blocktime_for", "check_blocktime", "export",
           "leave_binding_to_the_library", "plan_environment", "worker_slots"]

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


#: ``blocktime=`` / ``--blocktime`` not given: the user's ``KMP_BLOCKTIME``, else
#: :data:`DEFAULT_BLOCKTIME` (:func:`blocktime_for`)
BLOCKTIME_DEFAULT = "default"


def blocktime_for(asked: str | None, environ: Mapping[str, str]) -> str | None:
    """The ``KMP_BLOCKTIME`` to export: ``asked``, or for :data:`BLOCKTIME_DEFAULT`
    the user's own value in ``environ`` (kept, not replaced), else
    :data:`DEFAULT_BLOCKTIME`; None exports none.  One rule for ``apply()`` and
    ``affinity run``."""
    if asked == BLOCKTIME_DEFAULT:
        return environ.get("KMP_BLOCKTIME", DEFAULT_BLOCKTIME)
    return asked


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
    return export(plan, blocktime=blocktime)[0]


def export(plan: Any, *, blocktime: str | None = DEFAULT_BLOCKTIME) -> tuple[dict[str, str], list[str]]:
    """:func:`plan_environment`'s variables, and one sentence for each runtime that
    will not bind as the plan says (``affinity run`` warns, ``apply()`` too):

    * libgomp cuts every place to the process mask, so a set partly outside it (a
      ``norespect`` plan) cannot be given to it (:func:`~.gnu.exports.gomp_exports`);
    * libiomp5 reads no variable longer than 4096 bytes
      (:func:`~.intel.limits.fits_env`): an explicit proclist that long (one
      CPU a thread is written as ranges already) is replaced by a
      ``KMP_AFFINITY`` without a type, which leaves the binding to ``OMP_PLACES``
      (written with strides and repeats, :meth:`Plan.to_omp_places`); said when
      neither fits.
    """
    gomp, exact = gomp_exports(plan)  # libgomp's variables: planning/gnu/exports.py
    env = {
        "OMP_NUM_THREADS": str(plan.threads),
        "KMP_AFFINITY": _kmp_affinity(plan, gomp),
        "KMP_WARNINGS": "0",
        "TF_NUM_INTRAOP_THREADS": str(int(plan.intra_op_threads)),
        "TF_NUM_INTEROP_THREADS": str(int(plan.inter_op_threads)),
    }
    env.update(gomp)
    if blocktime is not None:
        env["KMP_BLOCKTIME"] = check_blocktime(blocktime)
    problems = []
    if not exact:
        problems.append(f"libgomp cuts every place to the process mask ({format_list(plan.initial_mask)}): a "
                        f"thread whose set lies partly outside it (the plan binds outside the mask: norespect) "
                        f"gets only the part inside; Intel's and LLVM's runtimes follow the plan")
    if not fits_env("KMP_AFFINITY", env["KMP_AFFINITY"]):
        problems.append(f"the plan needs a KMP_AFFINITY of {len(env['KMP_AFFINITY'])} characters, longer than "
                        f"Intel's runtime reads (4096 bytes with its name): libiomp5 ignores it (Warning #65) "
                        f"and binds nothing by it")
    return env, problems


def _kmp_affinity(plan: Any, gomp: dict[str, str]) -> str:
    """The explicit ``KMP_AFFINITY`` of ``plan``, or where libiomp5 would not read
    it, a ``KMP_AFFINITY`` without a type, which leaves the binding to ``OMP_PLACES``."""
    full = plan.to_kmp_affinity()  # one CPU a thread: ranges already, where the list is long
    if fits_env("KMP_AFFINITY", full):
        return full
    places = gomp.get("OMP_PLACES")
    if places is not None and fits_env("OMP_PLACES", places):  # no type: the runtime follows OMP_PLACES
        return "norespect,granularity=fine" if not plan.union <= plan.initial_mask else "granularity=fine"
    return full


#: What the OpenMP runtimes are told when the library pins: bind nothing yourselves.
#: A runtime that starts after the library pinned the main thread to its slot reads
#: that one slot as the process's mask: Intel's (and LLVM's) libomp then set every
#: worker to it as the worker starts, after the library's pin -- the whole team on one
#: CPU, whatever ``KMP_AFFINITY`` says, except ``disabled``; a libgomp loaded then
#: (``import torch``) drops every place outside it ("Number of places reduced").
RUNTIMES_BIND_NOTHING = {"KMP_AFFINITY": "disabled", "OMP_PROC_BIND": "false"}
#: the place lists the plan exports, not exported where the library pins
_PLACE_LISTS = ("OMP_PLACES", "GOMP_CPU_AFFINITY")


def leave_binding_to_the_library(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` (a plan's exports) with the runtimes' binding turned off
    (:data:`RUNTIMES_BIND_NOTHING`) and its place lists left out: the library binds
    every thread to its slot, and nothing binds it again."""
    out = {k: v for k, v in env.items() if k not in _PLACE_LISTS}
    out.update(RUNTIMES_BIND_NOTHING)
    return out
