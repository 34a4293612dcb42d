"""The demo's comparison: defaults and pinned interleaved round by round until the
verdict is settled, each side's figure and spread, and the verdict whose ratio is the
ratio of the two figures (:mod:`affinity.tuning.verdict`)."""

from __future__ import annotations

import pytest

from affinity.tools.rows import DEMO_ROUNDS, measure_row, row_text


def _workload(defaults: list[float], pinned: list[float]):
    calls: list[bool] = []
    it = {False: iter(defaults), True: iter(pinned)}

    def run(p: bool) -> dict:
        calls.append(p)
        return {"images_per_sec": next(it[p]), "side": p}

    return run, calls


def test_rounds_are_interleaved_and_go_on_while_the_interval_holds_one():
    # the numbers: one 10-batch run said "0.670"; interleaved runs overlap
    run, calls = _workload([361, 367, 290, 300, 350, 340], [272, 246, 297, 310, 330, 335])
    row = measure_row("TensorFlow resnet50", run)
    assert calls == [False, True, True, False] * 3  # alternating order, round by round, to the maximum
    assert len(row.defaults) == DEMO_ROUNDS and row.comparison.significant is False
    text = row_text(row)
    assert text[0] == "TensorFlow resnet50:"
    assert text[1] == "  defaults:             333.3 images/sec (spread 290.0-367.0 over 6 runs)"
    assert text[2] == "  pinned:               296.6 images/sec (spread 246.0-335.0 over 6 runs)"
    # the verdict's ratio is the ratio of the two figures shown above it
    assert text[3].startswith("  pinned / defaults: no significant difference (0.89x; interval ")
    assert f"{296.6 / 333.3:.2f}x" == "0.89x" and text[3].endswith(", 6 rounds)")
    assert text[4].startswith("  (figures: geometric means of the runs; the ratio is theirs, the geometric mean "
                              "of the per-round ratios 0.75 0.67 1.02 1.03 0.94 0.99)")
    assert row.last == {"images_per_sec": 335, "side": True}


@pytest.mark.parametrize("defaults,pinned,verdict", [
    ([100, 101, 100], [150, 151, 150], "1.50x faster (interval 1.47x-1.53x, 3 rounds)"),
    ([150, 151, 150], [100, 101, 100], "1.50x slower (interval 1.47x-1.53x, 3 rounds)"),
])
def test_a_settled_difference_stops_at_the_third_round(defaults, pinned, verdict):
    run, calls = _workload(defaults, pinned)
    row = measure_row("x", run)
    assert len(calls) == 6 and row.comparison.significant is True and row_text(row)[3].endswith(verdict)


def test_one_round_says_its_spread_is_unknown():
    run, _ = _workload([100], [120])
    text = row_text(measure_row("x", run, 1))
    assert text[1].endswith("(one run: spread unknown)") and text[3].endswith("1.20x (1 round: a verdict needs 3)")
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        measure_row("x", run, 0)
