"""``affinity tune``'s statistics and formatting: the speed-up of each round that measured
the defaults and a configuration side by side, its interval, and readable values."""

from __future__ import annotations

import pytest

from affinity.tools.tune_report import compare, fmt, reason, table


def test_the_speed_up_is_the_median_of_the_rounds_with_their_interval():
    c = compare([100, 110, 90], [150, 160, 140], "maximize")
    assert c.ratio == pytest.approx(1.5) and c.interval == (pytest.approx(1.4545, rel=1e-3), pytest.approx(1.5556, rel=1e-3))
    assert c.significant and c.verdict.startswith("1.50x faster (1.45x - 1.56x in 3 rounds)")


def test_a_round_that_disagrees_is_no_significant_difference():
    # medians differ by 1.4x, but in round 2 the defaults were as fast: not every round says faster
    c = compare([100, 150, 100], [140, 140, 145], "maximize")
    assert c.significant is False and c.verdict.startswith("no significant difference")


def test_minimize_slower_and_tiny_differences():
    c = compare([1.0, 1.0], [2.0, 2.1], "minimize")
    assert c.significant and c.verdict.startswith("2.05x slower (2.00x - 2.10x in 2 rounds)")
    c = compare([1.0, 1.0], [0.995, 0.996], "minimize")  # 0.5 % in every round: not worth a word
    assert c.significant is False
    assert compare([1.0], [0.5], "minimize").verdict == "2.00x (one round: spread unknown)"


def test_values_read_as_people_write_them():
    assert [fmt(v) for v in (15210.4, 1521.0, 999.96, 330.14, 50.0, 0.01234, 0.0, -0.0, 1.2e-5, None)] == \
        ["15,210", "1,521", "1,000", "330.1", "50.00", "0.01234", "0", "0", "0.00001200", "-"]


def test_values_and_the_ends_of_a_spread_keep_the_same_significant_digits():
    """The audit saw ``9.00e-04``, a spread ``9.90e-04 - 0.001358`` and ``1.02`` beside ``1.002``."""
    assert (fmt(0.0009), fmt(9.9e-4), fmt(0.001358), fmt(1.02), fmt(1.002)) == \
        ("0.0009000", "0.0009900", "0.001358", "1.020", "1.002")
    text = table([("defaults", [9.9e-4, 0.001358]), ("#1 a", [1.02, 1.002])], unit="seconds", direction="minimize")
    assert "0.0009900 - 0.001358" in text and "1.002 - 1.020" in text and "e-" not in text


def test_the_table_compares_each_row_round_by_round():
    text = table([("defaults", [100, 110]), ("#1 a", [150, 160]), ("#2 b", [])], unit="images/sec",
                 direction="maximize")
    lines = text.splitlines()
    assert "1.48x faster (1.45x - 1.50x in 2 rounds)" in lines[2] and lines[3].split()[-3:] == ["failed", "-", "-"]


def test_the_reason_of_a_failed_run_is_its_last_meaningful_line():
    tb = ("Traceback (most recent call last):\n  File \"f2.py\", line 2, in <module>\n"
          "    raise ValueError(\"this config is unsupported\")\nValueError: this config is unsupported\n"
          "    note: added by add_note\n\n")
    assert reason("warming up\n" + tb) == "ValueError: this config is unsupported"
    crash = "step 1\nSegmentation fault (core dumped)\n\n--- instance 1 ---\n"
    assert reason(crash) == "Segmentation fault (core dumped)"
    assert reason("\n \n") == ""

