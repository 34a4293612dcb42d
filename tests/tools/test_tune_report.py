"""``affinity tune``'s statistics and formatting: the speed-up of each round that measured
the defaults and a configuration side by side, its interval, and readable values."""

from __future__ import annotations

import pytest

from affinity.tools.tune_report import compare, fmt, reason, summarize, table


def test_the_speed_up_is_the_ratio_of_the_figures_with_its_interval():
    c = compare([100, 101, 99], [150, 152, 148], "maximize")
    assert c.ratio == pytest.approx(summarize([150, 152, 148])[0] / summarize([100, 101, 99])[0])
    assert c.ratios == pytest.approx((1.5, 152 / 101, 148 / 99)) and c.significant
    assert c.text.startswith(f"{c.ratio:.2f}x faster (interval ") and c.text.endswith(", 3 rounds)")


def test_a_round_that_disagrees_is_no_significant_difference():
    # the figures differ by 1.2x, but in round 2 the defaults were as fast
    c = compare([100, 150, 100], [140, 140, 145], "maximize")
    assert c.significant is False and c.text.startswith("no significant difference")


def test_minimize_slower_and_tiny_differences():
    c = compare([1.0, 1.0, 1.0], [2.0, 2.1, 2.0], "minimize")
    assert c.significant and c.text.startswith("2.03x slower (interval ")
    c = compare([1.0, 1.0, 1.0], [0.995, 0.996, 0.995], "minimize")  # 0.5 % in every round: not worth a word
    assert c.significant is False
    assert compare([1.0], [0.5], "minimize").text == "2.00x (1 round: a verdict needs 3)"


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
    text = table([("defaults", [100, 110, 105]), ("#1 a", [150, 165, None]), ("#2 b", [None, None, None])],
                 unit="images/sec", direction="maximize")
    lines = text.splitlines()
    assert "geometric mean, higher is better" in lines[0]
    # the figure of #1 is its two runs' geometric mean; its verdict is the pairs' (2 rounds: none)
    assert lines[2].split()[2] == "157.3" and lines[2].endswith("1.50x (2 rounds: a verdict needs 3)")
    assert lines[3].split()[-3:] == ["failed", "-", "-"]


def test_the_reason_of_a_failed_run_is_its_last_meaningful_line():
    tb = ("Traceback (most recent call last):\n  File \"f2.py\", line 2, in <module>\n"
          "    raise ValueError(\"this config is unsupported\")\nValueError: this config is unsupported\n"
          "    note: added by add_note\n\n")
    assert reason("warming up\n" + tb) == "ValueError: this config is unsupported"
    crash = "step 1\nSegmentation fault (core dumped)\n\n--- instance 1 ---\n"
    assert reason(crash) == "Segmentation fault (core dumped)"
    assert reason("\n \n") == ""

