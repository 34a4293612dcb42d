"""What ``affinity run`` was asked: :class:`RunOptions`, the ``run`` parser
(:func:`run_parser`) and :func:`options_from_args`, which finishes parsing (the
SPEC, the command after ``--``); plus :func:`say`, the command's voice on stderr."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Mapping

from ..cpulist import MAX_CPUS, IdList
from ..errors import SpecError, UsageError
from ..planning.serving import ENGINES, Serving
from ..planning.gpus import GPU_BIND_MODES
from ..planning.envvars import BLOCKTIME_DEFAULT, DEFAULT_BLOCKTIME, blocktime_for, check_blocktime
from ..planning.spec import DEFAULT_SPEC
from ..record import record
from typing import Any


__all__ = ["RunOptions", "add_engine_args", "options_from_args", "positive", "run_parser", "runtime_name", "say",
           "serving_of", "unrecognized"]


@record
class RunOptions:
    """What the command line asked for (see :func:`run_parser` for each option).

    Parameters
    ----------
    command : tuple of str
        The command and its arguments.
    spec : str or None
        ``KMP_AFFINITY`` string to plan; None: the environment's, else the default spec.
    threads : int or None
        Thread count; None: ``OMP_NUM_THREADS``, else one per core within the CFS quota.
    physcpubind, cpunodebind : IdList or None
        numactl's CPU selections (at most one).
    norespect : bool
        Start from the cgroup's cpuset instead of the inherited mask.
    mempolicy : str or None
        ``"bind"``, ``"interleave"``, ``"preferred"``, ``"local"``; None: none asked.
    mem_nodes : IdList or None
        The nodes of ``mempolicy`` (not for ``"local"``).
    membind_optional : bool
        A refused memory policy is a warning, not an error.
    pin_threads : bool
        Preload the pinning library (:mod:`affinity.launcher.preload`).
    pin_skip : int
        Threads the library leaves alone: bit *i* = the *i*-th ``pthread_create``.
    pin_main : bool
        The library pins the main thread to the first slot.
    pin_children : bool
        Processes the command starts pin their threads too.
    instances : int
        Copies to start on disjoint shares.
    cores_per_instance : int or None
        Exactly this many cores per copy.
    log_dir : str or None
        Each instance's output goes to ``log_dir/instance-I.log``.
    ranks : str or None
        ``"auto"`` or ``"R/N"``: take local rank R's share of the node.
    verbose : bool
        Say what is applied.
    dataloader_workers : int or None
        Place that many PyTorch DataLoader workers of the command beside its compute
        threads (exported as their CPU sets; the PyTorch start-up hook places them).
    gpu_bind, gpu, reserve_cores
        Each rank next to its GPU (:class:`~affinity.planning.decide.Request`'s
        fields of the same names).
    blocktime : str or None
        ``KMP_BLOCKTIME`` to export; None exports none; ``"default"``: the user's
        ``KMP_BLOCKTIME``, else :data:`~affinity.planning.envvars.DEFAULT_BLOCKTIME`
        (:func:`~affinity.planning.envvars.blocktime_for`).
    serving : Serving or None
        ``--for ENGINE`` and its options: start a serving engine laid out on the
        CPUs, told in its own words (:class:`~affinity.planning.engines.serve.Serving`).
    """

    command: tuple[str, ...] = ()
    spec: str | None = None
    threads: int | None = None
    physcpubind: IdList | None = None
    cpunodebind: IdList | None = None
    norespect: bool = False
    mempolicy: str | None = None  #: "bind", "interleave", "preferred", "local"
    mem_nodes: IdList | None = None
    membind_optional: bool = False
    pin_threads: bool = False
    pin_skip: int = 0
    pin_main: bool = True
    pin_children: bool = False
    instances: int = 1
    cores_per_instance: int | None = None
    log_dir: str | None = None
    ranks: str | None = None
    verbose: bool = False
    dataloader_workers: int | None = None
    gpu_bind: str | None = None  #: torchrun's --numa-binding modes: the rank next to its GPU
    gpu: str | None = None  #: "auto", an ordinal, a bus id or a UUID prefix
    reserve_cores: int = 0  #: with a GPU: cores kept for data loading
    blocktime: str | None = BLOCKTIME_DEFAULT  #: None: export no KMP_BLOCKTIME; "default": the user's, else 1
    runtime: str = "intel"  #: whose rules the plan follows; "auto": the command's (resolved by cmd_run)
    serving: Serving | None = None  #: --for ENGINE and its options

    def to_words(self, environ: Mapping[str, str] | None = None) -> list[str]:
        """The ``affinity run`` words that parse back to these options: the inverse of
        :func:`run_parser` and :func:`options_from_args` (``SPEC``, options, ``--``,
        the command; nothing for a default).

        Parameters
        ----------
        environ : mapping of str to str, optional
            The environment the words will be parsed in (``KMP_BLOCKTIME`` there is
            the default of ``--blocktime``); default: an empty one.

        Returns
        -------
        list of str
        """
        words = [self.spec] if self.spec else []
        words += _value_words(self)
        words += [flag for flag, on in _FLAGS if on(self)]
        if self.blocktime not in (BLOCKTIME_DEFAULT, blocktime_for(BLOCKTIME_DEFAULT, environ or {})):
            words += ["--blocktime", "none" if self.blocktime is None else self.blocktime]
        words += _serving_words(self.serving)
        return words + (["--", *self.command] if self.command else [])


def _value_words(o: RunOptions) -> list[str]:
    """The options of :meth:`RunOptions.to_words` that take a value."""
    pairs = [("-t", o.threads), ("-C", o.physcpubind and o.physcpubind.text),
             ("-N", o.cpunodebind and o.cpunodebind.text),
             (_MEMPOLICY_FLAG.get(o.mempolicy or ""), o.mem_nodes and o.mem_nodes.text),
             ("--pin-skip", hex(o.pin_skip) if o.pin_skip else None),
             ("--instances", o.instances if o.instances != 1 else None),
             ("--cores-per-instance", o.cores_per_instance), ("--log-dir", o.log_dir), ("--ranks", o.ranks),
             ("--runtime", o.runtime if o.runtime != "intel" else None),
             ("--dataloader-workers", o.dataloader_workers), ("--gpu-bind", o.gpu_bind), ("--gpu", o.gpu),
             ("--reserve-cores", o.reserve_cores or None)]
    return [w for flag, v in pairs if flag and v is not None for w in (flag, str(v))]


def _serving_words(s: Serving | None) -> list[str]:
    """``--for ENGINE`` and its options, those that differ from their defaults."""
    if s is None:
        return []
    pairs = [("--for", s.engine), ("--tp", s.count), ("--reserve", s.reserve or None),
             ("--reserve-per", s.reserve_per if s.reserve_per != "instance" else None),
             ("--by", s.by if s.by != "numa" else None), ("--form", s.form if s.form != "mask" else None)]
    return [w for flag, v in pairs if v is not None for w in (flag, str(v))] + (["--smt"] if s.smt else [])


_MEMPOLICY_FLAG = {"bind": "-m", "interleave": "-i", "preferred": "-p"}
_FLAGS: tuple[tuple[str, Callable[[RunOptions], bool]], ...] = (
    ("--norespect", lambda o: o.norespect), ("-l", lambda o: o.mempolicy == "local"),
    ("--membind-optional", lambda o: o.membind_optional), ("--pin-threads", lambda o: o.pin_threads),
    ("--no-pin-main", lambda o: not o.pin_main), ("--pin-children", lambda o: o.pin_children),
    ("-v", lambda o: o.verbose))


def say(text: str) -> None:
    """Write ``affinity run: TEXT`` to stderr, in one write.

    Parameters
    ----------
    text : str
        One line (ranks under one ``mpirun`` share its stderr: one write keeps it whole).
    """
    sys.stderr.write(f"affinity run: {text}\n")
    sys.stderr.flush()


def run_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``run`` sub-command's parser, without its function.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        The ``affinity`` command line's sub-commands.

    Returns
    -------
    argparse.ArgumentParser
        The ``run`` parser; :func:`options_from_args` finishes what it parses.
    """
    p = subparsers.add_parser(
        "run", help="run a command with its threads and memory placed (numactl, taskset, likwid-pin, "
                    "multi-instance, MPI ranks)",
        usage="affinity run [SPEC] [options] -- CMD [ARGS...]",
        description="Plan SPEC (a KMP_AFFINITY string; default: KMP_AFFINITY/OMP_PLACES from the "
                    f"environment, else '{DEFAULT_SPEC}', one thread per core) on the selected CPUs, "
                    "set the process mask and memory policy, export the plan's environment "
                    "(KMP_AFFINITY, OMP_PLACES, OMP_PROC_BIND, GOMP_CPU_AFFINITY, OMP_NUM_THREADS, "
                    "KMP_BLOCKTIME, KMP_WARNINGS, TF_NUM_INTRAOP_THREADS, TF_NUM_INTEROP_THREADS) and exec CMD "
                    "(no shell). Exit status: CMD's; 1 for affinity errors; 2 for usage errors; "
                    "126/127 when CMD cannot be executed / is not found.")
    g = p.add_argument_group("threads")
    g.add_argument("-t", "--threads", type=positive, metavar="N",
                   help="thread count (default: OMP_NUM_THREADS, else one per core of the selected "
                        "CPUs, capped by the cgroup's CFS quota)")
    g.add_argument("--dataloader-workers", type=positive, metavar="K",
                   help="place K PyTorch DataLoader workers of the command beside its compute threads: "
                        "each on CPUs of its own (free cores, else free PUs, else shared, said), one "
                        "intra-op thread each; what 'affinity plan --dataloader-workers K' shows")
    g.add_argument("--blocktime", metavar="MS|none",
                   help=f"KMP_BLOCKTIME to export (default: the user's KMP_BLOCKTIME, else "
                        f"{DEFAULT_BLOCKTIME}); 'none' exports none")
    g = p.add_argument_group("CPUs (numactl's options; '+' counts within the allowed set)")
    cpu = g.add_mutually_exclusive_group()
    cpu.add_argument("-C", "--physcpubind", type=_id_list("CPU"), metavar="CPUS", action=_Once,
                     help="run on these OS CPU ids: 0-3,8 | all | +0-1 (relative) | !2 (all but)")
    cpu.add_argument("-N", "-c", "--cpunodebind", "--cpubind", type=_id_list("node"), metavar="NODES",
                     action=_Once, help="run on the allowed CPUs of these NUMA nodes (-c, --cpubind: "
                                        "numactl's older names)")
    g.add_argument("--norespect", action="store_true",
                   help="start from the cgroup's cpuset instead of the inherited mask (KMP's "
                        "'norespect'; overrides an MPI launcher's own binding)")
    g = p.add_argument_group("memory (numactl's options; one of)")
    mem = g.add_mutually_exclusive_group()
    mem.add_argument("-m", "--membind", type=_id_list("node"), metavar="NODES", action=_Once,
                     help="allocate only on NODES")
    mem.add_argument("-i", "--interleave", type=_id_list("node"), metavar="NODES", action=_Once,
                     help="interleave pages over NODES")
    mem.add_argument("-p", "--preferred", type=_id_list("node"), metavar="NODES", action=_Once,
                     help="prefer NODES, fall back elsewhere")
    mem.add_argument("-l", "--localalloc", action="store_true", help="allocate on the local node")
    g.add_argument("--membind-optional", action="store_true",
                   help="if the memory policy is refused (EPERM in unprivileged containers), warn and "
                        "run without it instead of failing")
    g = p.add_argument_group("threads created later (likwid-pin's model)")
    g.add_argument("--pin-threads", action="store_true",
                   help="preload a library that pins the main thread to the plan's first slot and "
                        "each new pthread, in creation order, to the next one")
    g.add_argument("--pin-skip", type=_hexmask, default=0, metavar="HEX",
                   help="threads to leave unpinned: bit i = the i-th pthread_create (e.g. 0x1 for "
                        "Intel OpenMP's monitor thread)")
    g.add_argument("--no-pin-main", dest="pin_main", action="store_false",
                   help="leave the main thread alone; created threads start at the first slot")
    g.add_argument("--pin-children", action="store_true",
                   help="with --pin-threads: processes the command starts pin their threads too, each "
                        "from the first slot again (default: only the command's own process -- and what "
                        "it exec's, like a pyenv shim -- is pinned; its children are left alone)")
    g = p.add_argument_group("several processes")
    g.add_argument("--instances", type=positive, default=1, metavar="K",
                   help="start K copies on disjoint sets of whole cores, spread over NUMA nodes, "
                        "memory bound to each one's node(s); exit status: the worst copy's")
    g.add_argument("--cores-per-instance", type=positive, metavar="C", help="exactly C cores each")
    g.add_argument("--log-dir", metavar="DIR", help="write each instance's output to DIR/instance-I.log")
    g.add_argument("--ranks", metavar="auto|R/N", type=_ranks,
                   help="take local rank R's disjoint share of the node, R and N from Open MPI, "
                        "MPICH/Intel MPI, MVAPICH2, torchrun or Slurm variables ('auto'); a rank its "
                        "launcher bound (srun, Open MPI, Hydra -bind-to) plans inside that mask, and says so")
    g = p.add_argument_group("GPU nodes (each rank next to its GPU; docs/gpu.md)")
    g.add_argument("--gpu-bind", metavar="MODE", choices=GPU_BIND_MODES,
                   help="the rank's CPUs as torchrun --numa-binding=MODE gives them (node, socket, exclusive, "
                        "core-complex), its GPU found in sysfs through the visibility variables "
                        "(CUDA/HIP/ROCR_VISIBLE_DEVICES, ZE_AFFINITY_MASK, Slurm's); memory on the GPU's node(s) "
                        "and the pools sized to the rank's cores, without numactl or the driver")
    g.add_argument("--gpu", metavar="auto|N|BUSID|UUID",
                   help="the rank's GPU (default with --gpu-bind: auto, the local rank's visible device)")
    g.add_argument("--reserve-cores", metavar="K", type=_count, default=0,
                   help="with --gpu-bind: keep K cores of each rank's set for data loading (its DataLoader workers)")
    add_engine_args(p.add_argument_group("serving engines (vLLM, SGLang, llama.cpp; docs/engines.md)"))
    g = p.add_argument_group("inspection")
    g.add_argument("-s", "--show", action="store_true",
                   help="show the CPU and memory policy the options give (numactl --show) and exit")
    g.add_argument("-H", "--hardware", action="store_true",
                   help="show the NUMA nodes (numactl --hardware) and exit")
    g.add_argument("--dry-run", action="store_true", help="print what would be done and exit")
    g.add_argument("--json", action="store_true", help="with --dry-run: JSON instead of shell lines")
    g.add_argument("--topology", metavar="SRC",
                   help="plan for another machine (hwloc XML, a file of 'affinity topology --json', cpuinfo "
                        "file, 'synthetic:...'); only with --dry-run or --hardware")
    g.add_argument("--numa-nodes", metavar="DIR", default=None,
                   help="with a cpuinfo file as --topology: a sysfs-like node directory (nodeN/cpulist)")
    g.add_argument("-v", "--verbose", action="store_true",
                   help="say what is applied, and have --pin-threads report every pin")
    g.add_argument("--runtime", default="intel", metavar="NAME", type=runtime_name(auto=True),
                   help="whose rules the plan follows: intel (default), llvm, gnu, gnu-torch, or auto (the "
                        "OpenMP runtime the command's executable links, read from its ELF file; else intel)")
    p.add_argument("words", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(_run_parser=p)
    p._negative_number_matcher = _NEGATIVE  # '--ranks -1/2' is a value (argparse's own attribute)
    return p


class _Once(argparse.Action):
    """A CPU or node list given at most once: numactl applies ``-C 0 -C 1`` in turn
    and the last one wins, silently; here the second is a usage error naming both."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        before = getattr(namespace, self.dest, None)
        if before is not None:
            raise argparse.ArgumentError(self, f"given twice ({before.text}, then {values.text}): give one list, "
                                               f"such as {option_string} {before.text},{values.text}")
        setattr(namespace, self.dest, values)


def _forgot_dashes(words: list[str]) -> str | None:
    """The usage error for a command given without ``--`` before it (``affinity run
    -C 0 python -c 'print(1)'``): its first word names a program (on ``PATH``, or a
    path), which no SPEC does; None when it does not."""
    import shlex  # lazy: only for a usage error
    import shutil

    first = words[0]
    if "/" not in first and shutil.which(first) is None:
        return None
    return (f"{first!r} is a command, not a SPEC: put '--' before it "
            f"(affinity run [SPEC] [options] -- {shlex.join(words)})")


def add_engine_args(p: Any) -> None:
    """``--for ENGINE`` and its options, on ``affinity run`` and ``affinity plan`` alike
    (a parser or an argument group); :func:`serving_of` reads them back."""
    p.add_argument("--for", dest="engine", metavar="ENGINE", default=None, choices=ENGINES,
                   help="lay out a serving engine (vllm, sglang, llama.cpp): its ranks or instances one per NUMA "
                        "node, the engine told in its own variables or flags")
    p.add_argument("--tp", type=positive, default=None, metavar="N",
                   help="with --for: tensor-parallel ranks (vllm, sglang) or instances (llama.cpp); default one "
                        "per NUMA node (per L3 group with --by llc)")
    p.add_argument("--reserve", type=_count, default=0, metavar="K",
                   help="with --for: cores of each rank (--reserve-per node: of each NUMA node) kept off the "
                        "engine's threads, for the API server and tokenizer")
    p.add_argument("--reserve-per", choices=("instance", "node"), default="instance",
                   help="with --for: --reserve counts per rank/instance (default) or per NUMA node")
    p.add_argument("--by", choices=("numa", "llc"), default="numa",
                   help="with --for: one rank per NUMA node (default) or per L3 cache group (AMD's CCX)")
    p.add_argument("--smt", action="store_true", help="with --for: engine threads on every PU of their cores")
    p.add_argument("--form", choices=("mask", "range"), default="mask",
                   help="with --for llama.cpp: the CPUs as --cpu-mask (default) or --cpu-range")


#: the options of :func:`add_engine_args` but ``--for``, with their defaults
_ENGINE_OPTIONS = {"tp": None, "reserve": 0, "reserve_per": "instance", "by": "numa", "smt": False, "form": "mask"}


def serving_of(args: argparse.Namespace) -> Serving | None:
    """``--for`` and its options as a :class:`~affinity.planning.engines.serve.Serving`;
    None without ``--for``.  Raises UsageError for an engine's option given without
    ``--for``, or ``--form`` for another engine than llama.cpp."""
    if args.engine is None:
        given = [f"--{k.replace('_', '-')}" for k, v in _ENGINE_OPTIONS.items() if getattr(args, k, v) != v]
        if given:
            raise UsageError(f"{', '.join(given)} go{'es' if len(given) == 1 else ''} with --for ENGINE")
        return None
    if args.form != "mask" and args.engine != "llama.cpp":
        raise UsageError(f"--form {args.form} is llama.cpp's (--cpu-mask or --cpu-range), not {args.engine}'s")
    return Serving(engine=args.engine, count=args.tp, reserve=args.reserve, reserve_per=args.reserve_per,
                   by=args.by, smt=args.smt, form=args.form)


def unrecognized(parser: argparse.ArgumentParser, words: list[str]) -> str:
    """The usage error for ``words`` that ``parser`` does not know, with the option
    a mistyped one was probably meant to be (``--instanses``: ``--instances``).

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The command's parser (its options are the candidates).
    words : list of str
        What it left unparsed.

    Returns
    -------
    str
        ``unrecognized arguments: ...``, and ``(did you mean --X?)`` for the first
        word close to one of the parser's options.
    """
    import difflib  # lazy: only for a usage error

    names = [o[2:] for a in parser._actions for o in a.option_strings if o.startswith("--")]
    hint = ""
    for word in words:
        if word.startswith("--"):  # compared without the dashes: '--' alone makes '--typo' like '--topology'
            close = difflib.get_close_matches(word[2:].partition("=")[0], names, n=1, cutoff=0.75)
            if close:
                hint = f" (did you mean --{close[0]}?)"
                break
    return f"unrecognized arguments: {' '.join(words)}{hint}"


def _ranks(text: str) -> str:
    """``auto`` or ``R/N`` with ``0 <= R < N`` (the variables behind ``auto`` are read later)."""
    numbers = re.fullmatch(r"(-?\d+)/(\d+)", text)
    if text == "auto" or (numbers and 0 <= int(numbers[1]) < int(numbers[2])):
        return text
    if numbers and int(numbers[1]) < 0:
        raise argparse.ArgumentTypeError(f"the rank must be >= 0, got {int(numbers[1])} in {text!r} (RANK/SIZE "
                                         f"with 0 <= RANK < SIZE)")
    if numbers:
        raise argparse.ArgumentTypeError(f"expected RANK < SIZE, got {text!r} (RANK from 0 to SIZE-1)")
    raise argparse.ArgumentTypeError(f"expected 'auto' or RANK/SIZE with RANK < SIZE, such as '1/4', "
                                     f"got {text!r}")


#: what argparse takes for a negative number, not an option (its own test, and a
#: negative RANK/SIZE: '--ranks -1/2' is then a value that :func:`_ranks` refuses)
_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$|^-\d+/\d+$")


def _count(text: str) -> int:
    """A count, 0 or more (``--reserve-cores``)."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected a count (0 or more), got {text!r}")
    return int(text)


def positive(text: str) -> int:
    """The argparse type of a count: a positive integer (``-t``, ``--instances``, ...)."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def runtime_name(*, auto: bool) -> Callable[[str], str]:
    """The argparse type of a runtime's name: a name of the planner's
    :data:`~affinity.planning.planner.RUNTIMES`, and ``auto`` when ``auto``."""

    def parse(text: str) -> str:
        from ..planning.planner import RUNTIMES  # lazy: the planner only once a command line is parsed

        names = [*RUNTIMES, *(["auto"] if auto else [])]
        if text not in names:
            raise argparse.ArgumentTypeError(f"unknown runtime {text!r}: expected one of {', '.join(names)}")
        return text

    return parse


def _hexmask(text: str) -> int:
    if len(text) > MAX_CPUS // 4 + 2:  # int(.., 16) has no size limit: refuse before converting
        raise argparse.ArgumentTypeError(f"a hex mask of {len(text)} characters: at most {MAX_CPUS} bits")
    try:
        v = int(text, 16)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a hex mask such as 0x1, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative hex mask, got {text!r}")
    if v.bit_length() > MAX_CPUS:
        raise argparse.ArgumentTypeError(f"hex mask {text[:20]}...: at most {MAX_CPUS} bits")
    return v


def _id_list(what: str) -> Callable[[str], IdList]:
    """The argparse type of a numactl ``what`` (CPU or node) list."""

    def parse(text: str) -> IdList:
        try:
            return IdList.parse(text, what)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def _blocktime(text: str | None, environ: Mapping[str, str]) -> str | None:
    """``--blocktime``'s value: as given, None for ``none``; not given:
    :data:`~affinity.planning.envvars.BLOCKTIME_DEFAULT` (the user's ``KMP_BLOCKTIME``,
    else :data:`~affinity.planning.envvars.DEFAULT_BLOCKTIME`, decided with the rest)."""
    if text is None:
        return BLOCKTIME_DEFAULT
    if text.strip().lower() == "none":
        return None
    return check_blocktime(text, "--blocktime")


def check_numa_nodes(numa_nodes: str | None, topology: str | None) -> None:
    """``--numa-nodes DIR`` goes with a cpuinfo file as ``--topology`` (``affinity run``,
    ``plan``, ``topology``): any other source says its own NUMA nodes, and this machine's
    are read from the machine.  Raises UsageError naming both."""
    if numa_nodes is None:
        return
    from ..machine.topology import SOURCE_KINDS, source_kind  # lazy: only a described machine

    kind = source_kind(topology)
    if kind != "cpuinfo":
        raise UsageError(f"--numa-nodes {numa_nodes}: goes with a cpuinfo file as --topology, not with "
                         f"{SOURCE_KINDS[kind]} ({topology or 'system'!r}), which says its own NUMA nodes")


def options_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> RunOptions:
    """Finish parsing (the SPEC, the command after ``--``) and return the options.

    Parameters
    ----------
    args : argparse.Namespace
        What the ``run`` parser (:func:`run_parser`) parsed.
    environ : mapping of str to str, optional
        The environment the defaults come from (``KMP_BLOCKTIME``); default ``os.environ``.

    Returns
    -------
    RunOptions

    Raises
    ------
    SystemExit
        A usage error (status 2, through the parser).
    """
    parser: argparse.ArgumentParser = args._run_parser
    words = list(args.words or [])
    spec = None
    if words and words[0] != "--":
        forgot = _forgot_dashes(words) if "--" not in words else None  # (a SPEC is followed by '--')
        if forgot:
            parser.error(forgot)
        spec = words[0]
        # options may follow the SPEC: parse them into the same namespace
        args.words = []
        _, extra = parser.parse_known_args(words[1:], namespace=args)
        words = list(args.words or [])
        if any(w.startswith("-") for w in extra):  # a mistyped option, not a misplaced command
            parser.error(unrecognized(parser, extra))
        if extra or (words and words[0] != "--"):
            rest = " ".join(extra + words)
            parser.error(f"unexpected {rest!r}: the command goes after '--' "
                         f"(affinity run [SPEC] [options] -- CMD [ARGS...])")
    command = tuple(words[1:]) if words and words[0] == "--" else ()
    if not command and not (args.show or args.hardware):
        parser.error("no command: give it after '--' (affinity run [SPEC] [options] -- CMD [ARGS...])")
    if command and (args.show or args.hardware):
        parser.error("--show and --hardware take no command")
    if args.topology and not (args.dry_run or args.hardware):
        parser.error("--topology plans for another machine: use it with --dry-run or --hardware")
    if args.pin_children and not args.pin_threads:
        parser.error("--pin-children goes with --pin-threads")
    if args.json and not args.dry_run:
        parser.error("--json goes with --dry-run")
    if args.show and (args.instances > 1 or args.cores_per_instance):
        parser.error("--show describes one process: it does not go with --instances")
    mempolicy, mem_nodes = None, None
    for name in ("membind", "interleave", "preferred"):
        if getattr(args, name) is not None:
            mempolicy, mem_nodes = {"membind": "bind"}.get(name, name), getattr(args, name)
    if args.localalloc:
        mempolicy = "local"
    try:
        blocktime = _blocktime(args.blocktime, os.environ if environ is None else environ)
        serving = serving_of(args)
    except (SpecError, UsageError) as e:
        parser.error(str(e))
    return RunOptions(command=command, spec=spec, threads=args.threads, physcpubind=args.physcpubind,
                      cpunodebind=args.cpunodebind, norespect=args.norespect, mempolicy=mempolicy,
                      mem_nodes=mem_nodes, membind_optional=args.membind_optional,
                      pin_threads=args.pin_threads, pin_skip=args.pin_skip, pin_main=args.pin_main,
                      pin_children=args.pin_children,
                      instances=args.instances, cores_per_instance=args.cores_per_instance,
                      log_dir=args.log_dir, ranks=args.ranks, verbose=args.verbose,
                      blocktime=blocktime, runtime=args.runtime, dataloader_workers=args.dataloader_workers,
                      gpu_bind=args.gpu_bind, gpu=args.gpu, reserve_cores=args.reserve_cores, serving=serving)
