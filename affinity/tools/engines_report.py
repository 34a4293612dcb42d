"""``affinity plan --for vllm|sglang|llama.cpp``: where a serving engine's ranks or
instances go on a machine, and the engine's own words for it.

The layout and the words are :func:`affinity.planning.engines.serve.plan_serving`'s
(pure), the one ``affinity run --for`` performs; this face prints them, what the
engine would do by itself, and draws the shares.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..cpulist import format_list
from ..errors import EngineError, UsageError
from ..machine.topology import Topology
from ..planning.engines.layout import ServingLayout
from ..planning.engines.serve import plan_serving
from ..planning.engines.llamacpp import llamacpp_default
from ..planning.engines.sglang import sglang_default
from ..planning.engines.vllm import vllm_default

__all__ = ["add_plan_args", "cmd_plan_for", "engine_default"]


def add_plan_args(p: argparse.ArgumentParser) -> None:
    """``--for`` and its options on ``affinity plan``: the same as ``affinity run``'s
    (:func:`affinity.launcher.options.add_engine_args`)."""
    from ..launcher.options import add_engine_args  # lazy: a command loads only its own layers

    add_engine_args(p)


def engine_default(engine: str, topology: Topology, count: int) -> list[str]:
    """What ``engine`` binds by itself on ``topology`` with ``count`` ranks, one line each."""
    try:
        if engine == "vllm":
            sets = vllm_default(topology, count)
            return [f"vLLM by itself (VLLM_CPU_OMP_THREADS_BIND=auto): rank {i} on {format_list(s)}"
                    for i, s in enumerate(sets)]
        if engine == "sglang":
            sets = sglang_default(topology, count)
            return [f"SGLang by itself (SGLANG_CPU_OMP_THREADS_BIND unset): rank {i} on {format_list(s)}"
                    for i, s in enumerate(sets)]
    except EngineError as e:
        return [f"{engine} by itself: refuses ({e})"]
    return [f"llama.cpp by itself: {llamacpp_default(topology)} threads (the machine's physical cores, whatever "
            f"the process may use), no CPU mask, no memory binding"]


def _kept_text(layout: ServingLayout) -> str:
    if not layout.reserve:
        return ""
    per = layout.unit if layout.reserve_per == "instance" else "NUMA node"
    cores = f"{layout.reserve} core{'s' if layout.reserve != 1 else ''}"
    return f", {cores} per {per} kept for the API server and tokenizer"


def _text(engine: str, layout: ServingLayout, words: Any, defaults: list[str]) -> str:
    lines = [f"plan --for {engine}: {len(layout.shares)} {layout.unit}{'s' if len(layout.shares) != 1 else ''} "
             f"on {layout.topology.describe()}, one per {'NUMA node' if layout.by == 'numa' else 'L3 group'}"
             + _kept_text(layout) + ":"]
    lines += [f"  {x}" for x in layout.lines()]
    lines.append(f"{engine}'s words:")
    lines += [f"  {x}" for x in words.lines()]
    if words.memory:
        lines.append("  memory: " + "; ".join(f"{layout.unit} {i} on node{'s' if len(m) != 1 else ''} "
                                               f"{format_list(m)}" for i, m in enumerate(words.memory)))
    lines += [f"note: {n}" for n in words.notes]
    lines += defaults
    return "\n".join(lines)


def cmd_plan_for(args: argparse.Namespace, topology: Topology, write_picture: Any) -> int:
    """``affinity plan --for ENGINE``: the layout, the words (or JSON), the picture."""
    import json  # lazy: only --json prints JSON

    other = [name for name, given in (("SPEC", args.spec is not None), ("--threads", args.threads is not None),
                                      ("--env", bool(args.env)), ("--mask", args.mask is not None),
                                      ("--compare", bool(args.compare)), ("--translate", args.translate),
                                      ("--dataloader-workers", args.dataloader_workers is not None),
                                      ("--ranks", getattr(args, "ranks", None) is not None)) if given]
    if other:
        raise UsageError(f"--for plans one engine thread per core of each rank's share; it does not go with "
                         f"{', '.join(other)}")
    from ..launcher.options import serving_of  # lazy: a command loads only its own layers

    sp = plan_serving(topology, serving_of(args))
    layout, words = sp.layout, sp.words
    defaults = engine_default(args.engine, topology, len(layout.shares))
    if args.json:
        print(json.dumps({**sp.to_dict(), "engine_default": defaults}, indent=2))
    else:
        print(_text(args.engine, layout, words, defaults))
    if args.picture:
        sets = [s.cpus for s in layout.shares] + ([layout.reserved] if layout.reserved else [])
        kept = f"; {len(layout.shares)} (the last number) is the CPUs kept for the server" if layout.reserved else ""
        write_picture(args.picture, topology, sets, unit="rank",
                      title=f"{args.engine}: each number is the engine threads of one {layout.unit}{kept}")
    return 0
