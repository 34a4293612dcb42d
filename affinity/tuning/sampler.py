"""An optuna sampler that knows the machine: :class:`TopologySampler`.

optuna keeps the study (trials, their states and values, SQLite storage,
resuming, enqueued first candidates); this sampler decides what to try next.
It adds to a generic optimizer what only the machine can say
(:mod:`~affinity.tuning.priors`):

1. **First candidates**: the seeds' rules (:meth:`Priors.seeds`), enqueued into
   the study by :func:`~affinity.tuning.search.tune` (``study.enqueue_trial``).
2. **A model that starts from the prior**: a Bayesian linear model of the
   log-throughput with one feature per term of the prior (:data:`~affinity.tuning.priors.COMPONENTS`;
   their weights start at 1: the prior is believed until measurements say
   otherwise) and one per parameter value (starting at 0, with a wider spread for
   thread and instance counts), so each measurement moves every configuration
   that shares its values.  Infeasible trials count as much worse than the worst.
3. **The next trial** maximises the expected improvement (of at least 3 %) over
   the best so far among configurations never tried; one that launches the same
   thing as a configuration already tried (:meth:`Priors.twin`) is predicted to
   measure as its twin did.  Nothing outside the space is ever proposed, and no
   configuration twice.
4. **Large spaces** (more than :data:`ENUMERATE` configurations) are not listed:
   candidates are optuna TPE's proposals, one-parameter moves from the best
   trials and random configurations.

Every choice is a function of the trials in the study, the seed and the trial
number: the same seed gives the same sequence, and a resumed study continues
the way an uninterrupted one would have.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from .priors import COMPONENTS, Priors
from .space import COUNTS, Space

__all__ = ["ENUMERATE", "TopologySampler", "trial_config"]

#: spaces up to this size are scored whole at every trial
ENUMERATE = 20000
#: user attribute of a trial cut short by Ctrl-C (neither a value nor infeasible)
INTERRUPTED = "interrupted"
#: the user attribute of an enqueued trial: its fixed configuration (optuna's public API)
FIXED = "affinity.fixed"
_NOISE = 0.05  # expected measurement noise, in log units
_TAU = 0.07  # prior spread of one parameter value's effect, in log units
_TAU_COUNT = 0.35  # the same for thread and instance counts, which move speed most
_XI = 0.03  # the expected improvement counts only beyond 3 %
_PRIOR_WEIGHT_SD = 0.4  # prior spread of each prior term's weight around 1
_FAIL_DROP = 1.0  # an infeasible trial counts this much below the worst value
_FLOOR = 3.0  # log units below the best (5 %) where "terrible" stops getting worse


def trial_config(t: FrozenTrial, space: Space) -> dict[str, Any] | None:
    """The configuration a trial evaluated, or None when it is not one of ``space``."""
    cfg = {n: t.params[n] for n in space.names if n in t.params}
    return cfg if space.contains(cfg) else None


class TopologySampler(optuna.samplers.BaseSampler):
    """Propose the configuration with the largest expected improvement under a prior
    from the machine (see the module docstring).

    Parameters
    ----------
    space : Space
        What is searched (every parameter categorical).
    priors : Priors
        The machine's view of the configurations.
    seed : int
        Seeds every random choice (with the trial number).
    direction : {"maximize", "minimize"}
        Whether larger values are better.
    """

    def __init__(self, space: Space, priors: Priors, *, seed: int, direction: str = "maximize"):
        self.space = space
        self.priors = priors
        self.seed = int(seed)
        self.sign = 1.0 if direction == "maximize" else -1.0
        self._dists = {n: CategoricalDistribution(list(c)) for n, c in space.params}
        self._offsets = np.cumsum([0] + [len(c) for _, c in space.params])[:-1]
        self._ncomp = len(COMPONENTS)
        self._width = 1 + self._ncomp + sum(len(c) for _, c in space.params)
        self._tau2 = np.concatenate([np.zeros(1 + self._ncomp)] + [
            np.full(len(c), (_TAU_COUNT if n in COUNTS else _TAU) ** 2) for n, c in space.params])
        self._pool: _Pool | None = None
        self._twin_ids: dict[tuple[Any, ...], int] = {}
        self._tpe: optuna.samplers.TPESampler | None = None

    # ------------------------------------------------------------------ optuna hooks
    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        """optuna's hook: every parameter of the space is sampled together."""
        return dict(self._dists)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        """optuna's hook: the whole configuration of ``trial`` (:meth:`propose`); nothing for
        an enqueued trial, whose parameters are fixed."""
        if FIXED in trial.user_attrs:  # an enqueued first candidate
            return {}
        return self.propose(study.get_trials(deepcopy=False), trial.number, study, trial)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        """optuna's hook for a parameter outside the space (never asked by
        :func:`~affinity.tuning.search.tune`): a seeded random choice."""
        rng = np.random.default_rng([self.seed, trial.number, 1])
        choices = param_distribution.choices  # type: ignore[attr-defined]
        return choices[int(rng.integers(len(choices)))]

    # ------------------------------------------------------------------ the choice
    def propose(self, trials: Sequence[FrozenTrial], number: int, study: optuna.Study | None = None,
                trial: FrozenTrial | None = None) -> dict[str, Any]:
        """The configuration to try as trial ``number`` after ``trials``.

        Parameters
        ----------
        trials : sequence of FrozenTrial
            The study's trials so far (any state).
        number : int
            The trial being proposed (left out of ``trials``).
        study, trial : optional
            The optuna study and trial, for TPE's proposals in large spaces.

        Returns
        -------
        dict
            A configuration of the space none of ``trials`` holds.
        """
        seen, obs = self._observations(trials, number)
        # seeded by the place in evaluation order (not the trial number, which an
        # interrupted trial shifts): a resumed study continues as an uninterrupted one
        rng = np.random.default_rng([self.seed, len(obs)])
        pool = self._candidates(trials, seen, rng, study, trial)
        if pool.keys.shape[0] == 0:  # everything tried: the best one again
            done = [o for o in obs if o[1] is not None]
            best = max(done, key=lambda o: self.sign * o[1])[0] if done else next(iter(seen))
            return self.space.config(best)
        acq = self._acquisition(pool, obs)
        acq = acq + rng.uniform(0, 1e-12, size=acq.shape)
        return self.space.config(tuple(int(i) for i in pool.keys[int(np.argmax(acq))]))

    def _twin_id(self, key: tuple[int, ...]) -> int:
        twin = self.priors.twin(self.space.config(key))
        return self._twin_ids.setdefault(twin, len(self._twin_ids))

    def _pool_of(self, keys: np.ndarray) -> _Pool:
        rows = [tuple(int(i) for i in k) for k in keys]
        return _Pool(keys, np.array([self.priors.components(self.space.config(k)) for k in rows], dtype=float),
                     np.array([self._twin_id(k) for k in rows], dtype=int))

    def _observations(self, trials: Sequence[FrozenTrial], number: int
                      ) -> tuple[set[tuple[int, ...]], list[tuple[tuple[int, ...], float | None]]]:
        """(keys of every configuration tried or pending, [(key, y or None if infeasible)])."""
        seen: set[tuple[int, ...]] = set()
        obs: list[tuple[tuple[int, ...], float | None]] = []
        for t in trials:
            if t.number == number:
                continue
            cfg = trial_config(t, self.space)
            if cfg is None and t.state == TrialState.WAITING:
                fixed = t.user_attrs.get(FIXED) or {}
                cfg = fixed if self.space.contains(fixed) else None
            if cfg is None or t.user_attrs.get(INTERRUPTED):
                continue
            if t.state == TrialState.FAIL and "error" not in t.user_attrs:
                continue  # left running by a session that was killed: to be run again
            key = self.space.key(cfg)
            seen.add(key)
            if t.state == TrialState.COMPLETE and t.value is not None and math.isfinite(t.value):
                obs.append((key, float(t.value)))
            elif t.state == TrialState.FAIL:
                obs.append((key, None))
        return seen, obs

    def _targets(self, obs: list[tuple[tuple[int, ...], float | None]]) -> tuple[np.ndarray, np.ndarray]:
        """(y to fit, per-observation noise variance).

        Log values (sign by direction) when no value is negative, else values scaled
        to a comparable spread; anything more than :data:`_FLOOR` below the best is
        "terrible" and counts as that; infeasible trials count :data:`_FAIL_DROP`
        below the worst."""
        vals = np.array([v for _, v in obs if v is not None], dtype=float)
        if vals.size and (vals >= 0).all() and vals.max() > 0:
            ys = self.sign * np.log(np.maximum(vals, vals.max() * 1e-6))
        elif vals.size:
            spread = float(np.std(vals)) or 1.0
            ys = self.sign * (vals - float(np.median(vals))) / spread * 0.3
        else:
            ys = np.zeros(0)
        if ys.size:
            ys = np.maximum(ys, ys.max() - _FLOOR)
        worst = float(ys.min()) if ys.size else 0.0
        y, var, it = [], [], iter(ys)
        for _, v in obs:
            if v is None:
                y.append(worst - _FAIL_DROP)
                var.append((4 * _NOISE) ** 2)
            else:
                y.append(float(next(it)))
                var.append(_NOISE ** 2)
        return np.array(y), np.array(var)

    def _features(self, keys: np.ndarray, prior: np.ndarray) -> np.ndarray:
        """Rows of [1, prior components..., one-hot of each parameter's value]."""
        phi = np.zeros((keys.shape[0], self._width))
        phi[:, 0] = 1.0
        phi[:, 1:1 + self._ncomp] = prior
        rows = np.arange(keys.shape[0])
        for j, off in enumerate(self._offsets):
            phi[rows, 1 + self._ncomp + off + keys[:, j]] = 1.0
        return phi

    def _acquisition(self, pool: _Pool, obs: list[tuple[tuple[int, ...], float | None]]) -> np.ndarray:
        """Expected improvement (beyond :data:`_XI`) of each candidate under the model's
        posterior; a twin of a tried configuration is predicted to measure as its twin did,
        within the noise."""
        if not obs:
            return pool.prior.sum(axis=1)
        okeys = np.array([k for k, _ in obs], dtype=int)
        oprior = np.array([self.priors.components(self.space.config(tuple(k))) for k in okeys])
        y, var = self._targets(obs)
        phi = self._features(okeys, np.maximum(oprior, -_FLOOR))
        m0 = np.zeros(self._width)
        m0[1:1 + self._ncomp] = 1.0
        s0 = self._tau2.copy()
        s0[0] = 100.0
        s0[1:1 + self._ncomp] = _PRIOR_WEIGHT_SD ** 2
        cov = np.linalg.inv(np.diag(1.0 / s0) + (phi.T / var) @ phi)
        mean = cov @ (m0 / s0 + (phi.T / var) @ y)
        cphi = self._features(pool.keys, np.maximum(pool.prior, -_FLOOR))
        mu = cphi @ mean
        sd = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", cphi, cov, cphi), 1e-12))
        twin_y: dict[int, float] = {}
        for (k, _), yy in zip(obs, y):
            tid = self._twin_id(k)
            twin_y[tid] = max(twin_y.get(tid, -np.inf), float(yy))
        known = np.array([t in twin_y for t in pool.twins.tolist()], dtype=bool)
        if known.any():
            mu[known] = [twin_y[t] for t in pool.twins[known].tolist()]
            sd[known] = _NOISE
        best = float(np.max(y[[v is not None for _, v in obs]])) if any(v is not None for _, v in obs) \
            else float(np.max(y))
        z = (mu - best - _XI) / sd
        return (mu - best - _XI) * _ncdf(z) + sd * _npdf(z)

    # ------------------------------------------------------------------ candidates
    def _candidates(self, trials: Sequence[FrozenTrial], seen: set[tuple[int, ...]], rng: np.random.Generator,
                    study: optuna.Study | None, trial: FrozenTrial | None) -> _Pool:
        if self.space.size <= ENUMERATE:
            if self._pool is None:
                self._pool = self._pool_of(np.array([self.space.key(c) for c in self.space.configs()], dtype=int))
            pool = self._pool
        else:
            pool = self._sampled_pool(trials, rng, study, trial)
        if not seen:
            return pool
        return pool.take(np.array([tuple(k) not in seen for k in pool.keys.tolist()], dtype=bool))

    def _sampled_pool(self, trials: Sequence[FrozenTrial], rng: np.random.Generator, study: optuna.Study | None, trial: FrozenTrial | None) -> _Pool:
        """Random configurations, one-parameter moves from the best five trials and
        optuna TPE's proposals."""
        sizes = [len(c) for _, c in self.space.params]
        keys = {tuple(int(rng.integers(n)) for n in sizes) for _ in range(3000)}
        done = sorted((t for t in trials if t.state == TrialState.COMPLETE and t.value is not None),
                      key=lambda t: -self.sign * t.value)[:5]
        for t in done:
            cfg = trial_config(t, self.space)
            if cfg is None:
                continue
            base = self.space.key(cfg)
            for j, n in enumerate(sizes):
                keys.update(base[:j] + (i,) + base[j + 1:] for i in range(n))
        if study is not None and trial is not None and len(done) >= 5:
            if self._tpe is None:
                self._tpe = optuna.samplers.TPESampler(seed=self.seed, n_startup_trials=5, constant_liar=False)
            for _ in range(10):
                cfg = self._tpe.sample_relative(study, trial, dict(self._dists))
                if self.space.contains(cfg):
                    keys.add(self.space.key(cfg))
        return self._pool_of(np.array(sorted(keys), dtype=int))


class _Pool:
    """Candidate configurations as index rows, with their prior scores and twin numbers."""

    def __init__(self, keys: np.ndarray, prior: np.ndarray, twins: np.ndarray):
        self.keys = keys
        self.prior = prior
        self.twins = twins

    def take(self, mask: np.ndarray) -> _Pool:
        return _Pool(self.keys[mask], self.prior[mask], self.twins[mask])


def _ncdf(z: np.ndarray) -> np.ndarray:
    """The standard normal CDF (Abramowitz & Stegun 7.1.26 for erf, error < 1.5e-7)."""
    x = np.abs(z) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = 1.0 - poly * np.exp(-x * x)
    return 0.5 * (1.0 + np.sign(z) * erf)


def _npdf(z: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
