"""What the planner asks of the rules of one OpenMP runtime.

Each runtime whose placement the planner reproduces has a module of its own
(``planning/intel/runtime.py`` for Intel's libiomp5, ``planning/intel/llvm.py``
for LLVM's libomp, a sibling package per further runtime), registered under its
name in :data:`affinity.planning.planner.RUNTIMES`.  Such a module provides:

``NAME``
    Its registry name (``"intel"``).
``VARIABLES``
    The environment variables it reads, sorted; the planner passes it only those.
``read(env, *, strict) -> settings``
    How the runtime reads ``env``, the sorted ``(name, value)`` pairs of its
    variables: an immutable value of the module's own making, which depends on
    ``env`` alone (the planner memoizes it per ``(runtime, env, strict)``).  With
    ``strict``, malformed values raise :class:`~affinity.errors.SpecError`;
    :class:`~affinity.errors.PlanError` where the runtime aborts while reading.
``evaluate(settings, topology, initial, *, memo) -> Outcome``
    Where the runtime binds each thread of the first parallel region on
    ``topology`` when its process mask is ``initial``.  ``memo(key, make)`` is the
    planner's per-topology memo: whatever depends on the topology (the runtime's
    table of the machine, an initialization, a team) is kept there -- ``make()``
    runs once per key and topology, the key naming everything the value depends
    on besides the topology.  :class:`~affinity.errors.PlanError` where the
    runtime aborts.
``explain(plan) -> list[str]``
    The runtime's verbose account of a plan it made (its ``Outcome.view``
    is ``plan._view``).

Both are pure: no system call, no reading of the machine (the topology and the
process mask are inputs).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from ..record import record
from typing import Any, Protocol


__all__ = ["Memo", "Outcome", "Rules"]

#: ``memo(key, make)``: the value kept under ``key`` for the planned topology, made by ``make()`` once
Memo = Callable[[Hashable, Callable[[], Any]], Any]


@record
class Outcome:
    """What a runtime does for the first parallel region (the fields of a
    :class:`~affinity.planning.planner.Plan` that the rules decide)."""

    threads: int
    cpusets: tuple[frozenset[int], ...]
    places: tuple[frozenset[int], ...] | None
    place_nums: tuple[int, ...]
    warnings: tuple[str, ...]
    affinity_type: str
    granularity: str | None
    proc_bind: str
    num_procs: int
    view: Any = None  #: the runtime's own view of the machine, for its ``explain``
    settings: Any = None  #: a strict plan's parsed :class:`~affinity.planning.spec.Settings`, else None


class Rules(Protocol):
    """The module of one runtime's rules (see the module's docstring)."""

    NAME: str
    VARIABLES: tuple[str, ...]

    def read(self, env: tuple[tuple[str, str], ...], *, strict: bool) -> Any: ...

    def evaluate(self, settings: Any, topology: Any, initial: frozenset[int], *, memo: Memo) -> Outcome: ...

    def explain(self, plan: Any) -> list[str]: ...
