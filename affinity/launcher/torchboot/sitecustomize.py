"""PyTorch in a process started by ``affinity run``: loaded by Python at start-up
because ``affinity run`` put this directory first on ``PYTHONPATH``.

It does nothing at all unless the launcher exported
``AFFINITY_TORCH_INTEROP_THREADS``; then, right after the program's ``import
torch`` has completed:

* the thread that imported torch gets back the mask it had before: PyTorch's
  libgomp, reading the exported ``OMP_PLACES``, bound it to the first place as it
  loaded, and every thread and process it starts later (DataLoader workers) would
  inherit that one place;
* ``torch.set_num_interop_threads(N)`` sizes the inter-op pool from the plan
  (PyTorch reads no variable for it).

Then the ``sitecustomize`` this one hides, if there is one, is run as usual.
Standard library only: it runs in every Python process the launcher starts,
whatever that interpreter has installed.
"""

import importlib
import importlib.abc
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Wraps the loader of ``torch`` the first time it is imported."""

    def __init__(self, interop):
        self.interop = interop
        self.busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch" or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        orig, finder = spec.loader, self

        class Loader(importlib.abc.Loader):
            def create_module(self, spec_):
                return orig.create_module(spec_)

            def exec_module(self, module):
                if finder in sys.meta_path:
                    sys.meta_path.remove(finder)
                before = os.sched_getaffinity(0)
                orig.exec_module(module)
                module.__loader__ = spec.loader = orig
                if os.sched_getaffinity(0) != before:  # libgomp's load-time pin: undone
                    os.sched_setaffinity(0, before)
                try:
                    module.set_num_interop_threads(finder.interop)
                except (RuntimeError, AttributeError):
                    pass  # already set by the program, or not this torch

        spec.loader = Loader()
        return spec


def _install():
    text = os.environ.get("AFFINITY_TORCH_INTEROP_THREADS", "")
    if text.isdigit() and int(text) > 0 and "torch" not in sys.modules:
        sys.meta_path.insert(0, _AfterTorch(int(text)))


def _chain():
    """Run the ``sitecustomize`` further down ``sys.path`` that this module hides."""
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    me = sys.modules.pop("sitecustomize", None)
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        if me is not None:
            sys.modules["sitecustomize"] = me
    finally:
        sys.path[:] = saved


_install()
_chain()
