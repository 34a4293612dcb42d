"""optuna, the tuner's one dependency of its own (the ``tune`` extra): imported here
first, so that a missing optuna is one line naming the extra, not a traceback."""

from __future__ import annotations

from ..errors import TuneUnavailableError

try:
    import optuna
except ImportError as e:  # the tuner is an extra: pip install 'kmp-affinity[tune]'
    raise TuneUnavailableError(f"the tuner needs optuna, which is not installed ({e.msg}): "
                               f"pip install 'kmp-affinity[tune]'") from None

__all__ = ["optuna"]
