"""Command line: ``python -m affinity <command>`` (also the ``affinity`` script).

Every command is a function ``cmd_<name>(args) -> int``; :func:`main` parses
``argv`` and returns the exit status (``0`` ok, ``1`` failure, ``2`` usage).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

from ..errors import AffinityError, CommandError, PictureError, UsageError, exit_status
from typing import Any
import argparse


class _OnFirstUse:
    """A standard module imported when first used: ``affinity run`` starts in the
    time Python takes, and most commands never print JSON."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        module = importlib.import_module(self._name)
        globals()[self._name] = module
        return getattr(module, attr)


json: Any = _OnFirstUse("json")

__all__ = ["main"]


def _add_topology_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", metavar="SRC", default=None,
                   help="machine to use: an hwloc XML file, a file of 'affinity topology --json', a cpuinfo file, "
                        "'synthetic:<description>', 'fsroot:<dir>' (a described machine's sys/ tree, GPUs "
                        "included) or 'system' (default: this machine)")
    p.add_argument("--numa-nodes", metavar="DIR", default=None,
                   help="with a cpuinfo file: a sysfs-like node directory (nodeN/cpulist)")


def _load_topology(args: argparse.Namespace):
    from ..launcher.options import check_numa_nodes  # lazy: a command loads only its own layers
    from ..machine.topology import Topology  # lazy: a command loads only its own layers

    check_numa_nodes(args.numa_nodes, args.topology)
    return Topology.load(args.topology, numa_nodes=args.numa_nodes)


def cmd_topology(args: argparse.Namespace) -> int:
    topo = _load_topology(args)
    if args.json:
        print(topo.to_json(indent=2))
    else:
        print(topo.tree())
    return 0


def cmd_version(args: argparse.Namespace) -> int:
    from ..version import __version__  # lazy: a command loads only its own layers
    from ..machine import _native  # lazy: a command loads only its own layers

    info = {"affinity": __version__, **_native.hwloc_info()}
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for k, v in info.items():
            print(f"{k}: {v}")
    return 0


def _usage(args: argparse.Namespace, message: str) -> int:
    print(f"affinity {args.command}: error: {message}\n(see 'affinity {args.command} --help')",
          file=sys.stderr)
    return exit_status(UsageError(message))


def _picture_path(text: str) -> str:
    """``--picture``'s argparse type: the file checked before any work (a usage error)."""
    import argparse  # the standard parser: only once a command line is parsed

    from .picture import check_path  # lazy: only with --picture

    try:
        return check_path(text)
    except PictureError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _write_picture(path: str, *a: object, **k: object) -> None:
    """Draw to ``path`` and say so; an OS error on the user's path is one line."""
    from .picture import save  # lazy: a command loads only its own layers

    try:
        save(path, *a, **k)
    except OSError as e:
        raise CommandError(f"cannot write the picture {path}: {e.strerror or e}") from None
    print(f"picture written to {path}", file=sys.stderr)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _planned(spec: str | None, env: dict[str, str]) -> str:
    """What ``affinity plan`` planned, as its headers and picture say it: the SPEC, the
    ``--env`` settings, or the runtime's defaults when neither is given."""
    given = ([spec] if spec else []) + ([" ".join(f"{k}={v}" for k, v in env.items()) + " (--env)"] if env else [])
    return ", ".join(given) or "the runtime defaults"


def _plan_text(p: object, spec: str | None, env: dict[str, str], torch: bool = False) -> str:
    """The answer first: one line per thread; the runtime's verbose map is ``-v``.
    ``torch``: the plan is shown for PyTorch (its rules, or DataLoader workers):
    say where its thread 0 goes."""
    from ..cpulist import format_list  # lazy: a command loads only its own layers

    gran = f" at {p.granularity} granularity" if p.granularity else ""
    lines = [f"plan: {_planned(spec, env)} on {p.topology.describe()}{_in_mask(p)} ({p.runtime}'s rules)",
             f"{_plural(p.threads, 'thread')}, {p.affinity_type}{gran} (proc_bind {p.proc_bind}):"]
    lines += [f"  thread {i} -> {{{format_list(s)}}}" for i, s in enumerate(p.cpusets)]
    if torch and p.threads > 1 and p.cpusets[0] != p.union:
        import textwrap  # lazy: only for a plan shown for PyTorch

        first, union = f"{{{format_list(p.cpusets[0])}}}", f"{{{format_list(p.union)}}}"
        lines += textwrap.wrap(
            f"note: under PyTorch thread 0 is the main thread (intra-op thread 0), and apply(), pinned() and "
            f"affinity run keep it on all the plan's CPUs {union}, not {first}: by design, so that the threads "
            f"and DataLoader workers it starts get them (affinity run --pin-threads pins it to {first})",
            100, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False)
    lines += [f"warning: {w}" for w in _hinted(spec, p.warnings)]
    lines += [f"warning: {w}" for w in _unread(spec, p.runtime)]
    return "\n".join(lines)


def _in_mask(p: Any) -> str:
    """`` in process mask 100-111`` when the plan starts from another mask than the machine's."""
    from ..cpulist import format_list  # lazy: a command loads only its own layers

    whole = p.topology.allowed or p.topology.cpuset
    return "" if p.initial_mask == whole else f" in process mask {format_list(p.initial_mask)}"


def _unread(spec: str | None, runtime: str) -> list[str]:
    """What ``spec`` sets that ``runtime`` never reads (:func:`affinity.planning.planner.unread`)."""
    from ..planning.planner import unread  # lazy: a command loads only its own layers

    return unread(spec, runtime)


def _hinted(spec: str | None, warnings: Sequence[str]) -> list[str]:
    """The plan's warnings with their hints (:func:`affinity.planning.planner.hinted`)."""
    from ..planning.planner import hinted  # lazy: a command loads only its own layers

    return hinted(spec, warnings)


def _translations(p: Any) -> tuple[dict[str, str | None], dict[str, str]]:
    """The plan in every runtime's words (``--translate``, ``--json``), and why a form
    cannot say it (GOMP_CPU_AFFINITY cannot give a thread several CPUs)."""
    translations: dict[str, str | None] = {}
    untranslatable: dict[str, str] = {}
    for name, fn in (("KMP_AFFINITY", p.to_kmp_affinity), ("OMP_PLACES", p.to_omp_places),
                     ("GOMP_CPU_AFFINITY", p.to_gomp_cpu_affinity), ("taskset", p.to_taskset),
                     ("numactl", p.to_numactl)):
        try:
            translations[name] = fn()
        except AffinityError as e:
            translations[name] = None
            untranslatable[name] = str(e)
    return translations, untranslatable


def cmd_plan(args: argparse.Namespace) -> int:
    from ..cpulist import parse_list  # lazy: a command loads only its own layers

    if getattr(args, "engine", None) is not None:
        from .engines_report import cmd_plan_for  # lazy: only for --for

        return cmd_plan_for(args, _load_topology(args), _write_picture)
    if getattr(args, "ranks", None) is None and (getattr(args, "gpu_bind", None) or getattr(args, "reserve_cores", 0)):
        return _usage(args, "--gpu-bind and --reserve-cores go with --ranks N|auto (each rank next to its GPU)")
    if getattr(args, "ranks", None) is not None:
        from .ranks_report import cmd_plan_ranks  # lazy: only for --ranks

        return cmd_plan_ranks(args, _load_topology(args), _write_picture)
    from ..errors import SpecError  # lazy: a command loads only its own layers
    from ..planning.planner import plan  # lazy: a command loads only its own layers
    from ..planning.spec import parse_assignments  # lazy: a command loads only its own layers

    try:
        mask = None if args.mask is None else parse_list(args.mask)
    except ValueError as e:
        return _usage(args, f"--mask {args.mask}: {e}")
    try:
        env = parse_assignments(args.env, what="--env")
    except SpecError as e:
        return _usage(args, str(e))
    topo = _load_topology(args)
    if mask is not None:  # a CPU the machine lacks is no mask a process can have: not dropped silently
        try:
            topo.check_cpus(mask, f"--mask {args.mask}")
        except AffinityError as e:
            return _usage(args, str(e))
    if args.runtime == "auto":  # this process's loaded runtime: usually none -> the default
        from ..binding.which import resolve_runtime  # lazy: only for --runtime auto

        args.runtime = resolve_runtime("auto", caller="affinity plan --runtime")
        print(f"plan: --runtime auto: {args.runtime} (the OpenMP runtime loaded in this affinity process; "
              f"Intel's rules when none is)", file=sys.stderr)
    p = plan(args.spec, threads=args.threads, topology=topo, strict=not args.lenient, env=env,
             initial_mask=mask, runtime=args.runtime)
    if args.compare:
        return _plan_compare(args, p, env, mask, topo)
    translations, untranslatable = _translations(p)
    workers = None
    if args.dataloader_workers is not None:
        from ..planning.workers import worker_layout  # lazy: a command loads only its own layers

        workers = worker_layout(p, args.dataloader_workers)
    if args.json:
        print(json.dumps({**p.to_dict(), "unread": _unread(args.spec, p.runtime),
                          "translations": translations, "untranslatable": untranslatable,
                          **({"dataloader_workers": workers.to_dict()} if workers else {})}, indent=2))
    else:
        print(_plan_text(p, args.spec, env, torch=p.runtime == "gnu-torch" or workers is not None))
        if workers is not None:
            print(workers.describe())
        if args.verbose:
            print()
            print(p.explain())
        if args.translate:
            print()
            print("Equivalent settings:")
            for k, v in translations.items():
                print(f"  {k}: {v if v is not None else 'not expressible: ' + untranslatable[k]}")
    if args.picture:
        title = f"{_planned(args.spec, env)}, {_plural(p.threads, 'thread')}"
        if workers is None:
            _write_picture(args.picture, topo, p.cpusets, title=title)
        else:  # the workers beside the compute threads, each in a role of its own
            _write_picture(args.picture, topo, [*p.cpusets, *workers.cpusets],
                           roles=["openmp"] * p.threads + ["dataloader"] * workers.workers,
                           title=f"{title} and {_plural(workers.workers, 'DataLoader worker')}")
    return 0


def _plan_compare(args: argparse.Namespace, p: Any, env: dict[str, str], mask: Any, topo: Any) -> int:
    """``plan --compare OTHER``: the same settings under another runtime's rules, thread by thread."""
    from ..cpulist import format_list  # lazy: a command loads only its own layers
    from ..planning.planner import plan  # lazy: a command loads only its own layers

    try:
        q = plan(args.spec, threads=args.threads, topology=topo, strict=not args.lenient, env=env,
                 initial_mask=mask, runtime=args.compare)
        why = None
    except AffinityError as e:  # the other runtime refuses these settings (it would abort or hang)
        q, why = None, str(e)
    if args.json:
        print(json.dumps({"plan": {**p.to_dict(), "unread": _unread(args.spec, p.runtime)},
                          "compare": {**q.to_dict(), "unread": _unread(args.spec, q.runtime)} if q else
                          {"error": why, "unread": _unread(args.spec, args.compare)}}, indent=2))
        return 0
    rows = [("thread", p.runtime, args.compare, "")]
    n = max(p.threads, q.threads if q else 0)
    for i in range(n):
        a = "{" + format_list(p.cpusets[i]) + "}" if i < p.threads else "-"
        b = ("{" + format_list(q.cpusets[i]) + "}" if i < q.threads else "-") if q else "?"
        rows.append((str(i), a, b, "" if a == b else "differs"))
    w = [max(len(r[k]) for r in rows) for k in range(3)]
    print(f"plan: {_planned(args.spec, env)} on {p.topology.describe()}{_in_mask(p)}: {p.runtime} vs {args.compare}")
    for r in rows:
        print(f"  {r[0]:>{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]}".rstrip())
    same = q is not None and q.cpusets == p.cpusets
    print(f"{'same' if same else 'different'} placement" + (f"; {args.compare} refuses: {why}" if why else ""))
    for who, plan_ in ((p.runtime, p), (args.compare, q)):
        for wtext in [*_hinted(args.spec, plan_.warnings if plan_ else ()), *_unread(args.spec, who)]:
            print(f"warning ({who}): {wtext}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from ..binding.bindmap import report  # lazy: a command loads only its own layers

    if getattr(args, "ranks", False):
        from .ranks_report import cmd_show_ranks  # lazy: only for --ranks

        return cmd_show_ranks(args, _write_picture)

    try:
        bmap = report(args.pid, children=args.pid is not None)
    except FileNotFoundError:
        print(f"affinity show: error: no process {args.pid}", file=sys.stderr)
        return 1
    print(bmap.to_json(indent=2) if args.json else bmap.text())
    if args.picture:
        from ..machine.topology import Topology  # lazy: a command loads only its own layers

        rows = [r for m in _with_children(bmap) for r in m.rows]
        from .picture import ROLES  # lazy: a command loads only its own layers

        alias = {"torch-intra": "tf-intra", "torch-inter": "tf-inter",  # drawn in the pools' colours
                 "ort-intra": "tf-intra", "ort-inter": "tf-inter", "ov": "openmp"}
        roles = [r.role if r.role in ROLES else alias.get(r.role, "other") for r in rows]
        _write_picture(args.picture, Topology.from_system(), [r.actual for r in rows], roles=roles,
                       title=f"pid {bmap.pid}: {_plural(len(rows), 'thread')}")
    return 1 if any(m.mismatches for m in _with_children(bmap)) else 0


def _with_children(bmap: Any) -> list[Any]:
    """A bind map and its children's, depth first."""
    out = [bmap]
    for c in bmap.children:
        out += _with_children(c)
    return out


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run  # lazy: a command loads only its own layers

    more = {} if args.rounds is None else {"rounds": args.rounds}
    return run(sys.stdout, model=args.model, batch_size=args.batch_size, num_batches=args.num_batches, **more)


def cmd_bench(args: argparse.Namespace) -> int:
    from .workload import main_cli  # lazy: a command loads only its own layers

    return main_cli(args)


def _ranks_args(adder: str, p: argparse.ArgumentParser) -> None:
    from . import ranks_report  # lazy: a command loads only its own layers

    getattr(ranks_report, adder)(p)


def _columns() -> int:
    """The terminal's width, as :func:`shutil.get_terminal_size` gives it (``COLUMNS``,
    else standard output's terminal, else 80), without importing :mod:`shutil`
    (it imports zlib, bz2 and lzma: a millisecond of every ``affinity run``)."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns if columns > 0 else 80


def _parser_class() -> type[argparse.ArgumentParser]:
    """argparse's parser, for the command line and each command's, laying out help
    at the terminal's width measured without shutil (:func:`_columns`)."""
    import argparse  # the standard parser: only once a command line is parsed

    width = _columns() - 2  # what argparse does with shutil's answer (once: it makes a formatter per argument)

    class Formatter(argparse.HelpFormatter):
        """argparse's help layout, its width measured without shutil."""

        def __init__(self, prog: str, **kwargs: Any) -> None:
            kwargs.setdefault("width", width)
            super().__init__(prog, **kwargs)

    class Parser(argparse.ArgumentParser):
        """Every parser of the command line (the commands' too: subparsers are made
        of their parent's class) lays out help with ``Formatter``."""

        def __init__(self, *a: Any, **kwargs: Any) -> None:
            kwargs.setdefault("formatter_class", Formatter)
            super().__init__(*a, **kwargs)

    return Parser


def _add_plan_parser(sub: Any) -> None:
    """``affinity plan``'s options."""
    from ..launcher.options import positive, runtime_name  # lazy: a command loads only its own layers

    p = sub.add_parser("plan", help="the per-thread CPU sets an OpenMP runtime would bind to (Intel's by default)")
    p.add_argument("spec", nargs="?", default=None,
                   help="KMP_AFFINITY string (e.g. granularity=fine,compact,1,0) or KEY=VALUE assignments, "
                        "a value running to the next KEY= (e.g. 'GOMP_CPU_AFFINITY=0 2 4 6 OMP_PROC_BIND=true'); "
                        "omit to plan --env only")
    p.add_argument("--threads", "-t", type=positive, default=None, help="team size (OMP_NUM_THREADS)")
    _add_topology_arg(p)
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="more runtime variables: OMP_PLACES, OMP_PROC_BIND, KMP_HW_SUBSET, ...")
    p.add_argument("--mask", default=None, metavar="CPUS",
                   help="the process's initial affinity mask (default: every allowed PU)")
    p.add_argument("--lenient", action="store_true",
                   help="read malformed settings as the runtime does (warn, fall back) instead of failing")
    p.add_argument("--runtime", default="intel", metavar="NAME", type=runtime_name(auto=True),
                   help="whose rules: intel (default, libiomp5), gnu (GCC 12 libgomp), gnu-torch "
                        "(PyTorch's bundled libgomp), llvm, or auto (the runtime loaded in this process: "
                        "none, so intel)")
    p.add_argument("--compare", default=None, metavar="NAME", type=runtime_name(auto=False),
                   help="also plan under this runtime's rules and print both side by side, per thread")
    p.add_argument("--translate", action="store_true",
                   help="also print the equivalent KMP_AFFINITY, OMP_PLACES, GOMP_CPU_AFFINITY, taskset, numactl")
    p.add_argument("--dataloader-workers", type=positive, default=None, metavar="K",
                   help="also place K PyTorch DataLoader workers beside the compute threads")
    p.add_argument("--json", action="store_true")
    p.add_argument("--picture", metavar="FILE", default=None, type=_picture_path,
                   help="draw the plan (.svg or .png)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also print the runtime's verbose map (KMP_AFFINITY=verbose: topology, OS proc "
                        "map, one 'bound to OS proc set' line per thread)")
    _ranks_args("add_plan_args", p)
    from .engines_report import add_plan_args  # lazy: a command loads only its own layers

    add_plan_args(p)
    p.set_defaults(func=cmd_plan)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line; ``only="run"``: with the ``run`` command alone (what
    ``affinity run`` parses: it starts without building or importing the others)."""
    import argparse  # the standard parser: only once a command line is parsed

    from ..launcher.options import positive  # lazy: a command loads only its own layers

    parser = _parser_class()(
        prog="affinity",
        description="Thread and memory placement for TensorFlow, OpenMP and processes, "
                    "with Intel KMP_AFFINITY semantics.")

    class PrintVersion(argparse.Action):
        def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
            parser.exit(cmd_version(argparse.Namespace(json=False)))

    parser.add_argument("--version", action=PrintVersion, nargs=0,
                        help="print the versions of affinity and of the hwloc in use (as 'affinity version') "
                             "and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    parser.commands = sub.choices  # name -> the command's parser (main: its usage errors)
    if only == "run":
        from ..launcher.run import add_run_parser  # lazy: a command loads only its own layers

        add_run_parser(sub)
        return parser

    p = sub.add_parser("topology", help="show a machine: packages, NUMA nodes, cores, PUs")
    _add_topology_arg(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a tree")
    p.set_defaults(func=cmd_topology)

    _add_plan_parser(sub)

    p = sub.add_parser("show", help="the bind map of a process: every thread, its mask, CPU and node, its role (as "
                                    "a process bound by affinity published it, else inferred), its child processes")
    p.add_argument("pid", nargs="?", type=positive, default=None,
                   help="process id (default: this one); its child processes are shown under it")
    p.add_argument("--json", action="store_true")
    p.add_argument("--picture", metavar="FILE", default=None, type=_picture_path,
                   help="draw the live process (.svg or .png)")
    _ranks_args("add_show_args", p)
    p.set_defaults(func=cmd_show)

    from .doctor import add_doctor_parser  # lazy: a command loads only its own layers

    add_doctor_parser(sub, positive)

    p = sub.add_parser("bench", help="tf_cnn_benchmarks-style TensorFlow workload on synthetic data")
    p.add_argument("--model", choices=["resnet50", "small_cnn", "matmul"], default="small_cnn")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--num-batches", type=int, default=20)
    p.add_argument("--num-warmup-batches", type=int, default=2)
    p.add_argument("--forward-only", action="store_true", help="inference only (default: train)")
    p.add_argument("--pin", metavar="SPEC", default=None,
                   help="apply this KMP_AFFINITY-style plan before TensorFlow starts")
    p.add_argument("--threads", type=int, default=None, help="team size for --pin")
    p.add_argument("--json", action="store_true")
    p.add_argument("--hold", action="store_true",
                   help="after the timed batches, print {\"holding\": PID} and keep running until standard input "
                        "ends (a live job for 'affinity doctor PID')")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("demo", help="the main job end to end (what 'make demo' runs)")
    p.add_argument("--model", choices=["resnet50", "small_cnn", "matmul"], default="resnet50")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--num-batches", type=int, default=10)
    p.add_argument("--rounds", type=int, default=None,
                   help="the most rounds of a row, defaults and pinned interleaved; a row stops once its "
                        "interval excludes 1, after at least 3 (default: affinity.tools.rows.DEMO_ROUNDS, 6)")
    p.set_defaults(func=cmd_demo)

    from ..launcher.run import add_run_parser  # lazy: a command loads only its own layers

    add_run_parser(sub)

    from .tune_cli import add_tune_parser  # lazy: a command loads only its own layers

    add_tune_parser(sub)

    p = sub.add_parser("version", help="versions of affinity and of the hwloc in use")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_version)
    return parser


#: optional packages a command may need -> (what it is, the extra that installs it)
_EXTRAS = {"tensorflow": ("TensorFlow", "tf"), "torch": ("PyTorch", "torch"), "optuna": ("optuna", "tune"),
           "PIL": ("Pillow", "picture")}


def _missing_extra(e: ModuleNotFoundError) -> str | None:
    """One line for an optional package that is not installed, naming the extra that
    installs it; None for any other missing module (a real bug: its traceback stays)."""
    top = (e.name or "").partition(".")[0]
    if top not in _EXTRAS:
        return None
    what, extra = _EXTRAS[top]
    return f"{what} is not installed (no module named {top!r}): pip install 'kmp-affinity[{extra}]'"


def _broken_extra(e: ImportError) -> str | None:
    """One line for an optional package that is installed but fails to import (a
    missing shared library, a dependency of the wrong version): the package and the
    cause, the exception's own last ``...Error: ...`` line (TensorFlow wraps the
    whole traceback in its message).  The package is the one ``e.name`` names, or an
    extra whose own module raised it (its frames in the traceback); None otherwise
    (a bug of ours: its traceback stays)."""
    top = (e.name or "").partition(".")[0]
    if top not in _EXTRAS or isinstance(e, ModuleNotFoundError):
        tb, top = e.__traceback__, ""
        while tb is not None and not top:
            name = str(tb.tb_frame.f_globals.get("__name__", "")).partition(".")[0]
            top, tb = (name if name in _EXTRAS else ""), tb.tb_next
        if not top:
            return None
    lines = [line.strip() for line in str(e).splitlines() if line.strip()] or ["(no message)"]
    errors = [line for line in lines if line.partition(":")[0].isidentifier() and
              line.partition(":")[0].endswith(("Error", "Exception"))]
    cause = errors[-1] if errors else f"{type(e).__name__}: {lines[0]}"
    return f"{_EXTRAS[top][0]} is installed but fails to import ({cause}); python -c 'import {top}' shows why"


def main(argv: Sequence[str] | None = None) -> int:
    """The ``affinity`` command line ``argv`` (default ``sys.argv[1:]``); its exit status.
    A Ctrl-C while it parses is ``interrupted`` and 130, as while the command runs."""
    words = sys.argv[1:] if argv is None else list(argv)
    try:
        args = _parse(words, argv is None)
    except KeyboardInterrupt as e:
        print(f"affinity{' ' + words[0] if words[:1] and words[0].isidentifier() else ''}: interrupted",
              file=sys.stderr)
        return exit_status(e)
    try:
        return int(args.func(args) or 0)
    except UsageError as e:  # the one mapping of errors to exit statuses: errors.exit_status
        return _usage(args, str(e))
    except AffinityError as e:
        print(f"affinity {args.command}: error: {e}", file=sys.stderr)
        return exit_status(e)
    except ImportError as e:  # an extra not installed, or installed and broken: one line
        said = (_missing_extra(e) if isinstance(e, ModuleNotFoundError) else None) or _broken_extra(e)
        if said is None:
            raise
        print(f"affinity {args.command}: error: {said}", file=sys.stderr)
        return exit_status(CommandError(said))
    except BrokenPipeError:  # `affinity topology | head`
        return 0
    except KeyboardInterrupt as e:  # Ctrl-C, also during a long native load: no traceback
        print(f"affinity {args.command}: interrupted", file=sys.stderr)
        return exit_status(e)


def _parse(words: list[str], program: bool) -> argparse.Namespace:
    """The parsed command line (``program``: ``sys.argv``'s)."""
    parser = build_parser("run" if words[:1] == ["run"] else None)
    args, extra = parser.parse_known_args(words)
    if extra:  # said by the command's parser: its usage, its options (parse_args says the top level's)
        from ..launcher.options import unrecognized  # lazy: only for a usage error

        command = parser.commands[args.command]
        command.error(unrecognized(command, extra))
    return args


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
