"""The one statistic behind every "x faster" the product prints: :func:`paired`,
:func:`unpaired` and :func:`more_rounds`.

The demo (``make demo``), ``affinity tune``'s table, the pytest plugin's summary
and ``bench/report.py`` all say a speed-up with it, so that the number, its
interval and the verdict mean the same thing everywhere:

* **the figure** of each side is the *geometric mean* of its runs, and **the
  ratio** is the geometric mean of the per-round ratios -- for rounds that ran
  both sides, exactly the ratio of the two figures shown beside it (a median of
  per-round ratios is not: the demo once said "1.62x" beside medians 4.2x
  apart);
* **the interval** is Student's t interval of the mean log-ratio (paired rounds:
  one ratio per round; unpaired samples: Welch's), exponentiated.  Under no
  difference, the two runs of a round are exchangeable, so the log-ratio is
  symmetric about 0 -- the case where the t interval holds its level even when
  the noise has heavy tails (it widens: a disturbed round makes a verdict less
  likely, not more);
* **rounds continue** (:func:`more_rounds`) from :data:`MIN_ROUNDS` until the
  interval excludes 1 or the maximum is reached.  Looking after every round
  would call pure noise significant more often than the level says, so each
  look spends ``ALPHA / looks`` (Bonferroni over the looks a maximum allows),
  and a face that compares several candidates with one reference divides it by
  their number too (``family``): a "faster" or "slower" is then wrong in at
  most :data:`ALPHA` (1 %) of comparisons of things that do not differ;
* **the verdict** is "faster"/"slower" only when the interval excludes 1 *and*
  the ratio is at least :data:`MIN_GAIN` away from 1 (a consistent 0.5 % is not
  worth a word, and does not reproduce on another day); otherwise "no
  significant difference", or, with fewer than :data:`MIN_ROUNDS` rounds, no
  verdict at all.

What it cannot do: it assumes the rounds are independent (a machine whose load
drifts slowly within a round still biases that round; interleaving the sides,
as every face does, makes the drift fall on both alike), and unpaired samples
(pytest-benchmark runs one case's rounds before the next case's) carry any
change of load between the cases into the ratio.  A verdict is about this
machine, under its load, for this workload.

Pure: no clock, no randomness, no I/O; the standard library only.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

from ..record import record

__all__ = ["ALPHA", "MAX_ROUNDS", "MIN_GAIN", "MIN_ROUNDS", "Verdict", "geomean", "look_alpha", "more_rounds",
           "paired", "t_quantile", "unpaired"]

#: the share of comparisons of two things that do not differ that may be called
#: faster or slower (both together), over every look and candidate.  1 %, not 5 %: a
#: verdict must hold on 9 of 10 fresh reruns, and at 5 % ten reruns of the demo's two
#: rows on this 2-CPU machine (2026-11-28) said "1.15x faster" once and "1.50x slower"
#: once where the other 18 found no difference; simulated with 5 % noise per run
#: (4,000 demo reruns): no difference called either way in 3.7 % at 5 %, 0.8 % at 1 %,
#: a true 1.3x called faster in 100 % and 96.8 % (4.7 rounds of at most 6)
ALPHA = 0.01
#: a ratio closer to 1 than this is "no significant difference" however sure (2 %)
MIN_GAIN = 0.02
#: rounds before the first verdict: the spread of fewer means little
MIN_ROUNDS = 3
#: the faces' default maximum of rounds
MAX_ROUNDS = 10


@record
class Verdict:
    """One comparison of a candidate with a reference, said the same way by every face.

    Parameters
    ----------
    ratio : float
        The speed-up: > 1 the candidate is better, whatever the direction (for
        times, the reference's over the candidate's).  Paired: the geometric mean
        of the per-round ratios; unpaired: the ratio of the geometric means.  NaN
        when nothing was measured side by side.
    interval : tuple of (float, float) or None
        The interval of the ratio at the level of this look (see the module
        docstring); None below :data:`MIN_ROUNDS` rounds, or unmeasured.
    rounds : int
        Rounds compared (paired), or the size of the smaller sample (unpaired).
    word : {"faster", "slower", "no significant difference", "no verdict", "not measured"}
        What may be said.
    ratios : tuple of float
        The per-round ratios (paired), in round order; empty when unpaired.
    paired : bool
        Whether the rounds ran both sides one after the other.
    """

    ratio: float
    interval: tuple[float, float] | None
    rounds: int
    word: str
    ratios: tuple[float, ...] = ()
    paired: bool = True

    @property
    def significant(self) -> bool | None:
        """True: faster or slower; False: no significant difference; None: no
        verdict (too few rounds) or nothing measured."""
        if self.word in ("faster", "slower"):
            return True
        return False if self.word == "no significant difference" else None

    @property
    def decided(self) -> bool:
        """The interval excludes 1: more rounds would not change what is said."""
        return self.interval is not None and (self.interval[0] > 1 or self.interval[1] < 1)

    @property
    def text(self) -> str:
        """The verdict as the faces print it: ``"1.31x faster (interval 1.22x-1.41x, 5
        rounds)"``, ``"1.25x slower (...)"``, ``"no significant difference (0.98x;
        interval 0.93x-1.04x, 10 rounds)"``, ``"1.20x (2 rounds: a verdict needs 3)"``."""
        if self.word == "not measured":
            return "not measured side by side"
        n = f"{self.rounds} round{'s' if self.rounds != 1 else ''}" if self.paired else \
            f"{self.rounds} or more runs each, not interleaved"
        if self.interval is None:
            return f"{self.ratio:.2f}x ({n}: a verdict needs {MIN_ROUNDS})"
        lo, hi = self.interval
        if self.word == "faster":
            return f"{self.ratio:.2f}x faster (interval {lo:.2f}x-{hi:.2f}x, {n})"
        if self.word == "slower":
            return f"{1 / self.ratio:.2f}x slower (interval {1 / hi:.2f}x-{1 / lo:.2f}x, {n})"
        small = f"; under {MIN_GAIN:.0%}" if self.decided else ""
        return f"no significant difference ({self.ratio:.2f}x; interval {lo:.2f}x-{hi:.2f}x, {n}{small})"


def geomean(values: Sequence[float]) -> float:
    """The geometric mean of positive ``values`` (the figure every face shows for a
    side); NaN when there is none or one is not positive."""
    vals = [float(v) for v in values]
    if not vals or any(not v > 0 or not math.isfinite(v) for v in vals):
        return math.nan
    if min(vals) == max(vals):
        return vals[0]  # exactly, not to the last bit of exp(log(v))
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def look_alpha(max_rounds: int | None = MAX_ROUNDS, family: int = 1) -> float:
    """The two-sided level one look spends: :data:`ALPHA` shared by the looks a
    maximum of ``max_rounds`` allows (one after each round from :data:`MIN_ROUNDS`;
    None: the rounds were fixed beforehand, one look) and by ``family`` candidates
    compared with the same reference."""
    looks = 1 if max_rounds is None else max(1, int(max_rounds) - MIN_ROUNDS + 1)
    return ALPHA / (looks * max(1, int(family)))


def paired(reference: Sequence[float | None], candidate: Sequence[float | None], direction: str = "maximize", *,
           max_rounds: int | None = MAX_ROUNDS, family: int = 1) -> Verdict:
    """Compare ``candidate`` with ``reference`` round by round.

    Parameters
    ----------
    reference, candidate : sequence of float or None
        One value per round, ``reference[i]`` and ``candidate[i]`` measured in the
        same round (interleaved); a round where either is missing (None, 0, a
        shorter list: a run that failed) is left out.
    direction : {"maximize", "minimize"}
        Whether larger values are better (a throughput) or smaller (a time).
    max_rounds : int or None
        The maximum of rounds the face allows (:func:`more_rounds` after each); None:
        the number of rounds was fixed beforehand (a benchmark), one look.
    family : int
        How many candidates the face compares with the same reference (:func:`look_alpha`).

    Returns
    -------
    Verdict
    """
    _check_direction(direction)
    pairs = [(float(r), float(c)) for r, c in zip(reference, candidate) if r and c and r > 0 and c > 0]
    if not pairs:
        return Verdict(ratio=math.nan, interval=None, rounds=0, word="not measured", ratios=(), paired=True)
    logs = [math.log(c / r) if direction == "maximize" else math.log(r / c) for r, c in pairs]
    ratios = tuple(math.exp(x) for x in logs)
    n = len(logs)
    mean = sum(logs) / n
    if n < MIN_ROUNDS:
        return Verdict(ratio=math.exp(mean), interval=None, rounds=n, word="no verdict", ratios=ratios, paired=True)
    var = sum((x - mean) ** 2 for x in logs) / (n - 1)
    half = t_quantile(1 - look_alpha(max_rounds, family) / 2, n - 1) * math.sqrt(var / n)
    return _said(mean, half, n, ratios, True)


def unpaired(reference: Sequence[float], candidate: Sequence[float], direction: str = "maximize", *,
             family: int = 1) -> Verdict:
    """Compare two samples that were not measured round by round (Welch's interval
    of the difference of the mean logs: the ratio of the geometric means).

    One look (the rounds are already run); ``family`` as in :func:`paired`.  The
    samples must each hold :data:`MIN_ROUNDS` positive values for a verdict.
    """
    _check_direction(direction)
    a = [math.log(float(v)) for v in reference if v and v > 0]
    b = [math.log(float(v)) for v in candidate if v and v > 0]
    if not a or not b:
        return Verdict(ratio=math.nan, interval=None, rounds=0, word="not measured", ratios=(), paired=False)
    sign = 1 if direction == "maximize" else -1
    mean = sign * (sum(b) / len(b) - sum(a) / len(a))
    n = min(len(a), len(b))
    if n < MIN_ROUNDS:
        return Verdict(ratio=math.exp(mean), interval=None, rounds=n, word="no verdict", ratios=(), paired=False)
    va = sum((x - sum(a) / len(a)) ** 2 for x in a) / (len(a) - 1) / len(a)
    vb = sum((x - sum(b) / len(b)) ** 2 for x in b) / (len(b) - 1) / len(b)
    se2 = va + vb
    if se2 == 0:
        return _said(mean, 0.0, n, (), False)
    df = se2 ** 2 / ((va ** 2 / (len(a) - 1) if va else 0.0) + (vb ** 2 / (len(b) - 1) if vb else 0.0))
    half = t_quantile(1 - look_alpha(None, family) / 2, df) * math.sqrt(se2)
    return _said(mean, half, n, (), False)


def more_rounds(verdict: Verdict, max_rounds: int = MAX_ROUNDS) -> bool:
    """Whether a face should run another round: fewer than :data:`MIN_ROUNDS`, or
    the interval still holds 1 and ``max_rounds`` is not reached.  (A ratio under
    :data:`MIN_GAIN` whose interval excludes 1 is settled: more rounds would only
    make it surer.)"""
    if verdict.rounds >= max_rounds:
        return False
    return verdict.rounds < MIN_ROUNDS or not verdict.decided


def _said(mean: float, half: float, n: int, ratios: tuple[float, ...], is_paired: bool) -> Verdict:
    lo, hi = math.exp(mean - half), math.exp(mean + half)
    ratio = math.exp(mean)
    if lo > 1 and ratio >= 1 + MIN_GAIN:
        word = "faster"
    elif hi < 1 and 1 / ratio >= 1 + MIN_GAIN:
        word = "slower"
    else:
        word = "no significant difference"
    return Verdict(ratio=ratio, interval=(lo, hi), rounds=n, word=word, ratios=ratios, paired=is_paired)


def _check_direction(direction: str) -> None:
    if direction not in ("maximize", "minimize"):
        raise ValueError(f"direction must be 'maximize' or 'minimize', got {direction!r}")


# ---------------------------------------------------------------- Student's t

@functools.lru_cache(maxsize=512)  # the faces ask the same few (level, rounds) again and again
def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (``0.5 <= p < 1``),
    by bisection on its distribution function (to 1e-10 relative)."""
    if not 0.5 <= p < 1 or not df > 0:
        raise ValueError(f"t_quantile: p must be in [0.5, 1) and df > 0, got p={p}, df={df}")
    if p == 0.5:
        return 0.0
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        hi *= 2
        if hi > 1e12:
            return math.inf
    for _ in range(200):
        mid = (lo + hi) / 2
        if _t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-10 * hi:
            break
    return (lo + hi) / 2


def _t_cdf(t: float, df: float) -> float:
    """P(T <= t) for t >= 0."""
    return 1 - 0.5 * _betainc(df / 2, 0.5, df / (df + t * t))


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (continued fraction, modified Lentz)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast on this side only
        return 1 - front * _beta_fraction(b, a, 1 - x) / b
    return front * _beta_fraction(a, b, x) / a


def _beta_fraction(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h
