"""``affinity.tune()`` on recorded/model surfaces: the budget is a hard cap, nothing outside
the space is tried, the same seed gives the same sequence, infeasible configurations are
recorded and not retried, an interrupted study resumes as if it had not been, the
result's forms, and every bad input."""

from __future__ import annotations

import math
import re
import sqlite3
import time

import pytest

from affinity.errors import AffinityError
from affinity.machine.topology import Topology
from affinity.tuning.search import TuneResult, infer_topology, tune
from affinity.errors import SpaceError, TuneError, TuneUsageError

SMALL = "bench16_resnet18"  # 100 configurations: instances x threads x affinity x membind


def _run(s, budget=10, seed=0, **kw):
    calls = []

    def objective(cfg):
        calls.append(dict(cfg))
        return s.value(cfg)

    res = tune(objective, s.space, budget=budget, seed=seed, topology=Topology.from_synthetic(s.topology),
               progress=False, **kw)
    return res, calls


@pytest.mark.parametrize("budget", [1, 3, 12])
def test_the_budget_is_a_hard_cap_and_nothing_outside_the_space_is_tried(surfaces, budget):
    s = surfaces("xeon2s_serving")
    res, calls = _run(s, budget=budget)
    assert len(calls) == len(res.trials) == budget
    for c in calls:
        assert list(c) == list(s.params) and all(c[n] in s.space[n] for n in s.params)
    assert len({tuple(c.values()) for c in calls}) == budget  # never the same configuration twice
    assert res.best_value == max(s.value(c) for c in calls)


def test_a_budget_larger_than_the_space_tries_each_configuration_once():
    space = {"threads": [1, 2, 4], "blocktime": [0, 1]}
    calls = []
    res = tune(lambda c: calls.append(c) or c["threads"] + c["blocktime"], space, budget=50, seed=1,
               topology=Topology.from_synthetic("package:1 [numa] core:4 pu:1"), progress=False)
    assert len(calls) == 6 and len({tuple(c.values()) for c in calls}) == 6
    assert res.best == {"threads": 4, "blocktime": 1}


def test_the_same_seed_gives_the_same_sequence(surfaces):
    s = surfaces("xeonphi_tf")
    a = _run(s, budget=8, seed=5)[1]
    b = _run(s, budget=8, seed=5)[1]
    assert a == b


def test_the_first_trial_is_the_seeds_rule_and_finds_the_best_of_the_16_cpu_measurements(surfaces):
    """On the surface calibrated on the 16-CPU machine (1x16 167, 16x1 330 images/sec), the
    rule instances x threads = cores, with the most instances, is tried first."""
    s = surfaces(SMALL)
    res, calls = _run(s, budget=3)
    assert calls[0]["instances"] * calls[0]["threads"] == 16
    assert res.best_value >= 0.97 * s.best


def test_infeasible_configurations_are_recorded_not_retried(surfaces):
    s = surfaces(SMALL)
    calls = []

    def objective(cfg):
        calls.append(tuple(cfg.values()))
        if cfg["instances"] >= 8:
            raise RuntimeError(f"cannot start {cfg['instances']} copies")
        if cfg["threads"] == 16:
            return None
        if cfg["threads"] == 8:
            return math.nan
        return s.value(cfg)

    res = tune(objective, s.space, budget=25, seed=2, topology=Topology.from_synthetic(s.topology), progress=False)
    assert len(calls) == 25 and len(set(calls)) == 25
    bad = [t for t in res.trials if t.state == "infeasible"]
    assert bad and all(t.value is None and t.error for t in bad)
    assert any("cannot start" in t.error for t in bad)
    assert res.best["instances"] < 8 and res.best["threads"] < 8


def test_every_configuration_infeasible_is_an_error_naming_the_first():
    def objective(cfg):
        raise ValueError("no such device")

    with pytest.raises(TuneError, match="no such device"):
        tune(objective, {"threads": [1, 2], "blocktime": [0, 1]}, budget=3, seed=0,
             topology=Topology.from_synthetic("package:1 [numa] core:2 pu:1"), progress=False)


def test_resume_after_interruption_continues_the_same_sequence(surfaces, tmp_path):
    """Ctrl-C (KeyboardInterrupt) in the 4th call: three trials are kept, the 4th is
    interrupted; the same call resumes, runs the 4th again and stops at the budget, and
    the whole sequence is the uninterrupted one."""
    s = surfaces("epyc_serving")
    topo = Topology.from_synthetic(s.topology)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    uninterrupted = _run(s, budget=9, seed=7)[1]
    calls: list = []
    stop = [4]

    def objective(cfg):  # the same function each time: the study is named after it
        calls.append(dict(cfg))
        if len(calls) == stop[0]:
            raise KeyboardInterrupt
        return s.value(cfg)

    with pytest.raises(KeyboardInterrupt):
        tune(objective, s.space, budget=9, seed=7, topology=topo, storage=url, progress=False)
    first, calls[:], stop[0] = list(calls), [], 0
    res = tune(objective, s.space, budget=9, topology=topo, storage=url, progress=False)
    assert len(calls) == 6  # 9 - the 3 kept
    assert first[:3] + calls == uninterrupted
    assert [t.state for t in res.trials].count("interrupted") == 1
    assert sum(t.state == "complete" for t in res.trials) == 9
    assert res.seed == 7  # the study's seed, used again
    calls[:] = []
    again = tune(objective, s.space, budget=9, topology=topo, storage=url, progress=False)
    assert calls == [] and again.best == res.best  # nothing left to do
    other = tune(lambda c: s.value(c), s.space, budget=2, topology=topo, storage=url, progress=False)
    assert other.study_name != res.study_name  # another objective: another study


def test_result_forms(surfaces):
    s = surfaces("xeon2s_tf")
    res, _ = _run(s, budget=3, baseline=10.0)
    assert isinstance(res, TuneResult)
    assert res.baseline == 10.0 and res.speedup == pytest.approx(res.best_value / 10.0)
    assert res.run_line.startswith("affinity run ") and " -t " in res.run_line
    assert f"-- env TF_NUM_INTRAOP_THREADS={res.best['intra']} " in res.run_line and res.run_line.endswith(" CMD")
    assert "export OMP_NUM_THREADS=" in res.env_block and "export KMP_AFFINITY=" in res.env_block
    assert res.environment["TF_NUM_INTRAOP_THREADS"] == str(res.best["intra"])
    compile(res.apply_call, "<apply_call>", "exec")
    assert "affinity.apply(" in res.apply_call
    d = res.to_dict()
    assert d["best"] == res.best and len(d["trials"]) == 3 and d["trials"][0]["state"] == "complete"
    assert "TuneResult: best" in str(res)
    assert res.trials[0].seconds is not None and res.trials[0].number == 0


def test_a_baseline_configuration_is_measured_within_the_budget(surfaces):
    s = surfaces(SMALL)
    default = {"instances": 1, "threads": 16, "affinity": "none", "membind": "none"}
    res, calls = _run(s, budget=4, baseline=default)
    assert calls[0] == default and len(calls) == 4
    assert res.baseline == s.value(default) and res.speedup > 1.5


def test_the_baseline_is_the_first_trial_never_tried_twice(tmp_path):
    """The audit saw baseline={"threads": 1} called twice (as the baseline and as a
    trial), result.trials list 2 of the 3 calls, and a baseline outside the space, or
    with an unknown name, passed to the objective."""
    calls = []
    topo = Topology.from_synthetic("package:1 [numa] core:4 pu:1")
    url = f"sqlite:///{tmp_path / 'b.db'}"

    def run(budget, baseline):
        return tune(lambda c: calls.append(dict(c)) or float(c["threads"]), {"threads": [1, 2, 4]}, budget=budget,
                    seed=0, topology=topo, baseline=baseline, storage=url)

    res = run(2, {"threads": 1})
    assert calls[0] == {"threads": 1} and len(calls) == 2
    res = run(3, {"threads": 1})  # resumed: the baseline's trial is read, not run again
    assert sorted(c["threads"] for c in calls) == [1, 2, 4]
    assert [t.config for t in res.trials] == calls and res.baseline == 1.0 and res.speedup == 4.0
    for bad, words in [({"threads": 3}, "baseline: threads=3 is not a choice of the space ([1, 2, 4])"),
                       ({"threadz": 1}, "baseline: unknown parameter 'threadz'; the space has threads"),
                       ({}, "baseline: no value for threads")]:
        with pytest.raises(TuneUsageError, match=re.escape(words)):
            run(3, bad)
    assert len(calls) == 3


def test_minimize_seconds(surfaces):
    s = surfaces(SMALL)
    res = tune(lambda c: 1000.0 / s.value(c), s.space, budget=3, seed=0, direction="minimize",
               topology=Topology.from_synthetic(s.topology), progress=False, baseline=1000.0 / 167.0)
    assert res.best_value == pytest.approx(1000.0 / s.best, rel=0.05)
    assert res.speedup > 1.5


def test_the_library_prints_nothing_and_reports_progress_when_asked(surfaces, capsys, caplog):
    s = surfaces(SMALL)
    seen = []
    tune(s.value, s.space, budget=2, seed=0, topology=Topology.from_synthetic(s.topology),
         progress=lambda rec, recs: seen.append((rec.number, len(recs))))
    assert seen == [(0, 1), (1, 2)]
    with caplog.at_level("INFO", logger="affinity.tuning"):
        tune(s.value, s.space, budget=2, seed=0, topology=Topology.from_synthetic(s.topology), progress=True)
    assert any("trial 2/2" in r.getMessage() and "best" in r.getMessage() for r in caplog.records)
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_a_space_for_a_bigger_machine_without_a_topology_is_read_as_a_flat_machine():
    here = Topology.from_synthetic("package:1 [numa] core:2 pu:1")
    topo, note = infer_topology({"instances": [1, 16], "threads": [1, 16]}, here)
    assert len(topo.cores) == 16 and "flat 16-core" in note
    assert infer_topology({"threads": [1, 2, 4]}, here) == (here, None)


@pytest.mark.parametrize("kw, error, words", [
    ({"budget": 0}, TuneUsageError, "budget must be a whole number >= 1"),
    ({"budget": -3}, TuneUsageError, "budget"),
    ({"budget": 2.5}, TuneUsageError, "budget"),
    ({"budget": True}, TuneUsageError, "budget"),
    ({"space": {}}, SpaceError, "empty"),
    ({"space": {"threads": []}}, SpaceError, "no choices"),
    ({"space": {"threads": [{"n": 1}]}}, SpaceError, "cannot be tuned"),
    ({"direction": "up"}, TuneUsageError, "direction"),
    ({"storage": "tune.db"}, TuneUsageError, "expected a URL"),
    ({"baseline": "fast"}, TuneUsageError, "baseline"),
])
def test_bad_input_is_refused_before_anything_runs(kw, error, words):
    calls = []
    args = {"space": {"threads": [1, 2]}, "budget": 3, **kw}
    with pytest.raises(error, match=words):
        tune(lambda c: calls.append(c) or 1.0, topology=Topology.from_synthetic("package:1 [numa] core:2 pu:1"),
             progress=False, **args)
    assert calls == []
    with pytest.raises(TuneUsageError, match="callable"):
        tune(42, {"threads": [1]})


def test_a_storage_file_that_is_not_a_study_is_refused_and_left_untouched(tmp_path):
    topo = Topology.from_synthetic("package:1 [numa] core:2 pu:1")
    text = tmp_path / "notes.txt"
    text.write_bytes(b"my precious notes\n")
    other = tmp_path / "other.db"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE accounts (id INTEGER, balance REAL)")
    con.execute("INSERT INTO accounts VALUES (1, 100.0)")
    con.commit()
    con.close()
    before = other.read_bytes()
    for path, words in ((text, "not a SQLite database"), (other, "something else")):
        with pytest.raises(TuneError, match=words) as e:
            tune(lambda c: 1.0, {"threads": [1, 2]}, budget=2, topology=topo, storage=f"sqlite:///{path}",
                 progress=False)
        assert isinstance(e.value, AffinityError) and str(path) in str(e.value)
    assert text.read_bytes() == b"my precious notes\n" and other.read_bytes() == before
    with pytest.raises(TuneUsageError, match="does not exist"):
        tune(lambda c: 1.0, {"threads": [1]}, budget=1, topology=topo,
             storage=f"sqlite:///{tmp_path / 'no' / 'such.db'}", progress=False)


def test_a_stored_study_refuses_another_space_or_seed(tmp_path):
    topo = Topology.from_synthetic("package:1 [numa] core:2 pu:1")
    url = f"sqlite:///{tmp_path / 's.db'}"
    tune(lambda c: float(c["threads"]), {"threads": [1, 2]}, budget=2, seed=1, topology=topo, storage=url,
         study_name="mine", progress=False)
    with pytest.raises(TuneUsageError, match="another space"):
        tune(lambda c: 1.0, {"threads": [1, 2, 4]}, budget=2, topology=topo, storage=url, study_name="mine",
             progress=False)
    with pytest.raises(TuneUsageError, match="seed 1"):
        tune(lambda c: 1.0, {"threads": [1, 2]}, budget=2, seed=2, topology=topo, storage=url, study_name="mine",
             progress=False)


def test_a_trial_left_running_by_a_killed_session_is_run_again(tmp_path, monkeypatch):
    """A session killed hard (no Ctrl-C) leaves its trial running in the storage, its
    heartbeat stops: once the grace period is over, the next session counts it as
    interrupted (optuna's fail_stale_trials), not against the budget."""
    from affinity.tuning import storage
    from affinity.tuning.search import Search
    from affinity.tuning.space import Space

    monkeypatch.setattr(storage, "GRACE_S", 1)
    monkeypatch.setattr(storage, "HEARTBEAT_S", 0.2)
    topo = Topology.from_synthetic("package:1 [numa] core:4 pu:1")
    space = {"threads": [1, 2, 4], "blocktime": [0, 1]}
    url = f"sqlite:///{tmp_path / 'k.db'}"
    killed = Search(Space.of(space), topo, seed=3, storage=url, study_name="k")
    left = killed.study.ask(killed._dists)  # the session dies while this one runs
    with killed._heartbeat(left.number):
        pass  # its last heartbeat
    time.sleep(1.5)
    calls = []
    res = tune(lambda c: calls.append(c) or float(c["threads"]), space, budget=3, topology=topo, storage=url,
               study_name="k", progress=False)
    assert len(calls) == 3 and {n: left.params[n] for n in space} in calls  # re-run (queued again)
    assert [t.state for t in res.trials] == ["interrupted", "complete", "complete", "complete"]


def test_the_library_writes_nothing_even_through_optuna(tmp_path):
    """optuna's own handler (bound to the real stderr, out of capsys's reach) stays silent:
    a new study, a stored one, and a resumed one."""
    import subprocess
    import sys

    code = ("import affinity\n"
            "t = 'synthetic:package:1 core:2 pu:1'\n"
            "f = lambda c: float(c['threads'])\n"
            "affinity.tune(f, {'threads': [1, 2]}, budget=2, topology=t)\n"
            f"affinity.tune(f, {{'threads': [1, 2]}}, budget=2, topology=t, storage='sqlite:///{tmp_path}/q.db')\n"
            f"affinity.tune(f, {{'threads': [1, 2]}}, budget=3, topology=t, storage='sqlite:///{tmp_path}/q.db')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r.stderr
