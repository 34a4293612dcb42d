"""A configuration in ready-to-use forms: the ``affinity run`` words, the environment
it exports, and the ``affinity.apply(...)`` call that does the same in a process.

A configuration becomes :class:`~affinity.launcher.options.RunOptions` once
(:meth:`Config.run_options <affinity.tuning.config.Config.run_options>`); the
launcher turns those into words (:meth:`RunOptions.to_words
<affinity.launcher.options.RunOptions.to_words>`, the inverse of its parser) and into
the environment of a launch (:func:`~affinity.launcher.build.build_launch`): the
flags, the default spec and the default blocktime are the launcher's, not spelled
again here.

==============  ============================================================
``affinity``    the SPEC (``granularity=G,TYPE`` with ``granularity``)
``threads``     ``-t N`` (else ``omp``, else ``intra``: the team the plan places)
``instances``   ``--instances K`` (disjoint shares of whole cores)
``blocktime``   ``--blocktime MS``
``membind``     ``-l`` / ``-i all`` / nothing (``none``)
``omp``         ``OMP_NUM_THREADS`` (when it differs from the team)
``intra``       ``TF_NUM_INTRAOP_THREADS``
``inter``       ``TF_NUM_INTEROP_THREADS``
``env:NAME``    the variable ``NAME``
other names     substituted for ``{name}`` in the command's words
==============  ============================================================

The variables are set with ``env`` in front of the command, after the launcher
has exported the plan's, so the tuned values win.

:func:`exports` is the environment to type by hand: only what the program's
framework reads (:data:`READS`, :func:`frameworks_in`), never ``PYTHONPATH``, and
no binding for an affinity type that binds nothing.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..launcher.build import Context, build_launch
from ..machine.topology import Topology
from ..planning.planner import RUNTIMES
from ..planning.spec import DEFAULT_SPEC, parse_kmp_affinity
from ..record import record
from .config import Config

__all__ = ["READS", "Exports", "apply_call", "command_words", "env_overrides", "environment", "export_lines",
           "exports", "frameworks_in", "run_words", "shell_line"]


def run_words(config: Mapping[str, Any] | Config, environ: Mapping[str, str] | None = None) -> list[str]:
    """The ``affinity run`` options (SPEC first) that apply ``config``.

    Parameters
    ----------
    config : mapping or Config
        A configuration.
    environ : mapping, optional
        The environment ``affinity run`` will start in (its ``KMP_BLOCKTIME`` is the
        launcher's default); default: an empty one.

    Returns
    -------
    list of str
        E.g. ``["granularity=fine,scatter", "-t", "28", "--instances", "2", "--blocktime", "1"]``.
    """
    return Config.of(config).run_options().to_words(environ)


def env_overrides(config: Mapping[str, Any] | Config) -> dict[str, str]:
    """The variables set in front of the command (:meth:`Config.env_overrides
    <affinity.tuning.config.Config.env_overrides>`)."""
    return Config.of(config).env_overrides()


def command_words(config: Mapping[str, Any] | Config, command: Sequence[str]) -> list[str]:
    """``command`` with ``{name}`` replaced and ``env VAR=VALUE ...`` in front when
    variables are set (:meth:`Config.command_words <affinity.tuning.config.Config.command_words>`)."""
    return Config.of(config).command_words(command)


def shell_line(config: Mapping[str, Any] | Config, command: Sequence[str] | None = None) -> str:
    """The ``affinity run ... -- CMD`` line that applies ``config`` (``CMD`` when no command).

    Parameters
    ----------
    config : mapping or Config
        A configuration.
    command : sequence of str, optional
        The command; default the placeholder ``CMD``.

    Returns
    -------
    str
    """
    opts = Config.of(config).run_options(list(command) if command else ["CMD"])
    return shlex.join(["affinity", "run", *opts.to_words()])


#: the frameworks :func:`frameworks_in` recognizes, and the variables of a launch
#: each one's threads read: TensorFlow's pools and the OpenMP runtime it may run on
#: (Intel's or LLVM's in Intel's builds, libgomp elsewhere); PyTorch's wheels bundle
#: libgomp, which reads no ``KMP_*`` and no ``TF_*``
READS: dict[str, frozenset[str]] = {
    "tensorflow": frozenset(RUNTIMES["intel"].VARIABLES) | frozenset(RUNTIMES["gnu"].VARIABLES)
    | {"KMP_BLOCKTIME", "KMP_WARNINGS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"},
    "torch": frozenset(RUNTIMES["gnu"].VARIABLES),
}
#: the variables that place threads: replaced by "no binding" where the type binds nothing
_PLACING = ("KMP_AFFINITY", "OMP_PLACES", "OMP_PROC_BIND", "GOMP_CPU_AFFINITY")
_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import\b|import\s+([\w.]+(?:\s+as\s+\w+)?"
                     r"(?:\s*,\s*[\w.]+(?:\s+as\s+\w+)?)*))")


def frameworks_in(texts: Iterable[str]) -> frozenset[str]:
    """The frameworks of :data:`READS` that Python sources ``texts`` import at the
    start of a statement (``import torch``, ``from tensorflow import keras``,
    ``import numpy as np, torch``; statements split at new lines and ``;``).

    Cannot see an import hidden behind another module, ``importlib`` or ``exec``:
    the face then says it could not tell.
    """
    found: set[str] = set()
    for text in texts:
        for stmt in re.split(r"[\n;]", text):
            m = _IMPORT.match(stmt)
            if m is None:
                continue
            names = [m.group(1)] if m.group(1) else [n.split()[0] for n in m.group(2).split(",")]
            found.update(n.strip().split(".")[0] for n in names if n.strip().split(".")[0] in READS)
    return frozenset(found)


@record
class Exports:
    """What to export to run a program as ``config`` ran (:func:`exports`).

    Parameters
    ----------
    env : dict of str to str
        The variables, in the launcher's order, then the overrides.
    notes : tuple of str
        What the variables cannot do on their own, or could not be told (comment
        lines, without the ``#``).
    """

    env: dict[str, str]
    notes: tuple[str, ...] = ()


def exports(config: Mapping[str, Any] | Config, topology: Topology,
            frameworks: Iterable[str] | None = None) -> Exports:
    """The variables a program started by hand needs to run as ``config`` ran in a
    trial, on ``topology``: what the launcher exports for its first instance
    (:func:`~affinity.launcher.build.build_launch`, computed without running
    anything), then the configuration's own variables, kept to what the program's
    ``frameworks`` read (:data:`READS`); the ``env:NAME`` parameters always.

    * never ``PYTHONPATH`` (``affinity run`` puts its PyTorch start-up hook,
      inside this package, in front of the user's) nor a variable only that hook
      reads (``AFFINITY_TORCH_INTEROP_THREADS``): what the hook does is said in a
      note instead;
    * an affinity type that binds nothing (``none``, ``disabled``) is said as no
      binding -- ``KMP_AFFINITY=none`` and ``OMP_PROC_BIND=false`` -- not as the
      launcher's list of every thread on the whole mask, which binds the same way
      on this machine only;
    * ``frameworks`` None or empty (not recognized in the command's files): the
      variables of every runtime the launcher speaks to, said in a note.

    Parameters
    ----------
    config : mapping or Config
        A configuration.
    topology : Topology
        The machine.
    frameworks : iterable of str, optional
        Names of :data:`READS` (:func:`frameworks_in` the command's sources).

    Returns
    -------
    Exports
    """
    cfg = Config.of(config)
    known = frozenset(frameworks or ()) & READS.keys()
    if cfg.intra is not None or cfg.inter is not None:
        known |= {"tensorflow"}
    if cfg.torch_threads is not None or cfg.interop is not None or cfg.dataloader_workers is not None:
        known |= {"torch"}
    launch = build_launch(cfg.run_options(["CMD"]), topology, Context({}))
    env = {k: v for k, v in launch.instances[0].env.items() if not k.startswith("AFFINITY_") and k != "PYTHONPATH"}
    if cfg.spec is not None and parse_kmp_affinity(cfg.spec).type in ("none", "disabled"):
        env = {k: v for k, v in env.items() if k not in _PLACING}
        env.update({"KMP_AFFINITY": parse_kmp_affinity(cfg.spec).type, "OMP_PROC_BIND": "false"})
    notes: list[str] = []
    if known:
        reads = frozenset().union(*(READS[f] for f in known))
        env = {k: v for k, v in env.items() if k in reads}
    else:
        notes.append("the command's files import neither torch nor tensorflow (as far as can be read): the "
                     "variables of every runtime affinity run speaks to (TF_NUM_* are TensorFlow's, KMP_* Intel's "
                     "and LLVM's OpenMP)")
    overrides = cfg.env_overrides()
    interop = overrides.pop("AFFINITY_TORCH_INTEROP_THREADS", None)
    env.update(overrides)
    notes += _torch_notes(known, env, interop)
    return Exports(env, tuple(notes))


def _torch_notes(known: frozenset[str], env: Mapping[str, str], interop: str | None) -> list[str]:
    """What ``affinity run``'s PyTorch hook does that no variable does."""
    notes = []
    if interop is not None:
        notes.append(f"PyTorch's inter-op pool: torch.set_num_interop_threads({interop}) before its first parallel "
                     f"work (no variable sizes it; the affinity run line and apply() do)")
    if "torch" in known and env.get("OMP_PROC_BIND", "false") != "false":
        notes.append("PyTorch's libgomp pins the thread that runs 'import torch' to the first place, and DataLoader "
                     "workers started later inherit that one place: the affinity run line and affinity.apply() "
                     "undo it, these exports alone do not")
    return notes


def environment(config: Mapping[str, Any] | Config, topology: Topology,
                frameworks: Iterable[str] | None = None) -> dict[str, str]:
    """The variables of :func:`exports` (without its notes).

    Parameters
    ----------
    config : mapping or Config
        A configuration.
    topology : Topology
        The machine.
    frameworks : iterable of str, optional
        What the program imports (:func:`frameworks_in`); None: not known.

    Returns
    -------
    dict of str to str
    """
    return exports(config, topology, frameworks).env


def export_lines(exp: Exports, instances: int = 1) -> str:
    """``exp`` as shell lines: its notes as comments, then ``export NAME=VALUE``."""
    head = [f"# instance 0 of {instances}: 'affinity run' gives each instance its own CPUs"] if instances > 1 else []
    return "\n".join(head + [f"# {n}" for n in exp.notes] +
                     [f"export {n}={shlex.quote(v)}" for n, v in exp.env.items()])


def apply_call(config: Mapping[str, Any] | Config) -> str:
    """Python lines that give one process the placement of ``config`` with
    :func:`affinity.apply` (before TensorFlow or an OpenMP runtime starts).

    Parameters
    ----------
    config : mapping or Config
        A configuration.

    Returns
    -------
    str
        ``import affinity`` and the call; with several instances the call takes
        ``rank="auto"`` (each process its share, under a launcher that sets local
        ranks); the TensorFlow pool sizes when ``intra``/``inter`` are tuned;
        ``dataloader_workers=K`` (and the DataLoader's ``num_workers``) when the
        DataLoader's workers are tuned.
    """
    cfg = Config.of(config)
    args = [repr(cfg.spec or DEFAULT_SPEC)]
    if cfg.team is not None:
        args.append(f"threads={cfg.team}")
    if cfg.blocktime is not None:
        args.append(f"blocktime={str(cfg.blocktime)!r}")
    if cfg.membind == "interleave":
        args.append("membind='interleave:all'")
    if cfg.dataloader_workers is not None:
        args.append(f"dataloader_workers={int(cfg.dataloader_workers)}")
    k = int(cfg.instances)
    if k > 1:
        args.append("rank='auto'")
    lines = ["import affinity", f"binding = affinity.apply({', '.join(args)})"]
    if cfg.dataloader_workers is not None:
        lines.append(f"# and DataLoader(..., num_workers={int(cfg.dataloader_workers)}): apply() has placed them")
    if k > 1:
        lines.insert(1, f"# {k} instances: start {k} processes (e.g. mpirun -n {k}, torchrun, or the "
                        f"affinity run line), each takes its share")
    if cfg.intra is not None or cfg.inter is not None:
        lines.append("import tensorflow as tf  # after apply(): its pools are sized here")
        if cfg.intra is not None:
            lines.append(f"tf.config.threading.set_intra_op_parallelism_threads({cfg.intra})")
        if cfg.inter is not None:
            lines.append(f"tf.config.threading.set_inter_op_parallelism_threads({cfg.inter})")
    others = dict(cfg.env)
    if cfg.omp is not None and int(cfg.omp) != cfg.team:
        others["OMP_NUM_THREADS"] = str(cfg.omp)
    if others:
        lines.insert(1, "import os")
        lines.insert(2, f"os.environ.update({others!r})")
    return "\n".join(lines)
