"""A configuration in ready-to-use forms: the ``affinity run`` words, the environment
it exports, and the ``affinity.apply(...)`` call that does the same in a process.

The mapping from the tuner's names to the launcher (used by ``affinity tune`` to
run each trial, and by :class:`~affinity.tuning.search.TuneResult` to show the
best):

==============  ============================================================
``affinity``    the SPEC (``granularity=G,TYPE`` with ``granularity``)
``threads``     ``-t N`` (else ``omp``, else ``intra``: the team the plan places)
``instances``   ``--instances K`` (disjoint shares of whole cores)
``blocktime``   ``--blocktime MS``
``membind``     ``--localalloc`` / ``--interleave all`` / nothing (``none``)
``omp``         ``OMP_NUM_THREADS`` (when it differs from the team)
``intra``       ``TF_NUM_INTRAOP_THREADS``
``inter``       ``TF_NUM_INTEROP_THREADS``
other names     exported as variables of that name, and substituted for
                ``{name}`` in the command's words
==============  ============================================================

The variables are set with ``env`` in front of the command, after the launcher
has exported the plan's, so the tuned values win.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from ..cpulist import IdList
from ..launcher.build import Context, build_launch
from ..launcher.options import RunOptions
from ..machine.topology import Topology
from .priors import affinity_spec
from .space import KNOWN

__all__ = ["apply_call", "command_words", "env_overrides", "environment", "run_words", "shell_line"]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _team(config: Mapping[str, Any]) -> int | None:
    for name in ("threads", "omp", "intra"):
        if config.get(name) is not None:
            return int(config[name])
    return None


def run_words(config: Mapping[str, Any]) -> list[str]:
    """The ``affinity run`` options (SPEC first) that apply ``config``.

    Parameters
    ----------
    config : mapping
        A configuration.

    Returns
    -------
    list of str
        E.g. ``["granularity=fine,scatter", "-t", "28", "--instances", "2", "--blocktime", "1"]``.
    """
    words: list[str] = []
    spec = affinity_spec(config)
    if spec:
        words.append(spec)
    team = _team(config)
    if team is not None:
        words += ["-t", str(team)]
    k = int(config.get("instances", 1))
    if k > 1:
        words += ["--instances", str(k)]
    if "blocktime" in config:
        words += ["--blocktime", str(config["blocktime"])]
    mb = config.get("membind")
    if mb == "local":
        words.append("--localalloc")
    elif mb == "interleave":
        words += ["--interleave", "all"]
    return words


def env_overrides(config: Mapping[str, Any]) -> dict[str, str]:
    """The variables set in front of the command: the counts the plan does not export
    itself, and every parameter the tuner does not interpret.

    Parameters
    ----------
    config : mapping
        A configuration.

    Returns
    -------
    dict of str to str
    """
    env: dict[str, str] = {}
    team = _team(config)
    if config.get("omp") is not None and int(config["omp"]) != team:
        env["OMP_NUM_THREADS"] = str(config["omp"])
    if config.get("intra") is not None:
        env["TF_NUM_INTRAOP_THREADS"] = str(config["intra"])
    if config.get("inter") is not None:
        env["TF_NUM_INTEROP_THREADS"] = str(config["inter"])
    for name, value in config.items():
        if name not in KNOWN and _ENV_NAME.match(name):
            env[name] = str(value)
    return env


def command_words(config: Mapping[str, Any], command: Sequence[str]) -> list[str]:
    """``command`` with ``{name}`` replaced by the value of each parameter the tuner does
    not interpret, and ``env VAR=VALUE ...`` in front when variables are set.

    Parameters
    ----------
    config : mapping
        A configuration.
    command : sequence of str
        The command and its arguments.

    Returns
    -------
    list of str
    """
    words = list(command)
    for name, value in config.items():
        if name not in KNOWN:
            words = [w.replace("{" + name + "}", str(value)) for w in words]
    env = env_overrides(config)
    return (["env"] + [f"{k}={v}" for k, v in env.items()] + words) if env else words


def shell_line(config: Mapping[str, Any], command: Sequence[str] | None = None) -> str:
    """The ``affinity run ... -- CMD`` line that applies ``config`` (``CMD`` when no command).

    Parameters
    ----------
    config : mapping
        A configuration.
    command : sequence of str, optional
        The command; default the placeholder ``CMD``.

    Returns
    -------
    str
    """
    cmd = command_words(config, list(command) if command else ["CMD"])
    return shlex.join(["affinity", "run", *run_words(config), "--", *cmd])


def environment(config: Mapping[str, Any], topology: Topology) -> dict[str, str]:
    """The environment the first instance of ``config`` runs with on ``topology`` (the
    plan's variables, then the overrides), computed without running anything.

    Parameters
    ----------
    config : mapping
        A configuration.
    topology : Topology
        The machine.

    Returns
    -------
    dict of str to str
    """
    mb = config.get("membind")
    opts = RunOptions(command=("CMD",), spec=affinity_spec(config), threads=_team(config),
                      instances=int(config.get("instances", 1)),
                      mempolicy={"local": "local", "interleave": "interleave"}.get(str(mb)),
                      mem_nodes=IdList.parse("all", "node") if mb == "interleave" else None,
                      blocktime=str(config["blocktime"]) if "blocktime" in config else "1")
    launch = build_launch(opts, topology, Context({}))
    env = {k: v for k, v in launch.instances[0].env.items() if not k.startswith("AFFINITY_")}
    env.update(env_overrides(config))
    return env


def apply_call(config: Mapping[str, Any]) -> str:
    """Python lines that give one process the placement of ``config`` with
    :func:`affinity.apply` (before TensorFlow or an OpenMP runtime starts).

    Parameters
    ----------
    config : mapping
        A configuration.

    Returns
    -------
    str
        ``import affinity`` and the call; with several instances the call takes
        ``rank="auto"`` (each process its share, under a launcher that sets local
        ranks); the TensorFlow pool sizes when ``intra``/``inter`` are tuned.
    """
    args = [repr(affinity_spec(config) or "granularity=fine,compact,1,0")]
    team = _team(config)
    if team is not None:
        args.append(f"threads={team}")
    if "blocktime" in config:
        args.append(f"blocktime={str(config['blocktime'])!r}")
    if config.get("membind") == "interleave":
        args.append("membind='interleave:all'")
    k = int(config.get("instances", 1))
    if k > 1:
        args.append("rank='auto'")
    lines = ["import affinity", f"binding = affinity.apply({', '.join(args)})"]
    if k > 1:
        lines.insert(1, f"# {k} instances: start {k} processes (e.g. mpirun -n {k}, torchrun), each takes "
                        f"its share; or use the affinity run line")
    if config.get("intra") is not None or config.get("inter") is not None:
        lines.append("import tensorflow as tf  # after apply(): its pools are sized here")
        if config.get("intra") is not None:
            lines.append(f"tf.config.threading.set_intra_op_parallelism_threads({config['intra']})")
        if config.get("inter") is not None:
            lines.append(f"tf.config.threading.set_inter_op_parallelism_threads({config['inter']})")
    others = {n: v for n, v in config.items() if n not in KNOWN}
    if config.get("omp") is not None and int(config["omp"]) != team:
        others["OMP_NUM_THREADS"] = config["omp"]
    if others:
        lines.insert(1, "import os")
        lines.insert(2, f"os.environ.update({ {k: str(v) for k, v in others.items()}!r})")
    return "\n".join(lines)
