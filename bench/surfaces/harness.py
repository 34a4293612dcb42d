"""Running tuners on response surfaces and counting evaluations to within 3 % of the best.

A surface (``bench/surfaces/<name>.json``, written by ``models.py``) is a table:
one value per configuration of a space.  Three searchers are compared on it, each
seeded, each stopped at ``budget`` evaluations:

* ``affinity``: :func:`affinity.tune` (through :func:`affinity.tuning.search.tune`),
  given the surface's space and its machine as a :class:`~affinity.Topology`;
* ``tpe``: plain optuna, ``TPESampler(seed=s)`` with its defaults, one
  ``suggest_categorical`` per parameter;
* ``random``: optuna's ``RandomSampler(seed=s)``.

The count is the number of calls of the objective up to and including the first
whose value is within ``tol`` (3 %) of the surface's best; a searcher that never
gets there within the budget counts ``budget + 1`` (shown as ``>budget``).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

HERE = Path(__file__).resolve().parent
if str(HERE.parent.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent.parent))

from affinity.machine.topology import Topology  # noqa: E402
from affinity.tuning.search import tune  # noqa: E402

MAIN = ("xeon2s_tf", "xeonphi_tf", "epyc_serving", "xeon2s_serving", "bench16_resnet18", "bench16_resnet50")
STRESS = ("stress_rules_hold", "stress_omp_not_intra", "stress_anti_prior", "stress_unknown_param",
          "stress_plain", "stress_no_structure")
RECORDED = ("recorded_2cpu_tf_matmul",)
METHODS = ("affinity", "tpe", "random")


@dataclass(frozen=True)
class Surface:
    """A recorded or modelled response surface."""

    name: str
    title: str
    kind: str
    topology: str
    params: tuple[str, ...]
    space: dict[str, list[Any]]
    table: dict[tuple[Any, ...], float]

    @property
    def best(self) -> float:
        return max(self.table.values())

    @property
    def size(self) -> int:
        return len(self.table)

    def value(self, config: dict[str, Any]) -> float:
        return self.table[tuple(config[n] for n in self.params)]


def load(name: str) -> Surface:
    """The surface ``name`` from ``bench/surfaces/<name>.json``."""
    d = json.loads((HERE / f"{name}.json").read_text())
    table = {tuple(r[:-1]): float(r[-1]) for r in d["rows"]}
    return Surface(d["name"], d["title"], d["kind"], d["topology"], tuple(d["params"]), d["space"], table)


def evals_to_within(values: Sequence[float], best: float, tol: float = 0.03) -> int | None:
    """1-based index of the first value within ``tol`` of ``best`` (maximizing), or None."""
    for i, v in enumerate(values, 1):
        if v >= (1 - tol) * best:
            return i
    return None


class _Stop(BaseException):
    """Ends a search once the target is reached (not an Exception: the tuner lets it through)."""


def run_affinity(s: Surface, seed: int, budget: int, tol: float = 0.03) -> list[float]:
    """The values :func:`affinity.tune` sees, in order, until within ``tol`` or ``budget``."""
    seen: list[float] = []
    outside: list[dict[str, Any]] = []

    def objective(cfg: dict[str, Any]) -> float:
        if tuple(cfg) != s.params or any(cfg[n] not in s.space[n] for n in s.params):
            outside.append(cfg)
        v = s.value(cfg)
        seen.append(v)
        if v >= (1 - tol) * s.best:
            raise _Stop
        return v

    try:
        tune(objective, s.space, budget=budget, seed=seed, topology=Topology.from_synthetic(s.topology),
             progress=False)
    except _Stop:
        pass
    assert not outside, f"called outside the space: {outside[:3]}"
    assert len(seen) <= budget
    return seen


def run_optuna(s: Surface, sampler: optuna.samplers.BaseSampler, budget: int, tol: float = 0.03) -> list[float]:
    """The values a plain optuna study with ``sampler`` sees, until within ``tol`` or ``budget``."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    seen: list[float] = []
    for _ in range(budget):
        t = study.ask()
        cfg = {n: t.suggest_categorical(n, s.space[n]) for n in s.params}
        v = s.value(cfg)
        seen.append(v)
        study.tell(t, v)
        if v >= (1 - tol) * s.best:
            break
    return seen


SEARCHERS: dict[str, Callable[[Surface, int, int], list[float]]] = {
    "affinity": run_affinity,
    "tpe": lambda s, seed, b: run_optuna(s, optuna.samplers.TPESampler(seed=seed), b),
    "random": lambda s, seed, b: run_optuna(s, optuna.samplers.RandomSampler(seed=seed), b),
}


def compare(s: Surface, *, seeds: Sequence[int] = range(10), budget: int | None = None,
            methods: Sequence[str] = METHODS) -> dict[str, list[int]]:
    """Evaluations to within 3 % of ``s``'s best, per method and seed (``budget + 1``: not reached)."""
    b = budget or min(s.size, 300)
    out: dict[str, list[int]] = {}
    for m in methods:
        out[m] = [evals_to_within(SEARCHERS[m](s, seed, b), s.best) or b + 1 for seed in seeds]
    return out


def median(counts: Sequence[int]) -> float:
    return float(statistics.median(counts))
