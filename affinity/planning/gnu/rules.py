"""libgomp's rules as the planner's runtimes ``"gnu"`` and ``"gnu-torch"``.

Two entries of :data:`affinity.planning.planner.RUNTIMES`, one per build, because
the two libgomp builds users meet place some settings differently and fail on
different values (see :mod:`.builds`):

``"gnu"``
    GCC 12's libgomp: ``gcc -fopenmp`` programs on current distributions.
``"gnu-torch"``
    PyTorch's bundled libgomp (GCC 8.5): what ``import torch`` loads.

Each is a :class:`GnuRules` value with the interface of
:mod:`affinity.planning.rules`.
"""

from __future__ import annotations


from ...cpulist import format_list
from ...errors import SpecError
from ...record import record
from ..rules import Memo, Outcome
from .builds import BUILDS
from .runtime import GOMP_VARIABLES, GompPlan, plan_gomp
from typing import Any


__all__ = ["GnuRules", "GnuSettings", "GNU", "GNU_TORCH", "runtime_for_library"]


def _granularity(g: GompPlan) -> str | None:
    """The layer the places are made of, as Intel's plans name it (``None``: none or mixed)."""
    if g.places is None:
        return None
    name = dict(g.env).get("OMP_PLACES", "").strip().lower().split("(")[0].strip()
    if g.places_from == "threads" or all(len(p) == 1 for p in g.places):
        return "thread"
    return {"cores": "core", "sockets": "socket", "ll_caches": "ll_cache",
            "numa_domains": "numa"}.get(name) if g.places_from == "OMP_PLACES" else None


@record
class GnuSettings:
    """What :meth:`GnuRules.read` keeps: the sorted variables and the strictness."""

    env: tuple[tuple[str, str], ...]
    strict: bool


@record
class GnuRules:
    """The rules of one libgomp build (see :mod:`affinity.planning.rules`)."""

    NAME: str
    build: str
    VARIABLES: tuple[str, ...] = tuple(sorted(GOMP_VARIABLES))

    def read(self, env: tuple[tuple[str, str], ...], *, strict: bool) -> GnuSettings:
        """The sorted variables as libgomp will read them.  Its parsing depends on
        the process mask and the machine (libgomp sizes its CPU sets from the mask,
        builds abstract places from sysfs), so it runs in :meth:`evaluate`."""
        return GnuSettings(env, strict)

    def evaluate(self, settings: GnuSettings, topology: Any, initial: frozenset[int], *, memo: Memo) -> Outcome:
        """What this libgomp does with ``settings`` on ``topology`` (plans are
        remembered per topology by :func:`~affinity.planning.gnu.runtime.plan_gomp`).

        Strict settings: a value libgomp calls invalid (and ignores) raises
        :class:`~affinity.errors.SpecError` naming the variable and value."""
        values = dict(settings.env)
        g = plan_gomp(values, topology, initial, self.build)
        if settings.strict:
            for w in g.warnings:
                if w.startswith("Invalid value for envir"):
                    var = w.rsplit(" ", 1)[1]
                    raise SpecError(f"{BUILDS[self.build].library} ignores {var}={values.get(var)!r}: {w}",
                                    values.get(var))
        kind = "disabled" if g.places is None else ("gomp_cpu_affinity" if g.places_from == "GOMP_CPU_AFFINITY"
                                                    else "places")
        return Outcome(threads=g.threads, cpusets=g.cpusets, places=g.places, place_nums=g.place_nums,
                       warnings=g.warnings, affinity_type=kind, granularity=_granularity(g),
                       proc_bind=g.proc_bind, num_procs=g.num_procs, view=g)

    def explain(self, plan: Any) -> list[str]:
        """libgomp's own account: its messages, the settings as ``OMP_DISPLAY_ENV``
        shows them, the initial thread's mask at load, each thread's place and set."""
        g: GompPlan = plan._view
        lines = [f"libgomp: {w}" for w in g.warnings]
        lib = BUILDS[g.build].library
        lines.append(f"{self.NAME} ({lib}): OMP_PROC_BIND = '{g.proc_bind.upper()}', "
                     f"OMP_NUM_THREADS = '{g.max_threads}'")
        if g.places is None:
            lines.append(f"{self.NAME}: no place list: every thread runs on the process mask "
                         f"{{{format_list(g.initial_mask)}}}")
        else:
            text = ",".join("{" + format_list(p) + "}" for p in g.places)
            lines.append(f"{self.NAME}: OMP_PLACES = '{text}' (from {g.places_from})")
            lines.append(f"{self.NAME}: initial thread bound at load to {{{format_list(g.init_mask)}}}")
        for i, s in enumerate(g.cpusets):
            off, n = g.partitions[i]
            where = (f"place {g.place_nums[i]} of partition {format_list(range(off, off + n))}"
                     if g.place_nums[i] >= 0 else "no place")
            lines.append(f"{self.NAME}: thread {i} ({where}) bound to OS proc set {{{format_list(s)}}}")
        return lines


#: GCC 12's libgomp
GNU = GnuRules("gnu", "gcc12")
#: PyTorch's bundled libgomp (GCC 8.5)
GNU_TORCH = GnuRules("gnu-torch", "torch")


def runtime_for_library(path: str) -> str:
    """The registry name whose rules a loaded libgomp file follows: ``"gnu-torch"``
    for the copy a PyTorch wheel ships (``.../torch/lib/libgomp.so.1``, or an
    auditwheel-renamed ``.../torch.libs/libgomp-<hash>.so.1``), ``"gnu"`` for any
    other (the distribution's, GCC 12 here)."""
    return GNU_TORCH.NAME if ("/torch/lib/" in path or "/torch.libs/" in path) else GNU.NAME
