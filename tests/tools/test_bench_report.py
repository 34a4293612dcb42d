"""``bench/report.py`` and ``bench/bench_torch.py`` say a speed-up as every face does
(:mod:`affinity.tuning.verdict`): the figure is the geometric mean of the rounds, the
ratio that of two figures, "faster"/"slower" only when the interval excludes 1, and a
conclusion computed from the numbers (the memory-binding one was a fixed sentence)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from affinity.tuning.verdict import geomean, paired, unpaired

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        import bench_torch
        import report
        yield report, bench_torch
    finally:
        sys.path.remove(str(BENCH))


def _row(name: str, data: list[float]) -> dict:
    return {"name": name, "group": "g", "stats": {"median": sorted(data)[len(data) // 2], "min": min(data),
                                                  "max": max(data), "q1": min(data), "q3": max(data),
                                                  "rounds": len(data), "data": data}}


def test_a_benchmark_table_says_each_row_against_the_reference_with_the_shared_statistic(bench):
    report, _ = bench
    rng = random.Random(3)
    ref = [1e-3 * (1 + 0.03 * rng.gauss(0, 1)) for _ in range(40)]
    slow = [2e-3 * (1 + 0.03 * rng.gauss(0, 1)) for _ in range(40)]
    same = [1e-3 * (1 + 0.03 * rng.gauss(0, 1)) for _ in range(40)]
    rows = [_row("t[hwloc-fresh]", ref), _row("t[lscpu-parse]", slow), _row("t[cached]", same)]
    lines = report._group_table("topology", rows, set())
    body = "\n".join(lines)
    assert f"| `t[lscpu-parse]` | {report._fmt_time(geomean(slow))} |" in body
    assert unpaired(ref, slow, "minimize", family=2).text in body and " slower (interval " in body
    assert unpaired(ref, same, "minimize", family=2).text in body
    # the conclusion is the same verdict, not a ratio of medians
    assert f"running lscpu is {unpaired(ref, slow, 'minimize', family=2).text}" in body


def test_the_pytorch_section_says_interleaved_rounds_as_paired_verdicts(bench):
    _, bench_torch = bench
    rng = random.Random(5)
    base = [800 * (1 + 0.3 * rng.gauss(0, 1)) for _ in range(8)]  # the load moves every round...
    rows = [{"label": "torch defaults", "values": base},
            {"label": "affinity apply()", "values": [v * 1.3 * (1 + 0.02 * rng.gauss(0, 1)) for v in base]},
            {"label": "OMP_PROC_BIND/OMP_PLACES by hand", "values": [v * (1 + 0.02 * rng.gauss(0, 1)) for v in base]},
            {"label": "train: torch defaults", "values": base}, {"label": "train: affinity layout", "values": base}]
    doc = {"machine": {"torch": "x", "cpus": 2, "date": "d"}, "spec": "compact", "threads": 2, "rounds": 8,
           "rows": rows}
    text = "\n".join(bench_torch.section(doc))
    # ...and falls on both sides of a round alike: paired, 1.3x is said faster
    v = paired(base, rows[1]["values"], "maximize", max_rounds=None, family=2)
    assert v.word == "faster" and f"`affinity apply()` against `torch defaults`: {v.text}." in text
    assert f"| {geomean(rows[1]['values']):.1f} |" in text


def test_the_memory_binding_conclusion_is_computed(bench):
    report, _ = bench
    same = [2.0 + 0.01 * k for k in range(6)]
    doc = {"machine": {"cpus": 2, "model": "m", "numa_nodes": 1, "date": "d"},
           "membind_check": {"unit": "GiB/s", "rows": [{"label": "default policy", "values": same},
                                                      {"label": "numactl --membind 0", "values": [v / 2 for v in same]}]}}
    text = "\n".join(report._launcher_effects(doc))
    assert "`numactl --membind 0` 2.00x slower (interval 2.00x-2.00x, 6 rounds)" in text
    assert "costs nothing measurable" not in text
    doc["membind_check"]["rows"][1]["values"] = list(same)
    assert "costs nothing measurable here" in "\n".join(report._launcher_effects(doc))
