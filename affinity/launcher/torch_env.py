"""What ``affinity run`` adds for PyTorch in the processes it starts.

PyTorch reads ``OMP_NUM_THREADS`` for its intra-op team (the plan exports it,
per instance), but no variable for its inter-op pool; and its libgomp, reading the
exported ``OMP_PLACES``, binds the main thread to the first place while
``import torch`` runs, which every DataLoader worker forked later inherits.
:func:`torch_environment` exports the inter-op size
(``AFFINITY_TORCH_INTEROP_THREADS``) and puts :mod:`affinity.launcher.torchboot`
first on ``PYTHONPATH``: its ``sitecustomize`` gives the importing thread its mask
back right after ``import torch``, sizes the pool when the program first forks
work onto it (not before: ``torch.set_num_interop_threads`` is accepted once, and
that one call is the program's), and does nothing in a program that never imports
torch.

What it cannot reach: a Python that reads no ``PYTHONPATH`` (``-E``, ``-I``) or
imports no ``site`` (``-S``), given on the command line or on a script's ``#!``
line.  :func:`hook_unreachable` tells so from the command (and the script's first
line), and ``affinity run`` warns: libgomp's load-time pin then stays.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any


__all__ = ["BOOT_DIR", "hook_unreachable", "is_python", "python_argv", "torch_environment"]

#: the directory whose ``sitecustomize`` prepares PyTorch in launched Python processes
BOOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchboot")


def torch_environment(plan: Any, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that size PyTorch's inter-op pool from ``plan`` and undo
    libgomp's load-time pin in a Python process started with ``environ``."""
    path = environ.get("PYTHONPATH", "")
    # (an empty entry is kept: Python reads it as the working directory; an empty
    # PYTHONPATH is no entry at all)
    parts = [p for p in path.split(os.pathsep) if p != BOOT_DIR] if path else []
    return {"AFFINITY_TORCH_INTEROP_THREADS": str(int(plan.inter_op_threads)),
            "PYTHONPATH": os.pathsep.join([BOOT_DIR, *parts])}


#: Python options that keep the hook out: ``-E``/``-I`` ignore ``PYTHONPATH``, ``-S`` imports no ``site``
_NO_HOOK = frozenset("EIS")
_WITH_VALUE = frozenset("WX")  #: options whose value is attached or the next word
_LAST = frozenset("cm")  #: options whose value ends Python's options (the rest is the program's)
#: libgomp binds the thread that loads it when one of these is set (OMP_PROC_BIND=false: not)
_LOAD_PIN = ("OMP_PLACES", "OMP_PROC_BIND", "GOMP_CPU_AFFINITY")


def is_python(path: str) -> bool:
    """``python``, ``python3``, ``python3.11`` (by name: how the command line says it)."""
    name = os.path.basename(path)
    return name.startswith("python") and all(c.isdigit() or c == "." for c in name[6:])


def python_argv(argv: Sequence[str], first_line: bytes | None = None) -> list[str] | None:
    """The argument vector of the Python interpreter ``argv`` runs: ``argv`` itself
    when it names Python, or the ``#!`` line ``first_line`` of the script it names,
    expanded as Linux does (the interpreter, its one optional argument, the script,
    the arguments; ``#!/usr/bin/env [-S] python3 ...`` looked through); ``None``
    when it is not a Python interpreter (as far as its name says)."""
    if not argv:
        return None
    if is_python(argv[0]):
        return list(argv)
    if not first_line or not first_line.startswith(b"#!"):
        return None
    line = first_line[2:].split(b"\n", 1)[0].decode("utf-8", "surrogateescape").strip()
    interp, _, arg = line.partition(" ")
    interp, arg = interp.strip(), arg.strip()
    words = [interp, arg] if arg else [interp]
    if os.path.basename(interp) == "env" and arg:
        rest = arg[2:].split() if arg.startswith("-S") else [arg]  # (without -S: one program name)
        while rest and (rest[0].startswith("-") or "=" in rest[0]):  # env's options and NAME=VALUE
            rest.pop(0)
        words = rest
    if not words or not is_python(words[0]):
        return None
    return [*words, *argv]


def _options(argv: Sequence[str]) -> set[str]:
    """The one-letter options Python reads in ``argv`` (after the interpreter, up to
    the program: a script, ``-``, ``-c``/``-m``'s value or ``--``)."""
    found: set[str] = set()
    words = iter(argv[1:])
    for word in words:
        if word == "--" or not word.startswith("-") or word == "-":
            break
        if word.startswith("--"):  # --check-hash-based-pycs MODE, --help..., --version
            if word == "--check-hash-based-pycs":
                next(words, None)
            continue
        for i, c in enumerate(word[1:], start=1):
            found.add(c)
            if c in _WITH_VALUE or c in _LAST:
                if i == len(word) - 1:
                    next(words, None)
                break
        if found & _LAST:
            break
    return found


def hook_unreachable(argv: Sequence[str], first_line: bytes | None, env: Mapping[str, str]) -> str | None:
    """Why the PyTorch hook of this module cannot load in the command ``argv`` run
    with ``env`` -- a Python given ``-E``/``-I`` (no ``PYTHONPATH``) or ``-S`` (no
    ``site``), on its command line or its script's ``#!`` line ``first_line`` --
    while ``env`` makes libgomp pin the thread that loads it; ``None`` otherwise.

    Pure: the caller reads the script's first line (``None``: not read)."""
    py = python_argv(argv, first_line)
    if py is None or not env.get("AFFINITY_TORCH_INTEROP_THREADS"):
        return None
    flags = sorted(_options(py) & _NO_HOOK)
    binds = env.get("OMP_PROC_BIND", "").strip().lower().split(",")[0] != "false"
    if not flags or not binds or not any(env.get(k) for k in _LOAD_PIN):
        return None
    why = {"E": "-E ignores PYTHONPATH", "I": "-I ignores PYTHONPATH", "S": "-S imports no site"}
    who = py[0] if is_python(argv[0]) else f"{' '.join(py[:-len(argv)])} (the #! line of {argv[0]})"
    return (f"{who}: "
            f"{', '.join(why[f] for f in flags)}, so affinity's PyTorch hook cannot load: if the program "
            f"imports torch, its libgomp keeps the main thread on its first place (and every thread and "
            f"process started after it); run it with --pin-threads --no-pin-main (libgomp then binds nothing at "
            f"load), or without -{''.join(flags)}")
