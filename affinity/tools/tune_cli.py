"""``affinity tune [options] -- CMD ...``: find the counts and placement that make CMD fastest.

1. CMD runs once as it is (the defaults, the way it runs today; a ``{name}``
   placeholder gets its first choice): it must succeed and print the metric, else
   nothing is searched (exit status 1).
2. The search (:class:`~affinity.tuning.search.Search`): ``--budget`` trials, each
   CMD run through ``affinity run`` with a candidate placement
   (:mod:`~affinity.tools.tune_runner`), a progress line with the best so far.  The
   study is stored (default ``~/.cache/affinity/tune.db``, ``--storage``) under a
   name made of what can change the answer (:mod:`~affinity.tools.tune_key`: the
   command and its files' content, the environment, the metric, the machine and the
   space): the same command resumes it and says so; Ctrl-C, SIGTERM and SIGHUP keep
   every finished trial and stop the running one with its processes.
3. The defaults and the best few configurations are re-measured round by round
   (A B C A B C ...), three rounds each, then the defaults and the leader alone
   until the leader's interval against the defaults excludes 1 or ``--repeats``
   rounds are done.  Each row's figure is the geometric mean of its rounds; the
   speed-up is the ratio of two figures (the geometric mean of the per-round
   ratios), with its interval, said "faster"/"slower" only when the interval
   excludes 1 (:mod:`affinity.tuning.verdict`, the statistic every face shares).
4. A table, the best as an ``affinity run`` line, an environment block and an
   ``affinity.apply`` call (``--json``: all of it as JSON), and ``--plot FILE``.

Instances are copies of CMD (each does the whole work: the value is one copy's)
unless ``--split`` says the work splits between them, or CMD's files read
``AFFINITY_NUM_INSTANCES`` (``--copies`` says they are copies all the same); only
then are they in the default space.

Exit status: 0 done, 1 failure (CMD fails or prints no metric, every trial
failed, a storage that is not a study), 2 usage, 130 interrupted (143 SIGTERM,
129 SIGHUP) -- :func:`affinity.errors.exit_status`.

This module only registers the command (:func:`add_tune_parser`): it imports
nothing but the standard library and the parameter names
(:mod:`affinity.tuning.names`), so ``affinity``'s other commands do not pay for
optuna.  The work is :func:`affinity.tools.tune_command.run`.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..tuning.names import KNOWN

__all__ = ["add_tune_parser", "cmd_tune"]


def add_tune_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``tune`` to the ``affinity`` command line, with :func:`cmd_tune` as its function.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        Where ``tune`` goes (what ``ArgumentParser.add_subparsers()`` returned).

    Returns
    -------
    argparse.ArgumentParser
    """
    p = subparsers.add_parser(
        "tune", help="find the thread counts, placement and instances that make a command fastest",
        usage="affinity tune [options] -- CMD [ARGS...]",
        description="Run CMD as it is, then once per trial through 'affinity run' with a candidate "
                    "placement (threads, instances, KMP_AFFINITY, KMP_BLOCKTIME, memory policy, "
                    "TF_NUM_INTRAOP/INTEROP_THREADS), read the metric from its output, and report the "
                    "best against the defaults, both re-measured. Exit status: 0 done, 1 failure, "
                    "2 usage, 130 interrupted, 143 terminated (finished trials are kept: run it again "
                    "to resume).")
    p.add_argument("--budget", type=int, default=20, metavar="N", help="trials to run (default 20)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=v1,v2,...",
                   help=f"a parameter and its choices (repeat the option); known names: {', '.join(KNOWN)}; "
                        "env:VAR=... exports "
                        "the variable VAR; a name written {NAME} in CMD is replaced there; any other name is "
                        "an error. Several full KMP_AFFINITY strings: separate them with ';'. Default: a "
                        "space built from this machine")
    w = p.add_mutually_exclusive_group()
    w.add_argument("--split", action="store_true",
                   help="the work splits between instances (a service under load, or a command that takes "
                        "its share by AFFINITY_INSTANCE/AFFINITY_NUM_INSTANCES): their metrics add up and "
                        "'instances' is tuned. Default: instances are copies, each doing the whole work, "
                        "measured per copy, and not in the default space -- unless CMD's files mention "
                        "AFFINITY_NUM_INSTANCES (then split, said in a note)")
    w.add_argument("--copies", action="store_true",
                   help="instances are copies, each doing the whole work, even if CMD's files mention "
                        "AFFINITY_NUM_INSTANCES")
    m = p.add_mutually_exclusive_group()
    m.add_argument("--metric", metavar="REGEX",
                   help="read the value from the last match of REGEX (its first group); default: the "
                        "number with images/sec, examples/sec, samples/sec or tokens/sec, or a JSON "
                        "line's throughput; one copy's (the mean over instances), summed with --split")
    m.add_argument("--time", action="store_true",
                   help="minimize the wall time of CMD instead (affinity run's own start-up not counted)")
    p.add_argument("--minimize", action="store_true",
                   help="lower is better: minimize the --metric value (a latency, seconds per step); the "
                        "default maximizes it; --time implies it")
    p.add_argument("--repeats", type=int, default=10, metavar="R",
                   help="re-measure the defaults and the best configurations at the end, round by round, at "
                        "most R rounds (default 10): every row 3 rounds, then the defaults and the leader until "
                        "the leader's interval against the defaults excludes 1; fewer than 3 rounds give no "
                        "verdict")
    p.add_argument("--top", type=int, default=3, metavar="K", help="how many of the best to re-measure (default 3)")
    p.add_argument("--storage", metavar="URL", default=None,
                   help="keep the study in sqlite:///FILE (default sqlite:///$XDG_CACHE_HOME/affinity/tune.db, "
                        "that is ~/.cache/affinity/tune.db; 'none': in memory)")
    p.add_argument("--study", metavar="NAME", default=None,
                   help="study name (default: from the machine, the command, the metric and the space); a "
                        "study made for another command, files, environment or machine is refused")
    p.add_argument("--from", dest="from_study", metavar="STUDY", default=None,
                   help="warm start: try the best configurations of STUDY (in the same storage, made on this "
                        "machine) first; default: those of the latest study of the same command on this machine")
    p.add_argument("--seed", type=int, default=None, help="seed of the search (default: the study's, else random)")
    p.add_argument("--no-prune", dest="prune", action="store_false",
                   help="run every trial to the end; default: multi-fidelity -- a trial whose values printed "
                        "as it goes are worse than the median of the completed trials at the same point is "
                        "stopped there (with --time: once it has run twice as long as the best so far); the "
                        "final table is always measured at full length")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="stop a run after this long (infeasible); default 10x the defaults' time + 30 s")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--plot", metavar="FILE", default=None, help="draw the trials (.svg or .png)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress line (a resumed study, or one not resumed, is still said on stderr)")
    p.add_argument("words", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_tune, _tune_parser=p)
    return p


def cmd_tune(args: argparse.Namespace) -> int:
    """``affinity tune``: see :func:`add_tune_parser` and the module docstring.

    Parameters
    ----------
    args : argparse.Namespace
        What the ``tune`` parser parsed.

    Returns
    -------
    int
        0 done, 1 failure, 2 usage, 130 interrupted.
    """
    from .tune_command import run  # lazy: optuna and the launcher load only when tune runs

    return run(args)

