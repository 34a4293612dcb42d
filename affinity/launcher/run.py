"""``affinity run``: place a command's threads and memory, then exec it.

What numactl, taskset, likwid-pin and torch's ``run_cpu`` do, in one command
that speaks ``KMP_AFFINITY``::

    affinity run [SPEC] [options] -- CMD [ARGS...]

This module is the command (:func:`cmd_run`, and :func:`add_run_parser` for the
``affinity`` command line); the work is split the house way:

1. :mod:`~affinity.launcher.options`: the command line in, ``RunOptions`` out;
2. :mod:`~affinity.launcher.build` (pure): options, a
   :class:`~affinity.machine.topology.Topology` and a ``Context`` (environment,
   cgroup limits, allowed memory nodes) in; a ``Launch`` out -- per instance the
   process CPU mask, the memory policy, the plan (one CPU set per thread) and the
   environment that exports it;
3. :mod:`~affinity.launcher.execute`: validate everything that can fail (the
   command exists, the mask and memory policy can be set -- tried on this process
   and read back) *before* anything starts, then ``exec`` the command (one
   instance) or start every instance and wait for them (several); the exit status
   is the command's, or the worst instance's;
4. :mod:`~affinity.launcher.numactl`: ``--dry-run``, ``--show`` and ``--hardware``
   as numactl would say them.

The process mask is the selected CPU set (numactl's meaning), the thread
placement inside it travels in the environment (``KMP_AFFINITY`` with an
explicit proclist, ``OMP_PLACES``/``OMP_PROC_BIND``, ``GOMP_CPU_AFFINITY``,
``OMP_NUM_THREADS``, ``KMP_BLOCKTIME``, ``KMP_WARNINGS``, ``TF_NUM_INTRAOP_THREADS``/
``TF_NUM_INTEROP_THREADS``) and, with ``--pin-threads``, in a preloaded library
that pins threads as they are created (:mod:`~affinity.launcher.preload`); for
PyTorch, :mod:`~affinity.launcher.torch_env` (its inter-op size, libgomp's
load-time pin undone after ``import torch``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import stat
from typing import Any

from ..errors import TopologyError
from ..machine.topology import Topology
from ..record import replace
from .build import Context, Launch, build_launch
from .options import check_numa_nodes, options_from_args, run_parser, say
from .torch_env import hook_unreachable, is_python


__all__ = ["add_run_parser", "cmd_run"]


def add_run_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``run`` to the ``affinity`` command line, with :func:`cmd_run` as its function.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        Where ``run`` goes (what ``ArgumentParser.add_subparsers()`` returned).

    Returns
    -------
    argparse.ArgumentParser
        :func:`~affinity.launcher.options.run_parser`'s parser, its ``func`` set.
    """
    p = run_parser(subparsers)
    p.set_defaults(func=cmd_run)
    return p


def cmd_run(args: argparse.Namespace) -> int:
    """``affinity run``: see :func:`add_run_parser`.

    Parameters
    ----------
    args : argparse.Namespace
        What the ``run`` parser parsed.

    Returns
    -------
    int
        The exit status: the command's (several instances: the worst one's), ``0``
        after ``--dry-run``, ``--show`` or ``--hardware``, ``126``/``127`` when the
        command cannot be executed / is not found.  One instance is exec'd: no
        return on success.

    Raises
    ------
    AffinityError
        What cannot be planned or applied (the CLI turns it into status 1).
    SystemExit
        A usage error (status 2).
    """
    opts = _resolve_runtime(options_from_args(args))
    topology = _topology(args)
    if args.hardware:
        from .numactl import hardware_text  # lazy: only for --hardware

        print(hardware_text(topology, "/" if topology.is_this_system else None))
        return 0
    ctx = Context.of_this_process() if topology.is_this_system else Context(dict(os.environ))
    launch = build_launch(opts, topology, ctx)
    launch = _torch_hook_said(launch, ctx.environ)
    for w in launch.warnings:
        say(f"warning: {w}")
    for n in launch.notices:
        say(n)
    if launch.verbose:
        for n in launch.notes:
            say(n)
    if args.dry_run:
        return _dry_run(launch, args.json)
    if not topology.is_this_system:
        raise TopologyError("cannot run on a topology that is not this machine", topology.source)
    from .execute import execute, show_current  # lazy: binding layer + compiled core, only to really run

    if args.show:
        mems = ctx.mems_allowed if ctx.mems_allowed is not None else frozenset(
            n.os_index for n in topology.numa_nodes)
        print(show_current(launch, topology, mems))
        return 0
    return execute(launch)  # CannotExecute: its shell status, by errors.exit_status (tools.cli.main)


def _first_line(cmd: str, path: str) -> bytes | None:
    """The first 256 bytes of the command's file (what Linux reads for a ``#!``
    line), when it is a regular file this process may read; ``None`` otherwise."""
    found = shutil.which(cmd, path=path)
    if found is None:
        return None
    try:
        fd = os.open(found, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # (a FIFO: never waited for)
    except OSError:
        return None
    try:
        return os.read(fd, 256) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _torch_hook_said(launch: Launch, environ: dict[str, str]) -> Launch:
    """The launch with a warning where its command is a Python that cannot load the
    PyTorch hook (``python -E``/``-I``/``-S``, or such a ``#!`` line)."""
    if not launch.instances or not launch.instances[0].argv:
        return launch
    inst = launch.instances[0]
    env = {**environ, **inst.env}
    line = None if is_python(inst.argv[0]) else _first_line(inst.argv[0], env.get("PATH", os.defpath))
    said = hook_unreachable(inst.argv, line, env)  # decision: the torch hook cannot load (python -E/-I/-S)
    return replace(launch, warnings=(*launch.warnings, said)) if said else launch


def _topology(args: argparse.Namespace) -> Topology:
    """This machine, or ``--topology`` (with ``--numa-nodes`` for a cpuinfo file: refused
    with any other source, which says its own NUMA nodes)."""
    check_numa_nodes(args.numa_nodes, args.topology)
    if not args.topology:
        return Topology.from_system()
    return Topology.load(args.topology, numa_nodes=args.numa_nodes)


def _resolve_runtime(opts: Any) -> Any:
    """``--runtime auto``: the rules of the OpenMP runtime the command's executable
    links (:mod:`.elfneeds`), else the default (Intel's); ``-v`` says which and why."""
    if opts.runtime != "auto" or not opts.command:
        return opts if opts.runtime != "auto" else replace(opts, runtime="intel")
    from .elfneeds import command_runtime  # lazy: only for --runtime auto

    found = command_runtime(opts.command[0])
    runtime = found.runtime or "intel"
    if opts.verbose:
        say(f"--runtime auto: {runtime}'s rules ({found.why}" + ("" if found.runtime else "; the default") + ")")
    return replace(opts, runtime=runtime)


def _dry_run(launch: Launch, as_json: bool) -> int:
    """``--dry-run``: the launch as shell lines or JSON."""
    import json  # lazy: only --dry-run --json prints JSON

    from .numactl import shell_text  # lazy: only for --dry-run

    print(json.dumps(launch.to_dict(), indent=2) if as_json else shell_text(launch))
    return 0
