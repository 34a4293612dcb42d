"""The bindings applied in this process and not yet restored, oldest first.

Kept apart from :mod:`affinity.binding.apply` so that the bind map
(:mod:`affinity.binding.bindmap`) can read the active bindings' pins without
importing the module that creates them.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["active", "add", "exported", "remove"]

_lock = threading.RLock()
_active: list[Any] = []


def active() -> list[Any]:
    """The bindings applied and not yet restored, oldest first."""
    with _lock:
        return list(_active)


def add(binding: Any) -> None:
    with _lock:
        _active.append(binding)


def remove(binding: Any) -> None:
    with _lock:
        if binding in _active:
            _active.remove(binding)


def exported() -> dict[str, str]:
    """The variables the active bindings exported (newest wins): values that are
    ours, not the user's, when a nested binding decides what to keep."""
    with _lock:
        return {k: v for b in _active for k, v in b.env_set.items()}
