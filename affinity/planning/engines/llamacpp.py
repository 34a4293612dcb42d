"""llama.cpp's command line, in its own words (pure).

What ``llama-server``/``llama-cli`` parse (``common/arg.cpp``, ``common/common.cpp``
``parse_cpu_mask``/``parse_cpu_range``/``postprocess_cpu_params``,
``ggml/src/ggml-cpu/ggml-cpu.c``; the llama.cpp vendored by llama-cpp-python 0.3.36):

* ``-t/--threads N`` (default: the machine's physical cores, its P-cores on a
  hybrid x86, whatever the process mask or CPU quota); ``-tb/--threads-batch``
  the same for prompt processing (default: as ``-t``).
* ``-C/--cpu-mask M``: hexadecimal, most significant digit first, an optional
  ``0x``; only the first 128 digits are read, so CPUs 0-511
  (``GGML_MAX_N_THREADS``) are all it can name.  ``-Cr/--cpu-range lo-hi``: one
  range, either end may be left out; CPUs 0-511; a second range after a comma is
  not refused but misread (``stoull`` stops at the comma).  Both OR into one mask.
* ``--cpu-strict 1``: thread ``j`` gets the ``j``-th CPU of the mask, in increasing
  order, cycling (``ggml_thread_cpumask_next``); ``0`` (default): every thread gets
  the whole mask.  ``-Cb``/``-Crb``/``--cpu-strict-batch`` are the batch pool's.
* ``--numa distribute|isolate|numactl`` re-pins every thread at the start of each
  graph (``set_numa_thread_affinity``): to a node by thread number, to the start
  node, or to the process's mask -- it overrides ``--cpu-strict``'s one CPU per
  thread, so these words leave it out.
* Memory: llama.cpp binds none; the instance's launcher must (``numactl
  --membind``, ``affinity run --membind``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...cpulist import format_list, runs
from ...errors import EngineError
from ...machine.topology import Topology
from .words import EngineWords, check_disjoint, one_cpu_per_thread, rank_memory

__all__ = ["MAX_CPUS", "command_flags", "cpu_mask", "cpu_range", "llamacpp_default", "llamacpp_words"]

#: ``GGML_MAX_N_THREADS``: the size of llama.cpp's CPU mask (ggml/include/ggml.h)
MAX_CPUS = 512
_RULE = "llama.cpp's --cpu-strict 1 (ggml_thread_cpumask_next)"


def cpu_mask(cpus: frozenset[int]) -> str:
    """``cpus`` as ``-C``'s hexadecimal mask (``0x`` and the digits, most significant
    first).  :class:`EngineError` for a CPU past :data:`MAX_CPUS` - 1."""
    _check_max(cpus, "-C/--cpu-mask")
    return "0x" + format(sum(1 << c for c in cpus), "x")


def cpu_range(cpus: frozenset[int]) -> str:
    """``cpus`` as ``-Cr``'s one ``lo-hi`` range.  :class:`EngineError` for a set with
    holes (``-Cr`` takes one range) or a CPU past :data:`MAX_CPUS` - 1."""
    _check_max(cpus, "-Cr/--cpu-range")
    parts = runs(cpus)
    if len(parts) != 1:
        raise EngineError(f"llama.cpp: -Cr/--cpu-range takes one lo-hi range, and CPUs {format_list(cpus)} are "
                          f"{len(parts)} ranges (a list after a comma is misread, not refused): use -C/--cpu-mask "
                          f"{cpu_mask(cpus)}")
    lo, hi = parts[0]
    return f"{lo}-{hi}"


def _check_max(cpus: frozenset[int], flag: str) -> None:
    over = sorted(c for c in cpus if c >= MAX_CPUS)
    if over:
        raise EngineError(f"llama.cpp: {flag} names CPUs 0-{MAX_CPUS - 1} only (GGML_MAX_N_THREADS); CPUs "
                          f"{format_list(over)} cannot be given")


def llamacpp_words(plans: Sequence[Any], *, form: str = "mask", batch: bool = True) -> EngineWords:
    """The flags of one llama.cpp instance per plan: ``--threads`` and
    ``--cpu-strict 1`` over the plan's CPUs given as ``--cpu-mask`` (``form="mask"``)
    or ``--cpu-range`` (``form="range"``), and with ``batch`` the same for the batch
    pool (``-tb``, ``-Cb``/``-Crb``, ``--cpu-strict-batch``).

    Raises
    ------
    EngineError
        No plan; a thread on several CPUs or two on one (``--cpu-strict`` gives each
        thread one CPU of the mask); instances sharing CPUs; a CPU past 511; a set
        with holes for ``form="range"``; an unknown ``form``.
    """
    if form not in ("mask", "range"):
        raise EngineError(f"llama.cpp: form must be 'mask' or 'range', not {form!r}")
    if not plans:
        raise EngineError("llama.cpp: no instance to bind (give one plan per instance)")
    sets = [one_cpu_per_thread("llama.cpp", _RULE, i, p.cpusets) for i, p in enumerate(plans)]
    check_disjoint("llama.cpp", sets, noun="instance")
    argv = []
    for cpus in sets:
        n = str(len(cpus))
        words = ("--cpu-mask", cpu_mask(cpus)) if form == "mask" else ("--cpu-range", cpu_range(cpus))
        flags = ("--threads", n, *words, "--cpu-strict", "1")
        if batch:
            bwords = ("--cpu-mask-batch", words[1]) if form == "mask" else ("--cpu-range-batch", words[1])
            flags += ("--threads-batch", n, *bwords, "--cpu-strict-batch", "1")
        argv.append(flags)
    memory = tuple(rank_memory(p, s) for p, s in zip(plans, sets))
    notes = ("--numa is left out: it re-pins every thread at each graph, over --cpu-strict's one CPU per thread",
             "llama.cpp binds no memory: start each instance with its memory bound to its nodes (numactl --membind, "
             "affinity run --membind)")
    return EngineWords("llama.cpp", (), tuple(argv), memory, notes)


def llamacpp_default(topology: Topology) -> int:
    """The thread count llama.cpp takes by itself: the machine's physical cores (its
    P-cores on a hybrid machine), whatever the process may use; no CPU mask."""
    cores = topology.cores
    if cores and any(c.efficiency != cores[0].efficiency for c in cores):
        best = max(c.efficiency or 0 for c in cores)
        return sum(1 for c in cores if (c.efficiency or 0) == best)
    return len(cores)


#: flags whose CPUs llama.cpp ORs into the one mask (common.cpp ``parse_cpu_mask`` and
#: ``parse_cpu_range`` set bits, never clear them): a command's own would widen ours
_MASK_FLAGS = ("-C", "--cpu-mask", "-Cr", "--cpu-range", "-Cb", "--cpu-mask-batch", "-Crb", "--cpu-range-batch")
#: flags whose last value wins: the words, which follow the command, replace a command's own
_LAST_WINS = ("-t", "--threads", "-tb", "--threads-batch", "--cpu-strict", "--cpu-strict-batch")


def command_flags(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """What a llama.cpp command line already says about its threads: (the CPU-mask
    flags, which llama.cpp would OR into the words' masks -- to refuse; the thread
    counts, strictness and ``--numa``, which the words replace or that re-pins over
    them -- to say).  A flag is found alone or as ``flag=value``."""
    refused, said = [], []
    for i, word in enumerate(argv[1:], 1):
        flag = word.split("=", 1)[0]
        value = word.split("=", 1)[1] if "=" in word else (argv[i + 1] if i + 1 < len(argv) else "")
        if flag in _MASK_FLAGS:
            refused.append(f"{flag} {value}".strip())
        elif flag in _LAST_WINS:
            said.append(f"the command's {flag} {value} is replaced by the layout's (its flags follow the command, "
                        f"and llama.cpp takes a flag's last value)")
        elif flag == "--numa":
            said.append(f"the command's --numa {value} re-pins every thread at each graph, over --cpu-strict's "
                        f"one CPU per thread: leave it out")
    return refused, said
