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
whose configuration is within ``tol`` (3 %) of the surface's best (on a noisy
surface: its value without the noise, though the searcher sees a fresh noisy draw
at every call); a searcher that never gets there within the budget counts
``budget + 1`` (shown as ``>budget``).  A configuration whose value is ``None``
fails: the tuner's objective returns None, plain optuna's trial is told FAIL.
Surfaces to minimize (latency) count within 3 % above the least value.

On a **recording** with every run kept (``"runs"``), what counts as within 3 % is
judged on each configuration's **launch class**: configurations that launch the
same processes on the same CPUs with the same settings (the planner's layout:
instances, each thread's CPU set, the exported counts, the blocktime, the memory
policy; :meth:`Priors.twin <affinity.tuning.priors.Priors.twin>`) are one
configuration under two labels, and their recorded medians differ by noise alone.
Such a class's true value is the median of all its runs pooled; the searchers still
see each label's own median, as they would have measured it.  ``load(name,
pool=False)`` judges on the labels' medians instead (bench/RESULTS.md gives both).
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

import numpy as np  # noqa: E402

from affinity.tuning.priors import Priors  # noqa: E402
from affinity.tuning.search import tune  # noqa: E402
from affinity.tuning.space import Space  # noqa: E402
from hardware import topology_of  # noqa: E402

MAIN = ("xeon2s_tf", "xeonphi_tf", "epyc_serving", "xeon2s_serving", "bench16_resnet18", "bench16_resnet50")
#: written from how the hardware behaves, to break the rules of thumb (``hardware.py``)
HARDWARE = ("knl_phi", "hybrid_client", "numa4_membw", "latency_server", "failing_train", "noisy_numa4",
            "bench16_failfirst")
STRESS = ("stress_rules_hold", "stress_omp_not_intra", "stress_anti_prior", "stress_unknown_param",
          "stress_plain", "stress_no_structure")
RECORDED = ("recorded_2cpu_tf_matmul", "recorded_2cpu_torch_cnn")
#: the classic cases, modelled from published tuning guides (``guides.py``)
GUIDES = ("guide_xeon2s_tf_cnn", "guide_xeon2s_tf_alexnet", "guide_xeon2s_tf_wide", "guide_knl_tf", "guide_epyc_ccd",
          "guide_hybrid_8p8e")
ALL = (*HARDWARE, *GUIDES, *RECORDED, *MAIN, *STRESS)
METHODS = ("affinity", "tpe", "random")


@dataclass(frozen=True)
class Surface:
    """A recorded or modelled response surface (``None``: the configuration fails)."""

    name: str
    title: str
    kind: str
    topology: str
    params: tuple[str, ...]
    space: dict[str, list[Any]]
    table: dict[tuple[Any, ...], float | None]
    direction: str = "maximize"
    noise: float = 0.0  #: relative spread of a fresh draw at every evaluation
    #: what a hit is judged on, per configuration (a recording's pooled launch classes), else the table
    truth: dict[tuple[Any, ...], float | None] | None = None
    #: the configurations that fail for memory: ``affinity.tune``'s objective raises MemoryError for
    #: them, as a run killed by the out-of-memory killer tells ``affinity tune -- CMD`` (plain optuna's
    #: trial fails either way); other failures return None
    out_of_memory: frozenset[tuple[Any, ...]] = frozenset()

    @property
    def sign(self) -> float:
        return 1.0 if self.direction == "maximize" else -1.0

    @property
    def best(self) -> float:
        """The best true value (:attr:`truth` where there is one)."""
        vals = (self.truth or self.table).values()
        return max((v for v in vals if v is not None), key=lambda v: self.sign * v)

    @property
    def size(self) -> int:
        return len(self.table)

    def value(self, config: dict[str, Any]) -> float | None:
        """What a searcher measures for ``config``."""
        return self.table[tuple(config[n] for n in self.params)]

    def true_value(self, config: dict[str, Any]) -> float | None:
        """What a hit is judged on: :attr:`truth`'s value where there is one, else :meth:`value`."""
        key = tuple(config[n] for n in self.params)
        return (self.truth or self.table)[key]

    def near(self, value: float | None, tol: float = 0.03) -> bool:
        """Whether ``value`` (noiseless) is within ``tol`` of the best."""
        if value is None:
            return False
        return value >= (1 - tol) * self.best if self.sign > 0 else value <= (1 + tol) * self.best


def load(name: str, pool: bool = True) -> Surface:
    """The surface ``name`` from ``bench/surfaces/<name>.json`` (``pool``: a recording's
    hits judged on its pooled launch classes, see the module's docstring)."""
    d = json.loads((HERE / f"{name}.json").read_text())
    table = {tuple(r[:-1]): (None if r[-1] is None else float(r[-1])) for r in d["rows"]}
    truth = launch_classes(d) if pool and d.get("kind") == "recording" and "runs" in d else None
    return Surface(d["name"], d["title"], d["kind"], d["topology"], tuple(d["params"]), d["space"], table,
                   d.get("direction", "maximize"), float(d.get("noise", 0.0)), truth,
                   frozenset(tuple(r) for r in d.get("out_of_memory", ())))


def classes(d: dict[str, Any]) -> dict[tuple[Any, ...], list[tuple[Any, ...]]]:
    """A recording's configurations grouped by what they launch (``Priors.twin`` on its machine)."""
    priors = Priors(Space.of(d["space"]), topology_of(d["topology"]))
    out: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    for r in d["runs"]:
        out.setdefault(priors.twin(dict(zip(d["params"], r[:-1]))), []).append(tuple(r[:-1]))
    return out


def launch_classes(d: dict[str, Any]) -> dict[tuple[Any, ...], float | None]:
    """Per configuration of a recording, the median of every run of its launch class
    (None where most of them failed)."""
    runs = {tuple(r[:-1]): r[-1] for r in d["runs"]}
    truth: dict[tuple[Any, ...], float | None] = {}
    for members in classes(d).values():
        vals = [v for k in members for v in runs[k]]
        ok = [v for v in vals if v is not None]
        value = statistics.median(ok) if len(ok) * 2 > len(vals) else None
        truth.update((k, value) for k in members)
    return truth


class _Evaluator:
    """The objective of one run: true values, a seeded noisy draw per call, and the stop
    once a configuration within 3 % of the best has been evaluated."""

    def __init__(self, s: Surface, seed: int, tol: float = 0.03):
        self.s, self.tol = s, tol
        self.rng = np.random.default_rng([seed, 7919])
        self.true: list[float | None] = []

    def __call__(self, config: dict[str, Any]) -> float | None:
        v = self.s.value(config)
        self.true.append(self.s.true_value(config))
        if v is None:
            return None
        return v * float(np.exp(self.rng.normal(0.0, self.s.noise))) if self.s.noise else v

    @property
    def reached(self) -> bool:
        return bool(self.true) and self.s.near(self.true[-1], self.tol)


def evals_to_within(s: Surface, values: Sequence[float | None], tol: float = 0.03) -> int | None:
    """1-based index of the first (true) value within ``tol`` of ``s``'s best, or None."""
    for i, v in enumerate(values, 1):
        if s.near(v, tol):
            return i
    return None


class _Stop(BaseException):
    """Ends a search once the target is reached (not an Exception: the tuner lets it through)."""


def run_affinity(s: Surface, seed: int, budget: int, tol: float = 0.03) -> list[float | None]:
    """The true values :func:`affinity.tune` evaluates, in order, until within ``tol`` or ``budget``."""
    ev = _Evaluator(s, seed, tol)
    outside: list[dict[str, Any]] = []

    def objective(cfg: dict[str, Any]) -> float | None:
        if tuple(cfg) != s.params or any(cfg[n] not in s.space[n] for n in s.params):
            outside.append(cfg)
        v = ev(cfg)
        if ev.reached:
            raise _Stop
        if v is None and tuple(cfg[n] for n in s.params) in s.out_of_memory:
            raise MemoryError(f"{s.name}: out of memory")
        return v

    try:
        tune(objective, s.space, budget=budget, seed=seed, topology=topology_of(s.topology),
             direction=s.direction, progress=False)
    except _Stop:
        pass
    assert not outside, f"called outside the space: {outside[:3]}"
    assert len(ev.true) <= budget
    return ev.true


def run_optuna(s: Surface, sampler: optuna.samplers.BaseSampler, budget: int, seed: int = 0,
               tol: float = 0.03) -> list[float | None]:
    """The true values a plain optuna study with ``sampler`` evaluates, until within ``tol`` or ``budget``."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction=s.direction, sampler=sampler)
    ev = _Evaluator(s, seed, tol)
    for _ in range(budget):
        t = study.ask()
        cfg = {n: t.suggest_categorical(n, s.space[n]) for n in s.params}
        v = ev(cfg)
        if v is None:
            study.tell(t, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(t, v)
        if ev.reached:
            break
    return ev.true


SEARCHERS: dict[str, Callable[[Surface, int, int], list[float]]] = {
    "affinity": run_affinity,
    "tpe": lambda s, seed, b: run_optuna(s, optuna.samplers.TPESampler(seed=seed), b, seed),
    "random": lambda s, seed, b: run_optuna(s, optuna.samplers.RandomSampler(seed=seed), b, seed),
}


def compare(s: Surface, *, seeds: Sequence[int] = range(10), budget: int | None = None,
            methods: Sequence[str] = METHODS) -> dict[str, list[int]]:
    """Evaluations to within 3 % of ``s``'s best, per method and seed (``budget + 1``: not reached)."""
    b = budget or min(s.size, 300)
    out: dict[str, list[int]] = {}
    for m in methods:
        out[m] = [evals_to_within(s, SEARCHERS[m](s, seed, b)) or b + 1 for seed in seeds]
    return out


def median(counts: Sequence[int]) -> float:
    return float(statistics.median(counts))
