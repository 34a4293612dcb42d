"""What ``affinity tune`` does once its command line is parsed (:func:`run`); the parser
is :func:`affinity.tools.tune_cli.add_tune_parser`, kept apart so that registering the
command imports nothing heavy (optuna loads only when ``tune`` runs).

See :mod:`affinity.tools.tune_cli` for the steps; errors reach
:func:`affinity.tools.cli.main`, which gives each its exit status
(:func:`affinity.errors.exit_status`).
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..errors import (AffinityError, PictureError, SeedMismatch, Signalled, TrialPruned, TuneError, TuneUsageError,
                      exit_status)
from ..machine.topology import Topology
from ..planning.partition import partition
from ..record import field, record
from ..tuning import forms
from ..tuning.config import Config
from ..tuning.search import Search, TrialRecord, TuneResult, check_budget, machine_id
from ..tuning.space import ENV_PREFIX, KNOWN, Space, default_space, describe, parse_param
from ..tuning.storage import check_storage, default_storage
from ..tuning.verdict import MIN_ROUNDS, Verdict, more_rounds
from ..tuning.warm import MACHINE_ATTR, WarmStart
from . import tune_report as report
from .tune_key import SHARE_VAR, StudyKey, command_sources, reads_instance_share, unkeyed_modules
from .tune_metric import compile_metric
from .tune_report import Progress, fmt
from .tune_runner import CommandRunner, Measurement, remove_stale_folders

__all__ = ["run"]

_KEY_ATTR = "affinity.key"


def run(args: argparse.Namespace) -> int:
    """``affinity tune``: see :func:`~affinity.tools.tune_cli.add_tune_parser` and :mod:`affinity.tools.tune_cli`.

    Parameters
    ----------
    args : argparse.Namespace
        What the ``tune`` parser parsed.

    Returns
    -------
    int
        0 done, 130 interrupted (143 terminated, 129 hung up); errors are raised.
    """
    setup = _Setup.of(args)
    with _signals_interrupt():
        return setup.run()


@contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`Signalled`: the running trial (its launcher and
    instances) is stopped, the study keeps every finished trial, folders are removed."""
    def raise_it(signum: int, frame: Any) -> None:
        raise Signalled(signum)

    previous = {s: signal.signal(s, raise_it) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@record(frozen=False)
class _Setup:
    """What one ``affinity tune`` needs, checked before anything runs."""

    args: argparse.Namespace
    command: list[str]
    space: Space
    topology: Topology
    storage: str | None
    split: bool
    notes: list[str] = field(default_factory=list)
    frameworks: frozenset[str] = frozenset()  #: what CMD's files import (:func:`~affinity.tuning.forms.frameworks_in`)
    warm_from: str = ""
    resumed: dict[str, Any] | None = None

    @property
    def direction(self) -> str:
        return "minimize" if self.args.time or self.args.minimize else "maximize"

    @property
    def unit(self) -> str:
        return "seconds" if self.args.time else "value" if self.args.metric else "throughput"

    @property
    def quiet(self) -> bool:
        return bool(self.args.quiet or self.args.json)

    @classmethod
    def of(cls, args: argparse.Namespace) -> _Setup:
        words = _command(args.words)
        check_budget(args.budget)
        if args.repeats < 1 or args.top < 1:
            raise TuneUsageError(f"--repeats and --top must be >= 1, got {args.repeats} and {args.top}")
        if args.timeout is not None and not args.timeout > 0:
            raise TuneUsageError(f"--timeout must be a number of seconds > 0, got {args.timeout}")
        if args.metric is not None:
            compile_metric(args.metric)
        elif args.minimize and not args.time:
            raise TuneUsageError("--minimize: the default metric is a throughput (higher is better); give "
                                 "--metric REGEX for a value where lower is better, or --time")
        _check_plot(args.plot)
        topology = Topology.from_system()
        params = _params(args.param, words)
        notes = []
        share = reads_instance_share(words)
        split = bool(args.split or (share and not args.copies))
        if split and not args.split:
            notes.append(f"{os.path.basename(share)} reads {SHARE_VAR}: the work splits between "
                         f"instances (their metrics add up; --copies if they are copies)")
        if "instances" in params and not split:
            notes.append("instances are copies of CMD, each doing the whole work: measured per copy "
                         "(give --split if the work splits between them)")
        frameworks = forms.frameworks_in(command_sources(words))
        # a PyTorch program reads no TF_NUM_INTEROP_THREADS: no TensorFlow pool in its space
        tensorflow = "tensorflow" in frameworks or "torch" not in frameworks
        space = Space.of(params) if params else default_space(topology, instances=split, tensorflow=tensorflow)
        _check_instances(params.get("instances", []), topology)
        storage = None if (args.storage or "").lower() == "none" else args.storage or default_storage()
        check_storage(storage)  # a file that is not a study: said before anything runs
        return cls(args=args, command=words, space=space, topology=topology, storage=storage, split=split, notes=notes,
                   frameworks=frameworks)

    # ------------------------------------------------------------------ run
    def run(self) -> int:
        args = self.args
        remove_stale_folders()
        runner = CommandRunner(self.command, metric=args.metric, use_time=args.time, timeout=args.timeout,
                               split=self.split)
        try:
            return self._run(runner)
        except Signalled as e:
            return exit_status(e)
        finally:
            runner.close()

    def _run(self, runner: CommandRunner) -> int:
        args = self.args
        key = StudyKey.of(self.command, runner.environ, self._measure())
        warm = WarmStart(self.storage, machine_id(self.topology), self.direction, named=args.from_study,
                         same=lambda attrs: (attrs.get(_KEY_ATTR) or {}).get("command") == list(key.command),
                         what=f"--from {args.from_study}")
        self._preflight(key, warm)
        first = runner.defaults(self._plain())
        _check_defaults(first, self.command, args)
        if args.timeout is None:
            runner.timeout = 10 * first.seconds + 30
        with _seed_option(args.seed):
            search = Search(self.space, self.topology, direction=self.direction, seed=args.seed,
                            storage=self.storage, study_name=args.study, key=key.text(), pruning=args.prune,
                            warm=warm)
        self.resumed = self._remember(search, key)
        stored = warm.source.attrs.get(_KEY_ATTR) if warm.source is not None else None
        tried = min(len(search.warm), max(0, args.budget - search.done()))  # the budget may stop them
        self.warm_from = warm.said(tried, key.changes(stored) if stored else [])
        if self.warm_from and not self.quiet:
            print(f"affinity tune: {self.warm_from}", file=sys.stderr)
        bar = Progress(args.budget, self.direction, enabled=not self.quiet, label="affinity tune")
        t0 = time.monotonic()
        try:
            search.run(_objective(runner, search, args.prune), args.budget, on_trial=bar.update, reports=True)
        except KeyboardInterrupt as e:
            bar.close()
            self._interrupted(search)
            return exit_status(e)
        bar.close()
        searched = time.monotonic() - t0
        records = search.records()
        if not any(r.state == "complete" for r in records):
            bad = next((r for r in records if r.error), None)
            raise TuneError(f"every trial failed ({len(records)}): first {describe(bad.config) if bad else '-'}: "
                            f"{bad.error.splitlines()[0] if bad else '-'}")
        try:
            rows = self._remeasure(runner, search)
        except KeyboardInterrupt as e:
            self._interrupted(search)
            return exit_status(e)
        return self._finish(search, rows, runner, searched)

    def _preflight(self, key: StudyKey, warm: WarmStart) -> None:
        """What would be refused after the defaults' run, refused before it: a stored
        study made for another space, direction, seed, command or machine, and a
        ``--from`` study that is not there or not of this machine."""
        with _seed_option(self.args.seed):
            stored = Search.check(self.space, self.topology, direction=self.direction, seed=self.args.seed,
                                  storage=self.storage, study_name=self.args.study, key=key.text())
        if stored is not None:
            self._check_key(*stored, key)
        warm.check()

    def _plain(self) -> dict[str, Any]:
        """The first choice of each placeholder (the defaults' run)."""
        return {n: self.space.choices(n)[0] for n in self.space.names
                if n not in KNOWN and not n.startswith(ENV_PREFIX)}

    def _measure(self) -> str:
        what = "time" if self.args.time else f"metric {self.args.metric}" if self.args.metric else "throughput"
        lower = ", lower is better" if self.args.minimize and not self.args.time else ""
        return f"{what}{lower}, {'split' if self.split else 'copies'}"

    def _remember(self, search: Search, key: StudyKey) -> dict[str, Any] | None:
        """Store the key in a new study; say (on stderr, -q or not) what a resumed one
        is, or why a study of the same command was not resumed.  Returns the resumed
        study and its finished trials (``--json``'s ``resumed``), None for a new one."""
        self._check_key(search.study_name, search.study.user_attrs, key)
        done = search.done()
        if done:
            print(f"affinity tune: resuming, {_already(done, self.args.budget)} "
                  f"(study {search.study_name}: {self._same(search)})", file=sys.stderr)
            return {"study": search.study_name, "trials": done}
        if _KEY_ATTR not in search.study.user_attrs:
            search.study.set_user_attr(_KEY_ATTR, key.to_attr())
        for name, stored in _same_command(self.storage, search.study_name, key) if self.storage else []:
            why = "; ".join(key.changes(stored)) or "another space or machine"
            print(f"affinity tune: not resuming study {name} of the same command ({why}): a new study",
                  file=sys.stderr)
        return None

    def _same(self, search: Search) -> str:
        """What a resumed study is known to share with this command."""
        if _KEY_ATTR not in search.study.user_attrs:
            return "made without a key: its command, files and environment not compared"
        unkeyed = unkeyed_modules(self.command)
        if unkeyed:
            return (f"the same command, environment and machine; the file of module {', '.join(unkeyed)} "
                    f"not found, not compared")
        return "the same command, files, environment and machine"

    def _check_key(self, name: str, attrs: dict[str, Any], key: StudyKey) -> None:
        """A study (``--study NAME``, its user attributes ``attrs``) made for another
        command, files, environment, metric or machine is refused, as one made for
        another space is."""
        differs = key.changes(attrs[_KEY_ATTR]) if _KEY_ATTR in attrs else []
        if attrs.get(MACHINE_ATTR, machine_id(self.topology)) != machine_id(self.topology):
            differs.append(f"made on another machine ({attrs.get('affinity.machine', '?')})")
        if differs:
            raise TuneUsageError(f"study {name!r} in {self.storage} was made for another command "
                                 f"or inputs ({'; '.join(differs)}): give another study name (--study)")

    def _interrupted(self, search: Search) -> None:
        n = search.done()
        where = f"kept in {self.storage} (study {search.study_name}): run the same command to resume" \
            if self.storage else "not kept (--storage none)"
        print(f"\naffinity tune: interrupted; {n} finished trial{'s' if n != 1 else ''} {where}", file=sys.stderr)
        best = search.best()
        if best is not None:
            print(f"best so far: {describe(best.config)} = {fmt(best.value)}", file=sys.stderr)

    def _remeasure(self, runner: CommandRunner, search: Search) -> list[_Row]:
        """The defaults and the best ``--top`` configurations, interleaved round by round
        (A B C A B C ...: each round compares them under the same load): every row for
        :data:`~affinity.tuning.verdict.MIN_ROUNDS` rounds, then the defaults and the
        leader (the best figure) alone, until the leader's interval against the
        defaults excludes 1 or ``--repeats`` rounds are done
        (:func:`~affinity.tuning.verdict.more_rounds`)."""
        sign = 1 if self.direction == "maximize" else -1
        done = sorted((r for r in search.records() if r.state == "complete"), key=lambda r: -sign * r.value)
        top: list[dict[str, Any]] = []
        for r in done:
            if r.config not in top:
                top.append(r.config)
            if len(top) >= self.args.top:
                break
        rows = [_Row("defaults (CMD as it is)", None)] + [_Row(f"#{i + 1} {describe(c)}", c) for i, c in enumerate(top)]
        most = self.args.repeats
        for rnd in range(most):
            if rnd == MIN_ROUNDS:  # the leader, chosen once: the rounds go on for it alone
                self._leader(rows).carried = True
            active = rows if rnd < MIN_ROUNDS else [rows[0], self._leader(rows)]
            if rnd >= MIN_ROUNDS and not more_rounds(self._verdict(rows, active[1]), most):
                break
            if not self.quiet:
                print(f"affinity tune: re-measuring, round {rnd + 1} (at most {most})"
                      + ("" if len(active) == len(rows) else f": the defaults and {active[1].label.split()[0]}"),
                      file=sys.stderr)
            for row in rows:
                row.add(runner.defaults(self._plain()) if row.config is None and row in active else
                        runner.trial(row.config) if row in active else None)
        return rows

    def _leader(self, rows: list[_Row]) -> _Row:
        """The configuration the rounds went on for (:attr:`_Row.carried`), else the one
        with the best figure (the geometric mean of its rounds)."""
        carried = [r for r in rows[1:] if r.carried]
        if carried:
            return carried[0]
        sign = 1 if self.direction == "maximize" else -1
        measured = [r for r in rows[1:] if r.values] or rows[1:]
        return max(measured, key=lambda r: sign * report.summarize(r.values)[0] if r.values else -math.inf)

    def _verdict(self, rows: list[_Row], row: _Row) -> Verdict:
        """``row`` against the defaults, as the table says it (:func:`~affinity.tuning.verdict.paired`)."""
        return report.compare(rows[0].rounds, row.rounds, self.direction, max_rounds=self.args.repeats,
                              family=max(1, len(rows) - 1))

    def _finish(self, search: Search, rows: list[_Row], runner: CommandRunner, searched: float) -> int:
        args = self.args
        base = rows[0].values
        if not any(r.values for r in rows[1:]):
            raise TuneError("the best configurations failed when re-measured; see the trials")
        best = self._leader(rows)
        cmp = self._verdict(rows, best) if base else None
        spread = (_rel(base), _rel(best.values)) if len(base) > 1 and len(best.values) > 1 else None
        result = search.result(baseline=report.summarize(base)[0] if base else None, command=self.command,
                               best=(best.config, report.summarize(best.values)[0]), spread=spread,
                               significant=cmp.significant if cmp else None,
                               speedup_interval=cmp.interval if cmp else None, notes=self.notes)
        if args.plot:
            report.save_plot(args.plot, result.trials, baseline=result.baseline, direction=self.direction,
                             unit=self.unit, title=f"affinity tune: {' '.join(self.command)[:70]}",
                             remeasured=[(r.label, r.rounds) for r in rows])
        facts = {"warm_start": self.warm_from or None, "resumed": self.resumed, "search_seconds": round(searched, 3),
                 "trial_seconds": round(_trial_seconds(result.trials), 3),
                 "exhausted": search.exhausted, "split": self.split,
                 "pruned": sum(t.state == "pruned" for t in result.trials)}
        exp = forms.exports(result.best, self.topology, self.frameworks) if result.best is not None else None
        if args.json:
            out = {**result.to_dict(), **facts, "verdict": cmp.text if cmp else None,
                   "environment": exp.env if exp else {}, "environment_notes": list(exp.notes) if exp else [],
                   "frameworks": sorted(self.frameworks),
                   "round_ratios": list(cmp.ratios) if cmp else None,
                   "remeasured": [{"label": r.label, "config": r.config, "values": r.values, "rounds": r.rounds,
                                   "per_instance": r.per_instance} for r in rows]}
            print(json.dumps(out, indent=2, default=str))
            return 0
        print(_Text(setup=self, result=result, rows=rows, cmp=cmp, search=search, facts=facts, exports=exp).render())
        return 0


@record(frozen=False)
class _Row:
    """A configuration re-measured (None: the defaults), round by round."""

    label: str
    config: dict[str, Any] | None
    rounds: list[float | None] = field(default_factory=list)  #: one value per round; None: not run, or failed
    per_instance: list[list[float]] = field(default_factory=list)
    carried: bool = False  #: the leader after the first rounds, measured on until its verdict is settled

    @property
    def values(self) -> list[float]:
        """The values of the rounds that measured one."""
        return [v for v in self.rounds if v is not None]

    def add(self, m: Measurement | None) -> None:
        """The row's value in the next round (``m`` None: not run in it)."""
        self.rounds.append(m.value if m is not None else None)
        if m is not None and m.value is not None:
            self.per_instance.append(list(m.per_instance))


@record(frozen=False)
class _Text:
    """The text result of ``affinity tune``."""

    setup: _Setup
    result: TuneResult
    rows: list[_Row]
    cmp: Verdict | None
    search: Search
    facts: dict[str, Any]
    exports: forms.Exports | None = None  #: the environment block (:func:`~affinity.tuning.forms.exports`)

    def render(self) -> str:
        s, result = self.setup, self.result
        n = sum(t.state != "interrupted" for t in result.trials)
        lines = [f"affinity tune: {n} trial{'s' if n != 1 else ''} of {' '.join(s.command)} on "
                 f"{s.topology.describe()}, searched in {_duration(self.facts['search_seconds'])} "
                 f"({_duration(self.facts['trial_seconds'])} of runs in all sessions)",
                 f"study {self.search.study_name}" + (f" in {s.storage}" if s.storage else " (in memory)")]
        if self.facts["exhausted"]:
            lines.append(f"the space has {s.space.size} configuration{'s' if s.space.size != 1 else ''}: "
                         f"all tried, before the budget of {s.args.budget}")
        if self.facts["pruned"]:
            why = "still running at twice the best time so far" if s.args.time else \
                "worse than the completed ones at the same point"
            lines.append(f"{self.facts['pruned']} trial{'s' if self.facts['pruned'] != 1 else ''} stopped early "
                         f"(multi-fidelity: {why})")
        if s.args.time:
            lines.append("times are CMD's own, from its start to its end (affinity run's start-up not counted)")
        lines += [f"note: {note}" for note in result.notes]
        if s.warm_from:
            lines.append(s.warm_from)
        table = report.table([(self._label(r), r.rounds) for r in self.rows], unit=s.unit, direction=s.direction,
                             max_rounds=s.args.repeats)
        lines += ["", table, ""]
        if self.cmp is not None:
            lines.append(f"best vs defaults: {self.cmp.text}")
            lines.append(_per_round(self.rows, self.cmp))
        lines += self._infeasible()
        lines += ["", "best as an affinity run line:", f"  {result.run_line}", "", "environment:"]
        block = forms.export_lines(self.exports, int(Config.of(result.best).instances)) if self.exports else ""
        lines += [f"  {line}" for line in block.splitlines()]
        lines += ["", "in Python:"] + [f"  {line}" for line in result.apply_call.splitlines()]
        if s.args.plot:
            lines += ["", f"plot: {s.args.plot}"]
        return "\n".join(lines)

    def _label(self, row: _Row) -> str:
        """The row's label; one that sums or averages instances says so."""
        k = int(Config.of(row.config).instances) if row.config else 1
        if k < 2 or not row.per_instance or self.setup.args.time:
            return row.label
        last = row.per_instance[-1]
        each = " + ".join(fmt(v) for v in last) if len(last) <= 4 else f"{len(last)} x {fmt(sum(last) / len(last))}"
        if self.setup.split:
            return f"{row.label} ({k} instances sharing the work: {each})"
        return f"{row.label} ({k} copies: {k} x {fmt(sum(last) / len(last))}, the value is one copy's)"

    def _infeasible(self) -> list[str]:
        bad = [t for t in self.result.trials if t.state == "infeasible"]
        if not bad:
            return []
        out = ["", f"infeasible trials ({len(bad)}):"]
        for t in bad[:5]:
            out.append(f"  {describe(t.config)}: {(t.error or '').splitlines()[0][:160]}")
        if len(bad) > 5:
            out.append(f"  ... and {len(bad) - 5} more (--json lists them all)")
        return out


@contextmanager
def _seed_option(seed: int | None) -> Iterator[None]:
    """A stored study's other seed, said as the ``--seed`` option."""
    try:
        yield
    except SeedMismatch as e:
        raise TuneUsageError(f"--seed {seed}: study {e.study} was started with seed {e.stored}; resume "
                             f"it with --seed {e.stored} (or no --seed), or give another --study name") from e


def _command(words: Sequence[str] | None) -> list[str]:
    words = list(words or [])
    if words[:1] == ["--"]:
        words = words[1:]
    elif words:
        raise TuneUsageError(f"unexpected {' '.join(words)!r}: the command goes after '--' "
                             f"(affinity tune [options] -- CMD ...)")
    if not words:
        raise TuneUsageError("no command: give it after '--' (affinity tune [options] -- CMD ...)")
    return words


def _params(texts: Sequence[str], command: Sequence[str]) -> dict[str, list[Any]]:
    """``--param`` options as a space; a name is one the tuner knows, ``env:NAME``, or
    a ``{name}`` placeholder of the command -- anything else is a typo, said."""
    params: dict[str, list[Any]] = {}
    for text in texts:
        name, choices = parse_param(text)
        if name not in KNOWN and not name.startswith(ENV_PREFIX) and not any("{" + name + "}" in w for w in command):
            close = difflib.get_close_matches(name, list(KNOWN), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise TuneUsageError(f"--param {text!r}: unknown parameter {name!r}; {hint}known: {', '.join(KNOWN)}; "
                                 f"an environment variable is --param env:{name}=...; a placeholder is {{{name}}} "
                                 f"in the command")
        params[name] = params.get(name, []) + choices
    return params


def _check_instances(counts: Sequence[Any], topology: Topology) -> None:
    """An ``instances`` choice the launcher can never plan on this machine (more
    disjoint shares than its PUs) is a usage error, said before anything runs; a
    count that fails only with some other choices stays a trial."""
    for k in counts:
        try:
            partition(topology, k)  # what 'affinity run --instances K' cuts
        except AffinityError as e:
            raise TuneUsageError(f"--param instances={k}: {e}; on this machine at most {len(topology.allowed)} "
                                 f"instances") from e


def _check_plot(path: str | None) -> None:
    """``--plot``'s requirements, before the search (:func:`affinity.tools.picture.check_path`)."""
    if not path:
        return
    from .picture import check_path  # lazy: only with --plot

    try:
        check_path(path, "--plot")
    except PictureError as e:
        raise TuneUsageError(str(e)) from None


def _same_command(storage: str, name: str, key: StudyKey) -> list[tuple[str, dict[str, Any]]]:
    """Other studies in ``storage`` of the same command words, with their stored keys."""
    from ..tuning._optuna import optuna  # lazy: optuna is loaded by now; the summaries only here

    out = []
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        stored = summary.user_attrs.get(_KEY_ATTR)
        if summary.study_name != name and stored and stored.get("command") == list(key.command):
            out.append((summary.study_name, stored))
    return out


def _already(done: int, budget: int) -> str:
    """How many trials of a resumed study are done, against the budget."""
    if done <= budget:
        return f"{done} of {budget} trials already done"
    return f"{done} trials already done, more than the budget of {budget}: nothing new to try"


def _trial_seconds(trials: Sequence[TrialRecord]) -> float:
    return sum(t.seconds or 0.0 for t in trials)


def _duration(secs: float) -> str:
    if secs < 90:
        return f"{secs:.1f} s"
    return f"{int(secs // 60)} min {int(secs % 60):02d} s"


def _rel(vals: Sequence[float]) -> float:
    fig, lo, hi = report.summarize(vals)
    return (hi - lo) / fig if fig else 0.0


def _per_round(rows: Sequence[_Row], cmp: Verdict) -> str:
    """What the verdict's ratio is made of: the per-round ratios (their geometric
    mean is the ratio of the two figures of the table), and why it stopped."""
    said = " ".join(f"{r:.2f}" for r in cmp.ratios) or "-"
    done = len(rows[0].rounds)
    why = "its interval excludes 1" if cmp.decided else f"--repeats {done} reached" if cmp.rounds >= MIN_ROUNDS \
        else f"a verdict needs {MIN_ROUNDS} rounds"
    return (f"  (the geometric mean of the per-round ratios {said}, which is the ratio of the two figures; "
            f"stopped after {done} round{'s' if done != 1 else ''}: {why})")


def _objective(runner: CommandRunner, search: Search, pruning: bool) -> Any:
    """A trial: CMD through ``affinity run``; with multi-fidelity, stopped early when the
    values it prints as it goes are worse than the completed trials' at the same step
    (``--time``: when it runs twice as long as the best so far)."""
    def objective(config: dict[str, Any], report: Any) -> float:
        cutoff = None
        if pruning and runner.use_time:
            best = search.best()
            cutoff = 2 * best.value if best is not None else None
        m = runner.trial(config, report if pruning and not runner.use_time else None, cutoff)
        if m.pruned is not None:
            raise TrialPruned(m.pruned)
        if m.value is None:  # MemoryError: the sampler does not retry the same memory footprint next
            raise (MemoryError if m.out_of_memory else RuntimeError)(f"{_why(m)}\noutput ends:\n{m.output[-400:]}")
        return m.value

    return objective


def _check_defaults(m: Measurement, command: list[str], args: argparse.Namespace) -> None:
    """CMD as it is must work and print the metric: else there is nothing to tune."""
    cmd = " ".join(command)
    if m.status != 0 or (m.error and "exit status" in m.error) or m.status == 127:
        raise TuneError(f"{cmd!r} fails as it is ({_why(m)}): fix it before tuning it."
                        + (_tail(m) if m.output.strip() else ""))
    if m.value is None:
        what = f"a match of --metric {args.metric!r}" if args.metric else \
            "a number with images/sec, examples/sec, samples/sec or tokens/sec, or a JSON line's throughput"
        raise TuneError(f"no metric in the output of {cmd!r}: looked for {what}; give --metric REGEX or "
                        f"--time.{_tail(m)}")


def _why(m: Measurement) -> str:
    """Why run ``m`` failed, on one line: its error and the line of its output that says why."""
    error, said = m.error or f"exit status {m.status}", report.reason(m.output)
    return f"{error}: {said}" if said else f"{error}; no output"


def _tail(m: Measurement) -> str:
    """The end of run ``m``'s output, to follow an error message."""
    return f" Its output ends:\n{m.output.strip()}" if m.output.strip() else " It printed nothing."
