"""``import affinity`` has no side effects and loads nothing heavy."""

from __future__ import annotations

import subprocess
import sys

PROBE = r"""
import os, sys, time
before = {t: os.sched_getaffinity(int(t)) for t in os.listdir('/proc/self/task')}
t0 = time.perf_counter()
import affinity
dt = time.perf_counter() - t0
after = {t: os.sched_getaffinity(int(t)) for t in os.listdir('/proc/self/task')}
heavy = [m for m in ('tensorflow', 'numpy', 'affinity._affinity_native', '_cffi_backend') if m in sys.modules]
print(dt, before == after, len(after), ','.join(heavy) or '-', sep='|')
"""


def test_import_is_side_effect_free_and_loads_nothing_heavy():
    # (its time is measured in bench/bench_import.py: tests never assert on wall-clock time)
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        dt, same_masks, nthreads, heavy = r.stdout.strip().split("|")
        assert same_masks == "True", "import changed a thread mask"
        assert nthreads == "1", "import started a thread"
        assert heavy == "-", f"import loaded {heavy}"


def test_lazy_attributes():
    import affinity

    assert affinity.Topology.__name__ == "Topology"
    assert issubclass(affinity.SpecError, ValueError)
    assert issubclass(affinity.BindError, OSError)
    assert issubclass(affinity.UnsupportedError, NotImplementedError)
    assert issubclass(affinity.UnsupportedError, OSError)  # it carries an errno
    assert issubclass(affinity.NoSuchThread, ProcessLookupError)
    assert issubclass(affinity.AccessDenied, PermissionError)
    try:
        affinity.no_such_thing  # noqa: B018
    except AttributeError as e:
        assert "no_such_thing" in str(e)
    else:
        raise AssertionError("missing attribute did not raise")


def test_public_functions_are_not_shadowed_by_submodules():
    """Importing a submodule rebinds the package attribute of the same name: no
    public function may share its name with a module."""
    import importlib
    import pkgutil

    import affinity

    for info in pkgutil.walk_packages(affinity.__path__, "affinity."):
        if not info.name.rsplit(".", 1)[-1].startswith(("_", "lib")):  # lib*: the preload, not a module
            importlib.import_module(info.name)
    for name in affinity.__all__:
        value = getattr(affinity, name)
        if name in affinity._MODULES:  # documented modules: affinity.threads, .numa, .spec
            assert value is importlib.import_module(f"affinity.{affinity._MODULES[name]}")
        elif name != "__version__":
            assert not isinstance(value, type(affinity)), f"affinity.{name} is a module"
    assert callable(affinity.plan) and callable(affinity.report) and callable(affinity.apply)
