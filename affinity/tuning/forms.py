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
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from ..launcher.build import Context, build_launch
from ..machine.topology import Topology
from ..planning.spec import DEFAULT_SPEC
from .config import Config

__all__ = ["apply_call", "command_words", "env_overrides", "environment", "run_words", "shell_line"]


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


def environment(config: Mapping[str, Any] | Config, topology: Topology) -> dict[str, str]:
    """The environment the first instance of ``config`` runs with on ``topology`` (the
    plan's variables, then the overrides), computed by the launcher without running
    anything.

    Parameters
    ----------
    config : mapping or Config
        A configuration.
    topology : Topology
        The machine.

    Returns
    -------
    dict of str to str
    """
    cfg = Config.of(config)
    launch = build_launch(cfg.run_options(["CMD"]), topology, Context({}))
    env = {k: v for k, v in launch.instances[0].env.items() if not k.startswith("AFFINITY_")}
    env.update(cfg.env_overrides())
    return env


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
