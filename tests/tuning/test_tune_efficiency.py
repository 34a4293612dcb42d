"""Sample efficiency, test-sized: on small surfaces, the median over 10 seeds of the
evaluations this tuner needs to come within 3 % of the best is at most half of what
plain optuna TPE (``TPESampler(seed=s)``, defaults) needs.  ``bench/bench_tune.py`` runs
the full comparison (more and larger surfaces, random search too)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("name", ["bench16_resnet18", "xeon2s_serving", "stress_plain"])
def test_half_the_evaluations_of_plain_tpe(surfaces, name):
    import harness

    s = surfaces(name)
    counts = harness.compare(s, seeds=range(10), budget=min(s.size, 150), methods=("affinity", "tpe"))
    mine, tpe = harness.median(counts["affinity"]), harness.median(counts["tpe"])
    assert mine <= tpe / 2, f"{name}: affinity {counts['affinity']} vs plain TPE {counts['tpe']}"
