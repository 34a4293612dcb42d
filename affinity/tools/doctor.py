"""``affinity doctor [PID ...|--ranks|--all-mine] [--json]``: check live processes
against the placement failures seen in the field, and say the fix for each.

The reading is :func:`affinity.binding.doctor.observe`, the findings
:func:`affinity.planning.doctor.diagnose` (pure); this module picks the processes
(PIDs, the ranks of a job on this node, every process of this user) and prints:
text for people, ``--json`` for CI.  Exit status 1 when a finding is an error (or
no process can be read), 0 otherwise (warnings included), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..binding.doctor import observe
from ..errors import PlanError, SpecError, UsageError
from ..planning.doctor import diagnose
from .ranks_report import find_jobs

__all__ = ["add_doctor_parser", "cmd_doctor", "my_processes"]


def add_doctor_parser(sub: argparse._SubParsersAction, positive: object) -> None:
    """``affinity doctor``'s options."""
    p = sub.add_parser("doctor", help="check live processes for placement failures (collapsed masks, more "
                                      "runnable threads than CPUs, two OpenMP runtimes, overlap, remote "
                                      "memory, undone bindings...) and say the fix for each")
    p.add_argument("pids", nargs="*", type=positive, metavar="PID",
                   help="processes to check (their child processes too)")
    p.add_argument("--ranks", action="store_true",
                   help="every rank of the job of PID (default: of every job) on this node, found by its "
                        "launcher variables; ranks must not share CPUs")
    p.add_argument("--all-mine", action="store_true", help="every process of this user but this one")
    p.add_argument("--interval", type=float, default=0.5, metavar="S",
                   help="seconds between the two samples of each thread's CPU time (default 0.5)")
    p.add_argument("--no-children", dest="children", action="store_false",
                   help="leave the processes' child processes out")
    p.add_argument("--json", action="store_true", help="JSON for CI: processes, findings, what was checked")
    p.set_defaults(func=cmd_doctor)


def my_processes() -> list[int]:
    """Every process of this user (real uid) but this one and the processes it
    descends from (the shell that runs ``affinity doctor``)."""
    me, uid = os.getpid(), os.getuid()
    skip = {me, *_ancestors(me)}
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) not in skip:
            try:
                if os.stat(f"/proc/{d}").st_uid == uid and _has_threads(int(d)):
                    out.append(int(d))
            except OSError:
                continue  # exited meanwhile
    return sorted(out)


def _has_threads(pid: int) -> bool:
    """A user process (a kernel thread has no command line)."""
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        return bool(fh.read(1))


def _ancestors(pid: int) -> list[int]:
    out = []
    while pid > 1 and len(out) < 64:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                raw = fh.read()
        except OSError:
            break
        pid = int(raw[raw.rindex(b")") + 2:].split()[1])
        out.append(pid)
    return out


def _selected(args: argparse.Namespace) -> tuple[list[int], list[list[int]], bool]:
    """(processes, groups of ranks, read children) the options name."""
    if args.ranks:
        if len(args.pids) > 1:
            raise UsageError("--ranks takes one PID (the job of which to check every rank), or none")
        jobs = find_jobs(args.pids[0] if args.pids else None)
        if not jobs:
            raise PlanError("--ranks: no process of this user carries launcher rank variables (mpirun, srun, "
                            "torchrun) on this node")
        groups = [[r.pid for r in ranks] for ranks in jobs.values()]
        return [p for g in groups for p in g], groups, args.children
    if args.all_mine:
        if args.pids:
            raise UsageError("--all-mine takes no PID")
        return my_processes(), [], False  # every process is listed already: children are among them
    if not args.pids:
        raise UsageError("give the processes to check: PID ..., --ranks or --all-mine")
    return list(args.pids), [], args.children


def cmd_doctor(args: argparse.Namespace) -> int:
    if args.interval < 0:
        raise UsageError(f"--interval {args.interval:g}: must be 0 or more seconds")
    pids, groups, children = _selected(args)
    if not pids:
        raise PlanError("--all-mine: no other process of this user")
    try:
        snap = observe(pids, interval=args.interval, children=children, peers=groups, skip_gone=args.all_mine)
    except FileNotFoundError as e:
        print(f"affinity doctor: error: {e.strerror or e}" if e.strerror else f"affinity doctor: error: {e}",
              file=sys.stderr)
        return 1
    except SpecError as e:
        raise UsageError(str(e)) from None
    found = diagnose(snap)
    print(json.dumps(found.to_dict(), indent=2) if args.json else found.text())
    return 0 if found.ok else 1
