"""A row of ``make demo``'s comparison: one workload with its framework's defaults
against pinned, measured in interleaved rounds until the verdict is settled, and
said with each side's figure and spread, the ratio of the two figures and the
verdict -- the statistic every face shares (:mod:`affinity.tuning.verdict`).

Shared by every framework's row (TensorFlow's in :mod:`affinity.tools.demo`,
PyTorch's in :mod:`affinity.tools.workload_torch`): a workload is a callable that
runs it once, ``workload(pinned)``, and returns its result.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from ..record import record
from ..tuning.verdict import Verdict, geomean, more_rounds, paired

__all__ = ["DEMO_ROUNDS", "Row", "hold_running", "measure_row", "row_text"]

#: the demo's most rounds of one row: the looks it allows share the 1 % (fewer
#: looks than the tuner's 10 leave each a wider share; a row stops early once settled)
DEMO_ROUNDS = 6


@record
class Row:
    """One workload, defaults against pinned, measured in interleaved rounds."""

    label: str
    defaults: tuple[float, ...]  #: one throughput per round
    pinned: tuple[float, ...]
    comparison: Verdict  #: pinned against defaults (:func:`affinity.tuning.verdict.paired`)
    last: dict[str, Any]  #: the last pinned run's result (thread counts, bind map)
    last_defaults: dict[str, Any]


def measure_row(label: str, workload: Callable[[bool], dict[str, Any]], rounds: int = DEMO_ROUNDS,
                key: str = "images_per_sec", progress: Callable[[str], None] | None = None) -> Row:
    """Run ``workload(pinned)`` once each way per round, interleaved: round ``r``
    runs defaults then pinned, the next round pinned then defaults, so that a change
    of the machine's load falls on both sides alike; rounds continue until the
    interval of pinned/defaults excludes 1 or ``rounds`` are done
    (:func:`affinity.tuning.verdict.more_rounds`).

    Parameters
    ----------
    workload : callable
        ``workload(False)`` runs with the framework's defaults, ``workload(True)``
        pinned; each returns a dict with ``key`` (a throughput: higher is better).
    rounds : int
        The most rounds (>= 1; a verdict needs 3).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    got: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    r = 0
    while True:
        for pinned in ((False, True) if r % 2 == 0 else (True, False)):
            res = workload(pinned)
            got[pinned].append(res)
            if progress is not None:
                progress(f"  round {r + 1} (at most {rounds}), {'pinned' if pinned else 'defaults'}: "
                         f"{res[key]:.1f}")
        r += 1
        verdict = paired([x[key] for x in got[False]], [x[key] for x in got[True]], "maximize", max_rounds=rounds)
        if not more_rounds(verdict, rounds):
            break
    d = tuple(float(x[key]) for x in got[False])
    p = tuple(float(x[key]) for x in got[True])
    return Row(label=label, defaults=d, pinned=p, comparison=verdict, last=got[True][-1],
               last_defaults=got[False][-1])


def row_text(row: Row, unit: str = "images/sec") -> list[str]:
    """The row as a reader sees it: each side's figure (the geometric mean of its
    runs) and spread, the verdict, whose ratio is the ratio of the two figures, and
    the per-round ratios it is made of."""
    def side(values: tuple[float, ...]) -> str:
        spread = f" (spread {min(values):.1f}-{max(values):.1f} over {len(values)} runs)" if len(values) > 1 else \
            " (one run: spread unknown)"
        return f"{geomean(values):8.1f} {unit}{spread}"

    ratios = " ".join(f"{x:.2f}" for x in row.comparison.ratios)
    return [f"{row.label}:",
            f"  defaults:          {side(row.defaults)}",
            f"  pinned:            {side(row.pinned)}",
            f"  pinned / defaults: {row.comparison.text}",
            f"  (figures: geometric means of the runs; the ratio is theirs, the geometric mean of the "
            f"per-round ratios {ratios})"]


def hold_running(step: Callable[[], Any]) -> None:
    """Print ``{"holding": PID}`` and run ``step()`` until standard input ends: a
    workload kept running for ``affinity doctor PID`` to look at (``--hold``)."""
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    print(json.dumps({"holding": os.getpid()}), flush=True)
    while not done.is_set():
        step()
