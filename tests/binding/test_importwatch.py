"""The one import watch both adapters use (``binding.importwatch``): the callbacks run
around the module's own code, the module keeps its loader, a failed import stays
watched.  A throwaway module on ``sys.path`` stands in for the framework."""

from __future__ import annotations

import sys

import pytest

from affinity.binding.importwatch import ImportWatch


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """(name, path of its file): a module not yet imported, which records when it ran."""
    name = "affinity_watch_fake"
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / f"{name}.py"
    path.write_text("import builtins\nbuiltins._watch_log.append('module')\n")
    import builtins
    builtins._watch_log = []
    yield name, path
    sys.modules.pop(name, None)
    del builtins._watch_log


def _log() -> list:
    import builtins
    return builtins._watch_log


def test_callbacks_run_around_the_module(fake):
    name, _ = fake
    w = ImportWatch(name, lambda tok, ok: _log().append(("after", tok, ok)),
                    before=lambda: _log().append("before") or "token")
    try:
        mod = __import__(name)
        assert _log() == ["before", "module", ("after", "token", True)]
        assert w not in sys.meta_path  # once is enough
        assert type(mod.__loader__).__name__ == "SourceFileLoader"  # its own loader, not ours
        assert mod.__spec__.loader is mod.__loader__
        sys.modules.pop(name)
        __import__(name)  # a second import is not watched
        assert _log()[-1] == "module"
    finally:
        w.remove()


def test_other_imports_pass_through(fake):
    name, _ = fake
    w = ImportWatch(name + "_other", lambda tok, ok: _log().append("after"))
    try:
        __import__(name)
        assert _log() == ["module"]
        assert w in sys.meta_path
    finally:
        w.remove()
    w.remove()  # twice: nothing


def test_a_failed_import_stays_watched(fake):
    name, path = fake
    path.write_text("raise ImportError('broken install')\n")
    w = ImportWatch(name, lambda tok, ok: _log().append(("after", tok, ok)),
                    before=lambda: _log().append("before") or 1)
    try:
        with pytest.raises(ImportError, match="broken install"):
            __import__(name)
        assert _log() == ["before", ("after", 1, False)]  # told, so it can undo what before() did
        assert w in sys.meta_path
        path.write_text("import builtins\nbuiltins._watch_log.append('module')\n")
        sys.modules.pop(name, None)
        import importlib
        importlib.invalidate_caches()
        __import__(name)
        assert _log()[2:] == ["before", "module", ("after", 1, True)]
        assert w not in sys.meta_path
    finally:
        w.remove()
