"""A recording's hits are judged on its launch classes (bench/surfaces/harness.py):
labels that launch the same processes on the same CPUs are one configuration, valued
at the median of their pooled runs; the searchers still see each label's own median."""

from __future__ import annotations

import json
import statistics

import pytest


@pytest.fixture(scope="module")
def torch_cnn():
    import harness

    return json.loads((harness.HERE / "recorded_2cpu_torch_cnn.json").read_text())


def test_one_thread_on_a_one_cpu_share_is_one_launch_pinned_or_not(torch_cnn):
    import harness

    groups = [sorted(m) for m in harness.classes(torch_cnn).values()]
    assert [(2, 1, "compact", 8), (2, 1, "none", 8)] in groups
    # a team of two on both CPUs: pinned and unpinned threads are different launches
    assert not any((1, 2, "compact", 8) in g and (1, 2, "none", 8) in g for g in groups)
    # every label is in exactly one class
    assert sorted(k for g in groups for k in g) == sorted(tuple(r[:-1]) for r in torch_cnn["runs"])


def test_a_class_is_valued_at_the_median_of_its_pooled_runs(torch_cnn):
    import harness

    truth = harness.launch_classes(torch_cnn)
    runs = {tuple(r[:-1]): r[-1] for r in torch_cnn["runs"]}
    pair = [(2, 1, "compact", 8), (2, 1, "none", 8)]
    assert truth[pair[0]] == truth[pair[1]] == statistics.median(runs[pair[0]] + runs[pair[1]])
    alone = (1, 1, "none", 8)  # one thread in a two-CPU share: the OS may move it, pinned it may not
    assert truth[alone] == statistics.median(runs[alone])


def test_searchers_see_the_labels_and_hits_are_judged_on_the_classes():
    import harness

    pooled, plain = harness.load("recorded_2cpu_torch_cnn"), harness.load("recorded_2cpu_torch_cnn", pool=False)
    assert pooled.table == plain.table and plain.truth is None
    cfg = {"instances": 2, "threads": 1, "affinity": "compact", "batch": 8}
    assert pooled.value(cfg) == plain.value(cfg) != pooled.true_value(cfg)
    ev = harness._Evaluator(pooled, seed=0)
    assert ev(cfg) == pooled.value(cfg) and ev.true == [pooled.true_value(cfg)]


def test_models_are_judged_on_their_own_values():
    import harness

    s = harness.load("stress_plain")
    assert s.truth is None
    cfg = dict(zip(s.params, next(iter(s.table))))
    assert s.true_value(cfg) == s.value(cfg)
