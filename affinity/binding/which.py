"""``runtime="auto"``: whose rules this process's OpenMP runtime follows.

Planning is pure and knows only named rule sets (:data:`~affinity.planning.planner.RUNTIMES`);
``"auto"`` is resolved here, in the binding layer, from the runtimes mapped into
this process (:func:`~affinity.machine.loaded.census`), before planning is called:

=============================  ===========================================
loaded in this process         ``"auto"`` becomes
=============================  ===========================================
none                           ``"intel"`` (the documented default)
libgomp                        ``"gnu-torch"`` for PyTorch's bundled copy, else ``"gnu"``
libiomp5                       ``"intel"``
libomp                         ``"llvm"``
two or more of these rule sets a :class:`~affinity.errors.PlanError` naming them:
                               which one a given OpenMP call reaches depends on
                               the caller's link order, so no answer is right
                               for every thread -- pass ``runtime=`` explicitly
=============================  ===========================================
"""

from __future__ import annotations

from ..errors import PlanError
from ..planning.gnu.rules import runtime_for_library
from ..planning.planner import DEFAULT_RUNTIME
from ..machine.loaded import Census, LoadedRuntime, census

__all__ = ["AUTO", "resolve_runtime", "rules_of"]

AUTO = "auto"


def rules_of(rt: LoadedRuntime) -> str:
    """The planner's rule-set name for one loaded runtime file."""
    if rt.family == "gnu":
        return runtime_for_library(rt.path)
    return rt.family  # "intel" (libiomp5) or "llvm" (libomp): the planner's names


def resolve_runtime(runtime: str, loaded: Census | None = None, *, caller: str = "plan") -> str:
    """``runtime`` itself, or for ``"auto"`` the rules of the OpenMP runtime loaded in
    this process (``loaded``: a census, default this process's now).

    Raises :class:`PlanError` (naming ``caller``) when runtimes following different
    rules are loaded together."""
    if runtime != AUTO:
        return runtime
    loaded = census() if loaded is None else loaded
    names: list[str] = []
    for rt in loaded.runtimes:
        if rules_of(rt) not in names:
            names.append(rules_of(rt))
    if not names:
        return DEFAULT_RUNTIME
    if len(names) == 1:
        return names[0]
    what = ", ".join(f"{rt.path} ({rules_of(rt)})" for rt in loaded.runtimes)
    raise PlanError(f"{caller}(runtime='auto'): this process has OpenMP runtimes following different rules "
                    f"loaded: {what}; pass runtime= one of {', '.join(names)}")
