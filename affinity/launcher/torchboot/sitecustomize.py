"""PyTorch in a process started by ``affinity run``: loaded by Python at start-up
because ``affinity run`` put this directory first on ``PYTHONPATH``.

It does nothing at all unless the launcher exported
``AFFINITY_TORCH_INTEROP_THREADS``; then, right after the program's ``import
torch`` has completed:

* the thread that imported torch gets back the mask it had before: PyTorch's
  libgomp, reading the exported ``OMP_PLACES``, bound it to the first place as it
  loaded, and every thread and process it starts later (DataLoader workers) would
  inherit that one place;
* the inter-op pool is sized from the plan (PyTorch reads no variable for it) by
  ``torch.set_num_interop_threads(N)`` -- late: torch accepts that call once, and
  the program may make it itself, so the hook makes it only when the program first
  makes TorchScript (``torch.jit.script``, ``trace``, ``trace_module``, ``load``:
  only TorchScript starts the pool, at its first ``fork``), and not at all when the
  program made it first.  What it cannot do: a program that makes TorchScript and
  only then calls ``set_num_interop_threads`` is refused by torch (plain Python
  accepts it until the pool starts); TorchScript made without those four functions
  (``torch.jit.CompilationUnit``, ``torch.package``) starts a pool of torch's own size;
* with ``affinity run --dataloader-workers K`` (``AFFINITY_DATALOADER_CPUS``, the
  workers' CPU sets decided with the plan): every multi-process DataLoader started
  afterwards gives its worker ``i`` the ``i``-th set (a worker process, forked or
  spawned, on CPUs of its own instead of its parent's mask), before the program's own
  ``worker_init_fn``; torch itself gives each worker one intra-op thread.

Then the ``sitecustomize`` this one hides, if there is one, is run as usual: an
error in it is reported by ``site`` as with plain Python ("Error in
sitecustomize").  Standard library only: it runs in every Python process the
launcher starts, whatever that interpreter has installed.
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
                _size_at_first_torchscript(module, finder.interop)
                if os.environ.get(WORKERS_VARIABLE):
                    _place_dataloader_workers()

        spec.loader = Loader()
        return spec


#: the DataLoader workers' CPU sets, ``;`` between workers (affinity.planning.decide.WORKERS_VARIABLE)
WORKERS_VARIABLE = "AFFINITY_DATALOADER_CPUS"


def _cpus(text):
    """A kernel cpulist (``0-3,8``) as a set of ints."""
    out = set()
    for part in text.split(","):
        a, _, b = part.strip().partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def place_worker(worker_id, user_fn=None):
    """A DataLoader ``worker_init_fn``: this worker process on the ``worker_id``-th set
    of ``AFFINITY_DATALOADER_CPUS`` (cycling past the last), then the program's own."""
    sets = [s for s in os.environ.get(WORKERS_VARIABLE, "").split(";") if s.strip()]
    if sets:
        cpus = _cpus(sets[worker_id % len(sets)])
        for tid in os.listdir("/proc/self/task"):  # the worker's threads, started or not yet
            try:
                os.sched_setaffinity(int(tid), cpus)
            except OSError:
                pass  # a thread that ended meanwhile
        os.environ["AFFINITY_WORKER_ID"] = str(worker_id)
        os.environ["AFFINITY_WORKER_CPUS"] = sets[worker_id % len(sets)].strip()
    if user_fn is not None:
        user_fn(worker_id)


def _place_dataloader_workers():
    """Every multi-process DataLoader iterator started from now on gives its workers
    :func:`place_worker` before the program's own ``worker_init_fn``."""
    import functools

    try:
        from torch.utils.data import dataloader
    except ImportError:
        return
    cls = dataloader._MultiProcessingDataLoaderIter
    orig = cls.__init__

    def __init__(self, loader):
        user = loader.worker_init_fn
        if getattr(user, "func", None) is place_worker:
            return orig(self, loader)
        loader.worker_init_fn = functools.partial(place_worker, user_fn=user)
        try:
            orig(self, loader)
        finally:
            loader.worker_init_fn = user

    cls.__init__ = __init__


#: the functions that make TorchScript, the only code that starts torch's inter-op pool
_TORCHSCRIPT = ("script", "trace", "trace_module", "load")


def _size_at_first_torchscript(torch, interop):
    """Wrap ``torch.jit``'s TorchScript makers so that the first call sizes the
    inter-op pool (unless the program did: torch then refuses ours, which is
    right) and puts the originals back."""
    jit = getattr(torch, "jit", None)
    originals = {n: getattr(jit, n) for n in _TORCHSCRIPT if callable(getattr(jit, n, None))}
    wrappers = {}

    def size_once():
        for n, f in originals.items():
            if getattr(jit, n, None) is wrappers[n]:
                setattr(jit, n, f)
        try:
            torch.set_num_interop_threads(interop)
        except (RuntimeError, AttributeError):
            pass  # set by the program (its one call), or the pool exists, or not this torch

    def wrap(f):
        def call(*args, **kwargs):
            size_once()
            return f(*args, **kwargs)

        call.__name__, call.__qualname__, call.__doc__ = f.__name__, f.__qualname__, f.__doc__
        call.__module__, call.__wrapped__ = f.__module__, f
        return call

    for n, f in originals.items():
        wrappers[n] = wrap(f)
        setattr(jit, n, wrappers[n])


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
    except ImportError as e:
        if me is not None:
            sys.modules["sitecustomize"] = me
        if e.name != "sitecustomize":  # raised inside the user's: site says so, as without us
            raise
    finally:
        sys.path[:] = saved


_install()
_chain()
