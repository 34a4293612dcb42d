"""A plan in the runtimes' own variables: the one module that translates (issue #36).

:func:`export` (:func:`plan_environment`) is what :func:`affinity.apply` and ``affinity
run`` export (the decision, :mod:`affinity.planning.decide`, calls it); each runtime's
words for one set per thread are here too -- :func:`explicit_kmp_affinity`,
:func:`omp_places`, :func:`gomp_cpu_affinity`, :func:`gomp_exports` (libgomp's rules of
what it reads), :func:`translation_env` -- and :class:`~affinity.planning.planner.Plan`'s
``to_*`` methods call them.  It says what the plan says, thread for thread, in every
runtime's language, so that a runtime started later binds thread ``i`` of its
first team to ``plan.cpusets[i]`` -- exactly what the plan (and Intel's runtime
given the original settings) does:

=========================  ====================================================
``OMP_NUM_THREADS``        the plan's team size (``plan.threads``)
``KMP_AFFINITY``           Intel/LLVM runtimes: an explicit proclist with one set
                           per thread (:func:`explicit_kmp_affinity`);
                           where libiomp5 would not read one that long (4096 bytes),
                           CPU ranges, or no type, so that ``OMP_PLACES`` decides
``OMP_PLACES``             OpenMP 4+ runtimes (libgomp): one place per thread, in
                           thread order (with strides and repeats where the plain
                           list is too long for libiomp5); left out when a
                           one-CPU-per-thread plan binds outside the process mask
                           (libgomp would cut it)
``OMP_PROC_BIND``          ``close``: thread i on place i
``GOMP_CPU_AFFINITY``      libgomp's own form, only when every thread has one CPU
                           (the rules: :func:`gomp_exports`)
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
from collections.abc import Iterable, Mapping
from typing import Any

from ..cpulist import format_list, runs
from ..errors import PlanError, SpecError, UsageError
from .gnu.builds import BUILDS
from .gnu.places import affinity_hang, cpu_limit
from .intel.limits import fits_env
from .intel.runtime import kmp_mask_str
from .spec import KmpAffinity, ProcList


__all__ = ["BLOCKTIME_DEFAULT", "DEFAULT_BLOCKTIME", "EXPORTED_VARIABLES", "RUNTIMES_BIND_NOTHING",
           "blocktime_for", "check_blocktime", "check_inherited", "explicit_kmp_affinity", "export",
           "gomp_cpu_affinity", "gomp_exports", "leave_binding_to_the_library", "omp_places", "plan_environment",
           "translation_env", "worker_slots"]

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
      ``norespect`` plan) cannot be given to it (:func:`gomp_exports`);
    * libiomp5 reads no variable longer than 4096 bytes
      (:func:`~.intel.limits.fits_env`): an explicit proclist that long (one
      CPU a thread is written as ranges already) is replaced by a
      ``KMP_AFFINITY`` without a type, which leaves the binding to ``OMP_PLACES``
      (written with strides and repeats, :meth:`Plan.to_omp_places`); said when
      neither fits.
    """
    gomp, exact = gomp_exports(plan)  # libgomp's variables: below
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


# ------------------------------------------------ one thread, one set: each runtime's words

def explicit_kmp_affinity(plan: Any) -> str:
    """An explicit ``KMP_AFFINITY`` giving every thread its set.

    Use it with ``OMP_NUM_THREADS=<threads>`` (:func:`translation_env`).

    Returns
    -------
    str
        ``granularity=fine,proclist=[...],explicit`` (with ``norespect``
        when a set lies outside the initial mask).  One CPU a thread, where the
        list written out is longer than libiomp5 reads (4096 bytes with the
        name: :func:`~affinity.planning.intel.limits.fits_env`), as ranges
        (``0-62:2``); several CPUs a thread have no shorter form, and such a
        plan can pass the limit (:func:`translation_env` refuses it then).
    """
    pl = ProcList.of(plan.cpusets)
    spec = KmpAffinity(type="explicit", granularity="thread", proclist=pl,
                       respect=False if not plan.union <= plan.initial_mask else None)
    full = str(spec)
    if fits_env("KMP_AFFINITY", full) or any(len(s) != 1 for s in plan.cpusets):
        return full
    # one CPU a thread, too long for libiomp5 written out: the same CPUs as ranges (0-62:2)
    return _PROCLIST.sub("proclist=[" + _proc_ranges([min(s) for s in plan.cpusets]) + "]", full, count=1)


def omp_places(plan: Any) -> str:
    """An ``OMP_PLACES`` list with one place per thread, in thread order.

    With ``OMP_PROC_BIND=close`` and ``OMP_NUM_THREADS=<threads>`` thread
    ``i`` gets place ``i`` (:func:`translation_env`).

    Returns
    -------
    str
        The place list, e.g. ``{0:2},{2:2}``; where that is longer than
        Intel's runtime reads (:func:`~affinity.planning.intel.limits.fits_env`),
        the same places with strides and repeats (``{0:32:2}:64:0``).
    """
    plain = ",".join("{" + _place_members(s) + "}" for s in plan.cpusets)
    return plain if fits_env("OMP_PLACES", plain) else _compact_places(plan.cpusets)


def gomp_cpu_affinity(plan: Any) -> str:
    """A ``GOMP_CPU_AFFINITY`` list (libgomp binds thread ``i`` to the ``i``-th CPU).

    Returns
    -------
    str
        The CPUs of the threads, in thread order, separated by spaces.

    Raises
    ------
    PlanError
        Some thread has more than one CPU: only plans where every thread
        has a single CPU can be expressed.
    """
    out = []
    for i, s in enumerate(plan.cpusets):
        if len(s) != 1:
            raise PlanError(f"GOMP_CPU_AFFINITY binds each thread to one CPU; thread {i} has "
                            f"{{{kmp_mask_str(s)}}}")
        out.append(str(next(iter(s))))
    return " ".join(out)


def translation_env(plan: Any, target: str) -> dict[str, str]:
    """The environment that reproduces this plan with ``target``, team size included.

    Parameters
    ----------
    target : {"kmp_affinity", "omp_places", "gomp"}
        The variables to use: ``KMP_AFFINITY``, ``OMP_PLACES`` with
        ``OMP_PROC_BIND=close``, or ``GOMP_CPU_AFFINITY``.

    Returns
    -------
    dict of str to str
        The variables to export, ``OMP_NUM_THREADS`` included.

    Raises
    ------
    PlanError
        ``kmp_affinity``: the proclist is longer than libiomp5 reads;
        ``gomp``: the plan cannot be expressed (a thread with several
        CPUs, or a CPU beyond the CPU sets libgomp sizes for the process mask).
    ValueError
        An unknown ``target``.
    """
    n = str(plan.threads)
    if target == "kmp_affinity":
        kmp = explicit_kmp_affinity(plan)
        if not fits_env("KMP_AFFINITY", kmp):
            raise PlanError(f"KMP_AFFINITY alone cannot say this plan: its proclist takes {len(kmp)} "
                            f"characters, and libiomp5 reads no variable longer than 4096 bytes; use "
                            f"translation_env('omp_places')")
        return {"KMP_AFFINITY": kmp, "OMP_NUM_THREADS": n}
    if target == "omp_places":
        env = {"OMP_PLACES": omp_places(plan), "OMP_PROC_BIND": "close", "OMP_NUM_THREADS": n}
        if not plan.union <= plan.initial_mask:
            env["KMP_AFFINITY"] = "norespect"
        return env
    if target == "gomp":
        gca = gomp_cpu_affinity(plan)  # libgomp binds these CPUs as they are, outside the mask too,
        limit = cpu_limit(plan.initial_mask)  # up to the size of its CPU sets
        if max(plan.union) >= limit:
            raise PlanError(f"GOMP_CPU_AFFINITY cannot name CPU {max(plan.union)}: libgomp sizes its CPU "
                            f"sets for the process mask's highest CPU and drops CPUs from {limit} on")
        return {"GOMP_CPU_AFFINITY": gca, "OMP_NUM_THREADS": n}
    raise UsageError(f"unknown translation target {target!r} (kmp_affinity, omp_places or gomp)")


def _place_members(s: frozenset[int]) -> str:
    """``{0, 1, 2, 3, 8}`` -> ``"0:4,8"`` (OMP_PLACES interval form)."""
    return ",".join(str(a) if a == b else f"{a}:{b - a + 1}" for a, b in runs(s))


_PROCLIST = re.compile(r"proclist=\[[^\]]*\]")


def _proc_ranges(cpus: list[int]) -> str:
    """CPUs in order as proclist items: ascending arithmetic runs of 3 or more as
    ``first-last[:stride]`` (``0-6:2`` is 0, 2, 4, 6: one thread each)."""
    out, i = [], 0
    while i < len(cpus):
        j = i
        if i + 1 < len(cpus) and cpus[i + 1] > cpus[i]:
            step = cpus[i + 1] - cpus[i]
            while j + 1 < len(cpus) and cpus[j + 1] - cpus[j] == step:
                j += 1
        if j - i >= 2:
            out.append(f"{cpus[i]}-{cpus[j]}" + ("" if step == 1 else f":{step}"))
        else:
            j = i
            out.append(str(cpus[i]))
        i = j + 1
    return ",".join(out)


def _strided_members(s: frozenset[int]) -> str:
    """``{0, 2, 4, 6, 9}`` -> ``"0:4:2,9"``: arithmetic runs as ``first:count[:stride]``."""
    xs, out, i = sorted(s), [], 0
    while i < len(xs):
        j = i + 1
        if j < len(xs):
            step = xs[j] - xs[i]
            while j + 1 < len(xs) and xs[j + 1] - xs[j] == step:
                j += 1
            if j - i + 1 >= 3 or step == 1:
                out.append(f"{xs[i]}:{j - i + 1}" + ("" if step == 1 else f":{step}"))
                i = j + 1
                continue
        out.append(str(xs[i]))
        i += 1
    return ",".join(out)


def _compact_places(cpusets: Iterable[frozenset[int]]) -> str:
    """One place per set, in order, in OpenMP's shortest forms the runtimes all read:
    members as strided intervals, and a run of places each the one before shifted by
    the same stride (0 included: a repeated place) as ``{place}:count:stride``."""
    sets = [sorted(s) for s in cpusets]
    out, i = [], 0
    while i < len(sets):
        j, step = i, None
        while j + 1 < len(sets) and len(sets[j + 1]) == len(sets[i]):
            d = sets[j + 1][0] - sets[j][0]
            if d < 0 or (step is not None and d != step) or any(b - a != d for a, b in zip(sets[j], sets[j + 1])):
                break
            step, j = d, j + 1
        place = "{" + _strided_members(frozenset(sets[i])) + "}"
        out.append(place if j == i else f"{place}:{j - i + 1}:{step}")
        i = j + 1
    return ",".join(out)


# ------------------------------------------------ libgomp
# The variables that make libgomp bind thread ``i`` to a given CPU set.
# 
# libgomp reads ``OMP_PLACES`` first and ``GOMP_CPU_AFFINITY`` only when no valid
# ``OMP_PLACES`` is set; it cuts every ``OMP_PLACES`` place to the process mask
# (dropping places left empty) but binds ``GOMP_CPU_AFFINITY`` CPUs as they are.
# So:
# 
# * every set inside the process mask: one ``OMP_PLACES`` place per thread with
#   ``OMP_PROC_BIND=close`` (thread i on place i, as many places as threads), and
#   ``GOMP_CPU_AFFINITY`` beside it when every thread has one CPU (older
#   libgomp builds read only that one);
# * some set outside the mask (an Intel ``norespect`` plan) and one CPU per
#   thread: ``GOMP_CPU_AFFINITY`` with ``OMP_PROC_BIND=close`` and no
#   ``OMP_PLACES`` -- the only form libgomp does not cut to the mask -- as long
#   as every CPU is below libgomp's set size (:func:`~.places.cpu_limit`: the
#   highest CPU of the mask rounded up to 64; libgomp drops larger numbers);
# * otherwise, with some set outside the mask, libgomp cannot be told; the
#   ``OMP_PLACES`` form is kept (libgomp binds each thread to the part of its
#   set inside the mask) and :func:`gomp_exports` says so.
# 
# Either way libgomp binds the **initial thread at load** (before ``main``) to
# thread 0's set: threads the program starts outside OpenMP, and child
# processes, inherit that set.

def gomp_exports(plan: Any) -> tuple[dict[str, str], bool]:
    """``(variables, exact)``: what to export so that libgomp binds thread ``i`` of
    its first team to ``plan.cpusets[i]`` in a process whose mask is
    ``plan.initial_mask`` (a :class:`~affinity.planning.planner.Plan`).

    ``exact`` is False where libgomp cannot be given the sets (see the module
    docstring); ``OMP_NUM_THREADS`` is the caller's."""
    cpusets, mask = plan.cpusets, frozenset(plan.initial_mask)
    single = all(len(s) == 1 for s in cpusets)
    inside = all(s <= mask for s in cpusets)
    gca = plan.to_gomp_cpu_affinity() if single else None
    if not inside and gca is not None and max(min(s) for s in cpusets) < cpu_limit(mask):
        return {"GOMP_CPU_AFFINITY": gca, "OMP_PROC_BIND": "close"}, True
    env = {"OMP_PLACES": plan.to_omp_places(), "OMP_PROC_BIND": "close"}
    if gca is not None:
        env["GOMP_CPU_AFFINITY"] = gca
    return env, inside


def check_inherited(environ: Mapping[str, str], exported: Mapping[str, str]) -> None:
    """Refuse a launch whose command would inherit, from ``environ``, a libgomp
    variable that ``exported`` does not replace and that defeats it.

    Raises
    ------
    PlanError
        ``GOMP_CPU_AFFINITY`` holds a word: PyTorch's libgomp never returns from
        loading (``import torch`` hangs); or ``OMP_PLACES`` would be read in place
        of the exported ``GOMP_CPU_AFFINITY``.
    """
    if "KMP_AFFINITY" not in exported:  # no plan exported: nothing to defeat
        return
    gca = environ.get("GOMP_CPU_AFFINITY")
    if gca is not None and "GOMP_CPU_AFFINITY" not in exported:
        why = affinity_hang(gca, BUILDS["torch"])
        if why is not None:
            raise PlanError(f"the command would inherit {why}; unset GOMP_CPU_AFFINITY")
    if "OMP_PLACES" in environ and "OMP_PLACES" not in exported and "GOMP_CPU_AFFINITY" in exported:
        raise PlanError(f"the command would inherit OMP_PLACES={environ['OMP_PLACES']!r}, which libgomp reads "
                        f"in place of the exported GOMP_CPU_AFFINITY={exported['GOMP_CPU_AFFINITY']!r} "
                        "(the plan binds outside the process mask); unset OMP_PLACES")
