"""Reading a throughput (or a time) from a command's output.

Default: the last number printed with a rate unit -- ``330.1 images/sec`` or
``total images/sec: 330.1`` (tf_cnn_benchmarks, ``affinity bench``), the same
with ``examples``, ``samples`` or ``tokens`` (``/sec`` or ``/s``) -- or the
``throughput`` of a JSON line, whichever comes last.  ``--metric REGEX``: the last
match of REGEX, its first group if it has one.
"""

from __future__ import annotations

import json
import math
import re

from ..errors import TuneUsageError

__all__ = ["DEFAULT_UNITS", "compile_metric", "parse_metric", "parse_metrics"]

#: the units the default metric recognises
DEFAULT_UNITS = ("images/sec", "examples/sec", "samples/sec", "tokens/sec")
_NUM = r"[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d*)?|\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_UNIT = r"(?:images|examples|samples|tokens)\s*/\s*s(?:ec(?:ond)?)?\b"
_BEFORE = re.compile(rf"(?P<n>{_NUM})\s*(?P<u>{_UNIT})", re.IGNORECASE)
_AFTER = re.compile(rf"(?P<u>{_UNIT})\s*[:=]\s*(?P<n>{_NUM})", re.IGNORECASE)
_JSON_KEYS = ("throughput", "images_per_sec")


def compile_metric(pattern: str) -> re.Pattern[str]:
    """``--metric``'s pattern, compiled (raises TuneUsageError naming a bad one)."""
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise TuneUsageError(f"--metric {pattern!r} is not a regular expression: {e}") from None
    return rx


def _number(text: str) -> float | None:
    try:
        v = float(text.replace(",", ""))
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _json_value(line: str) -> float | None:
    line = line.strip()
    if not (line.startswith("{") and line.endswith("}")):
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    for key in _JSON_KEYS:
        v = obj.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return float(v)
    return None


def parse_metric(text: str, pattern: re.Pattern[str] | str | None = None) -> float | None:
    """The metric in a command's output, or None when it is not there.

    Parameters
    ----------
    text : str
        The output (stdout and stderr).
    pattern : regex or str, optional
        ``--metric``: the last match wins; its first group if it has groups, else the
        whole match, must read as a number.

    Returns
    -------
    float or None
    """
    values = parse_metrics(text, pattern)
    return values[-1] if values else None


def parse_metrics(text: str, pattern: re.Pattern[str] | str | None = None) -> list[float]:
    """Every value of the metric in a command's output, in the order printed (what a
    command prints as it goes: the intermediate values multi-fidelity prunes on; the
    last is :func:`parse_metric`'s).

    Parameters
    ----------
    text : str
        The output so far.
    pattern : regex or str, optional
        As for :func:`parse_metric`.

    Returns
    -------
    list of float
    """
    found: list[tuple[int, float]] = []
    if pattern is not None:
        rx = compile_metric(pattern) if isinstance(pattern, str) else pattern
        for m in rx.finditer(text):
            v = _number(m.group(1) if rx.groups else m.group(0))
            if v is None:
                nums = re.findall(_NUM, m.group(0))
                v = _number(nums[-1]) if nums else None
            if v is not None:
                found.append((m.start(), v))
        return [v for _, v in found]
    after = {m.start("u"): m for m in _AFTER.finditer(text)}  # "images/sec: 330": the number is the unit's
    for m in [*_BEFORE.finditer(text), *after.values()]:
        if m.re is _BEFORE and m.start("u") in after:
            continue  # "10  images/sec: 1053.6": 10 is a step number
        v = _number(m.group("n"))
        if v is not None:
            found.append((m.start(), v))
    pos = 0
    for line in text.splitlines(keepends=True):
        v = _json_value(line)
        if v is not None:
            found.append((pos, v))
        pos += len(line)
    return [v for _, v in sorted(found, key=lambda f: f[0])]
