"""What a serving engine's launch is asked (:class:`Serving`) and the engines known:
a value of its own, apart from the engines' rules (:mod:`affinity.planning.engines`),
so that ``affinity run`` loads those only when it starts an engine."""

from __future__ import annotations

from ..record import record

__all__ = ["ENGINES", "ONE_SERVER", "Serving"]

#: the serving engines whose words :func:`affinity.planning.engines.words_for` writes
ENGINES = ("vllm", "sglang", "llama.cpp")
#: the engines that start one worker process per rank from one server and bind each
#: rank's memory themselves (llama.cpp starts as one process per instance, unbound)
ONE_SERVER = ("vllm", "sglang")


@record
class Serving:
    """What was asked for a serving engine (``affinity plan --for``, ``affinity run --for``).

    Parameters
    ----------
    engine : str
        One of :data:`ENGINES`.
    count : int or None
        Tensor-parallel ranks (vLLM, SGLang) or instances (llama.cpp), ``--tp``;
        None: one per NUMA node (per L3 group with ``by="llc"``).
    reserve : int
        Cores of each rank (``reserve_per="node"``: of each NUMA node) kept off the
        engine's threads for the API server and tokenizer.
    reserve_per : {"instance", "node"}
    by : {"numa", "llc"}
    smt : bool
        Engine threads on every PU of their cores.
    form : {"mask", "range"}
        llama.cpp's CPUs as ``--cpu-mask`` or ``--cpu-range``.
    """

    engine: str
    count: int | None = None
    reserve: int = 0
    reserve_per: str = "instance"
    by: str = "numa"
    smt: bool = False
    form: str = "mask"

    @property
    def unit(self) -> str:
        """What a share is called: ``"rank"`` (vLLM, SGLang) or ``"instance"`` (llama.cpp)."""
        return "rank" if self.engine in ONE_SERVER else "instance"
