"""``affinity tune``'s metric: the number read from a command's output."""

from __future__ import annotations

import pytest

from affinity.tools.tune_metric import compile_metric, parse_metric, parse_metrics
from affinity.errors import TuneUsageError


TF_BENCH = """Step\tImg/sec
1\timages/sec: 8589.7 +/- 0.0 (jitter = 0.0)
3\timages/sec: 8788.1 +/- 346.3 (jitter = 90.2)
----------------------------------------------------------------
total images/sec: 8774.84
----------------------------------------------------------------
intra_op_threads: 2  inter_op_threads: 2  pinned: no (TensorFlow defaults)
"""


@pytest.mark.parametrize("text, value", [
    (TF_BENCH, 8774.84),
    ("throughput: 330.5 images/sec\n", 330.5),
    ("12 examples/sec then 14 samples/s\n", 14.0),
    ("tokens/sec: 1,234.5\n", 1234.5),
    ("1.5e3 Images/Sec", 1500.0),
    ('{"throughput": 99.5, "loss": 1}\n', 99.5),
    ('250 images/sec\n{"throughput": 12}\n', 12.0),
    ('{"throughput": 12}\nlater 250 images/sec\n', 250.0),
    ("no rate here\n", None),
    ('{"throughput": "fast"}\n', None),
])
def test_the_default_metric(text, value):
    assert parse_metric(text) == value


def test_a_metric_pattern():
    assert parse_metric("acc=0.5\nacc=0.75\n", r"acc=([\d.]+)") == 0.75
    assert parse_metric("latency 12.5 ms", r"latency [\d.]+ ms") == 12.5  # no group: the number in the match
    assert parse_metric("nothing", r"acc=([\d.]+)") is None
    with pytest.raises(TuneUsageError, match="not a regular expression"):
        compile_metric("([")


def test_every_value_in_order_for_pruning():
    text = ("Step\tImg/sec\n1\timages/sec: 1074.1 +/- 0.0 (jitter = 0.0)\n"
            "10\timages/sec: 1053.6 +/- 123.5 (jitter = 23.0)\n"
            "------\ntotal images/sec: 1035.43\n")
    assert parse_metrics(text) == [1074.1, 1053.6, 1035.43]  # never the step numbers
    assert parse_metric(text) == 1035.43
    assert parse_metrics("a 5 images/sec\n{\"throughput\": 7}\nb 9 images/sec\n") == [5.0, 7.0, 9.0]
    assert parse_metrics("acc=0.5 acc=x acc=0.7", r"acc=([\d.]+)") == [0.5, 0.7]
