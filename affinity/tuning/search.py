"""``affinity.tune()``: find the counts and placement that make a workload fastest.

:func:`tune` calls ``objective(config)`` at most ``budget`` times, each time with
a configuration of the space chosen by :class:`~affinity.tuning.sampler.TopologySampler`
(the seeds' rules first, then the configuration with the largest expected
improvement under a prior from the machine), and returns a :class:`TuneResult`.

:class:`Search` is the study behind it (also used by ``affinity tune``): an
optuna study, in memory or in SQLite storage, named after the machine, the space
and the direction (and, for the command line, the command), so that running the
same search again resumes it.  A resumed search continues to the same total
number of trials, never re-runs a finished configuration, and re-runs one that
was interrupted.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import math
import numbers
import os
import secrets
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from ..record import field, record
from ._optuna import optuna  # first: a one-line error naming the extra when optuna is missing
from optuna.distributions import CategoricalDistribution  # noqa: E402,I001 - after the check above
from optuna.trial import FrozenTrial, TrialState  # noqa: E402

from ..cpulist import format_list
from ..machine.topology import Topology
from . import forms
from .priors import Priors
from .sampler import FIXED, INTERRUPTED, TopologySampler, trial_config
from ..errors import SeedMismatch, TrialPruned, TuneError, TuneUsageError
from .space import Space, default_space, describe
from . import storage as storage_mod
from .storage import check_storage, rdb_storage
from .warm import WarmStart

__all__ = ["Search", "TrialRecord", "TuneResult", "check_budget", "tune"]

_ATTR = "affinity."  # prefix of the study's user attributes
_LOG = logging.getLogger("affinity.tuning")
#: user attribute of a trial asked after the budget was reached by other tuners (not run)
SURPLUS = "affinity.surplus"
#: user attribute of a running trial: the tuner running it (:func:`.storage.tuner_identity`)
OWNER = "affinity.owner"


# ------------------------------------------------------------------ results

@record
class TrialRecord:
    """One call of the objective.

    Attributes
    ----------
    number : int
        Its place in evaluation order (from 0).
    config : dict
        The configuration.
    value : float or None
        What the objective returned; None when infeasible or interrupted.
    seconds : float or None
        How long the call took.
    state : {"complete", "infeasible", "pruned", "interrupted"}
        ``infeasible``: it raised or returned no number (recorded, not retried);
        ``pruned``: stopped early by multi-fidelity, its intermediate values worse
        than the completed trials' (counted, never a finalist);
        ``interrupted``: cut short by Ctrl-C (tried again when the study resumes).
    error : str or None
        Why it is infeasible or was pruned.
    """

    number: int
    config: dict[str, Any]
    value: float | None
    seconds: float | None
    state: str
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready data."""
        return {"number": self.number, "config": dict(self.config), "value": self.value,
                "seconds": self.seconds, "state": self.state, "error": self.error}


@record
class TuneResult:
    """What :func:`tune` found.

    Attributes
    ----------
    best : dict or None
        The best configuration (None when no trial completed).
    best_value : float or None
        Its value.
    trials : tuple of TrialRecord
        Every trial, in evaluation order.
    baseline : float or None
        The defaults' value, when measured.
    direction : {"maximize", "minimize"}
        Whether larger values are better.
    space : dict
        The space searched.
    seed : int
        The seed (pass it again to get the same sequence).
    study_name, storage : str or None
        Where the trials are kept (storage None: in memory).
    topology : Topology
        The machine the configurations were read with.
    command : tuple of str or None
        The command tuned (``affinity tune``); forms then name it instead of ``CMD``.
    notes : tuple of str
        What the tuner assumed or could not do.
    spread : tuple of (float, float) or None
        ``(defaults, best)`` relative spreads of repeated measurements (``affinity tune``).
    significant : bool or None
        Whether the speed-up is larger than the spread of repeats (None: not repeated).
    speedup_interval : tuple of (float, float) or None
        The lowest and highest speed-up of the rounds that measured the defaults and
        the best side by side (``affinity tune``; None: fewer than two rounds).
    """

    best: dict[str, Any] | None
    best_value: float | None
    trials: tuple[TrialRecord, ...]
    baseline: float | None
    direction: str
    space: dict[str, list[Any]]
    seed: int
    study_name: str | None
    storage: str | None
    topology: Topology = field(repr=False, compare=False)
    command: tuple[str, ...] | None = None
    notes: tuple[str, ...] = ()
    spread: tuple[float, float] | None = None
    significant: bool | None = None
    speedup_interval: tuple[float, float] | None = None

    @property
    def speedup(self) -> float | None:
        """The best over the defaults (for ``minimize``: the defaults' time over the best);
        None without a baseline."""
        if self.baseline is None or self.best_value is None or not self.baseline or not self.best_value:
            return None
        return self.best_value / self.baseline if self.direction == "maximize" else self.baseline / self.best_value

    @functools.cached_property
    def environment(self) -> dict[str, str]:
        """The variables the best configuration's (first) instance runs with (computed
        by the launcher once, without running anything)."""
        return forms.environment(self.best, self.topology) if self.best is not None else {}

    @property
    def env_block(self) -> str:
        """:attr:`environment` as ``export`` lines."""
        if self.best is None:
            return ""
        k = int(self.best.get("instances", 1))
        head = [f"# instance 0 of {k}: 'affinity run' gives each instance its own CPUs"] if k > 1 else []
        return "\n".join(head + [f"export {n}={_shell_quote(v)}" for n, v in self.environment.items()])

    @property
    def run_line(self) -> str:
        """The ``affinity run ... -- CMD`` line of the best configuration."""
        return forms.shell_line(self.best, self.command) if self.best is not None else ""

    @property
    def apply_call(self) -> str:
        """The ``affinity.apply(...)`` call (with what it needs around it) of the best configuration."""
        return forms.apply_call(self.best) if self.best is not None else ""

    def to_dict(self) -> dict[str, Any]:
        """Everything as JSON-ready data (what ``affinity tune --json`` prints)."""
        return {"best": self.best, "best_value": self.best_value, "baseline": self.baseline,
                "speedup": self.speedup, "significant": self.significant,
                "speedup_interval": list(self.speedup_interval) if self.speedup_interval else None,
                "spread": list(self.spread) if self.spread else None, "direction": self.direction,
                "seed": self.seed, "study_name": self.study_name, "storage": self.storage,
                "machine": self.topology.describe(), "space": self.space,
                "command": list(self.command) if self.command else None, "notes": list(self.notes),
                "run_line": self.run_line, "environment": self.environment, "apply_call": self.apply_call,
                "trials": [t.to_dict() for t in self.trials]}

    def __str__(self) -> str:
        if self.best is None:
            return f"TuneResult: no configuration completed in {len(self.trials)} trials"
        gain = f", {self.speedup:.2f}x the defaults" if self.speedup is not None else ""
        return (f"TuneResult: best {describe(self.best)} = {self.best_value:.4g}{gain} "
                f"({len(self.trials)} trials)\n  {self.run_line}")


def _shell_quote(v: str) -> str:
    return v if v and all(c.isalnum() or c in "_-.,:/=" for c in v) else "'" + v.replace("'", "'\\''") + "'"


# ------------------------------------------------------------------ checks

def check_budget(budget: Any) -> int:
    """``budget`` as a positive int (raises TuneUsageError naming it otherwise)."""
    if isinstance(budget, bool) or not isinstance(budget, numbers.Integral) or budget < 1:
        raise TuneUsageError(f"budget must be a whole number >= 1 (calls of the objective), got {budget!r}")
    return int(budget)


def machine_id(topology: Topology) -> str:
    """The machine's fingerprint: its description and the CPUs this process may use."""
    blob = json.dumps({"machine": topology.describe(), "cpus": format_list(topology.allowed)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _fingerprint(topology: Topology, space: Space, direction: str, extra: str) -> str:
    blob = json.dumps({"machine": topology.describe(), "cpus": format_list(topology.allowed),
                       "space": space.to_dict(), "direction": direction, "extra": extra},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def infer_topology(space: Mapping[str, Any] | None, here: Topology) -> tuple[Topology, str | None]:
    """The topology to read a space with when none was given: this machine, unless the
    space's counts go far beyond it (then a flat machine with that many cores, and a note).

    Parameters
    ----------
    space : mapping or None
        The space given.
    here : Topology
        This machine.

    Returns
    -------
    (Topology, str or None)
    """
    if not isinstance(space, Mapping):
        return here, None
    counts = [v for n in ("intra", "omp", "threads", "instances") for v in (space.get(n) or [])
              if isinstance(v, int) and not isinstance(v, bool)]
    pus = len(here.allowed)
    if not counts or max(counts) < 4 * pus:
        return here, None
    n = max(counts)
    note = (f"the space's counts go up to {n} but this machine has {pus} PUs: the priors read it as a "
            f"flat {n}-core machine; pass topology= (e.g. Topology.from_synthetic(...)) to plan for the "
            f"machine that will run it")
    return Topology.from_synthetic(f"package:1 [numa] core:{n} pu:1"), note


# ------------------------------------------------------------------ the study

class Search:
    """An optuna study searched by :class:`~affinity.tuning.sampler.TopologySampler`.

    Parameters
    ----------
    space : Space
        What is searched.
    topology : Topology
        The machine the configurations run on.
    direction : {"maximize", "minimize"}
        Whether larger values are better.
    seed : int, optional
        Default: the study's (when resumed), else a random one.
    storage : None, str or optuna storage
        See :func:`open_storage`.
    study_name : str, optional
        Default ``affinity-tune-<fingerprint>`` of the machine, space, direction and ``key``.
    key : str
        More to name the study after (the command line's command and metric).
    pruning : bool
        Multi-fidelity (:meth:`run` with ``reports=True``): optuna's median pruner.
    warm : callable, optional
        A warm start: called with the study's name and the space's membership test
        (``space.contains``) when the study is new, it returns configurations learned
        elsewhere (the best of an earlier study of the same command on this machine,
        among those in the space); those of the space are tried first, before the
        seeds' rules (:attr:`warm` lists them).
    first : mapping, optional
        A configuration of the space to try before all others (:func:`tune`'s
        baseline), unless the study has tried or queued it already
        (:attr:`first_queued` says whether it was queued now).

    Raises
    ------
    TuneUsageError
        A stored study made for another space or direction, or with another seed.
    TuneError
        A storage that is not a study.
    """

    def __init__(self, space: Space, topology: Topology, *, direction: str = "maximize", seed: int | None = None,
                 storage: Any = None, study_name: str | None = None, key: str = "", pruning: bool = False,
                 warm: Callable[[str, Callable[[Mapping[str, Any]], bool]], Sequence[Mapping[str, Any]]] | None = None,
                 first: Mapping[str, Any] | None = None):
        if direction not in ("maximize", "minimize"):
            raise TuneUsageError(f"direction must be 'maximize' or 'minimize', got {direction!r}")
        self.space, self.topology, self.direction = space, topology, direction
        self.exhausted = False  # set by run(): it stopped because every configuration was tried
        self.storage = check_storage(storage)
        self.study_name = _study_name(study_name, topology, space, direction, key)
        self._rdb, self._lock = self._connect()
        self._me = storage_mod.tuner_identity()
        with self._lock():
            self.study = self._open()
            self.seed = self._seed(seed)
            self.priors = Priors(space, topology)
            self._dists = {n: CategoricalDistribution(list(c)) for n, c in space.params}
            self.resumed = bool(self.study.get_trials(deepcopy=False))
            self._close_stale()
            self._enqueue_interrupted()
            self.warm: list[dict[str, Any]] = []
            if not self.resumed:
                self.warm = [dict(c) for c in (warm(self.study_name, space.contains) if warm is not None else ())
                             if space.contains(c)]
            self.first_queued = first is not None and self.space.key(first) not in self._known()
            queue = ([dict(first)] if self.first_queued else []) + \
                ([] if self.resumed else self.warm + self.priors.seeds())
            for i, cfg in enumerate(queue):
                if cfg not in queue[:i]:
                    self.study.enqueue_trial(cfg, user_attrs={FIXED: dict(cfg)})
        self.sampler = TopologySampler(space, self.priors, seed=self.seed, direction=direction)
        self.study.sampler = self.sampler
        if pruning:  # a trial worse than the median of the completed ones at the same step stops there
            self.study.pruner = optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1)

    @staticmethod
    def check(space: Space, topology: Topology, *, direction: str = "maximize", seed: int | None = None,
              storage: Any = None, study_name: str | None = None,
              key: str = "") -> tuple[str, dict[str, Any]] | None:
        """What opening this search would refuse (a stored study made for another space,
        direction or seed), checked without creating or changing anything: for the
        command line, before CMD runs.  Returns the stored study's name and user
        attributes, None when there is no such study yet (or no storage)."""
        name = _study_name(study_name, topology, space, direction, key)
        if check_storage(storage) is None:
            return None
        target, lock = rdb_storage(storage, optuna) if isinstance(storage, str) else (storage, _no_lock)
        with lock():  # a schema made by two tuners at once would clash
            if name not in optuna.get_all_study_names(target):
                return None
            study = optuna.load_study(study_name=name, storage=target)
        _check_study(study, space, direction, storage)
        _stored_seed(study, seed)
        return name, dict(study.user_attrs)

    def _connect(self) -> tuple[Any, Callable[[], Any]]:
        """(optuna's RDB storage with heartbeats or None, the lock of its file)."""
        if not isinstance(self.storage, str):
            return None, _no_lock
        try:
            return rdb_storage(self.storage, optuna)
        except Exception as e:  # noqa: BLE001 - SQLAlchemy/optuna errors: say which storage
            raise TuneError(f"storage {self.storage}: cannot open it: {type(e).__name__}: {e}") from e

    def _open(self) -> optuna.Study:
        """Create or load the study (optuna's public API only; nothing logged)."""
        target = self._rdb if self._rdb is not None else self.storage
        try:
            study = self._create_or_load(target)
        except Exception as e:  # noqa: BLE001 - SQLAlchemy/optuna errors: say which storage
            raise TuneError(f"storage {self.storage}: cannot open study {self.study_name!r}: "
                            f"{type(e).__name__}: {e}") from e
        if _check_study(study, self.space, self.direction, self.storage) is None:
            study.set_user_attr(_ATTR + "space", self.space.to_dict())
            study.set_user_attr(_ATTR + "machine", self.topology.describe())
            study.set_user_attr(_ATTR + "machine_id", machine_id(self.topology))
        return study

    def _seed(self, seed: int | None) -> int:
        stored = _stored_seed(self.study, seed)
        value = int(seed) if seed is not None else int(stored) if stored is not None else secrets.randbelow(2 ** 31)
        if stored is None:
            self.study.set_user_attr(_ATTR + "seed", value)
        return value

    def _create_or_load(self, storage: Any) -> optuna.Study:
        if storage is not None and self.study_name in optuna.get_all_study_names(storage):
            return optuna.load_study(study_name=self.study_name, storage=storage)
        try:
            with _quiet_optuna():
                return optuna.create_study(storage=storage, study_name=self.study_name, direction=self.direction)
        except optuna.exceptions.DuplicatedStudyError:  # another tuner made it just now
            return optuna.load_study(study_name=self.study_name, storage=storage)

    def _enqueue_interrupted(self) -> None:
        """A trial cut short (Ctrl-C, or a tuner that died) runs again first, as if it had
        not been interrupted -- unless its configuration was finished or is queued since."""
        trials = self.study.get_trials(deepcopy=False)
        done = {self.space.key(r.config) for r in map(lambda t: _record(t, self.space), trials)
                if r is not None and r.state != "interrupted"}
        queued = {self.space.key(c) for t in trials if t.state == TrialState.WAITING
                  for c in [t.user_attrs.get(FIXED) or {}] if self.space.contains(c)}
        for t in trials:
            rec = _record(t, self.space)
            if rec is not None and rec.state == "interrupted" and self.space.key(rec.config) not in done | queued:
                self.study.enqueue_trial(rec.config, user_attrs={FIXED: dict(rec.config)})
                queued.add(self.space.key(rec.config))

    def _close_stale(self) -> None:
        """Trials left running by a tuner that died: at once where its tuner ran on this
        machine (its recorded PID is gone, or another process's), else once it has had
        no heartbeat for the grace period (failed by optuna); then run again as
        interrupted.  A live tuner's running trial is left alone."""
        if self._rdb is None:
            return
        me = storage_mod.tuner_identity()
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if storage_mod.owner_gone(t.user_attrs.get(OWNER), me):
                self._fail_interrupted(t)
        with warnings.catch_warnings():  # optuna calls fail_stale_trials experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)

    def _fail_interrupted(self, t: FrozenTrial) -> None:
        """Fail another (dead) tuner's running trial as interrupted: it is run again."""
        store = self.study._storage
        with contextlib.suppress(Exception):  # finished meanwhile: nothing to do
            store.set_trial_user_attr(t._trial_id, INTERRUPTED, True)
            store.set_trial_state_values(t._trial_id, state=TrialState.FAIL)

    # ---------------------------------------------------------------- trials
    def records(self) -> list[TrialRecord]:
        """Every finished trial, in evaluation order."""
        out = []
        for t in sorted(self.study.get_trials(deepcopy=False), key=lambda t: t.number):
            rec = _record(t, self.space)
            if rec is not None:
                out.append(rec)
        return out

    def done(self) -> int:
        """How many trials count against the budget (completed or infeasible)."""
        return sum(r.state != "interrupted" for r in self.records())

    def run(self, objective: Callable[..., Any], budget: int,
            on_trial: Callable[[TrialRecord, list[TrialRecord]], None] | None = None, *,
            reports: bool = False) -> None:
        """Call ``objective`` until ``budget`` trials are done (this session and earlier ones
        together), or every configuration of the space is.

        Parameters
        ----------
        objective : callable
            ``objective(config) -> float``; raising or returning None/NaN marks the
            configuration infeasible.
        budget : int
            The total number of trials.
        on_trial : callable, optional
            Called after each trial with its record and every record so far.
        reports : bool
            Multi-fidelity: call ``objective(config, report)``, where ``report(step,
            value)`` records an intermediate value and returns True when the trial
            should stop (the study's pruner: worse than the median of completed
            trials at that step); the objective then raises :class:`TrialPruned`.

        Raises
        ------
        KeyboardInterrupt
            After recording the running trial as interrupted.
        """
        self.exhausted = False
        gone: set[int] = set()  # running trials waited for in vain (no heartbeat ever recorded)
        while True:
            trials = self.study.get_trials(deepcopy=False)
            full = _counted(trials, len(trials)) >= budget
            if (full or len(self._tried(trials)) >= self.space.size) and self._wait_for_others(trials, gone):
                continue  # another tuner's trials ended (or died): count again
            if full:
                return
            if len(self._tried(trials)) >= self.space.size:
                self.exhausted = True
                return
            with _interrupt_deferred() as interrupted:  # asked, then running with a heartbeat, or told
                trial = self._ask()
                trial.set_user_attr(OWNER, self._me)  # (a tuner that finds it running can tell we died)
                if _counted(self.study.get_trials(deepcopy=False), trial.number) >= budget:
                    trial.set_user_attr(SURPLUS, True)  # another tuner took the last trial first
                    self.study.tell(trial, state=TrialState.FAIL)
                    return
                beat = self._heartbeat(trial.number)
                if interrupted:  # a signal came while asking: the trial is told before it is raised
                    with beat:
                        pass
                    trial.set_user_attr(INTERRUPTED, True)
                    self.study.tell(trial, state=TrialState.FAIL)
                    return  # the Ctrl-C is raised as the block ends
            with beat:
                self._trial(trial, objective, reports)
            if on_trial is not None:
                records = self.records()
                on_trial(next(r for r in records if r.number == trial.number), records)

    def _ask(self) -> optuna.Trial:
        with warnings.catch_warnings():  # optuna: heartbeats "are supposed to be used with optimize"
            warnings.simplefilter("ignore", UserWarning)
            return self.study.ask(self._dists)

    def _wait_for_others(self, trials: Sequence[FrozenTrial], gone: set[int]) -> bool:
        """Wait while trials of other tuners run (they may end infeasible, or their tuner
        may have died: optuna fails those once their heartbeat is older than the grace
        period); True when one ended.  A trial still running after the grace period and
        two heartbeats has no heartbeat at all (its tuner died before the first): it is
        put in ``gone`` and not waited for again."""
        running = {t.number for t in trials if t.state == TrialState.RUNNING} - gone
        if not running or self._rdb is None:
            return False
        deadline = time.monotonic() + storage_mod.GRACE_S + 2 * storage_mod.HEARTBEAT_S
        while time.monotonic() < deadline:
            time.sleep(storage_mod.HEARTBEAT_S)
            self._close_stale()
            now = {t.number for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
            if not running <= now:
                return True
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if t.number in running and OWNER not in t.user_attrs:  # its tuner died right after asking
                self._fail_interrupted(t)
        gone |= running
        return True

    def _known(self) -> set[tuple[int, ...]]:
        """The configurations tried (finished or running) or queued."""
        trials = self.study.get_trials(deepcopy=False)
        queued = {self.space.key(c) for t in trials if t.state == TrialState.WAITING
                  for c in [t.user_attrs.get(FIXED) or {}] if self.space.contains(c)}
        return self._tried(trials) | queued

    def _tried(self, trials: Sequence[FrozenTrial]) -> set[tuple[int, ...]]:
        """The configurations finished (not interrupted) or running."""
        out = set()
        for t in trials:
            if t.state == TrialState.RUNNING or (t.state.is_finished() and _countable(t)):
                cfg = trial_config(t, self.space)
                if cfg is not None:
                    out.add(self.space.key(cfg))
        return out

    def _trial(self, trial: optuna.Trial, objective: Callable[..., Any], reports: bool) -> None:
        """Run one trial and tell optuna how it went (a Ctrl-C while telling waits for the tell)."""
        cfg = {n: trial.params[n] for n in self.space.names}
        t0 = time.perf_counter()

        def report(step: int, value: float) -> bool:
            with _interrupt_deferred():  # a Ctrl-C in the middle of a storage call would leave it broken
                trial.report(float(value), int(step))
                return bool(trial.should_prune())

        try:
            value, error = _value(objective(dict(cfg), report) if reports else objective(dict(cfg)))
        except TrialPruned as e:
            with _interrupt_deferred():
                trial.set_user_attr("seconds", time.perf_counter() - t0)
                trial.set_user_attr("pruned", str(e)[:500])
                self.study.tell(trial, state=TrialState.PRUNED)
            return
        except KeyboardInterrupt:
            with _interrupt_deferred():
                trial.set_user_attr(INTERRUPTED, True)
                trial.set_user_attr("seconds", time.perf_counter() - t0)
                self.study.tell(trial, state=TrialState.FAIL)
            raise
        except Exception as e:  # noqa: BLE001 - any failure of the objective: infeasible
            value, error = None, f"{type(e).__name__}: {e}"[:2000]
        with _interrupt_deferred():
            trial.set_user_attr("seconds", time.perf_counter() - t0)
            if value is None:
                trial.set_user_attr("error", error)
                self.study.tell(trial, state=TrialState.FAIL)
            else:
                self.study.tell(trial, value)

    def _heartbeat(self, number: int) -> contextlib.AbstractContextManager[None]:
        """optuna's heartbeat of a running trial: the first recorded now, the next ones from
        a thread until the returned context ends."""
        if self._rdb is None:
            return contextlib.nullcontext()
        rdb = self._rdb
        trial_id = rdb.get_trial_id_from_study_id_trial_number(rdb.get_study_id_from_name(self.study_name), number)
        rdb.record_heartbeat(trial_id)
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(storage_mod.HEARTBEAT_S):
                try:
                    rdb.record_heartbeat(trial_id)
                except Exception:  # noqa: BLE001,S110 - a busy database: the next beat is in time
                    pass

        thread = threading.Thread(target=beat, name="affinity-tune-heartbeat", daemon=True)
        thread.start()

        @contextlib.contextmanager
        def running() -> Iterator[None]:
            try:
                yield
            finally:
                stop.set()
                thread.join()

        return running()

    def best(self) -> TrialRecord | None:
        """The best completed trial (the first on a tie)."""
        done = [r for r in self.records() if r.state == "complete"]
        if not done:
            return None
        sign = 1 if self.direction == "maximize" else -1
        return max(done, key=lambda r: (sign * r.value, -r.number))

    def result(self, *, baseline: float | None = None, command: Sequence[str] | None = None,
               notes: Sequence[str] = (), best: tuple[dict[str, Any], float] | None = None,
               spread: tuple[float, float] | None = None, significant: bool | None = None,
               speedup_interval: tuple[float, float] | None = None) -> TuneResult:
        """The :class:`TuneResult` of the trials so far (``best`` overrides the search's own)."""
        rec = self.best()
        cfg, val = best if best is not None else ((rec.config, rec.value) if rec else (None, None))
        storage = self.storage if isinstance(self.storage, str) or self.storage is None else repr(self.storage)
        return TuneResult(best=cfg, best_value=val, trials=tuple(self.records()), baseline=baseline,
                          direction=self.direction, space=self.space.to_dict(), seed=self.seed,
                          study_name=self.study_name, storage=storage, topology=self.topology,
                          command=tuple(command) if command else None, notes=tuple(notes), spread=spread,
                          significant=significant, speedup_interval=speedup_interval)


def _study_name(name: str | None, topology: Topology, space: Space, direction: str, key: str) -> str:
    """The study's name: the one given, else made of what can change the answer."""
    return name or f"affinity-tune-{_fingerprint(topology, space, direction, key)}"


def _check_study(study: optuna.Study, space: Space, direction: str, storage: Any) -> Any:
    """Refuse a stored study made for another space or direction; returns the space it
    was made for (None: a new study, not marked yet)."""
    stored = study.user_attrs.get(_ATTR + "space")
    if stored is not None and stored != json.loads(json.dumps(space.to_dict())):
        raise TuneUsageError(f"study {study.study_name!r} in {storage} was made for another space "
                             f"({stored}); give another study name to search this one")
    if study.direction.name.lower() != direction:
        raise TuneUsageError(f"study {study.study_name!r} in {storage} is a "
                             f"{study.direction.name.lower()} study, not {direction}")
    return stored


def _stored_seed(study: optuna.Study, seed: int | None) -> int | None:
    """The study's seed (None: not stored yet); :class:`SeedMismatch` when ``seed`` is another."""
    stored = study.user_attrs.get(_ATTR + "seed")
    if stored is not None and seed is not None and int(seed) != int(stored):
        raise SeedMismatch(study.study_name, int(stored))
    return stored


def _countable(t: FrozenTrial) -> bool:
    """A finished trial that counts against the budget: complete, or infeasible (not
    interrupted, not a surplus trial another tuner made redundant)."""
    if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
        return True
    return t.state == TrialState.FAIL and "error" in t.user_attrs


def _counted(trials: Sequence[FrozenTrial], below: int) -> int:
    """Trials numbered below ``below`` that count against the budget: finished ones, and
    running ones (this tuner's or another's, alive: a dead tuner's were failed when the
    study was opened)."""
    return sum(1 for t in trials if t.number < below and (t.state == TrialState.RUNNING or _countable(t)))


@contextlib.contextmanager
def _interrupt_deferred() -> Iterator[list[int]]:
    """Ctrl-C (SIGINT), SIGTERM and SIGHUP held until the block ends, then delivered to
    the handlers they had: a trial is never left asked but not running, or run but
    not told.  The block gets the list of signals held so far (empty: none).
    Outside the main thread (where no handler can be set) nothing is deferred."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    previous = {sig: signal.signal(sig, lambda s, frame: caught.append(s)) for sig in _DEFERRED}
    try:
        yield caught
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    for sig in dict.fromkeys(caught):
        handler = previous[sig]
        if callable(handler):
            handler(sig, None)
        elif handler == signal.SIG_DFL:
            os.kill(os.getpid(), sig)


_DEFERRED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _ThisThreadsInfo(logging.Filter):
    """Drops the INFO records of one thread (optuna's "A new study created ...")."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.thread == self.thread and record.levelno <= logging.INFO)


@contextlib.contextmanager
def _quiet_optuna() -> Iterator[None]:
    """optuna's INFO lines of this thread dropped for the block, and only them: its
    loggers' levels and handlers, everyone else's records, are left as they are."""
    quiet = _ThisThreadsInfo()
    handlers = [h for h in logging.getLogger("optuna").handlers]
    for h in handlers:
        h.addFilter(quiet)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(quiet)


def _no_lock() -> Any:
    return contextlib.nullcontext()


def _value(raw: Any) -> tuple[float | None, str | None]:
    """(value, None) for a finite number, else (None, why)."""
    if raw is None:
        return None, "the objective returned None"
    if isinstance(raw, bool) or not isinstance(raw, numbers.Real):
        try:
            raw = float(raw)  # numpy scalars, Decimal
        except (TypeError, ValueError):
            return None, f"the objective returned {type(raw).__name__} {raw!r}, not a number"
    value = float(raw)
    if not math.isfinite(value):
        return None, f"the objective returned {value}"
    return value, None


def _record(t: FrozenTrial, space: Space) -> TrialRecord | None:
    if t.state not in (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED):
        return None
    cfg = trial_config(t, space)
    if cfg is None:
        return None
    secs = t.user_attrs.get("seconds")
    if t.state == TrialState.COMPLETE:
        return TrialRecord(t.number, cfg, float(t.value), secs, "complete")
    if t.state == TrialState.PRUNED:
        return TrialRecord(number=t.number, config=cfg, value=None, seconds=secs, state="pruned",
                           error=str(t.user_attrs.get("pruned", "pruned")))
    if t.user_attrs.get(SURPLUS):
        return None
    if "error" in t.user_attrs:
        return TrialRecord(number=t.number, config=cfg, value=None, seconds=secs, state="infeasible",
                           error=str(t.user_attrs["error"]))
    return TrialRecord(t.number, cfg, None, secs, "interrupted")


# ------------------------------------------------------------------ tune()

def tune(objective: Callable[[dict[str, Any]], Any], space: Mapping[str, Sequence[Any]] | None = None, *,
         budget: int = 40, seed: int | None = None, topology: Topology | str | None = None,
         direction: str = "maximize", storage: Any = None, study_name: str | None = None,
         progress: bool | Callable[[TrialRecord, list[TrialRecord]], None] = False,
         baseline: Mapping[str, Any] | float | None = None, work: str = "copies",
         warm_start: bool | str = True) -> TuneResult:
    """Find the configuration of ``space`` that makes ``objective`` best, in few calls.

    Parameters
    ----------
    objective : callable
        ``objective(config: dict) -> float``: images/sec (or seconds with
        ``direction="minimize"``).  Raising, or returning None, NaN or anything but a
        number, marks that configuration infeasible: recorded, never retried.
    space : mapping of str to list, optional
        Parameter name -> choices.  ``intra``, ``inter``, ``omp``, ``blocktime``,
        ``affinity``, ``granularity``, ``instances``, ``threads`` and ``membind`` are
        read with the topology (see :mod:`affinity.tuning.priors`); any other name is
        a plain choice.  Default: :func:`~affinity.tuning.space.default_space` of the
        topology.
    budget : int
        The most calls of ``objective`` (a resumed study counts its earlier trials).
    seed : int, optional
        The same seed gives the same sequence of configurations.  Default: random
        (stored in the study, and used again when it resumes).
    topology : Topology or str, optional
        The machine the configurations will run on (a :class:`~affinity.Topology`, or a
        source such as ``"synthetic:pack:2 core:28 pu:2"``).  Default: this machine --
        unless the space's counts are far beyond it, then a flat machine with that
        many cores (said in ``result.notes``).
    direction : {"maximize", "minimize"}
        Whether larger values are better.
    storage : str or optuna storage, optional
        ``"sqlite:///tune.db"`` keeps every trial there, and a later call with the same
        space resumes the study; default: in memory.
    study_name : str, optional
        Default ``affinity-tune-<fingerprint>`` of the machine, the space, the direction
        and the objective's qualified name.
    progress : bool or callable
        ``progress(record, records)`` is called after each trial (a
        :class:`TrialRecord` and every record so far); ``True`` logs one line per
        trial at INFO level to the ``affinity.tuning`` logger (the library writes
        nothing itself: configure :mod:`logging` to see it); False: nothing.
    baseline : mapping or float, optional
        The defaults: a configuration of the space (every parameter, one of its
        choices), tried as the first trial -- counted in the budget, listed in
        ``result.trials``, never tried again -- or a value already measured.  Gives
        ``result.baseline`` and ``result.speedup``.

    work : {"copies", "split"}
        What several instances do: ``"copies"`` -- each the whole job (so
        ``instances`` is not in the default space: copies are not a faster job);
        ``"split"`` -- the work splits between them (a service under load, ranks that
        take their share): ``instances`` is in the default space.
    warm_start : bool or str
        A new study in a ``storage`` first tries the best configurations of an
        earlier study there (:mod:`affinity.tuning.warm`): ``True`` -- the newest
        made on this machine for the same objective (its qualified name); a study
        name -- that study, which must have been made on this machine; ``False`` --
        none.  ``result.notes`` says where they came from.  A resumed study, or one
        in memory, starts from nothing.

    Returns
    -------
    TuneResult
        ``best``, ``best_value``, ``trials`` (config, value, seconds, state, in
        evaluation order), ``baseline``, ``speedup`` and the best as ``env_block``,
        ``run_line`` and ``apply_call``.

    Raises
    ------
    TuneUsageError
        A budget below 1, an empty or unknown-typed space, a bad direction, a baseline
        outside the space, a stored study made for another space or seed.
    TuneError
        A storage that is not a study; every trial infeasible (the message gives the
        first error).
    KeyboardInterrupt
        After every finished trial is stored and the running one marked interrupted.
    """
    if not callable(objective):
        raise TuneUsageError(f"objective must be callable (config -> float), got {type(objective).__name__}")
    budget = check_budget(budget)
    notes: list[str] = []
    if topology is None:
        topo, note = infer_topology(space, Topology.from_system())
        notes += [note] if note else []
    else:
        topo = Topology.load(topology)
    if work not in ("copies", "split"):
        raise TuneUsageError(f"work must be 'copies' or 'split', got {work!r}")
    sp = default_space(topo, instances=work == "split") if space is None else Space.of(space)
    who = f"{getattr(objective, '__module__', '')}.{getattr(objective, '__qualname__', type(objective).__name__)}"
    warm = _warm_start(warm_start, storage, topo, direction, who)
    first = _baseline_config(baseline, sp)
    search = Search(sp, topo, direction=direction, seed=seed, storage=storage, study_name=study_name, key=who,
                    warm=warm, first=first)
    if warm is not None:
        if _ATTR + "objective" not in search.study.user_attrs:
            search.study.set_user_attr(_ATTR + "objective", who)
        left = budget - search.done() - search.first_queued  # said of the trials the budget leaves them
        notes += [n for n in [warm.said(min(len(search.warm), max(0, left)))] if n]
    search.run(objective, budget, on_trial=_on_trial(progress, budget, search.direction))
    records = search.records()
    base, note = _baseline_value(baseline, first, records, sp)
    notes += [note] if note else []
    if records and not any(r.state == "complete" for r in records if r.state != "interrupted"):
        first = next((r for r in records if r.error), None)
        raise TuneError(f"every configuration tried ({len(records)}) was infeasible; first error "
                        f"({describe(first.config) if first else '-'}): {first.error if first else '-'}")
    return search.result(baseline=base, notes=notes)


def _warm_start(warm_start: bool | str, storage: Any, topology: Topology, direction: str,
                who: str) -> WarmStart | None:
    """:func:`tune`'s ``warm_start`` as the search's hook (None: no warm start)."""
    if warm_start is False or warm_start is None:
        return None
    if not isinstance(warm_start, (bool, str)) or warm_start == "":
        raise TuneUsageError(f"warm_start: True, False or a study name, got {warm_start!r}")
    named = warm_start if isinstance(warm_start, str) else None
    return WarmStart(storage, machine_id(topology), direction, named=named,
                     same=lambda attrs: attrs.get(_ATTR + "objective") == who, what=f"warm_start={named!r}")


def _on_trial(progress: Any, budget: int, direction: str) -> Callable[[TrialRecord, list[TrialRecord]], None] | None:
    """What :meth:`Search.run` calls after a trial: the caller's callable, a log line, or nothing."""
    if callable(progress):
        return progress
    if not progress:
        return None
    sign = 1 if direction == "maximize" else -1

    def log(record: TrialRecord, records: list[TrialRecord]) -> None:
        done = [r for r in records if r.state == "complete"]
        best = max(done, key=lambda r: sign * r.value) if done else None
        _LOG.info("trial %d/%d: %s = %s; best %s (%s)", sum(r.state != "interrupted" for r in records), budget,
                  describe(record.config), record.value if record.state == "complete" else record.state,
                  best.value if best else "-", describe(best.config) if best else "-")

    return log


def _baseline_config(baseline: Any, space: Space) -> dict[str, Any] | None:
    """``baseline`` when it is a configuration (None for a value or nothing), checked:
    it names every parameter of ``space`` with one of its choices, and nothing else."""
    if baseline is None or (isinstance(baseline, numbers.Real) and not isinstance(baseline, bool)):
        return None
    if not isinstance(baseline, Mapping):
        raise TuneUsageError(f"baseline: expected a configuration (mapping) or a value, got {baseline!r}")
    for name, value in baseline.items():
        if name not in space.names:
            raise TuneUsageError(f"baseline: unknown parameter {name!r}; the space has {', '.join(space.names)}")
        if not space.contains({**{n: space.choices(n)[0] for n in space.names}, name: value}):
            raise TuneUsageError(f"baseline: {name}={value!r} is not a choice of the space "
                                 f"({list(space.choices(name))})")
    missing = [n for n in space.names if n not in baseline]
    if missing:
        raise TuneUsageError(f"baseline: no value for {', '.join(missing)}: give a configuration of the space "
                             f"(every parameter), or a value already measured")
    return dict(baseline)


def _baseline_value(baseline: Any, first: dict[str, Any] | None, records: Sequence[TrialRecord],
                    space: Space) -> tuple[float | None, str | None]:
    """(the defaults' value, a note when they were not measured): a value given, or
    the trial of the baseline configuration."""
    if first is None:
        return (None if baseline is None else float(baseline)), None
    rec = next((r for r in records if space.key(r.config) == space.key(first) and r.state != "interrupted"), None)
    if rec is None:
        return None, f"the defaults {first} were not measured (interrupted)"
    if rec.state != "complete":
        return None, f"the defaults {first} failed: {rec.error}"
    return rec.value, None
