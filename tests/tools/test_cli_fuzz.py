"""The command line under seeded random words (issue 42, point 6): ``affinity plan``,
``affinity run --dry-run`` and ``affinity topology`` on described machines (nothing is
applied or started), with random specs, variables and options.

Each command line ends with status 0, 1 (one line of error) or 2 (a usage error), never
an exception; none takes more than 2 s of this thread's CPU (not the wall clock); the
process does not grow past 64 MB over the run.  ``AFFINITY_FUZZ_SEED=N`` replays another
sequence, ``AFFINITY_FUZZ_CASES=N`` runs more.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import random
import time
import traceback

from affinity.tools.cli import main
from helpers import fuzz

SEED = int(os.environ.get("AFFINITY_FUZZ_SEED", "42"))
CASES = int(os.environ.get("AFFINITY_FUZZ_CASES", "300"))


def _rss() -> int:
    gc.collect()
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _one(words: list[str]) -> tuple[object, str]:
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            status: object = main(words)
    except SystemExit as e:
        status = e.code
    return status, err.getvalue()


def test_cli_fuzz():
    rng = random.Random(SEED)
    failures = []
    before = _rss()
    for i in range(CASES):
        words = fuzz.cli_words(rng)
        start = time.thread_time()
        try:
            status, err = _one(words)
        except Exception as e:  # noqa: BLE001 - what the test looks for
            where = traceback.extract_tb(e.__traceback__)[-1]
            failures.append(f"case {i}: {type(e).__name__}: {e} at {where.filename}:{where.lineno}: {words}")
            continue
        spent = time.thread_time() - start
        said = [line for line in err.splitlines() if ": error: " in line]
        if status not in (0, 1, 2):
            failures.append(f"case {i}: status {status!r}: {words}")
        elif status in (1, 2) and len(said) != 1:
            failures.append(f"case {i}: status {status} with {len(said)} error lines: {words}\n{err[-600:]}")
        if spent > 2.0:
            failures.append(f"case {i}: {spent:.1f} s of CPU: {words}")
    grown = _rss() - before
    assert not failures, f"seed {SEED}: " + "\n".join(failures[:10])
    assert grown < 64 << 20, f"seed {SEED}: the process grew by {grown >> 20} MB over {CASES} command lines"
