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
    # the trials that raised the best: marked tN on the plot (trial N: the table's #N is a rank) and
    # named under it, best first
    assert [t for t in texts if t[:1] == "t" and t[1:].isdigit()] == ["t1", "t5", "t8"]
    named = [t for t in texts if t.startswith("trial ")]
    assert named == ["trial 8  137.8  threads=2 affinity=compact", "trial 5  132.1  threads=1 affinity=compact",
                     "trial 1  117.4  threads=1 affinity=scatter"]


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


def _lines(svg: str) -> list[dict]:
    return [e.attrib for e in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}line")]


def test_the_plot_shows_the_tables_figures_beside_the_trials(tmp_path):
    """The audit: the plot's defaults line sat above every trial while the table said
    #1 was 1.15x faster.  The trials are single runs of the search; the table's rows
    are runs taken again afterwards, round by round -- under noise the two disagree,
    and nothing on the plot showed the table's figures.  Now the defaults line is the
    table's defaults figure and the table's rows stand beside the trials, #1's bar
    above the line when the table says faster."""
    trials = [TrialRecord(i, {"affinity": a}, v, 1.0, "complete", None)
              for i, (a, v) in enumerate([("none", 951.0), ("compact", 968.0), ("none", 940.0)])]
    rows = [("defaults (CMD as it is)", [1000.0, 1001.0, 999.0]), ("#1 affinity=compact", [1160.0, 1161.0, 1159.0]),
            ("#2 affinity=none", [1000.0, None, 1012.0])]
    assert all(t.value < tune_report.summarize(rows[0][1])[0] for t in trials)  # the audit's picture
    text = tune_report.table(rows, unit="images/sec", direction="maximize")
    assert "1.16x faster" in text.splitlines()[2]
    path = tmp_path / "trials.svg"
    save_plot(str(path), trials, unit="images/sec", remeasured=rows)
    svg = path.read_text()
    texts = _texts(svg)
    for (label, vals), line in zip(rows, text.splitlines()[1:]):
        figure = line[len(label):].split()[0]  # the table's figure of that row
        n = sum(v is not None for v in vals)
        assert f"re-measured {label}: {figure} ({n} rounds)" in texts, (label, figure)
    assert "re-measured" in texts and "defaults (the table's figure)" in texts
    dashed = [ln for ln in _lines(svg) if ln.get("stroke-dasharray") and ln.get("stroke") == "#888"]
    bars = [ln for ln in _lines(svg) if ln.get("stroke-width") == "2.5" and float(ln["x1"]) > 500]
    assert len(dashed) == 2 and len(bars) == 3  # the defaults line and its legend; one bar per row
    line_y = float(dashed[0]["y1"])
    assert float(bars[0]["y1"]) == pytest.approx(line_y, abs=0.06)  # the defaults' bar is on the line
    assert float(bars[1]["y1"]) < line_y  # #1 above it (higher is better), as the table says
    assert all(float(d.attrib["cy"]) > line_y for d in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}circle")
               if d.attrib["fill"] == "#1f5fbf" and d.attrib["r"] == "4" and float(d.attrib["cx"]) < 500)
