"""The tuner's plot as a reader needs it: round ticks, a legend for every kind of
mark, the configurations of the trials that raised the best, and titles that keep
their spaces in PNG as in SVG."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET

import pytest
from PIL import Image

from affinity.tools import tune_report
from affinity.tools.tune_report import _ticks, save_plot
from affinity.tuning.search import TrialRecord

NS = {"s": "http://www.w3.org/2000/svg"}
TITLE = "python -m affinity bench --model small_cnn"


def _records() -> list[TrialRecord]:
    values = [117.4, 113.0, 103.9, None, 132.1, 129.3, 122.9, 137.8, 88.3, 126.7, 114.2, None]
    return [TrialRecord(i, {"threads": 1 + i % 2, "affinity": "compact" if i % 3 else "scatter"}, v, 1.0,
                        "complete" if v is not None else "infeasible", None if v is not None else "timeout")
            for i, v in enumerate(values)]


def _texts(svg: str) -> list[str]:
    return [t.text or "" for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")]


@pytest.mark.parametrize("lo,hi,want,decimals", [
    (80.94, 144.3, [90.0, 100.0, 110.0, 120.0, 130.0, 140.0], 0),
    (0.12, 0.57, [0.2, 0.3, 0.4, 0.5], 1),
    (1000.0, 9000.0, [2000.0, 4000.0, 6000.0, 8000.0], 0),
    (0.0, 16.0, [0.0, 2.5, 5.0, 7.5, 10.0, 12.5, 15.0], 1),
])
def test_ticks_are_round(lo, hi, want, decimals):
    ticks, d = _ticks(lo, hi)
    assert ticks == pytest.approx(want) and d == decimals


def test_the_plot_says_what_each_mark_is_and_which_configuration_won(tmp_path):
    path = tmp_path / "trials.svg"
    save_plot(str(path), _records(), baseline=100.0, unit="images/sec", title=TITLE)
    texts = _texts(path.read_text())
    assert TITLE in texts
    # ticks read as round numbers, no 136.4 / 73.79
    ticks = [t for t in texts if t.replace(",", "").isdigit()]
    assert {"100", "120", "140"} <= set(ticks)
    # a legend for the dots, the best-so-far line, the defaults and the red X
    for words in ("trial", "best so far", "defaults (as they are)", "failed trial (no value)"):
        assert words in texts, words
    # the trials that raised the best: marked #N on the plot and named under it, best first
    assert [t for t in texts if t.startswith("#") and "  " not in t] == ["#1", "#5", "#8"]
    named = [t for t in texts if t.startswith("#") and "  " in t]
    assert named == ["#8  137.8  threads=2 affinity=compact", "#5  132.1  threads=1 affinity=compact",
                     "#1  117.4  threads=1 affinity=scatter"]


def test_without_failures_or_defaults_the_legend_lists_neither(tmp_path):
    path = tmp_path / "trials.svg"
    save_plot(str(path), [r for r in _records() if r.value is not None], unit="s", direction="minimize")
    texts = _texts(path.read_text())
    assert "failed trial (no value)" not in texts and "defaults (as they are)" not in texts


def test_png_titles_keep_their_spaces(tmp_path):
    """Drawn with the TrueType font every PNG of the package uses: the title's width
    is that of the text with its spaces (the old bitmap font drew them zero-wide)."""
    font = tune_report.__dict__  # noqa: F841  (the module is what is tested)
    from affinity.tools.picture import png_font

    f = png_font(14, sans=True)
    assert f.getlength(TITLE) > f.getlength(TITLE.replace(" ", "")) + 5 * 3
    path = tmp_path / "trials.png"
    save_plot(str(path), _records(), baseline=100.0, title=TITLE)
    with Image.open(io.BytesIO(path.read_bytes())) as img:
        assert img.size[0] == 720 and img.size[1] > 400  # the legend and the names below the axes
