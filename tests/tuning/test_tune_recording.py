"""The recorded surface of this machine is honest: instances split one job (they are not
copies counted as speed), each configuration is the median of interleaved rounds, and the
file says how stable each median is and what else ran."""

from __future__ import annotations

import json
import statistics

import pytest

from helpers import ROOT

RECORDING = ROOT / "bench" / "surfaces" / "recorded_2cpu_torch_cnn.json"


@pytest.mark.parametrize("images", [2048, 2049, 7])
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_the_workload_splits_one_job_between_instances(monkeypatch, images, n):
    import torch_workload

    parts = []
    for i in range(n):
        monkeypatch.setenv("AFFINITY_INSTANCE", str(i))
        monkeypatch.setenv("AFFINITY_NUM_INSTANCES", str(n))
        parts.append(torch_workload.share(images))
    assert sum(parts) == images and max(parts) - min(parts) <= 1


def test_alone_the_workload_does_the_whole_job(monkeypatch):
    import torch_workload

    monkeypatch.delenv("AFFINITY_INSTANCE", raising=False)
    monkeypatch.delenv("AFFINITY_NUM_INSTANCES", raising=False)
    assert torch_workload.share(2048) == 2048


def test_spread_is_the_quartiles_over_the_median():
    import record

    assert record.spread([5.0, 1.0, 3.0, None, 2.0, 4.0]) == [pytest.approx(2 / 3, abs=1e-3),
                                                               pytest.approx(4 / 3, abs=1e-3)]
    assert record.spread([1.0]) == [None, None]
    assert record.median([1.0, None, None]) is None and record.median([1.0, 3.0, None]) == 2.0


def test_the_recording_is_a_split_job_timed_in_interleaved_rounds():
    d = json.loads(RECORDING.read_text())
    assert d["split"] and d["time"] and d["direction"] == "minimize"
    assert "{batch}" in d["command"] and "--images" in d["command"]
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
