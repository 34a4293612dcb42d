"""An optuna sampler that knows the machine: :class:`TopologySampler`.

optuna keeps the study (trials, their states and values, SQLite storage,
resuming, enqueued first candidates); this sampler decides what to try next.
It adds to a generic optimizer what only the machine can say
(:mod:`~affinity.tuning.priors`, :mod:`~affinity.tuning.features`), and keeps the
generic optimizer as a hedge: the priors steer, they do not decide.

1. **First candidates**: the seeds' rules (:meth:`Priors.seeds`), enqueued into
   the study by :func:`~affinity.tuning.search.tune` (``study.enqueue_trial``).
2. **A model that starts from the prior and generalises through the topology**: a
   Bayesian linear model of the log-throughput with one feature per term of the prior
   (:data:`~affinity.tuning.priors.COMPONENTS`; their weights start at 1: the prior
   is believed until measurements say otherwise), one per parameter value, and the
   numbers the topology gives a configuration (:data:`~affinity.tuning.features.FEATURES`:
   copies, threads per copy and per core, oversubscription, NUMA nodes spanned, memory
   locality, spinning, core kinds; with squares of the counts, so a best in the middle
   can be learned).  How much to believe the prior, how far the features reach and how
   much single parameter values matter are chosen by the evidence of the measurements.  A measurement moves every configuration that shares a label *or*
   a layout property with it.  What the model gets wrong reaches the neighbours: its
   leave-one-out residuals are spread by a kernel over the parameters (a Gaussian
   process on the residuals, one parameter away half as much), with an amplitude of
   the residuals' typical size beyond the noise times the share of the measurements the
   model does not explain out of sample -- nothing where the model predicts, and where a
   prior is wrong (a configuration it ranks low measures high) the configurations next
   to it are expected higher and less certain, so the search goes there.
3. **Failures are not values.**  A configuration that fails (or measures 0 where the
   others measure more) does not enter the model as a terrible value dragging its
   labels down; it makes a failure more likely near it (a kernel over the parameters:
   its twins most, one parameter away half as much, successes nearby cancel it), and
   everywhere a value that explains the failures is (a noisy-OR model of single
   parameter values as causes: when every trial with 16 copies ran out of memory and
   trials with 8 ran, no more trials go to 16 copies, whatever their other values).  A
   failure for memory (:data:`MEMORY_ERROR`) is caused by the counts or the memory
   policy, and rules out what needs as much memory: as many copies or more, each with as
   many threads or more (on several NUMA nodes, with the same memory policy).
4. **A failed first candidate keeps its neighbourhood.**  When the first trial fails,
   the next three proposals stay among its neighbours: first the same layout with
   other pinning or memory policy (the one whose launch differs most, e.g. unbound),
   then the next count or the next copies x threads on the same cores, the best of
   them by the model.  When it failed for memory (the objective raised MemoryError:
   :data:`MEMORY_ERROR`), only the neighbours that may need less: fewer copies, or
   fewer threads, or on several NUMA nodes another memory policy; the same copies
   with other pinning would fail the same way.
5. **The next trial** maximises the expected improvement (of at least 3 %) over the
   best so far, times the chance that it runs, among configurations never tried; one
   that launches the same thing as a configuration already measured
   (:meth:`Priors.twin`) is predicted to measure as its twin did, and one almost sure
   to fail (:data:`_HOPELESS`) is not tried while others are left.  The model counts a
   trial far below the best as less precise (:data:`_FAR`), so that it fits where the
   choice is made.  Nothing outside the space is ever proposed, and no configuration
   twice.
6. **A good first candidate is exploited**: while the best so far is what the prior
   expected (:meth:`TopologySampler._incumbent`), every second trial is the one-parameter
   move from it the model predicts highest, the trials between are the model's choice
   over the whole space (keeping the whole prior, without the hedge); a trial that beats
   the first candidate by more than the prior expected (:data:`_NEAR_PRIOR`), or
   :data:`_LOCAL_TRIES` moves in a row without a gain, send the search wide for good.
7. **The hedge**: a share of the trials is optuna TPE's proposal (random ones until
   TPE has ten trials to learn from), at a rate that starts at 5 % and grows by 5 % for
   every trial since the best last improved by 1 %, plus up to 30 % as the model
   explains less of the measurements (its leave-one-out R²), at most one in two: where
   the priors and the model stop finding better configurations, or explain nothing, a
   generic optimizer gets more of the budget.
8. **Large spaces** (more than :data:`ENUMERATE` configurations) are not listed:
   candidates are one-parameter moves from the best trials and random configurations.

Every choice is a function of the trials in the study, the seed and the number of
trials evaluated: the same seed gives the same sequence, and a resumed study continues
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

from .features import FEATURES, features
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
_TAU_FEATURE = 0.2  # prior spread of a topology feature's weight, per standard deviation of the feature
_TAU_SQUARE = 0.1  # the same for the squares of the count features
_SQUARED = ("instances", "team", "load", "threads_per_core", "spin")
_XI = 0.03  # the expected improvement counts only beyond 3 %
_PRIOR_WEIGHT_SD = 0.4  # prior spread of each prior term's weight around 1
_FLOOR = 3.0  # log units below the best (5 %) where "terrible" stops getting worse
_FLOOR_MEDIAN = 1.5  # ... and below the median: one terrible trial does not condemn its labels
_FAR = 0.1  # the noise of a trial grows by this per log unit below the best
_HEDGE_BASE, _HEDGE_STEP, _HEDGE_MAX = 0.05, 0.05, 0.5  # the hedge's rate: start, per stalled trial, cap
_HEDGE_FIT = 0.3  # the hedge's rate where the model explains none of the measurements
_FIT_AFTER = 8  # measurements before the model's fit counts
_HEDGE_AFTER = 3  # trials measured before the hedge may fire
_STALL_GAIN = 0.01  # an improvement of the best by less than this (log units) is a stall
_BELIEF = (1.0, 0.5, 0.0)  # how much of the prior the evidence may keep
_REACH = (0.5, 1.0, 2.0)  # how far the topology features may reach, times their spread
_LABELS = (1.0, 3.0)  # how much single parameter values may matter, times their spread
_EVIDENCE_AFTER = 3  # measurements before the evidence chooses
_NEIGHBOURS = 3  # trials kept in a failed first candidate's neighbourhood
_HEDGE_RISK = 0.5  # the hedge proposes nothing more likely to fail than to run
_HOPELESS = 0.9  # no trial goes where a failure is this likely while anything less likely is left
_FAIL_PRIOR = 0.25  # trials that ran credited to every parameter value before a failure is blamed on it
_FAIL_EM = 30  # expectation-maximisation steps of the failure causes
#: how the error of a trial that failed for memory begins: the objective raised MemoryError (the
#: trial's error is ``"<exception type>: <message>"``; ``affinity tune -- CMD`` raises it for a
#: command killed by the out-of-memory killer or saying it ran out of memory)
MEMORY_ERROR = "MemoryError"
_LOCAL_TRIES = 6  # one-parameter moves in a row that do not improve the best before the search goes wide
_PROBE_EVERY = 2  # while exploiting, every second trial (the 2nd, 4th, ...) is the model's choice over the whole space
_NEAR_PRIOR = 0.3  # a gain over the first candidate beyond what the prior expected (log units) that ends exploiting
_SURPRISE_FROM = 2  # ... counted from the third trial on: the second is the model's first choice, a second start
_NEEDS_MORE = 0.95  # the chance to fail of a configuration that needs at least the memory of one that ran out


def trial_config(t: FrozenTrial, space: Space) -> dict[str, Any] | None:
    """The configuration a trial evaluated, or None when it is not one of ``space``."""
    cfg = {n: t.params[n] for n in space.names if n in t.params}
    return cfg if space.contains(cfg) else None


Obs = list[tuple[tuple[int, ...], float | None]]


class TopologySampler(optuna.samplers.BaseSampler):
    """Propose the configuration with the largest expected improvement under a prior
    from the machine, with a generic optimizer as a hedge (see the module docstring).

    Parameters
    ----------
    space : Space
        What is searched (every parameter categorical).
    priors : Priors
        The machine's view of the configurations.
    seed : int
        Seeds every random choice (with the number of trials evaluated).
    direction : {"maximize", "minimize"}
        Whether larger values are better.
    """

    def __init__(self, space: Space, priors: Priors, *, seed: int, direction: str = "maximize"):
        self.space = space
        self.priors = priors
        self.seed = int(seed)
        self.direction = direction
        self.sign = 1.0 if direction == "maximize" else -1.0
        self._dists = {n: CategoricalDistribution(list(c)) for n, c in space.params}
        self._offsets = np.cumsum([0] + [len(c) for _, c in space.params])[:-1]
        self._ncomp = len(COMPONENTS)
        self._nonehot = sum(len(c) for _, c in space.params)
        self._sq = [FEATURES.index(f) for f in _SQUARED]
        self._nfeat = len(FEATURES) + len(self._sq)
        self._width = 1 + self._ncomp + self._nonehot + self._nfeat
        self._tau2 = np.concatenate([np.zeros(1 + self._ncomp)] + [
            np.full(len(c), (_TAU_COUNT if n in COUNTS else _TAU) ** 2) for n, c in space.params] + [
            np.full(len(FEATURES), _TAU_FEATURE ** 2), np.full(len(self._sq), _TAU_SQUARE ** 2)])
        self._pool: _Pool | None = None
        self._twin_ids: dict[tuple[Any, ...], int] = {}
        self._rows: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
        self._scale: tuple[np.ndarray, np.ndarray] | None = None

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
            The optuna study and trial, for the hedge's TPE proposals.

        Returns
        -------
        dict
            A configuration of the space none of ``trials`` holds.
        """
        seen, obs = self._observations(trials, number)
        bounds = self._bounds(trials, number)
        # seeded by the place in evaluation order (not the trial number, which an
        # interrupted trial shifts): a resumed study continues as an uninterrupted one
        rng = np.random.default_rng([self.seed, len(obs)])
        pool = self._candidates(trials, seen, rng)
        if pool.keys.shape[0] == 0:  # everything tried: the best one again
            done = [o for o in obs if o[1] is not None]
            best = max(done, key=lambda o: self.sign * o[1])[0] if done else next(iter(seen))
            return self.space.config(best)
        memory = self._out_of_memory(trials)
        near = self._neighbourhood(pool, obs, bool(obs) and obs[0][1] is None and obs[0][0] in memory)
        exploit = near is None and self._incumbent(obs) is not None
        local = None
        if exploit and not self._probe(len(obs)):  # a one-parameter move from the incumbent
            near = local = self._local(pool, obs)
            exploit = local is not None  # none left: the model's choice, as when not exploiting
        elif exploit:  # a probe: the model's choice over the whole space, without the hedge
            near = np.ones(pool.keys.shape[0], dtype=bool)
        post = self._posterior(obs, bounds, trust=exploit)
        if rng.uniform() < self.hedge_rate(obs, post[3] if post else 1.0) and near is None:
            risky = self._fail_chance(pool, obs, memory) > _HEDGE_RISK
            safe = pool.take(~risky) if not risky.all() else pool
            return self._hedge(safe, seen | {tuple(int(i) for i in k) for k in pool.keys[risky]}, rng, study, trial)
        acq = self._acquisition(pool, obs, post, memory, greedy=local is not None)
        if near is not None:
            acq = np.where(near, acq, -np.inf)
        acq = acq + rng.uniform(0, 1e-12, size=acq.shape)
        return self.space.config(tuple(int(i) for i in pool.keys[int(np.argmax(acq))]))

    def hedge_rate(self, obs: Obs, fit: float = 1.0) -> float:
        """The chance that the next trial is the generic optimizer's: 0 for the first
        :data:`_HEDGE_AFTER` trials, then 5 %, plus 5 % per trial since the best last
        improved by 1 %, plus up to 30 % as the model explains less of the measurements
        (``fit``: its leave-one-out R², from :data:`_FIT_AFTER` measurements on), at most 50 %."""
        if len(obs) < _HEDGE_AFTER:
            return 0.0
        ys = iter(self._targets(obs)[0].tolist())
        best, last = -math.inf, -1
        for i, (_, v) in enumerate(obs):  # a failure is a trial that did not improve
            y = next(ys) if v is not None else -math.inf
            if y > best + _STALL_GAIN:
                best, last = y, i
        stall = len(obs) - 1 - last
        unexplained = _HEDGE_FIT * min(1.0, max(0.0, 1.0 - fit)) if len(obs) >= _FIT_AFTER else 0.0
        return min(_HEDGE_MAX, _HEDGE_BASE + _HEDGE_STEP * stall + unexplained)

    def _hedge(self, pool: _Pool, seen: set[tuple[int, ...]], rng: np.random.Generator,
               study: optuna.Study | None, trial: FrozenTrial | None) -> dict[str, Any]:
        """TPE's proposal (a fresh sampler seeded by the place in evaluation order, so a
        resumed study proposes the same), or a random untried configuration when TPE has
        fewer than ten trials, proposes one already tried, or no study is given.  ``pool``
        and ``seen`` leave out what more likely fails than runs (:data:`_HEDGE_RISK`): TPE
        learns nothing from failed trials, and the hedge is there for values the model
        gets wrong, not for failures it explains."""
        done = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE] if study else []
        if study is not None and trial is not None and len(done) >= 10:
            tpe = optuna.samplers.TPESampler(seed=int(rng.integers(2 ** 31)))
            cfg = {n: tpe.sample_independent(study, trial, n, d) for n, d in self._dists.items()}
            if self.space.contains(cfg) and self.space.key(cfg) not in seen:
                return cfg
        return self.space.config(tuple(int(i) for i in pool.keys[int(rng.integers(pool.keys.shape[0]))]))

    # ------------------------------------------------------------------ observations
    def _observations(self, trials: Sequence[FrozenTrial], number: int) -> tuple[set[tuple[int, ...]], Obs]:
        """(keys of every configuration tried or pending, [(key, value or None if it failed)]
        in evaluation order).  A value of 0 (or below) where the others are positive is a
        run that did no work: a failure."""
        seen: set[tuple[int, ...]] = set()
        obs: Obs = []
        for t in sorted(trials, key=lambda t: t.number):
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
        return seen, self._no_work_failed(obs)

    def _no_work_failed(self, obs: Obs) -> Obs:
        """``obs`` with a value of 0 (or below) read as a failure where the others are positive."""
        vals = [v for _, v in obs if v is not None]
        if self.sign > 0 and any(v > 0 for v in vals) and not any(v < 0 for v in vals if v != 0):
            return [(k, None if v is not None and v <= 0 else v) for k, v in obs]
        return obs

    def _bounds(self, trials: Sequence[FrozenTrial], number: int) -> Obs:
        """[(key, last intermediate value)] of the pruned trials: what they measured
        before multi-fidelity stopped them.  A throughput printed as a run goes rises
        through its warm-up, so this is a lower bound of what the whole run would have
        measured (:meth:`_posterior` uses it as one)."""
        out: Obs = []
        for t in trials:
            if t.number == number or t.state != TrialState.PRUNED or not t.intermediate_values:
                continue
            cfg = trial_config(t, self.space)
            last = t.intermediate_values[max(t.intermediate_values)]
            if cfg is not None and last is not None and math.isfinite(last):
                out.append((self.space.key(cfg), float(last)))
        return out

    def _targets(self, obs: Obs) -> tuple[np.ndarray, np.ndarray]:
        """(y of the trials that ran, their noise variance).

        Log values (sign by direction) when no value is negative, else values scaled
        to a comparable spread; anything more than :data:`_FLOOR` below the best, or
        :data:`_FLOOR_MEDIAN` below the median, counts as that.  The noise is
        :data:`_NOISE` at the best and grows by :data:`_FAR` per log unit below it: the
        many trials far from the best would otherwise pull the fit away from the few
        near it, where the next choice is made (a one-parameter move from a configuration
        within 4 % of the best was predicted at 0.7 of it, behind the prior's terms)."""
        vals = np.array([v for _, v in obs if v is not None], dtype=float)
        if vals.size and (vals > 0).all():
            ys = self.sign * np.log(vals)
        elif vals.size:
            spread = float(np.std(vals)) or 1.0
            ys = self.sign * (vals - float(np.median(vals))) / spread * 0.3
        else:
            ys = np.zeros(0)
        if ys.size:
            ys = np.maximum(ys, max(ys.max() - _FLOOR, float(np.median(ys)) - _FLOOR_MEDIAN))
            # how bad a bad trial is matters less than how good a good one is: its noise grows
            # with the distance below the best, so the model fits where the decision is
            return ys, _NOISE ** 2 + (_FAR * (ys.max() - ys)) ** 2
        return ys, np.full(ys.shape, _NOISE ** 2)

    # ------------------------------------------------------------------ the model
    def _row(self, key: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(prior components, raw topology features with the squares appended) of ``key``."""
        if key not in self._rows:
            cfg = self.space.config(key)
            comp = np.maximum(np.array(self.priors.components(cfg), dtype=float), -_FLOOR)
            f, _ = features(self.priors, cfg)
            fv = np.array(f, dtype=float)
            self._rows[key] = (comp, fv)
        return self._rows[key]

    def _design(self, keys: np.ndarray) -> np.ndarray:
        """Rows of [1, prior components..., one-hot of each value, standardised features
        and the squares of the count features]."""
        n = keys.shape[0]
        phi = np.zeros((n, self._width))
        phi[:, 0] = 1.0
        rows = [self._row(tuple(int(i) for i in k)) for k in keys]
        if n:
            phi[:, 1:1 + self._ncomp] = np.array([r[0] for r in rows])
        idx = np.arange(n)
        for j, off in enumerate(self._offsets):
            phi[idx, 1 + self._ncomp + off + keys[:, j]] = 1.0
        if n:
            mean, sd = self._scaling()
            z = (np.array([r[1] for r in rows]) - mean) / sd
            start = 1 + self._ncomp + self._nonehot
            phi[:, start:start + len(FEATURES)] = z
            phi[:, start + len(FEATURES):] = z[:, self._sq] ** 2 - 1.0
        return phi

    def _scaling(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean and spread of each feature over the space (a seeded sample of it when large)."""
        if self._scale is None:
            if self.space.size <= ENUMERATE:
                keys = [self.space.key(c) for c in self.space.configs()]
            else:
                rng = np.random.default_rng([self.seed, 99])
                sizes = [len(c) for _, c in self.space.params]
                keys = [tuple(int(rng.integers(m)) for m in sizes) for _ in range(2000)]
            f = np.array([self._row(k)[1] for k in keys])
            sd = f.std(axis=0)
            self._scale = (f.mean(axis=0), np.where(sd > 1e-9, sd, 1.0))
        return self._scale

    def _posterior(self, obs: Obs, bounds: Obs = (),
                   trust: bool = False) -> tuple[np.ndarray, np.ndarray, float, float] | None:
        """(mean, covariance of the weights, best y, leave-one-out R² of the fit) given the
        trials that ran; None before any.

        A pruned trial's ``bounds`` (its value is at least its last intermediate value)
        is a censored measurement: where the model predicts less than the bound, it
        counts as a measurement of the bound; where it predicts more, as a measurement
        of what it predicts (it tells nothing against it).  The fit and its leave-one-out
        R² are those of the trials that ran; the weights are refitted with the bounds.

        How much to believe the prior, and how far the topology features may reach, are
        chosen by the evidence (the marginal likelihood of the measurements) among
        :data:`_BELIEF` x :data:`_REACH`: a prior the measurements contradict loses its
        weight as soon as the data say so.  With ``trust`` (while the search exploits the
        first candidate, :meth:`_incumbent`) the whole prior is kept."""
        ran = [(k, v) for k, v in obs if v is not None]
        if not ran:
            return None
        y, var = self._targets(obs)
        phi = self._design(np.array([k for k, _ in ran], dtype=int))
        best_m0, best_s0, best_ev = self._prior_weights(1.0, 1.0, 1.0) + (-math.inf,)
        if len(ran) >= _EVIDENCE_AFTER:
            for belief in ((1.0,) if trust else _BELIEF):
                for reach in _REACH:
                    for labels in _LABELS:
                        m0, s0 = self._prior_weights(belief, reach, labels)
                        ev = _log_evidence(phi, y, var, m0, s0)
                        if ev > best_ev + 1e-9:
                            best_m0, best_s0, best_ev = m0, s0, ev
        cov = np.linalg.inv(np.diag(1.0 / best_s0) + (phi.T / var) @ phi)
        mean = cov @ (best_m0 / best_s0 + (phi.T / var) @ y)
        # a linear smoother: leave-one-out residuals are the residuals over (1 - leverage)
        lev = np.einsum("ij,jk,ik->i", phi, cov, phi) / var
        loo = (y - phi @ mean) / np.maximum(1.0 - lev, 1e-6)
        spread = float(((y - y.mean()) ** 2).sum())
        r2 = 1.0 - float((loo ** 2).sum()) / spread if spread > 1e-12 else 1.0
        vals = [v for _, v in ran]
        if bounds and all(v > 0 for v in vals) and all(b > 0 for _, b in bounds):
            bphi = self._design(np.array([k for k, _ in bounds], dtype=int))
            at = self.sign * np.log([b for _, b in bounds])
            pred = bphi @ mean
            yb = np.maximum(at, pred) if self.sign > 0 else np.minimum(at, pred)  # value >= bound
            yb = np.maximum(yb, float(y.min()))  # as low as the worst that ran, at most (cf. _targets)
            phi2, y2 = np.vstack([phi, bphi]), np.concatenate([y, yb])
            var2 = np.concatenate([var, np.full(len(yb), _NOISE ** 2)])
            cov = np.linalg.inv(np.diag(1.0 / best_s0) + (phi2.T / var2) @ phi2)
            mean = cov @ (best_m0 / best_s0 + (phi2.T / var2) @ y2)
        return mean, cov, float(np.max(y)), r2

    def _prior_weights(self, belief: float, reach: float, labels: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """(mean, variance) of the weights: the prior's terms at ``belief`` (1 = as the
        priors say, 0 = learned from nothing), the features' spread times ``reach``, the
        parameter values' spread times ``labels``."""
        m0 = np.zeros(self._width)
        m0[1:1 + self._ncomp] = belief
        s0 = self._tau2.copy()
        s0[0] = 100.0
        s0[1:1 + self._ncomp] = _PRIOR_WEIGHT_SD ** 2
        start = 1 + self._ncomp + self._nonehot
        s0[start:] *= reach ** 2
        s0[1 + self._ncomp:start] *= labels ** 2
        return m0, s0

    def _acquisition(self, pool: _Pool, obs: Obs, post: tuple[np.ndarray, np.ndarray, float, float] | None,
                     memory: frozenset[tuple[int, ...]] = frozenset(), greedy: bool = False) -> np.ndarray:
        """Expected improvement (beyond :data:`_XI`) of each candidate under the model's
        posterior, times the chance it runs; a twin of a measured configuration is
        predicted to measure as its twin did, within the noise.  A candidate more likely
        to fail than :data:`_HOPELESS` is left out while others remain: the model knows
        nothing of the value of a configuration that never ran, and a large gain it
        extrapolates there would otherwise outweigh a 2 % chance to run, trial after trial."""
        run = 1.0 - self._fail_chance(pool, obs, memory)
        cphi = self._design(pool.keys)
        if post is None:  # nothing measured yet: the prior, and the chance to run
            return cphi[:, 1:1 + self._ncomp].sum(axis=1) + np.log(np.maximum(run, 1e-3))
        mean, cov, best, _ = post
        dmu, dvar = self._residual_reach(pool, obs, post)
        mu = cphi @ mean + dmu
        sd = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", cphi, cov, cphi) + dvar, 1e-12))
        ys = iter(self._targets(obs)[0].tolist())
        twin_y: dict[int, float] = {}
        for k, v in obs:
            if v is not None:
                tid = self._twin_id(k)
                twin_y[tid] = max(twin_y.get(tid, -np.inf), next(ys))
        known = np.array([t in twin_y for t in pool.twins.tolist()], dtype=bool)
        if known.any():
            mu[known] = [twin_y[t] for t in pool.twins[known].tolist()]
            sd[known] = _NOISE
        if greedy:  # a one-parameter move: the best predicted, less the log of its chance to run
            acq = mu + np.log(np.maximum(run, 1e-3))
        else:
            z = (mu - best - _XI) / sd
            acq = ((mu - best - _XI) * _ncdf(z) + sd * _npdf(z)) * run
        hopeless = run < 1.0 - _HOPELESS
        if hopeless.any() and not hopeless.all():  # a large gain predicted where failures are explained
            acq[hopeless] = -np.inf  # is the model extrapolating, not a reason to spend a trial
        return acq

    def _residual_reach(self, pool: _Pool, obs: Obs,
                        post: tuple[np.ndarray, np.ndarray, float, float]) -> tuple[np.ndarray, np.ndarray]:
        """(shift of the mean, added variance) of each candidate from what the model got
        wrong: its leave-one-out residuals, spread to nearby configurations by a kernel over
        the parameters (a twin 1, one parameter away 1/2, two 1/4, ...; a Gaussian process on
        the residuals).  Its amplitude is the residuals' own spread beyond the noise, so it
        is nothing where the model predicts out of sample, and where a prior is wrong the
        neighbours of a configuration that beat its prediction are expected to beat theirs."""
        zero = np.zeros(pool.keys.shape[0])
        ran = [k for k, v in obs if v is not None]
        if len(ran) < _EVIDENCE_AFTER:
            return zero, zero
        mean, cov, _, r2 = post
        y, var = self._targets(obs)
        ks = np.array(ran, dtype=int)
        phi = self._design(ks)
        lev = np.einsum("ij,jk,ik->i", phi, cov, phi) / var
        loo = (y - phi @ mean) / np.maximum(1.0 - lev, 1e-6)
        amp = float(np.median(loo ** 2 - var)) * min(1.0, max(0.0, 1.0 - r2))
        if amp <= 1e-6:
            return zero, zero
        tw = np.array([self._twin_id(k) for k in ran])

        def kernel(a: np.ndarray, at: np.ndarray) -> np.ndarray:
            d = (a[:, None, :] != ks[None, :, :]).sum(axis=2).astype(float)
            d[at[:, None] == tw[None, :]] = 0.0
            return amp * 0.5 ** d

        kk = kernel(ks, tw) + np.diag(var)
        kp = kernel(pool.keys, pool.twins)
        resid = y - phi @ mean
        sol = np.linalg.solve(kk, np.concatenate([resid[:, None], kp.T], axis=1))
        return kp @ sol[:, 0], np.maximum(amp - np.einsum("ij,ji->i", kp, sol[:, 1:]), 0.0)

    def _fail_chance(self, pool: _Pool, obs: Obs, memory: frozenset[tuple[int, ...]] = frozenset()) -> np.ndarray:
        """How likely each candidate is to fail: failures near it (one parameter away
        count 1/2, two 1/4, ...) against successes near it (a twin of one counts 1), and a
        pseudo-count.  A twin of a failure is only one parameter away: the launch differs
        in what it exports, which may be what failed."""
        failed = [k for k, v in obs if v is None]
        if not failed:
            return np.zeros(pool.keys.shape[0])
        ran = [k for k, v in obs if v is not None]

        def near(keys: list[tuple[int, ...]], twins: bool) -> np.ndarray:
            if not keys:
                return np.zeros(pool.keys.shape[0])
            ks = np.array(keys, dtype=int)
            d = (pool.keys[:, None, :] != ks[None, :, :]).sum(axis=2).astype(float)
            tw = np.array([self._twin_id(k) for k in keys])
            d[pool.twins[:, None] == tw[None, :]] = 0.0 if twins else 1.0
            return (0.5 ** d).sum(axis=1)

        f, ok = near(failed, False), near(ran, True)
        p = np.maximum(f / (f + ok + 0.5), self._fail_causes(pool, failed, ran, memory))
        return np.maximum(p, _NEEDS_MORE * self._needs_more(pool, memory))

    def _needs_more(self, pool: _Pool, memory: frozenset[tuple[int, ...]]) -> np.ndarray:
        """Candidates that need at least the memory of a configuration that ran out of it:
        as many copies or more, each with as many threads or more (and, on several NUMA nodes,
        the same memory policy); the memory a run needs grows with both."""
        out = np.zeros(pool.keys.shape[0], dtype=bool)
        names = self.space.names
        counts = [n for n in ("instances", "threads") if n in names]
        if not memory or not counts:
            return out
        value = {n: np.array([float(v) for v in self.space.choices(n)]) for n in counts}
        policy = names.index("membind") if "membind" in names and self.priors.machine.nodes > 1 else None
        for k in memory:
            more = np.ones(pool.keys.shape[0], dtype=bool)
            for n in counts:
                j = names.index(n)
                more &= value[n][pool.keys[:, j]] >= value[n][k[j]]
            if policy is not None:
                more &= pool.keys[:, policy] == k[policy]
            out |= more
        return out

    def _fail_causes(self, pool: _Pool, failed: list[tuple[int, ...]], ran: list[tuple[int, ...]],
                     memory: frozenset[tuple[int, ...]] = frozenset()) -> np.ndarray:
        """How likely each candidate is to fail because of one of its parameter values: a
        noisy-OR model (a configuration fails when any of its values causes a failure, value
        ``v`` of parameter ``j`` with probability ``q[j][v]``) fitted to the trials by
        expectation-maximisation, each value starting with :data:`_FAIL_PRIOR` trials that
        ran.  A failure is explained away by the value its failures share and no trial
        that ran has (every copy count of 16 ran out of memory: ``instances=16``), not
        by the values it shares with trials that ran."""
        keys = np.array(failed + ran, dtype=int)
        fk = keys[:len(failed)]
        sizes = [len(c) for _, c in self.space.params]
        seen = [np.bincount(keys[:, j], minlength=m).astype(float) + _FAIL_PRIOR for j, m in enumerate(sizes)]
        q = [np.full(m, 0.1) for m in sizes]
        # a failure for memory (``memory``) is caused by the counts or the memory policy, not by pinning
        can = np.array([[k not in memory or n in COUNTS or n == "membind" for n in self.space.names]
                        for k in failed], dtype=float).reshape(len(failed), len(sizes))
        for _ in range(_FAIL_EM):
            qf = np.stack([q[j][fk[:, j]] for j in range(len(sizes))], axis=1) * can  # (failures, parameters)
            cause = qf / np.maximum(1.0 - np.prod(1.0 - qf, axis=1), 1e-12)[:, None]  # P(value caused it | failed)
            q = [np.bincount(fk[:, j], weights=cause[:, j], minlength=m) / seen[j] for j, m in enumerate(sizes)]
        qp = np.stack([q[j][pool.keys[:, j]] for j in range(len(sizes))], axis=1)
        return 1.0 - np.prod(1.0 - qp, axis=1)

    def _out_of_memory(self, trials: Sequence[FrozenTrial]) -> frozenset[tuple[int, ...]]:
        """The configurations whose trials failed for memory (an error that is a :data:`MEMORY_ERROR`)."""
        out = set()
        for t in trials:
            if t.state == TrialState.FAIL and str(t.user_attrs.get("error", "")).startswith(MEMORY_ERROR):
                cfg = trial_config(t, self.space)
                if cfg is not None:
                    out.add(self.space.key(cfg))
        return frozenset(out)

    def _smaller(self, pool: _Pool, first: np.ndarray) -> np.ndarray:
        """Candidates with a smaller memory footprint than ``first``: fewer copies, or as
        many with fewer threads each (all of them where the space has neither)."""
        names = self.space.names
        value = {n: np.array([float(v) for v in self.space.choices(n)])[pool.keys[:, names.index(n)]]
                 for n in ("instances", "threads") if n in names}
        at = {n: float(self.space.choices(n)[int(first[names.index(n)])]) for n in value}
        if not value:
            return np.ones(pool.keys.shape[0], dtype=bool)
        if "instances" not in value:
            return value["threads"] < at["threads"]
        fewer = value["instances"] < at["instances"]
        if "threads" in value:
            fewer |= (value["instances"] == at["instances"]) & (value["threads"] < at["threads"])
        return fewer

    def _neighbourhood(self, pool: _Pool, obs: Obs, memory: bool = False) -> np.ndarray | None:
        """Candidates to keep to after a failed first candidate: its neighbours (one
        parameter changed, or copies and threads moved one step each in opposite
        directions), until :data:`_NEIGHBOURS` of them were tried; None otherwise.
        After a failure for ``memory`` only those that may need less: a smaller footprint
        (:meth:`_smaller`), or on several NUMA nodes another memory policy (a copy bound to
        one node's memory runs out where one that spreads may not); another pinning of
        the same footprint would fail the same way."""
        if not obs or obs[0][1] is not None:
            return None
        first = np.array(obs[0][0], dtype=int)
        diff = pool.keys != first[None, :]
        mask = diff.sum(axis=1) <= 1
        names = self.space.names
        if "instances" in names and "threads" in names:
            i, t = names.index("instances"), names.index("threads")
            step_i, step_t = pool.keys[:, i] - first[i], pool.keys[:, t] - first[t]
            others = np.delete(diff, [i, t], axis=1).sum(axis=1) == 0
            mask |= others & (np.abs(step_i) == 1) & (step_t == -step_i)
        inside = sum(1 for k, _ in obs[1:] if int((np.array(k) != first).sum()) <= 2)
        if inside >= _NEIGHBOURS:
            return None
        counts = [j for j, n in enumerate(names) if n in COUNTS]
        same = mask & (diff[:, counts].sum(axis=1) == 0) if counts else mask
        if memory:
            policy = np.zeros(pool.keys.shape[0], dtype=bool)
            if "membind" in names and self.priors.machine.nodes > 1:
                policy = (diff.sum(axis=1) == 1) & diff[:, names.index("membind")]
            same &= policy
            mask &= self._smaller(pool, first) | policy
        if inside == 0 and same.any():  # first the same layout with other pinning or memory policy,
            # the one whose launch differs most (a twin of the failure is the least informative)
            mean, sd = self._scaling()
            f0 = (self._row(tuple(int(i) for i in first))[1] - mean) / sd
            dist = np.zeros(pool.keys.shape[0])
            for j in np.flatnonzero(same):
                dist[j] = float(np.abs((self._row(tuple(int(i) for i in pool.keys[j]))[1] - mean) / sd - f0).sum())
            return same & (dist >= dist.max() - 1e-9)
        return mask if mask.any() else None

    # ------------------------------------------------------------------ exploiting
    def _probe(self, j: int) -> bool:
        """Whether trial ``j`` (0 is the first), while the search exploits, is a probe (the
        model's choice over the whole space) rather than a one-parameter move: every
        :data:`_PROBE_EVERY`-th, from the second trial on."""
        return (j - 1) % _PROBE_EVERY == 0

    def _incumbent(self, obs: Obs) -> tuple[int, ...] | None:
        """The configuration one-parameter moves start from while the search exploits a good
        first candidate; None once it goes wide (or when the first candidate failed).

        The incumbent is the best configuration so far.  Exploiting goes on while it is near
        the prior's expectation: a trial (from the third on, :data:`_SURPRISE_FROM`) whose
        gain over the first candidate, beyond what the prior expected of it (its prior score
        less the first candidate's), is more than :data:`_NEAR_PRIOR` log units says the
        prior is wrong here, and the search goes wide; so it does after
        :data:`_LOCAL_TRIES` one-parameter moves in a row that did not improve the best by
        :data:`_STALL_GAIN`."""
        ys = iter(self._targets(obs)[0].tolist())
        inc, best, tries, y0, p0 = None, -math.inf, 0, 0.0, 0.0
        for j, (k, v) in enumerate(obs):
            y = next(ys) if v is not None else -math.inf
            if inc is None:
                if v is None:
                    return None
                inc, best, y0, p0 = k, y, y, self.priors.score(self.space.config(k))
                continue
            if y > best + _STALL_GAIN:
                inc, best, tries = k, y, 0
                surprise = (y - y0) - (self.priors.score(self.space.config(k)) - p0)
                if j >= _SURPRISE_FROM and surprise > _NEAR_PRIOR:
                    return None
                continue
            if y > best:
                inc, best = k, y
            if not self._probe(j):
                tries += 1
                if tries >= _LOCAL_TRIES:
                    return None
        return inc

    def _distance(self, keys: np.ndarray, at: tuple[int, ...]) -> np.ndarray:
        """Parameters changed from ``at``, where counts moved one step together (OMP and
        intra-op the same way, copies and threads opposite ways) count as one move."""
        origin = np.array(at, dtype=int)
        d = (keys != origin[None, :]).sum(axis=1)
        names = self.space.names
        for a, b, sign in (("instances", "threads", -1), ("omp", "intra", 1)):
            if a in names and b in names:
                i, j = names.index(a), names.index(b)
                si, sj = keys[:, i] - origin[i], keys[:, j] - origin[j]
                d = d - ((np.abs(si) == 1) & (sj == sign * si)).astype(int)
        return d

    def _local(self, pool: _Pool, obs: Obs) -> np.ndarray | None:
        """The one-parameter moves from the incumbent (:meth:`_incumbent`) not yet tried, or
        None when the search no longer exploits (or none is left)."""
        inc = self._incumbent(obs)
        if inc is None:
            return None
        mask = self._distance(pool.keys, inc) <= 1
        return mask if mask.any() else None

    # ------------------------------------------------------------------ candidates
    def _twin_id(self, key: tuple[int, ...]) -> int:
        twin = self.priors.twin(self.space.config(key))
        return self._twin_ids.setdefault(twin, len(self._twin_ids))

    def _pool_of(self, keys: np.ndarray) -> _Pool:
        rows = [tuple(int(i) for i in k) for k in keys]
        return _Pool(keys, np.array([self._twin_id(k) for k in rows], dtype=int))

    def _candidates(self, trials: Sequence[FrozenTrial], seen: set[tuple[int, ...]], rng: np.random.Generator) -> _Pool:
        if self.space.size <= ENUMERATE:
            if self._pool is None:
                self._pool = self._pool_of(np.array([self.space.key(c) for c in self.space.configs()], dtype=int))
            pool = self._pool
        else:
            pool = self._sampled_pool(trials, rng)
        if not seen:
            return pool
        return pool.take(np.array([tuple(k) not in seen for k in pool.keys.tolist()], dtype=bool))

    def _sampled_pool(self, trials: Sequence[FrozenTrial], rng: np.random.Generator) -> _Pool:
        """Random configurations and one-parameter moves from the best five trials."""
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
        return self._pool_of(np.array(sorted(keys), dtype=int))


class _Pool:
    """Candidate configurations as index rows, with their twin numbers."""

    def __init__(self, keys: np.ndarray, twins: np.ndarray):
        self.keys = keys
        self.twins = twins

    def take(self, mask: np.ndarray) -> _Pool:
        return _Pool(self.keys[mask], self.twins[mask])


def _log_evidence(phi: np.ndarray, y: np.ndarray, var: np.ndarray, m0: np.ndarray, s0: np.ndarray) -> float:
    """log p(y) of a Bayesian linear model: y ~ N(phi m0, phi S0 phi' + diag(var))."""
    cov = (phi * s0) @ phi.T + np.diag(var)
    r = y - phi @ m0
    sign, logdet = np.linalg.slogdet(cov)
    if sign <= 0:
        return -math.inf
    return float(-0.5 * (r @ np.linalg.solve(cov, r) + logdet + len(y) * math.log(2 * math.pi)))


def _ncdf(z: np.ndarray) -> np.ndarray:
    """The standard normal CDF (Abramowitz & Stegun 7.1.26 for erf, error < 1.5e-7)."""
    x = np.abs(z) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = 1.0 - poly * np.exp(-x * x)
    return 0.5 * (1.0 + np.sign(z) * erf)


def _npdf(z: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
