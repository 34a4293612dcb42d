"""The planner under seeded random settings (issue 42, point 6): ``plan()`` and
``plan_env()`` over five runtimes' grammars, three runtimes and six machines.

Every call answers or raises an :class:`~affinity.errors.AffinityError` (the documented
classes: SpecError, PlanError, TopologyError, ArgumentTypeError); none takes more than
2 s of this thread's CPU (CPU time, not the wall clock: other work on the machine does
not count); the caches stay within their bounds and the process does not grow past
64 MB over the run.  The probe of issue 42 found 8 AttributeError and 8 TypeError in
702,497 calls (an ``OMP_PLACES`` list, or ``OMP_PROC_BIND``, after a typeless
``KMP_AFFINITY=proclist=[...]``) and a place list of 2**31 copies that never ended.

``AFFINITY_FUZZ_SEED=N`` replays another sequence, ``AFFINITY_FUZZ_CASES=N`` runs more.
"""

from __future__ import annotations

import gc
import os
import random
import time
import traceback

from affinity.errors import AffinityError
from affinity.machine.topology import Topology
from affinity.planning import planner
from helpers import fuzz

SEED = int(os.environ.get("AFFINITY_FUZZ_SEED", "42"))
CASES = int(os.environ.get("AFFINITY_FUZZ_CASES", "2500"))
CPU_LIMIT_S = 2.0
GROWTH_LIMIT = 64 << 20


def _rss() -> int:
    gc.collect()
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_plan_and_plan_env_fuzz():
    rng = random.Random(SEED)
    topologies = {t: Topology.from_synthetic(t) for t in fuzz.TOPOLOGIES}
    failures, slow = [], []
    before = _rss()
    for i in range(CASES):
        name, kwargs = fuzz.plan_call(rng, topologies)
        start = time.thread_time()
        try:
            getattr(planner, name)(**kwargs)
        except AffinityError:
            pass
        except Exception as e:  # noqa: BLE001 - what the test looks for
            where = traceback.extract_tb(e.__traceback__)[-1]
            failures.append(f"case {i}: {type(e).__name__}: {e} at {where.filename}:{where.lineno} "
                            f"from {name}({kwargs!r})")
        spent = time.thread_time() - start
        if spent > CPU_LIMIT_S:
            slow.append(f"case {i}: {spent:.1f} s of CPU: {name}({kwargs!r})")
    grown = _rss() - before
    assert not failures, f"seed {SEED}: " + "\n".join(failures[:10])
    assert not slow, f"seed {SEED}: " + "\n".join(slow[:10])
    assert planner._read.cache_info().currsize <= planner._MAX_READS
    assert len(planner._BASES) <= planner._MAX_TOPOLOGIES
    assert all(len(store) <= planner._MAX_ENTRIES for _, store in planner._BASES.values())
    assert grown < GROWTH_LIMIT, f"seed {SEED}: the process grew by {grown >> 20} MB over {CASES} calls"
