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

__all__ = ["DEFAULT_UNITS", "compile_metric", "parse_metric"]

#: the units the default metric recognises
DEFAULT_UNITS = ("images/sec", "examples/sec", "samples/sec", "tokens/sec")
_NUM = r"[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d*)?|\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_UNIT = r"(?:images|examples|samples|tokens)\s*/\s*s(?:ec(?:ond)?)?\b"
_BEFORE = re.compile(rf"({_NUM})\s*{_UNIT}", re.IGNORECASE)
_AFTER = re.compile(rf"{_UNIT}\s*[:=]\s*({_NUM})", re.IGNORECASE)
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
    if pattern is not None:
        rx = compile_metric(pattern) if isinstance(pattern, str) else pattern
        found = None
        for m in rx.finditer(text):
            found = _number(m.group(1) if rx.groups else m.group(0))
            if found is None:
                nums = re.findall(_NUM, m.group(0))
                found = _number(nums[-1]) if nums else None
        return found
    best: tuple[int, float] | None = None
    for rx in (_BEFORE, _AFTER):
        for m in rx.finditer(text):
            v = _number(m.group(1))
            if v is not None and (best is None or m.start() >= best[0]):
                best = (m.start(), v)
    pos = 0
    for line in text.splitlines(keepends=True):
        v = _json_value(line)
        if v is not None and (best is None or pos >= best[0]):
            best = (pos, v)
        pos += len(line)
    return best[1] if best else None
