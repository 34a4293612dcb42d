"""LLVM's OpenMP runtime (libomp 19): Intel's rules, read in LLVM's dialect.

libomp and libiomp5 share ``kmp_affinity.cpp`` and ``kmp_settings.cpp``; what
LLVM's build does differently is small and is all in :data:`LLVM` (a
:class:`~affinity.planning.syntax.Dialect`), applied by Intel's steps
(:mod:`affinity.planning.intel.runtime`):

* **No NUMA layer.**  libiomp5 reads ``/sys/devices/system/node`` and inserts a
  NUMA-domain layer into its table of the machine; libomp builds its table from
  ``/proc/cpuinfo`` (or x2APIC ids) alone and learns NUMA domains only through
  hwloc (``KMP_TOPOLOGY_METHOD=hwloc``, which a default build does not use).
  So on libomp ``granularity=numa_domain``, ``OMP_PLACES=numa_domains`` fall back
  to cores with a warning, ``KMP_HW_SUBSET=2n`` is ignored, and ``scatter`` /
  ``compact,<permute>`` / ``balanced`` order the procs over one layer fewer --
  on machines whose NUMA nodes are not the packages the threads land elsewhere.
* **C integer overflow.**  ``__kmp_str_to_int`` accumulates digits in an
  ``int``: libomp lets ``99999999999`` wrap around (to ``1215752191``), libiomp5
  saturates at ``INT_MAX``.  ``OMP_NUM_THREADS=2147483648`` is thus a negative
  team size to libomp ("value too small": one thread), a crash to libiomp5.
* **Malformed OMP_PLACES** falls back to ``cores`` (libiomp5: ``threads``).
* **Crashes where libiomp5 warns**: a ``proclist`` with a type other than
  ``explicit``; an ``OMP_NUM_THREADS`` with no valid team size (``abc``, ``-1``,
  ``3x``, the empty string); an ``OMP_PLACES`` exclusion (``!{0}``), which libomp
  complements over whole 64-bit mask words and then asserts on the bits that
  are no OS proc of the machine (every machine whose OS procs are not exactly
  0-63, 0-127, ...).  The planner raises :class:`~affinity.errors.PlanError`.

Checked against every ``other_runtimes.libomp19`` result of the golden data
(``tests/planning/test_llvm.py``).
"""

from __future__ import annotations


from ..rules import Memo, Outcome
from ..syntax import Dialect
from . import runtime as intel
from typing import Any


__all__ = ["LLVM", "NAME", "VARIABLES", "evaluate", "explain", "read"]

#: The name the planner's registry knows these rules by.
NAME = "llvm"
#: The variables libomp reads to place threads (the same as libiomp5).
VARIABLES = intel.VARIABLES
#: How libomp 19 differs from libiomp5 (see the module's docstring).
LLVM = Dialect(NAME, wrap_ints=True, places_fallback="cores", numa_layer=False, strict_crashes=True)


def read(env: tuple[tuple[str, str], ...], *, strict: bool) -> intel.Read:
    """How libomp 19 reads the sorted variables ``env`` (see :mod:`affinity.planning.rules`)."""
    return intel.read(env, strict=strict, dialect=LLVM)


def evaluate(settings: intel.Read, topology: Any, initial: frozenset[int], *, memo: Memo) -> Outcome:
    """What libomp 19 does on ``topology`` with the settings it read: Intel's
    steps, in the dialect the settings carry."""
    return intel.evaluate(settings, topology, initial, memo=memo)


def explain(plan: Any) -> list[str]:
    """libomp's ``verbose`` account of ``plan`` (worded as libiomp5's)."""
    return intel.explain(plan)
