"""A row of ``make demo``'s comparison: one workload with its framework's defaults
against pinned, measured in interleaved rounds, and said with medians, spreads and
the tuner's verdict ("no significant difference" unless every round agrees).

Shared by every framework's row (TensorFlow's in :mod:`affinity.tools.demo`,
PyTorch's in :mod:`affinity.tools.workload_torch`): a workload is a callable that
runs it once, ``workload(pinned)``, and returns its result.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
from collections.abc import Callable
from typing import Any

from ..record import record
from .tune_report import Comparison, compare

__all__ = ["Row", "hold_running", "measure_row", "row_text"]


@record
class Row:
    """One workload, defaults against pinned, measured in interleaved rounds."""

    label: str
    defaults: tuple[float, ...]  #: one throughput per round
    pinned: tuple[float, ...]
    comparison: Comparison  #: the tuner's verdict (:func:`affinity.tools.tune_report.compare`)
    last: dict[str, Any]  #: the last pinned run's result (thread counts, bind map)
    last_defaults: dict[str, Any]


def measure_row(label: str, workload: Callable[[bool], dict[str, Any]], rounds: int,
                key: str = "images_per_sec", progress: Callable[[str], None] | None = None) -> Row:
    """Run ``workload(pinned)`` ``rounds`` times each way, interleaved: round ``r``
    runs defaults then pinned, the next round pinned then defaults, so that a change
    of the machine's load falls on both sides alike.

    Parameters
    ----------
    workload : callable
        ``workload(False)`` runs with the framework's defaults, ``workload(True)``
        pinned; each returns a dict with ``key`` (a throughput: higher is better).
    rounds : int
        Runs per side (>= 1; 3 gives each side a spread).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    got: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for r in range(rounds):
        for pinned in ((False, True) if r % 2 == 0 else (True, False)):
            res = workload(pinned)
            got[pinned].append(res)
            if progress is not None:
                progress(f"  round {r + 1}/{rounds}, {'pinned' if pinned else 'defaults'}: "
                         f"{res[key]:.1f}")
    d = tuple(float(x[key]) for x in got[False])
    p = tuple(float(x[key]) for x in got[True])
    return Row(label=label, defaults=d, pinned=p, comparison=compare(d, p, "maximize"), last=got[True][-1],
               last_defaults=got[False][-1])


def row_text(row: Row, unit: str = "images/sec") -> list[str]:
    """The row as a reader sees it: each side's median and spread, the ratio, the verdict."""
    def side(values: tuple[float, ...]) -> str:
        med = statistics.median(values)
        spread = f" (spread {min(values):.1f}-{max(values):.1f} over {len(values)} runs)" if len(values) > 1 else \
            " (one run: spread unknown)"
        return f"{med:8.1f} {unit}{spread}"

    return [f"{row.label}:",
            f"  defaults:          {side(row.defaults)}",
            f"  pinned:            {side(row.pinned)}",
            f"  pinned / defaults: {row.comparison.verdict}"]


def hold_running(step: Callable[[], Any]) -> None:
    """Print ``{"holding": PID}`` and run ``step()`` until standard input ends: a
    workload kept running for ``affinity doctor PID`` to look at (``--hold``)."""
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    print(json.dumps({"holding": os.getpid()}), flush=True)
    while not done.is_set():
        step()
