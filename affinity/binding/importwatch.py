"""Run code around the first ``import NAME``: how an adapter learns that its framework
was imported after ``apply()`` (:class:`ImportWatch`).

A finder at the front of ``sys.meta_path`` answers for ``NAME`` alone: it finds the
real spec the usual way and wraps its loader, so that the module executes as it
would have, between the watch's two callbacks.  Every other import passes through
untouched, and the module keeps its own loader afterwards.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["ImportWatch"]


class ImportWatch(importlib.abc.MetaPathFinder):
    """Calls ``before()`` just before ``import name`` executes the module and
    ``after(token, ok)`` right after, with what ``before`` returned and whether the
    module ran to its end, the first time the import succeeds while the watch is
    installed.

    ``after`` runs when the module raised too (``ok`` False: to undo what ``before``
    did; the module is still in ``sys.modules`` then, until the import machinery
    takes it out).  An import that raised leaves the watch installed, so that the
    user's next attempt is watched too; one that succeeded removes it.
    :meth:`remove` uninstalls it.

    Parameters
    ----------
    name : str
        A top-level module name, such as ``"torch"``.
    after : callable
        ``after(token, ok)``; exceptions it raises reach the importer.
    before : callable, optional
        ``before() -> token``; by default the token is None.
    """

    def __init__(self, name: str, after: Callable[[Any, bool], None], before: Callable[[], Any] | None = None):
        self.name = name
        self.before, self.after = before, after
        self._busy = False
        sys.meta_path.insert(0, self)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        orig, watch = spec.loader, self

        class Loader(importlib.abc.Loader):
            def create_module(self, spec_: Any) -> Any:
                return orig.create_module(spec_)

            def exec_module(self, module: Any) -> None:
                token = watch.before() if watch.before is not None else None
                ok = False
                try:
                    orig.exec_module(module)
                    ok = True
                    watch.remove()
                finally:
                    module.__loader__ = spec.loader = orig  # the module keeps its own loader
                    watch.after(token, ok)

        spec.loader = Loader()
        return spec

    def remove(self) -> None:
        """Uninstall the watch (again: nothing)."""
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
