"""What the planner asks of the rules of one OpenMP runtime.

Each runtime whose placement the planner reproduces has a module of its own
(``planning/intel/`` for Intel's libiomp5, ``planning/intel/llvm.py`` for LLVM's
libomp, a sibling package per further runtime), registered under its name in
:data:`affinity.planning.planner.RUNTIMES`.  Such a module provides:

``NAME``
    Its registry name (``"intel"``).
``VARIABLES``
    The environment variables it reads, sorted; the planner passes it only those.
``evaluate(env, topology, initial, *, strict, threads, memo) -> Outcome``
    Where the runtime binds each thread of the first parallel region: ``env``
    the sorted ``(name, value)`` pairs of its variables, ``topology`` the
    machine, ``initial`` the process mask the runtime starts with, ``strict``
    whether malformed values raise :class:`~affinity.errors.SpecError`,
    ``threads`` a team size that overrides the environment, and ``memo(key,
    make)`` the planner's per-topology memo (what depends on the topology
    only, such as the runtime's table of the machine, is kept there: ``make()``
    runs once per key and topology).  It raises
    :class:`~affinity.errors.PlanError` where the runtime aborts.
``explain(plan) -> list[str]``
    The runtime's verbose account of a plan it made (its ``Outcome.view``
    is ``plan._view``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Memo", "Outcome", "Rules"]

#: ``memo(key, make)``: the value kept under ``key`` for the planned topology, made by ``make()`` once
Memo = Callable[[Hashable, Callable[[], Any]], Any]


@dataclass(frozen=True)
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


class Rules(Protocol):
    """The module of one runtime's rules (see the module's docstring)."""

    NAME: str
    VARIABLES: tuple[str, ...]

    def evaluate(self, env: tuple[tuple[str, str], ...], topology: Any, initial: frozenset[int], *,
                 strict: bool, threads: int | None, memo: Memo) -> Outcome: ...

    def explain(self, plan: Any) -> list[str]: ...
