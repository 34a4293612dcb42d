"""A serving engine laid out on a machine and the processes that start it (pure).

:func:`plan_serving` is the one place that turns what was asked for a server
(:class:`Serving`: the engine, ``--tp``, ``--reserve`` ...) into its layout
(:func:`~affinity.planning.engines.layout.serving_layout`) and the engine's own
words (:func:`~affinity.planning.engines.words_for`): ``affinity plan --for``
shows it, and :func:`affinity.planning.decide.decide` turns it into the processes
``affinity run --for`` starts (:meth:`ServingPlan.processes`):

* vLLM, SGLang: one server process; its mask is every rank's engine CPUs and the
  CPUs kept for the API server and tokenizer; the engine's variable in its
  environment; its memory left to the engine, which binds each rank's strictly to
  the node of the rank's lowest CPU (``numa_set_membind``) -- a policy set on the
  server process would only be replaced rank by rank;
* llama.cpp: one process per instance, masked to the instance's engine CPUs and
  its kept ones, its memory bound to the instance's NUMA nodes (llama.cpp binds
  none), the engine's flags appended to the command.

What it cannot do: start the engine's worker processes itself (vLLM and SGLang
start one per rank and bind them from the variable), or know that the command is
the engine named (a command that reads none of the words is placed by the
process mask alone).
"""

from __future__ import annotations

from ...cpulist import format_list
from ...errors import EngineError
from ...machine.topology import Topology
from ...record import record
from ..planner import Plan, plan
from ..serving import ENGINES, ONE_SERVER, Serving
from . import words_for
from .layout import ServingLayout, serving_layout
from .words import EngineWords

__all__ = ["ServerProcess", "ServingPlan", "plan_serving"]

_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "llama.cpp": "llama.cpp"}


@record
class ServerProcess:
    """One process of a server: where it runs, what it is told, where its memory goes."""

    index: int
    cpus: frozenset[int]  #: the process mask: engine CPUs and the CPUs kept for the server
    plan: Plan  #: where the engine binds its threads: thread ``i`` -> its CPU, rank after rank
    env: tuple[tuple[str, str], ...]  #: the engine's variables
    flags: tuple[str, ...]  #: the engine's flags, after the command
    memory: frozenset[int] | None  #: NUMA nodes to bind its memory to; None: the engine binds it


@record
class ServingPlan:
    """:func:`plan_serving`'s answer: the layout, the engine's words, and what is said."""

    serving: Serving
    layout: ServingLayout
    words: EngineWords

    @property
    def engine(self) -> str:
        return self.serving.engine

    def processes(self) -> tuple[ServerProcess, ...]:
        """The processes that start the server (see the module's docstring)."""
        layout, words = self.layout, self.words
        if self.engine in ONE_SERVER:
            engine = [c for s in layout.shares for c in sorted(s.cpus)]
            cpus = frozenset(engine) | layout.reserved
            return (ServerProcess(index=0, cpus=cpus, plan=_in_order(layout.topology, engine, cpus),
                                  env=words.env, flags=(), memory=None),)
        out = []
        for s, argv in zip(layout.shares, words.argv):
            nodes_cpus = frozenset().union(*(n.cpuset for n in layout.topology.numa_nodes
                                             if n.os_index in s.memory))
            cpus = s.cpus | s.reserved | (layout.node_reserved & nodes_cpus)
            out.append(ServerProcess(index=s.index, cpus=cpus, plan=_in_order(layout.topology, sorted(s.cpus), cpus),
                                     env=(), flags=argv,
                                     memory=s.memory or None))
        return tuple(out)

    def memory_text(self, asked: str | None = None) -> str:
        """One sentence: where each rank's or instance's memory goes, and who binds it;
        ``asked``: the memory policy given by the user (``--membind 0``), for every process."""
        unit, name = self.serving.unit, _NAMES[self.engine]
        where = "; ".join(f"{unit} {i} on node{'s' if len(m) != 1 else ''} {format_list(m)}"
                          for i, m in enumerate(self.words.memory) if m)
        if self.engine in ONE_SERVER:
            head = f"the server process's policy as asked ({asked})" if asked else \
                "the server process's own policy is left as it is"
            tail = (f"{name} binds each rank's strictly to the node of the rank's lowest CPU: {where}" if where
                    else f"the topology knows no NUMA node: {name} binds none")
            return f"memory: {head}; {tail}"
        if asked:
            return f"memory: as asked ({asked}) for every instance, in place of each instance's own node"
        if not where:
            return "memory: the topology knows no NUMA node: memory is not bound"
        return f"memory: bound by affinity run, as llama.cpp binds none: {where}"

    def lines(self) -> list[str]:
        """The layout, then the words, one line each."""
        return self.layout.lines() + self.words.lines()

    def to_dict(self) -> dict:
        return {"engine": self.engine, "layout": self.layout.to_dict(), "words": self.words.to_dict()}


def _in_order(topology: Topology, cpus: list[int], mask: frozenset[int]) -> Plan:
    """One thread per CPU of ``cpus``, in that order, in a process masked to ``mask``:
    where the engine binds its threads -- each rank's (instance's) thread ``i`` on its
    ``i``-th CPU in increasing order (vLLM's and SGLang's ``init_cpu_threads_env``,
    llama.cpp's ``--cpu-strict 1``), rank after rank (each rank's worker binds its
    own part)."""
    spec = f"granularity=fine,explicit,proclist=[{','.join(str(c) for c in cpus)}]"
    return plan(spec, threads=len(cpus), topology=topology.with_allowed(mask), initial_mask=mask)


def plan_serving(topology: Topology, serving: Serving) -> ServingPlan:
    """``serving``'s layout on the allowed CPUs of ``topology`` and the engine's words
    for it.

    Raises
    ------
    EngineError
        An unknown engine; what the engine cannot be told (a thread on several CPUs,
        a CPU past llama.cpp's 512, a set with holes for ``--cpu-range``), naming it.
    PlanError
        A layout that cannot be made (a share with no more cores than ``reserve``,
        more ranks than cores).
    """
    if serving.engine not in ENGINES:
        raise EngineError(f"unknown engine {serving.engine!r}: one of {', '.join(ENGINES)}")
    layout = serving_layout(topology, serving.count, reserve=serving.reserve, reserve_per=serving.reserve_per,
                            by=serving.by, unit=serving.unit, smt=serving.smt)
    options = {"form": serving.form} if serving.engine == "llama.cpp" else {}
    return ServingPlan(serving=serving, layout=layout, words=words_for(serving.engine, layout.plans, **options))
