"""The variables that make libgomp bind thread ``i`` to a given CPU set.

libgomp reads ``OMP_PLACES`` first and ``GOMP_CPU_AFFINITY`` only when no valid
``OMP_PLACES`` is set; it cuts every ``OMP_PLACES`` place to the process mask
(dropping places left empty) but binds ``GOMP_CPU_AFFINITY`` CPUs as they are.
So:

* every set inside the process mask: one ``OMP_PLACES`` place per thread with
  ``OMP_PROC_BIND=close`` (thread i on place i, as many places as threads), and
  ``GOMP_CPU_AFFINITY`` beside it when every thread has one CPU (older
  libgomp builds read only that one);
* some set outside the mask (an Intel ``norespect`` plan) and one CPU per
  thread: ``GOMP_CPU_AFFINITY`` with ``OMP_PROC_BIND=close`` and no
  ``OMP_PLACES`` -- the only form libgomp does not cut to the mask -- as long
  as every CPU is below libgomp's set size (:func:`~.places.cpu_limit`: the
  highest CPU of the mask rounded up to 64; libgomp drops larger numbers);
* otherwise, with some set outside the mask, libgomp cannot be told; the
  ``OMP_PLACES`` form is kept (libgomp binds each thread to the part of its
  set inside the mask) and :func:`gomp_exports` says so.

Either way libgomp binds the **initial thread at load** (before ``main``) to
thread 0's set: threads the program starts outside OpenMP, and child
processes, inherit that set.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...errors import PlanError
from .builds import BUILDS
from .places import affinity_hang, cpu_limit
from typing import Any


__all__ = ["gomp_exports", "check_inherited"]


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
