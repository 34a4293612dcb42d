"""The surfaces drawn at random (bench/surfaces/random_models.py) are a pure function of
(family, k): the same tables on every call, every configuration of the space valued,
and families that differ from draw to draw."""

from __future__ import annotations

import pytest


def test_a_draw_is_the_same_every_time():
    import random_models

    for family in random_models.FAMILIES:
        a, b = random_models.generate(family, 3), random_models.generate(family, 3)
        assert a.title == b.title and a.table == b.table and a.space == b.space


def test_every_configuration_is_valued_and_the_best_runs():
    import random_models

    for family in random_models.FAMILIES:
        s = random_models.generate(family, 0)
        n = 1
        for values in s.space.values():
            n *= len(values)
        assert s.size == n and set(s.params) == set(s.space)
        ok = [v for v in s.table.values() if v is not None]
        assert ok and all(v > 0 for v in ok) and s.best == max(ok)


def test_draws_differ():
    import random_models

    tables = {random_models.generate("naive", k).title for k in range(6)}
    assert len(tables) == 6
    drawn = [random_models.generate("machine", i) for i in range(6)]
    bests = {next(k for k, v in s.table.items() if v == s.best) for s in drawn}
    assert len(bests) > 1  # not one answer in disguise


def test_the_machine_family_has_failures():
    """Copies that do not fit in memory fail (None) on some draws, as on real machines."""
    import random_models

    assert any(None in random_models.generate("machine", k).table.values() for k in range(6))


def test_an_unknown_family_is_named():
    import random_models

    with pytest.raises(ValueError, match="generate\\(\\): unknown family 'other'"):
        random_models.generate("other", 0)
