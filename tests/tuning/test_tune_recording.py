"""The recorded surfaces of this machine are honest: instances split one job (they are not
copies counted as speed), each configuration is the median of interleaved rounds, and the
file says how stable each median is and what else ran."""

from __future__ import annotations

import json
import statistics

import pytest

from helpers import ROOT

RECORDINGS = {name: ROOT / "bench" / "surfaces" / f"{name}.json"
              for name in ("recorded_2cpu_torch_cnn", "recorded_2cpu_tf_matmul")}
WORKLOADS = ("torch_workload", "tf_workload")


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("images", [2048, 2049, 7])
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_the_workload_splits_one_job_between_instances(monkeypatch, workload, images, n):
    share = __import__(workload).share
    parts = []
    for i in range(n):
        monkeypatch.setenv("AFFINITY_INSTANCE", str(i))
        monkeypatch.setenv("AFFINITY_NUM_INSTANCES", str(n))
        parts.append(share(images))
    assert sum(parts) == images and max(parts) - min(parts) <= 1


@pytest.mark.parametrize("workload", WORKLOADS)
def test_alone_the_workload_does_the_whole_job(monkeypatch, workload):
    monkeypatch.delenv("AFFINITY_INSTANCE", raising=False)
    monkeypatch.delenv("AFFINITY_NUM_INSTANCES", raising=False)
    assert __import__(workload).share(2048) == 2048


def test_spread_is_the_quartiles_over_the_median():
    import record

    assert record.spread([5.0, 1.0, 3.0, None, 2.0, 4.0]) == [pytest.approx(2 / 3, abs=1e-3),
                                                               pytest.approx(4 / 3, abs=1e-3)]
    assert record.spread([1.0]) == [None, None]
    assert record.median([1.0, None, None]) is None and record.median([1.0, 3.0, None]) == 2.0


@pytest.mark.parametrize("name", RECORDINGS)
def test_the_recording_is_a_split_job_timed_in_interleaved_rounds(name):
    d = json.loads(RECORDINGS[name].read_text())
    assert d["split"] and d["time"] and d["direction"] == "minimize"
    assert "--images" in d["command"] and any(w.endswith("_workload.py") for w in d["command"])
    assert d["repeats"] >= 5 and len(d["load"]) == d["repeats"] + 1
    assert len(d["defaults_runs"]) == d["repeats"]
    n = len(d["params"])
    rows = {tuple(r[:n]): r[n] for r in d["rows"]}
    spreads = {tuple(r[:n]): r[n:] for r in d["spread"]}
    for r in d["runs"]:
        key, runs = tuple(r[:n]), r[n]
        assert len(runs) == d["repeats"]
        assert rows[key] == pytest.approx(statistics.median(v for v in runs if v is not None))
        q1, q3 = spreads[key]
        assert q1 <= 1.0 <= q3
