"""How ``affinity tune`` shows a search: the progress line, the final table, the plot of the trials.

* :class:`Progress`: one line per trial (rewritten in place on a terminal) with a
  bar, the best so far and the last trial;
* :func:`summarize`, :func:`compare`: the figure (geometric mean) and spread of
  repeated measurements, and the speed-up of a configuration measured round by
  round beside the defaults, with its interval and verdict -- the statistic every
  face shares, :mod:`affinity.tuning.verdict`;
* :func:`fmt`: values as people read them (``15,210``, not ``1.521e+04``);
* :func:`reason`: the line of a failed run's output that says why;
* :func:`table`: defaults vs the re-measured best configurations;
* :func:`save_plot`: the trials, the best so far and the defaults, as SVG (no
  dependency) or PNG (Pillow, the ``picture`` extra).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from ..errors import TuneError, TuneUsageError
from ..record import record
from ..tuning.space import describe
from ..tuning.verdict import MAX_ROUNDS, Verdict, geomean, paired

__all__ = ["Progress", "compare", "fmt", "reason", "save_plot", "summarize", "table"]


#: significant digits of a value that is not a whole number below 1,000
DIGITS = 4


def fmt(v: float | None) -> str:
    """A measured value as people read it, never in e-notation: 1,000 and above whole,
    with separators (``15,210``); below, :data:`DIGITS` significant digits, trailing
    zeros kept so that values compare at a glance (``1.020`` beside ``1.002``,
    ``0.0009900`` beside ``0.001358``, ``50.00``)."""
    if v is None:
        return "-"
    if v == 0 or not math.isfinite(v):
        return "0" if v == 0 else str(v)
    rounded = float(f"{v:.{DIGITS - 1}e}")
    if abs(rounded) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{max(0, DIGITS - 1 - math.floor(math.log10(abs(rounded))))}f}"


_TRACEBACK = "Traceback (most recent call last):"


def reason(output: str) -> str:
    """The line of a failed run's ``output`` that says why: a Python traceback's
    exception line (``ValueError: ...``, the first unindented line after the last
    traceback), else the last non-empty line; "" when it printed nothing."""
    lines = [ln.rstrip() for ln in output.splitlines()
             if ln.strip() and not ln.startswith("--- instance ")]
    starts = [i for i, ln in enumerate(lines) if ln.startswith(_TRACEBACK)]
    if starts:
        said = next((ln for ln in lines[starts[-1] + 1:] if not ln[0].isspace()), None)
        if said is not None:
            return said
    return lines[-1] if lines else ""


class Progress:
    """The progress line of a search.

    Parameters
    ----------
    budget : int
        Trials in all.
    direction : {"maximize", "minimize"}
        Which values are better.
    enabled : bool
        False: say nothing.
    stream : file, optional
        Default ``sys.stderr``.
    label : str
        The line's first word.
    """

    def __init__(self, budget: int, direction: str, *, enabled: bool = True,
                 stream: TextIO | None = None, label: str = "tune"):
        self.budget, self.direction, self.enabled = budget, direction, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.label = label
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._open = False

    def _say(self, text: str, *, inplace: bool = False) -> None:
        if inplace and self.tty:
            self.stream.write("\r\x1b[K" + text)
            self._open = True
        else:
            if self._open:
                self.stream.write("\n")
                self._open = False
            self.stream.write(text + "\n")
        self.stream.flush()

    def update(self, record: Any, records: Sequence[Any]) -> None:
        """Show trial ``record`` and the best of ``records``."""
        if not self.enabled:
            return
        done = sum(r.state != "interrupted" for r in records)
        ok = [r for r in records if r.state == "complete"]
        sign = 1 if self.direction == "maximize" else -1
        best = max(ok, key=lambda r: sign * r.value) if ok else None
        width = 20
        filled = min(width, round(width * done / max(self.budget, 1)))
        last = fmt(record.value) if record.state == "complete" else record.state
        secs = f" in {record.seconds:.1f} s" if record.seconds is not None else ""
        text = (f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{self.budget}  "
                f"best {fmt(best.value) if best else '-'} ({describe(best.config) if best else '-'})  "
                f"last {last}{secs}")
        self._say(text, inplace=True)

    def close(self) -> None:
        """End the line."""
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False


# ------------------------------------------------------------------ statistics

def summarize(values: Sequence[float | None]) -> tuple[float, float, float]:
    """(figure, min, max) of repeated measurements (None: a round that failed, left
    out): the figure is their geometric mean (:func:`affinity.tuning.verdict.geomean`),
    whose ratio is the speed-up every face prints."""
    vals = [float(v) for v in values if v is not None]
    return geomean(vals), min(vals), max(vals)


def compare(defaults: Sequence[float | None], other: Sequence[float | None], direction: str, *,
            max_rounds: int = MAX_ROUNDS, family: int = 1) -> Verdict:
    """A configuration against the defaults, round by round: :func:`affinity.tuning.verdict.paired`
    (``defaults[i]`` and ``other[i]`` measured in round ``i``; None: that run failed)."""
    return paired(defaults, other, direction, max_rounds=max_rounds, family=family)


def table(rows: Sequence[tuple[str, Sequence[float | None]]], *, unit: str, direction: str,
          max_rounds: int = MAX_ROUNDS, family: int | None = None) -> str:
    """Defaults vs re-measured configurations.

    Parameters
    ----------
    rows : sequence of (label, rounds)
        The defaults first; each row's value in each round (None: not run or failed
        in that round), rounds aligned across rows.
    unit : str
        What the values are (``images/sec``, ``seconds``).
    direction : {"maximize", "minimize"}
        Which values are better.
    max_rounds, family : int
        The most rounds the re-measure allows, and how many configurations are
        compared with the defaults (default: the rows after the first):
        :func:`affinity.tuning.verdict.paired`.

    Returns
    -------
    str
        One line per row: its figure (the geometric mean of its rounds), spread
        (min-max), and the verdict against the defaults, whose ratio is the ratio
        of the two figures.
    """
    better = "lower" if direction == "minimize" else "higher"
    head = ("", f"{unit} (geometric mean, {better} is better)", "spread", "vs defaults")
    lines = [head]
    base = list(rows[0][1]) if rows else []
    k = family if family is not None else max(1, len(rows) - 1)
    for i, (label, vals) in enumerate(rows):
        n = sum(v is not None for v in vals)
        if not n:
            lines.append((label, "failed", "-", "-"))
            continue
        fig, lo, hi = summarize(vals)
        spread = f"{fmt(lo)} - {fmt(hi)}" if n > 1 else "(1 run)"
        verdict = "1.00" if i == 0 else compare(base, vals, direction, max_rounds=max_rounds, family=k).text \
            if any(v is not None for v in base) else "-"
        lines.append((label, fmt(fig), spread, verdict))
    widths = [max(len(row[j]) for row in lines) for j in range(4)]
    return "\n".join("  ".join(c.ljust(w) if j in (0, 3) else c.rjust(w) for j, (c, w) in
                               enumerate(zip(row, widths))).rstrip() for row in lines)


# ------------------------------------------------------------------ the plot

_W, _H, _L, _R, _T, _B = 720, 400, 70, 20, 40, 50
_BEST, _DOT, _FAILED, _DEFAULTS = "#2a9d55", "#1f5fbf", "#c0392b", "#888"
_LABELLED = 4  #: configurations named under the plot: the last improvements of the best


def _ticks(lo: float, hi: float, most: int = 8) -> tuple[list[float], int]:
    """Round tick values in ``[lo, hi]`` (steps of 1, 2, 2.5 or 5 times a power of
    ten, at most ``most``) and the decimals that show them all alike."""
    span = hi - lo
    raw = span / max(1, most - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    ticks = [first + k * step for k in range(int((hi - first) / step + 1e-9) + 1)]
    decimals = max(0, -math.floor(math.log10(step) + 1e-9) + (1 if step / mag == 2.5 else 0))
    return ticks, decimals


def _improvements(ok: Sequence[Any], sign: int) -> list[Any]:
    """The trials that raised the best so far, in order."""
    out, best = [], None
    for r in sorted(ok, key=lambda r: r.number):
        if best is None or sign * r.value > sign * best:
            best = r.value
            out.append(r)
    return out


def _legend(y: float, baseline: float | None, failed: bool, remeasured: bool) -> tuple[list[tuple[Any, ...]], float]:
    """What each mark of the plot is, in rows that fit the width; and the last row's y."""
    out: list[tuple[Any, ...]] = []
    x = _L
    items: list[tuple[str, str]] = [("dot", "trial"), ("best", "best so far")]
    if baseline is not None:
        items.append(("defaults", "defaults (the table's figure)" if remeasured else "defaults (as they are)"))
    if failed:
        items.append(("cross", "failed trial (no value)"))
    if remeasured:
        items.append(("bar", "re-measured: rounds and figure"))
    for kind, text in items:
        width = 24 + round(6.5 * len(text)) + 22
        if x > _L and x + width - 22 > _W - _R:
            x, y = _L, y + 17
        if kind == "dot":
            out.append(("dot", x + 8, y - 4, 4, _DOT))
        elif kind == "cross":
            out.append(("cross", x + 8, y - 4, 4, _FAILED))
        elif kind == "bar":
            out += [("dot", x + 9, y - 4, 3, _BEST), ("line", x, y - 4, x + 18, y - 4, _BEST, 2.5, False)]
        else:
            color, lw, dashed = (_BEST, 2, False) if kind == "best" else (_DEFAULTS, 1.5, True)
            out.append(("line", x, y - 4, x + 18, y - 4, color, lw, dashed))
        out.append(("text", x + 24, y, text, 11, "start", "#222"))
        x += width
    return out, y


#: the width of the panel of re-measured rows, right of the trials
_PANEL = 150


def _panel(rows: Sequence[tuple[str, Sequence[float | None]]], left: float, py: Any) -> list[tuple[Any, ...]]:
    """The re-measured rows, as the table has them: one column each (the defaults
    first), a dot per round and a bar at the row's figure (geometric mean)."""
    out: list[tuple[Any, ...]] = [("line", left, _T, left, _H - _B, "#bbb", 1, True),
                                  ("text", left + (_W - _R - left) / 2, _T - 6, "re-measured", 11, "middle", "#222")]
    step = (_W - _R - left) / max(1, len(rows))
    for k, (label, vals) in enumerate(rows):
        x = left + step * (k + 0.5)
        color = _DEFAULTS if k == 0 else _BEST if k == 1 else _DOT
        got = [v for v in vals if v is not None]
        out += [("dot", x, py(v), 3, color) for v in got]
        if got:
            fig = summarize(got)[0]
            out.append(("line", x - 11, py(fig), x + 11, py(fig), color, 2.5, False))
        out.append(("text", x, _H - _B + 16, "defaults" if k == 0 else label.split(" ", 1)[0], 10, "middle", "#444"))
    return out


def _shapes(records: Sequence[Any], baseline: float | None, direction: str, unit: str, title: str,
            remeasured: Sequence[tuple[str, Sequence[float | None]]] = ()) -> tuple[list[tuple[Any, ...]], int]:
    """The plot as primitives, and its height: ("line", x1, y1, x2, y2, color, width,
    dashed), ("dot", x, y, r, color), ("cross", x, y, r, color), ("text", x, y, text,
    size, anchor, color).  Under the axes: a legend, the configurations of the last
    trials that raised the best so far (marked tN on the plot: trial N), and the
    re-measured rows with their figures -- the table's."""
    ok = [r for r in records if r.state == "complete"]
    again = [v for _, vals in remeasured for v in vals if v is not None]
    vals = [r.value for r in ok] + ([baseline] if baseline is not None else []) + again
    lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
    if hi == lo:
        lo, hi = lo - 1, hi + 1
    pad = (hi - lo) * 0.08
    lo, hi = lo - pad, hi + pad
    right = _W - _R - (_PANEL if remeasured else 0)
    n = max((r.number for r in records), default=0) + 1
    px = (lambda i: _L + (right - _L) * (i + 0.5) / n)
    py = (lambda v: _T + (_H - _T - _B) * (1 - (v - lo) / (hi - lo)))
    out: list[tuple[Any, ...]] = [("text", _W / 2, 22, title, 14, "middle", "#222")]
    out += [("line", _L, _H - _B, _W - _R, _H - _B, "#444", 1, False), ("line", _L, _T, _L, _H - _B, "#444", 1, False)]
    ticks, decimals = _ticks(lo, hi)
    for v in ticks:
        out += [("line", _L - 4, py(v), _L, py(v), "#444", 1, False),
                ("text", _L - 6, py(v) + 4, f"{v:,.{decimals}f}", 11, "end", "#444")]
    step = max(1, n // 10)
    for i in range(0, n, step):
        out.append(("text", px(i), _H - _B + 16, str(i + 1), 11, "middle", "#444"))
    out.append(("text", (_L + right) / 2, _H - _B + 34, "trial", 12, "middle", "#222"))
    out.append(("text", 14, _T - 10, unit, 12, "start", "#222"))
    if baseline is not None:
        out.append(("line", _L, py(baseline), _W - _R, py(baseline), _DEFAULTS, 1.5, True))
    named = _trial_marks(records, _improvements(ok, 1 if direction == "maximize" else -1), px, py, n, out)
    if remeasured:
        out += _panel(remeasured, right + 8, py)
    legend, y = _legend(_H + 4, baseline, any(r.state == "infeasible" for r in records), bool(remeasured))
    out += legend
    for r in reversed(named):  # the best first
        y += 17
        out.append(("text", _L, y, f"trial {r.number + 1}  {fmt(r.value)}  {describe(r.config)}", 11, "start",
                    "#222"))
    if remeasured:
        y += 8
        for label, rounds in remeasured:
            got = [v for v in rounds if v is not None]
            y += 17
            out.append(("text", _L, y, f"re-measured {label}: {fmt(summarize(got)[0]) if got else 'failed'}"
                                       f" ({len(got)} round{'s' if len(got) != 1 else ''})", 11, "start", "#222"))
    return out, y + 14


def _trial_marks(records: Sequence[Any], better: list[Any], px: Any, py: Any, n: int,
                 out: list[tuple[Any, ...]]) -> list[Any]:
    """The trials onto ``out``: the best-so-far steps, a dot per trial, a cross per
    failed one, ``tN`` over the last that raised the best; returns those."""
    prev = None
    for r in better:
        pt = (px(r.number), py(r.value))
        if prev is not None:
            out += [("line", prev[0], prev[1], pt[0], prev[1], _BEST, 2, False),
                    ("line", pt[0], prev[1], pt[0], pt[1], _BEST, 2, False)]
        prev = pt
    if prev is not None:  # the best so far holds to the last trial
        out.append(("line", prev[0], prev[1], px(n - 1), prev[1], _BEST, 2, False))
    for r in records:
        if r.state == "complete":
            out.append(("dot", px(r.number), py(r.value), 4, _DOT))
        elif r.state == "infeasible":
            out.append(("cross", px(r.number), _H - _B - 8, 4, _FAILED))
    named = better[-_LABELLED:]
    for r in named:
        out.append(("text", px(r.number), py(r.value) - 8, f"t{r.number + 1}", 10, "middle", _BEST))
    return named


def _svg(shapes: list[tuple[Any, ...]], height: int) -> bytes:
    from xml.sax.saxutils import escape

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" viewBox="0 0 {_W} {height}" '
             f'font-family="DejaVu Sans, sans-serif"><rect width="{_W}" height="{height}" fill="white"/>']
    for s in shapes:
        if s[0] == "line":
            dash = ' stroke-dasharray="6,4"' if s[7] else ""
            parts.append(f'<line x1="{s[1]:.1f}" y1="{s[2]:.1f}" x2="{s[3]:.1f}" y2="{s[4]:.1f}" '
                         f'stroke="{s[5]}" stroke-width="{s[6]}"{dash}/>')
        elif s[0] == "dot":
            parts.append(f'<circle cx="{s[1]:.1f}" cy="{s[2]:.1f}" r="{s[3]}" fill="{s[4]}"/>')
        elif s[0] == "cross":
            x, y, r, c = s[1:]
            parts.append(f'<path d="M{x - r:.1f},{y - r:.1f}L{x + r:.1f},{y + r:.1f}M{x - r:.1f},{y + r:.1f}'
                         f'L{x + r:.1f},{y - r:.1f}" stroke="{c}" stroke-width="2"/>')
        else:
            parts.append(f'<text x="{s[1]:.1f}" y="{s[2]:.1f}" font-size="{s[4]}" text-anchor="{s[5]}" '
                         f'fill="{s[6]}" xml:space="preserve">{escape(str(s[3]))}</text>')
    parts.append("</svg>")
    return "\n".join(parts).encode()


def _png(shapes: list[tuple[Any, ...]], height: int) -> bytes:
    try:
        from PIL import Image, ImageDraw
    except ImportError as e:  # pragma: no cover - Pillow is in the test extra
        raise TuneError("a PNG plot needs Pillow: pip install 'kmp-affinity[picture]' (or write .svg)") from e
    import io

    from .picture import png_font  # lazy: Pillow only for a PNG

    img = Image.new("RGB", (_W, height), "white")
    draw = ImageDraw.Draw(img)
    for s in shapes:
        if s[0] == "line":
            if s[7]:  # dashed, as the SVG draws it
                x1, y1, x2, y2 = s[1:5]
                length = math.hypot(x2 - x1, y2 - y1) or 1
                for a in range(0, int(length), 10):
                    b = min(a + 6, length)
                    draw.line([(x1 + (x2 - x1) * a / length, y1 + (y2 - y1) * a / length),
                               (x1 + (x2 - x1) * b / length, y1 + (y2 - y1) * b / length)],
                              fill=s[5], width=max(1, round(s[6])))
            else:
                draw.line([(s[1], s[2]), (s[3], s[4])], fill=s[5], width=max(1, round(s[6])))
        elif s[0] == "dot":
            draw.ellipse([s[1] - s[3], s[2] - s[3], s[1] + s[3], s[2] + s[3]], fill=s[4])
        elif s[0] == "cross":
            x, y, r, c = s[1:]
            draw.line([(x - r, y - r), (x + r, y + r)], fill=c, width=2)
            draw.line([(x - r, y + r), (x + r, y - r)], fill=c, width=2)
        else:
            font = png_font(s[4], sans=True)
            anchor = {"end": "rs", "middle": "ms"}.get(s[5], "ls")
            draw.text((s[1], s[2]), str(s[3]), fill=s[6], font=font, anchor=anchor)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def save_plot(path: str, records: Sequence[Any], *, baseline: float | None = None, direction: str = "maximize",
              unit: str = "value", title: str = "affinity tune",
              remeasured: Sequence[tuple[str, Sequence[float | None]]] = ()) -> None:
    """Draw the trials (dots; infeasible ones as red crosses at the bottom), the best so
    far (green steps) and the defaults (dashed) to ``path``, with round ticks, a
    legend of those marks, and the configurations of the last trials that raised the
    best (``tN`` on the plot: trial N, named under it); with ``remeasured``, the
    table's rows beside the trials (a dot per round, a bar at the row's figure) and
    their figures under it.

    A trial is one run, during the search; the table's rows are runs taken again
    afterwards, round by round.  Under a changing load or mere noise the two
    disagree (the audit saw the re-measured defaults above every trial while the
    table found #1 faster): the plot therefore shows the table's own figures
    beside the trials, and its defaults line is the table's defaults figure.

    Parameters
    ----------
    path : str
        ``.svg`` or ``.png`` (the extension picks the format).
    records : sequence of TrialRecord
        The trials.
    baseline : float, optional
        The defaults' value; default, with ``remeasured``, the table's defaults
        figure (the geometric mean of its rounds).
    direction : {"maximize", "minimize"}
        Which values are better.
    unit : str
        The y axis.
    title : str
        Above the plot.
    remeasured : sequence of (label, rounds)
        The table's rows (:func:`table`'s ``rows``: the defaults first).

    Raises
    ------
    TuneUsageError
        Another extension.
    TuneError
        A PNG without Pillow, or a file that cannot be written.
    """
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".svg", ".png"):
        raise TuneUsageError(f"plot {path!r}: write .svg or .png")
    if baseline is None and remeasured and any(v is not None for v in remeasured[0][1]):
        baseline = summarize(remeasured[0][1])[0]
    shapes, height = _shapes(records, baseline, direction, unit, title, remeasured)
    data = _svg(shapes, height) if ext == ".svg" else _png(shapes, height)
    try:
        with open(path, "wb") as fh:
            fh.write(data)
    except OSError as e:
        raise TuneError(f"plot {path!r}: cannot write: {e.strerror}") from e
