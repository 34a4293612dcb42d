"""Warm starts: a new study begins with what an earlier one learned, on this machine only.

A study (:class:`~affinity.tuning.search.Search`) that starts empty may first try
the best configurations of an earlier study: one named (``affinity tune --from
STUDY``, ``tune(warm_from=STUDY)``), or the newest study of the same storage that
was made on this machine and that ``same`` accepts (the CLI: the same command;
``tune()``: the same objective).  Only this machine's studies count -- the same
fingerprint, :func:`~affinity.tuning.search.machine_id` -- and only those of the
same direction: another machine's best is no evidence here.  The configurations
outside the new study's space are dropped by the search.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from ..errors import TuneUsageError
from ..record import record

__all__ = ["KEEP", "MACHINE_ATTR", "WarmSource", "WarmStart"]

#: configurations a warm start hands over: the best distinct ones of the source
KEEP = 3
#: the user attribute of a study that holds its machine's fingerprint
MACHINE_ATTR = "affinity.machine_id"


@record
class WarmSource:
    """Where a warm start came from: the study, its completed trials, the
    configurations handed over, and its user attributes (what it was made for)."""

    name: str
    trials: int
    best: tuple[dict[str, Any], ...]
    attrs: Mapping[str, Any]


class WarmStart:
    """``Search``'s ``warm`` hook: called with the new study's name, the best
    configurations of the source study (none when there is no source).

    Parameters
    ----------
    storage : str, optuna storage or None
        Where the studies are (``None``: in memory, nothing to start from).
    machine : str
        This machine's fingerprint (:func:`~affinity.tuning.search.machine_id`).
    direction : {"maximize", "minimize"}
        The new study's; a source must have the same.
    named : str, optional
        The source study, by name: refused (:class:`TuneUsageError`) when it is not
        in ``storage`` or was made on another machine.
    same : callable, optional
        Without ``named``: which of this machine's studies may be the source, from
        their user attributes; the newest accepted one that has a completed trial is.
    what : str
        How messages name the choice of ``named`` (``"--from X"``, ``"warm_from='X'"``).
    """

    def __init__(self, storage: Any, machine: str, direction: str, *, named: str | None = None,
                 same: Callable[[Mapping[str, Any]], bool] | None = None, what: str = "warm_from"):
        self.storage, self.machine, self.direction = storage, machine, direction
        self.named, self.same, self.what = named, same, what
        self.source: WarmSource | None = None
        self.asked = False  # called: the study is new
        self.empty = ""  # why the named study handed over nothing

    def check(self) -> None:
        """Refuse the named source (no storage, not in it, made on another machine)
        without reading its trials: for the command line, before CMD runs."""
        if self.named:
            self._check_named(self._summaries())

    def __call__(self, name: str, contains: Callable[[Mapping[str, Any]], bool] | None = None) -> list[dict[str, Any]]:
        """The best configurations of the source for the new study ``name``: the
        :data:`KEEP` best distinct ones that ``contains`` accepts (the new space's)."""
        self.asked = True
        summaries = self._summaries()
        from ._optuna import optuna  # lazy: loaded by the search already

        for src in self._candidates(summaries, name):
            study = optuna.load_study(study_name=src, storage=self.storage)
            best = self._best(study, contains)
            if best:
                done = sum(t.state.name == "COMPLETE" for t in study.get_trials(deepcopy=False))
                self.source = WarmSource(src, done, tuple(best), dict(summaries[src].user_attrs))
                return best
            self.empty = (f"is a {study.direction.name.lower()} study, this one {self.direction}s"
                          if study.direction.name.lower() != self.direction else
                          "has no completed configuration in this space" if contains is not None and self._best(study)
                          else "has no completed trial")
        return []

    def _summaries(self) -> dict[str, Any]:
        """The studies of the storage by name (none in memory: refused when one is named)."""
        if self.storage is None:
            if self.named:
                raise TuneUsageError(f"{self.what}: give the storage that holds study {self.named!r} "
                                     f"(an in-memory study starts from nothing)")
            return {}
        from ._optuna import optuna  # lazy: summaries only here

        return {s.study_name: s for s in optuna.get_all_study_summaries(self.storage, include_best_trial=False)}

    def _check_named(self, summaries: dict[str, Any]) -> None:
        """The named source is in the storage and was made on this machine."""
        src = summaries.get(self.named)
        if src is None:
            raise TuneUsageError(f"{self.what}: no study {self.named!r} in {self.storage}")
        if src.user_attrs.get(MACHINE_ATTR) != self.machine:
            raise TuneUsageError(f"{self.what}: study {self.named!r} was made on another machine "
                                 f"({src.user_attrs.get('affinity.machine', '?')}); warm starts use this "
                                 f"machine's results only")

    def _candidates(self, summaries: dict[str, Any], name: str) -> list[str]:
        """The source study named, checked; else this machine's accepted ones, newest first."""
        if self.named:
            self._check_named(summaries)
            return [self.named]
        if self.same is None:
            return []
        names = [n for n, s in summaries.items()
                 if n != name and s.user_attrs.get(MACHINE_ATTR) == self.machine and self.same(s.user_attrs)]
        return sorted(names, key=lambda n: summaries[n].datetime_start or datetime.min, reverse=True)

    def _best(self, study: Any, contains: Callable[[Mapping[str, Any]], bool] | None = None) -> list[dict[str, Any]]:
        """The :data:`KEEP` best distinct configurations of ``study`` that ``contains``
        accepts (none for the other direction): a best outside the new space takes no
        place from one inside it."""
        if study.direction.name.lower() != self.direction:
            return []
        done = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE" and t.value is not None]
        done.sort(key=lambda t: -t.value if self.direction == "maximize" else t.value)
        out: list[dict[str, Any]] = []
        for t in done:
            if dict(t.params) not in out and (contains is None or contains(dict(t.params))):
                out.append(dict(t.params))
            if len(out) == KEEP:
                break
        return out

    def said(self, tried: int, changes: list[str] | None = None) -> str:
        """What the output says of the warm start that handed over ``tried``
        configurations; ``changes``: what differs from the source (the CLI: the
        variables, files or metric).  A named source that gave nothing says why; ""
        when an unnamed one gave nothing."""
        if self.source is None or not tried:
            return f"{self.what}: nothing used: {self._unused()}" if self.named else ""
        what = f"; {'; '.join(changes)}" if changes else ""
        n = self.source.trials
        return (f"warm start from study {self.source.name} (this machine, {n} trial{'s' if n != 1 else ''}{what}): "
                f"its best {tried} configuration{'s' if tried != 1 else ''} tried first")

    def _unused(self) -> str:
        """Why the named source gave the study no configuration."""
        if not self.asked:
            return "the study resumes (a warm start only begins a new study)"
        if self.source is None:
            return f"study {self.named} {self.empty}"
        n = len(self.source.best)
        return f"none of study {self.named}'s best {n} configuration{'s' if n != 1 else ''} is in this space"
