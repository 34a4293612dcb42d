"""The demo's comparison: defaults and pinned interleaved over rounds, medians and
spreads, and the tuner's verdict ("no significant difference" within the spread)."""

from __future__ import annotations

import pytest

from affinity.tools.rows import measure_row, row_text


def _workload(defaults: list[float], pinned: list[float]):
    calls: list[bool] = []
    it = {False: iter(defaults), True: iter(pinned)}

    def run(p: bool) -> dict:
        calls.append(p)
        return {"images_per_sec": next(it[p]), "side": p}

    return run, calls


def test_rounds_are_interleaved_and_overlapping_spreads_are_no_difference():
    # the numbers: one 10-batch run said "0.670"; interleaved runs overlap
    run, calls = _workload([361, 367, 290], [272, 246, 297])
    row = measure_row("TensorFlow resnet50", run, 3)
    assert calls == [False, True, True, False, False, True]  # alternating order, round by round
    assert row.defaults == (361, 367, 290) and row.pinned == (272, 246, 297)
    assert row.comparison.significant is False
    text = row_text(row)
    assert text[0] == "TensorFlow resnet50:"
    assert text[1] == "  defaults:             361.0 images/sec (spread 290.0-367.0 over 3 runs)"
    assert text[2] == "  pinned:               272.0 images/sec (spread 246.0-297.0 over 3 runs)"
    # the tuner's verdict on the rounds' paired ratios (0.75, 0.67, 1.02: no agreement)
    assert text[3] == "  pinned / defaults: no significant difference (0.75x; 0.67x - 1.02x in 3 rounds)"
    assert row.last == {"images_per_sec": 297, "side": True}


@pytest.mark.parametrize("defaults,pinned,verdict", [
    ([100, 105, 102], [150, 155, 152], "1.49x faster (1.48x - 1.50x in 3 rounds)"),
    ([150, 155, 152], [100, 105, 102], "1.49x slower (1.48x - 1.50x in 3 rounds)"),
])
def test_separated_spreads_are_a_result(defaults, pinned, verdict):
    run, _ = _workload(defaults, pinned)
    row = measure_row("x", run, 3)
    assert row.comparison.significant is True and row_text(row)[3].endswith(verdict)


def test_one_round_says_its_spread_is_unknown():
    run, _ = _workload([100], [120])
    text = row_text(measure_row("x", run, 1))
    assert text[1].endswith("(one run: spread unknown)") and "spread unknown" in text[3]
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        measure_row("x", run, 0)
