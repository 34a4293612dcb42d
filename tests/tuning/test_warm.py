"""tune(warm_start=...): a new study in a storage starts from an earlier study's
best, on this machine and for the same objective only, and says so."""

from __future__ import annotations

import pytest

from affinity import tune
from affinity.errors import TuneUsageError

SPACE = {"threads": [1, 2, 4, 8], "blocktime": [0, 1, 200]}
TOPO = "synthetic:package:1 [numa] core:8 pu:1"


def peak(best_threads: int):
    """An objective that is best at ``best_threads`` (any blocktime)."""
    def objective(config: dict) -> float:
        return 100.0 - 10 * abs(config["threads"] - best_threads) + config["blocktime"] / 1000
    return objective


def another_objective(config: dict) -> float:
    return float(config["threads"])


def test_a_new_study_of_the_same_objective_starts_from_the_earlier_best(tmp_path):
    url = f"sqlite:///{tmp_path / 'w.db'}"
    obj = peak(2)
    first = tune(obj, SPACE, budget=12, topology=TOPO, storage=url, study_name="a", seed=1)
    assert first.best["threads"] == 2 and not any("warm start" in n for n in first.notes)
    calls = []
    second = tune(lambda c: calls.append(dict(c)) or obj(c), {**SPACE, "blocktime": [0, 1]}, budget=3,
                  topology=TOPO, storage=url, study_name="b", seed=1, warm_start="a")
    assert calls[0]["threads"] == 2  # a's best, tried first
    assert any(n.startswith("warm start from study a (this machine, 12 trials)") for n in second.notes), \
        second.notes
    # automatic: the same objective (its qualified name) on this machine; another objective is not
    again = tune(obj, SPACE, budget=2, topology=TOPO, storage=url, study_name="c", seed=2)
    assert again.trials[0].config["threads"] == 2 and any("warm start from study" in n for n in again.notes)
    other = tune(another_objective, SPACE, budget=2, topology=TOPO, storage=url, study_name="d", seed=2)
    assert not any("warm start" in n for n in other.notes)
    cold = tune(obj, SPACE, budget=2, topology=TOPO, storage=url, study_name="e", seed=2, warm_start=False)
    assert not any("warm start" in n for n in cold.notes)


def test_only_this_machines_studies(tmp_path):
    url = f"sqlite:///{tmp_path / 'w.db'}"
    tune(peak(4), SPACE, budget=6, topology="synthetic:package:2 [numa] core:4 pu:1", storage=url,
         study_name="elsewhere", seed=1)
    res = tune(peak(4), SPACE, budget=2, topology=TOPO, storage=url, study_name="here", seed=1)
    assert not any("warm start" in n for n in res.notes)  # another machine's study is no evidence
    with pytest.raises(TuneUsageError, match="made on another machine"):
        tune(peak(4), SPACE, budget=2, topology=TOPO, storage=url, study_name="here2", warm_start="elsewhere")
    with pytest.raises(TuneUsageError, match="no study 'nope'"):
        tune(peak(4), SPACE, budget=2, topology=TOPO, storage=url, study_name="here3", warm_start="nope")
    with pytest.raises(TuneUsageError, match="give the storage"):
        tune(peak(4), SPACE, budget=2, topology=TOPO, warm_start="elsewhere")


def test_the_warm_start_note_counts_what_the_budget_runs(tmp_path):
    """The audit saw "its best 3 configurations tried first" with a budget of 2, and "1 trials"."""
    url = f"sqlite:///{tmp_path / 'w.db'}"
    obj = peak(2)
    tune(obj, SPACE, budget=12, topology=TOPO, storage=url, study_name="a", seed=1)
    two = tune(obj, SPACE, budget=2, topology=TOPO, storage=url, study_name="b", seed=1, warm_start="a")
    assert any(n.endswith("its best 2 configurations tried first") for n in two.notes), two.notes
    tune(obj, SPACE, budget=1, topology=TOPO, storage=url, study_name="one", seed=1)
    again = tune(obj, SPACE, budget=1, topology=TOPO, storage=url, study_name="c", seed=1, warm_start="one")
    assert any("(this machine, 1 trial)" in n and n.endswith("its best 1 configuration tried first")
               for n in again.notes), again.notes


def test_a_named_source_that_gives_nothing_says_why(tmp_path):
    """The audit saw warm_start='a' (--from a) give nothing without a word."""
    url = f"sqlite:///{tmp_path / 'w.db'}"
    tune(peak(2), SPACE, budget=3, topology=TOPO, storage=url, study_name="a", seed=1)
    elsewhere = tune(peak(2), {"threads": [3, 5], "blocktime": [0]}, budget=1, topology=TOPO, storage=url,
                     study_name="b", warm_start="a")
    assert "warm_start='a': nothing used: study a has no completed configuration in this space" \
        in elsewhere.notes, elsewhere.notes
    tune(peak(2), SPACE, budget=1, topology=TOPO, storage=url, study_name="m", direction="minimize")
    other = tune(peak(2), SPACE, budget=1, topology=TOPO, storage=url, study_name="c", warm_start="m")
    assert "warm_start='m': nothing used: study m is a minimize study, this one maximizes" in other.notes
    resumed = tune(peak(2), SPACE, budget=4, topology=TOPO, storage=url, study_name="a", warm_start="b")
    assert "warm_start='b': nothing used: the study resumes (a warm start only begins a new study)" \
        in resumed.notes, resumed.notes


def test_the_best_outside_the_new_space_takes_no_place_from_one_inside(tmp_path):
    """The source's best 3 were taken before those outside the new space were dropped: a
    source whose 3 best have 4 threads handed a study without 4 threads nothing."""
    url = f"sqlite:///{tmp_path / 'w.db'}"
    tune(peak(4), SPACE, budget=len(SPACE["threads"]) * len(SPACE["blocktime"]), topology=TOPO, storage=url,
         study_name="all", seed=1)
    import optuna

    done = sorted(optuna.load_study(study_name="all", storage=url).get_trials(), key=lambda t: -t.value)
    top = done[0].params["threads"]
    assert all(t.params["threads"] == top for t in done[:len(SPACE["blocktime"])])  # the best share a count
    rest = [n for n in SPACE["threads"] if n != top]
    narrow = tune(peak(4), {"threads": rest, "blocktime": SPACE["blocktime"]}, budget=1, topology=TOPO,
                  storage=url, study_name="narrow", seed=1, warm_start="all")
    want = next(t.params for t in done if t.params["threads"] != top)
    assert narrow.trials[0].config == want, (narrow.trials[0].config, want, narrow.notes)
    assert any(n.endswith("its best 1 configuration tried first") for n in narrow.notes), narrow.notes
