"""What ``affinity tune`` does once its command line is parsed (:func:`run`); the parser
is :func:`affinity.tools.tune_cli.add_tune_parser`, kept apart so that registering the
command imports nothing heavy (optuna loads only when ``tune`` runs).

See :mod:`affinity.tools.tune_cli` for the steps and the exit statuses.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from ..machine.topology import Topology
from ..tuning.search import Search, TuneResult, check_budget
from ..tuning.storage import check_storage, default_storage
from ..errors import TuneError, TuneUsageError
from ..tuning.space import KNOWN, Space, default_space, describe, parse_param
from . import tune_report as report
from .tune_metric import compile_metric
from .tune_report import Progress
from .tune_runner import CommandRunner, Measurement

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """``affinity tune``: see :func:`~affinity.tools.tune_cli.add_tune_parser` and :mod:`affinity.tools.tune_cli`.

    Parameters
    ----------
    args : argparse.Namespace
        What the ``tune`` parser parsed.

    Returns
    -------
    int
        0 done, 1 failure, 2 usage, 130 interrupted.
    """
    return _Setup.of(args).run()  # errors: one line and their exit status (tools.cli.main)


class _Setup:
    """What one ``affinity tune`` needs, checked before anything runs."""

    def __init__(self, args: argparse.Namespace, command: list[str], space: Space, topology: Topology,
                 storage: str | None):
        self.args, self.command, self.space, self.topology, self.storage = args, command, space, topology, storage
        self.direction = "minimize" if args.time else "maximize"
        self.unit = "seconds" if args.time else "value" if args.metric else "throughput"

    @classmethod
    def of(cls, args: argparse.Namespace) -> _Setup:
        words = list(args.words or [])
        if words[:1] == ["--"]:
            words = words[1:]
        elif words:
            raise TuneUsageError(f"unexpected {' '.join(words)!r}: the command goes after '--' "
                                 f"(affinity tune [options] -- CMD ...)")
        if not words:
            raise TuneUsageError("no command: give it after '--' (affinity tune [options] -- CMD ...)")
        check_budget(args.budget)
        if args.repeats < 1 or args.top < 1:
            raise TuneUsageError(f"--repeats and --top must be >= 1, got {args.repeats} and {args.top}")
        if args.metric is not None:
            compile_metric(args.metric)
        if args.plot and os.path.splitext(args.plot)[1].lower() not in (".svg", ".png"):
            raise TuneUsageError(f"--plot {args.plot!r}: write .svg or .png")
        topology = Topology.from_system()
        params: dict[str, list[Any]] = {}
        for text in args.param:
            name, choices = parse_param(text)
            params[name] = params.get(name, []) + choices
        space = Space.of(params) if params else default_space(topology)
        storage = None if (args.storage or "").lower() == "none" else args.storage or default_storage()
        check_storage(storage)  # a file that is not a study: said before anything runs
        return cls(args, words, space, topology, storage)

    # ------------------------------------------------------------------ run
    def run(self) -> int:
        args = self.args
        runner = CommandRunner(self.command, metric=args.metric, use_time=args.time, timeout=args.timeout)
        plain = {n: self.space.choices(n)[0] for n in self.space.names if n not in KNOWN}
        first = runner.defaults(plain)
        _check_defaults(first, self.command, args)
        if args.timeout is None:
            runner.timeout = 10 * first.seconds + 30
        key = json.dumps({"command": self.command, "metric": args.metric, "time": args.time})
        search = Search(self.space, self.topology, direction=self.direction, seed=args.seed,
                        storage=self.storage, study_name=args.study, key=key)
        bar = Progress(args.budget, self.direction, enabled=not args.quiet and not args.json,
                       done=search.done(), label="affinity tune")
        try:
            search.run(_objective(runner), args.budget, on_trial=bar.update)
        except KeyboardInterrupt:
            bar.close()
            return self._interrupted(search)
        bar.close()
        records = search.records()
        if not any(r.state == "complete" for r in records):
            bad = next((r for r in records if r.error), None)
            raise TuneError(f"every trial failed ({len(records)}): first {describe(bad.config) if bad else '-'}: "
                            f"{bad.error if bad else '-'}")
        try:
            rows = self._remeasure(runner, search)
        except KeyboardInterrupt:
            return self._interrupted(search)
        return self._finish(search, rows)

    def _interrupted(self, search: Search) -> int:
        n = sum(r.state == "complete" for r in search.records())
        where = f"kept in {self.storage} (study {search.study_name}): run the same command to resume" \
            if self.storage else "not kept (--storage none)"
        print(f"\naffinity tune: interrupted; {n} finished trial{'s' if n != 1 else ''} {where}", file=sys.stderr)
        best = search.best()
        if best is not None:
            print(f"best so far: {describe(best.config)} = {best.value:.4g}", file=sys.stderr)
        return 130

    def _remeasure(self, runner: CommandRunner, search: Search) -> list[tuple[str, dict | None, list[float]]]:
        """The defaults and the best ``--top`` configurations, ``--repeats`` rounds, interleaved."""
        plain = {n: self.space.choices(n)[0] for n in self.space.names if n not in KNOWN}
        sign = 1 if self.direction == "maximize" else -1
        done = sorted((r for r in search.records() if r.state == "complete"), key=lambda r: -sign * r.value)
        top: list[dict[str, Any]] = []
        for r in done:
            if r.config not in top:
                top.append(r.config)
            if len(top) >= self.args.top:
                break
        rows: list[tuple[str, dict | None, list[float]]] = [("defaults (CMD as it is)", None, [])]
        rows += [(f"#{i + 1} {describe(c)}", c, []) for i, c in enumerate(top)]
        quiet = self.args.quiet or self.args.json
        for rnd in range(self.args.repeats):
            if not quiet:
                print(f"affinity tune: re-measuring, round {rnd + 1} of {self.args.repeats}", file=sys.stderr)
            for _, cfg, vals in rows:
                m = runner.defaults(plain) if cfg is None else runner.trial(cfg)
                if m.value is not None:
                    vals.append(m.value)
        return rows

    def _finish(self, search: Search, rows: list[tuple[str, dict | None, list[float]]]) -> int:
        args = self.args
        sign = 1 if self.direction == "maximize" else -1
        measured = [r for r in rows[1:] if r[2]]
        base = rows[0][2]
        if not measured:
            raise TuneError("the best configurations failed when re-measured; see the trials")
        label, cfg, vals = max(measured, key=lambda r: sign * report.summarize(r[2])[0])
        med = report.summarize(vals)[0]
        cmp = report.compare(base, vals, self.direction) if base else None
        spread = (_rel(base), _rel(vals)) if base and len(base) > 1 and len(vals) > 1 else None
        result = search.result(baseline=report.summarize(base)[0] if base else None, command=self.command,
                               best=(cfg, med), spread=spread, significant=cmp.significant if cmp else None)
        if args.plot:
            report.save_plot(args.plot, result.trials, baseline=result.baseline, direction=self.direction,
                             unit=self.unit, title=f"affinity tune: {' '.join(self.command)[:70]}")
        if args.json:
            out = result.to_dict()
            out["remeasured"] = [{"label": lab, "config": c, "values": v} for lab, c, v in rows]
            out["verdict"] = cmp.verdict if cmp else None
            print(json.dumps(out, indent=2, default=str))
            return 0
        print(self._text(result, rows, cmp, search))
        return 0

    def _text(self, result: TuneResult, rows: list[tuple[str, dict | None, list[float]]],
              cmp: report.Comparison | None, search: Search) -> str:
        n = len(result.trials)
        lines = [f"affinity tune: {n} trials of {' '.join(self.command)} on {self.topology.describe()}",
                 f"study {search.study_name}" + (f" in {self.storage}" if self.storage else " (in memory)"),
                 "", report.table([(lab, v) for lab, _, v in rows], unit=self.unit, direction=self.direction), ""]
        if cmp is not None:
            lines.append(f"best vs defaults: {cmp.verdict}")
        lines += ["", "best as an affinity run line:", f"  {result.run_line}", "", "environment:"]
        lines += [f"  {line}" for line in result.env_block.splitlines()]
        lines += ["", "in Python:"] + [f"  {line}" for line in result.apply_call.splitlines()]
        if self.args.plot:
            lines += ["", f"plot: {self.args.plot}"]
        return "\n".join(lines)


def _rel(vals: Sequence[float]) -> float:
    med, lo, hi = report.summarize(vals)
    return (hi - lo) / med if med else 0.0


def _objective(runner: CommandRunner) -> Any:
    def objective(config: dict[str, Any]) -> float:
        m = runner.trial(config)
        if m.value is None:
            raise RuntimeError(f"{m.error}; output ends: {m.output[-400:]}")
        return m.value

    return objective


def _check_defaults(m: Measurement, command: list[str], args: argparse.Namespace) -> None:
    """CMD as it is must work and print the metric: else there is nothing to tune."""
    cmd = " ".join(command)
    if m.status != 0 or (m.error and "exit status" in m.error) or m.status == 127:
        raise TuneError(f"{cmd!r} fails as it is ({m.error or f'exit status {m.status}'}): fix it before "
                        f"tuning it. Its output ends:\n{m.output}")
    if m.value is None:
        what = f"a match of --metric {args.metric!r}" if args.metric else \
            "a number with images/sec, examples/sec, samples/sec or tokens/sec, or a JSON line's throughput"
        raise TuneError(f"no metric in the output of {cmd!r}: looked for {what}; give --metric REGEX or "
                        f"--time. Its output ends:\n{m.output}")
