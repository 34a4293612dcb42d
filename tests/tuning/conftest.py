"""Fixtures of the tuner's tests: the response surfaces of ``bench/surfaces`` (their
harness is imported from there)."""

from __future__ import annotations

import sys

import pytest

from helpers import ROOT

SURFACES = ROOT / "bench" / "surfaces"
if str(SURFACES) not in sys.path:
    sys.path.insert(0, str(SURFACES))



@pytest.fixture(scope="session")
def surfaces():
    """``load(name)`` of the surface harness (``bench/surfaces/harness.py``)."""
    import harness

    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = harness.load(name)
        return cache[name]

    return get
