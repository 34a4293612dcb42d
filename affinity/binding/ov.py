"""OpenVINO adapter (``affinity.openvino``).  openvino is imported lazily.

OpenVINO's CPU plugin takes counts and switches, not per-thread CPU sets
(:mod:`affinity.planning.engines.openvino`).  While a binding is active,
``openvino.Core.compile_model`` for the CPU (or with no device named) is wrapped:

* the plan's properties (``INFERENCE_NUM_THREADS``, ``NUM_STREAMS``,
  ``ENABLE_CPU_PINNING``, ``ENABLE_HYPER_THREADING``, ``SCHEDULING_CORE_TYPE``) are
  added to the call's config -- a property the caller gave keeps the caller's
  value, and is noted where it differs;
* the calling thread runs the compilation on the plan's CPUs (its own mask put back
  afterwards): OpenVINO reads the CPUs it may use from the thread that compiles
  the process's first model, and the threads it starts inherit that mask;
* the threads that appear meanwhile are entered in the bind map (role ``ov``) with
  the plan's CPUs as their bound: OpenVINO pins each to one CPU of its choosing
  among them (the exact CPU is OpenVINO's, read back from the kernel);
* what OpenVINO changed of what it was asked (pinning turned off on a hybrid
  machine mixing core types...) is read back from the compiled model and noted.

What it cannot do: give OpenVINO a per-thread set; move the CPUs of a plugin whose
CPU map was read before the binding (a model compiled earlier in the process):
its threads then show in the bind map outside their bound.
"""

from __future__ import annotations

import sys
import threading
import warnings
from typing import Any

from ..errors import AffinityWarning
from ..planning.engines.openvino import NOT_TOLD, OvProperties, ov_default_threads, ov_properties
from . import threads as _threads
from .importwatch import ImportWatch

__all__ = ["OvAdapter", "attach", "compile_config", "imported"]

ROLE = "ov"


def imported() -> bool:
    return "openvino" in sys.modules


def compile_config(plan: Any, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``compile_model`` config for ``plan`` (a Plan, or a Binding: its plan):
    the plan's properties (:func:`~affinity.planning.engines.openvino.ov_properties`),
    with ``config``'s own keys kept.  Compile on the plan's CPUs too (inside
    ``pinned()``, or with the calling thread's mask narrowed to them): OpenVINO
    takes its CPUs from the compiling thread."""
    props = ov_properties(getattr(plan, "plan", plan))  # decision: OpenVINO's properties from the plan
    return {**props.config(), **(config or {})}


def _is_cpu(device: Any) -> bool:
    return device is None or str(device).upper().startswith(("CPU", "AUTO"))


class OvAdapter:
    """OpenVINO's side of one binding (in ``binding._hooks``: :meth:`remove` at restore)."""

    def __init__(self, binding: Any, pin_cls: Any):
        self.binding, self.pin_cls = binding, pin_cls
        self.props: OvProperties = ov_properties(binding.plan)  # decision: OpenVINO's properties from the plan
        self.cls: Any = None
        self.orig: Any = None
        self.new: Any = None
        self.watch: ImportWatch | None = None
        self.models = 0
        self.said = False

    def install(self) -> None:
        if self.cls is not None or not self.binding.active:
            return
        from openvino import _ov_api  # noqa: PLC0415  (openvino is imported already)

        cls = _ov_api.Core
        orig, adapter = cls.compile_model, self

        def compile_model(core: Any, model: Any, device_name: Any = None, config: Any = None, **kw: Any) -> Any:
            if not adapter.binding.active or adapter.cls is None or not _is_cpu(device_name):
                return orig(core, model, device_name, config, **kw)
            return adapter.compile(orig, core, model, device_name, config, kw)

        compile_model.__wrapped__ = orig  # type: ignore[attr-defined]
        self.cls, self.orig, self.new = cls, orig, compile_model
        cls.compile_model = compile_model

    def imported_now(self, _token: Any, ok: bool) -> None:
        self.watch = None
        if ok and self.binding.active:
            self.install()

    def remove(self) -> None:
        if self.watch is not None:
            self.watch.remove()
            self.watch = None
        if self.cls is not None and self.cls.__dict__.get("compile_model") is self.new:
            self.cls.compile_model = self.orig
        self.cls = None

    def compile(self, orig: Any, core: Any, model: Any, device: Any, config: Any, kw: dict[str, Any]) -> Any:
        """Compile with the plan's properties on the plan's CPUs; enter OpenVINO's
        new threads in the bind map; note what OpenVINO changed."""
        b, props = self.binding, self.props
        ours = props.config()
        theirs = dict(config or {})
        kept = {k: v for k, v in theirs.items() if str(k) in ours and str(v) != ours[str(k)]}
        me = threading.get_native_id()
        mask = _threads.get_affinity(me)
        before = _threads.task_starts()
        _threads.set_threads_affinity({me: props.cpus})
        try:
            compiled = orig(core, model, device, {**ours, **theirs}, **kw)
        finally:
            _threads.set_threads_affinity({me: mask})
        after = _threads.task_starts()
        new = sorted(t for t, start in after.items() if before.get(t) != start)
        for i, tid in enumerate(new):
            b.pins[tid] = self.pin_cls(tid, ROLE, props.cpus, i, NOT_TOLD)
        b._see(new)
        self.models += 1
        self._notes(compiled, kept)
        return compiled

    def _notes(self, compiled: Any, kept: dict[Any, Any]) -> None:
        b, ours = self.binding, self.props.config()
        said = [f"an OpenVINO model keeps the caller's {k}={v} (the plan's: {ours[str(k)]})" for k, v in kept.items()]
        for key in ("INFERENCE_NUM_THREADS", "ENABLE_CPU_PINNING", "ENABLE_HYPER_THREADING"):
            if key in {str(k) for k in kept}:
                continue
            try:
                got = compiled.get_property(key)
            except Exception:  # noqa: BLE001 - a property this build does not report
                continue
            shown = ("YES" if got else "NO") if isinstance(got, bool) else str(got)
            if shown != ours[key]:
                said.append(f"OpenVINO set {key}={shown} where the plan asked {ours[key]}")
        if not self.said:
            own = ov_default_threads(b.plan.topology)  # decision: what the plan overrides of OpenVINO's default
            if own != self.props.inference_num_threads:
                said.insert(0, f"OpenVINO's default of {own} inference threads (the cores of one socket) replaced "
                               f"by the plan's {self.props.inference_num_threads}")
            said = list(self.props.notes[1:]) + said
            self.said = True
        for n in said:
            b.notes.append(n)
            warnings.warn(f"affinity: {n}", AffinityWarning, stacklevel=4)


def attach(b: Any, pin_cls: Any) -> OvAdapter:
    """OpenVINO's part of :func:`affinity.apply`: wrap ``compile_model`` now if
    openvino is imported, else right after it is.  Returns the adapter."""
    ad = OvAdapter(b, pin_cls)
    b._hooks.append(ad)
    if imported():
        ad.install()
    else:
        ad.watch = ImportWatch("openvino", ad.imported_now)
    return ad
