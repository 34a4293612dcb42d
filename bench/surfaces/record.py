"""Record a response surface: run a command once per configuration of a space, through
``affinity run`` exactly as ``affinity tune`` runs a trial, and write the table.

    python bench/surfaces/record.py NAME --synthetic "package:1 [numa] core:2 pu:1" \\
        --param instances=1,2 --param threads=1,2 ... -- CMD ...

Configurations run round by round, interleaved: with ``--repeats N`` the whole
space runs N times, each round in its own shuffled (seeded) order with the
command's defaults among them, so that a drift of the machine (other sessions'
load) does not line up with one parameter or one configuration; the table holds
each configuration's median, and every run is kept under ``"runs"``.  The file
says how stable the medians are (``"spread"``: per configuration the quartiles of
its runs, relative to the median) and what else ran (``"load"``: the 1-minute load
average before each round and at the end).

``--split`` says the instances share one job (the command reads
``AFFINITY_INSTANCE`` / ``AFFINITY_NUM_INSTANCES``): their rates add up; without
it they are copies and a trial's value is one copy's.  ``--time`` records the wall
time of the whole job instead of a printed rate (``"direction": "minimize"``),
exactly as ``affinity tune --time`` measures it.

The file is labelled ``"kind": "recording"`` and names the machine it was
recorded on; ``--synthetic`` is the hwloc description the benchmark reads that
machine back with.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from affinity.machine.topology import Topology  # noqa: E402
from affinity.tools.tune_runner import CommandRunner  # noqa: E402
from affinity.tuning.space import Space, parse_param  # noqa: E402


def spread(vals: list) -> list[float | None]:
    """The quartiles of the runs that ran, relative to their median."""
    ok = sorted(v for v in vals if v is not None)
    if len(ok) < 2:
        return [None, None]
    q1, mid, q3 = statistics.quantiles(ok, n=4, method="inclusive")
    return [round(q1 / mid, 3), round(q3 / mid, 3)]


def median(vals: list) -> float | None:
    """The median of the runs, None when most of them failed."""
    ok = [v for v in vals if v is not None]
    return statistics.median(ok) if len(ok) * 2 > len(vals) else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name")
    ap.add_argument("--synthetic", required=True, help="hwloc synthetic description of this machine")
    ap.add_argument("--param", action="append", default=[])
    ap.add_argument("--title", default="")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--split", action="store_true", help="the instances share one job (their rates add up)")
    ap.add_argument("--time", action="store_true", help="record the wall time of the job (minimize)")
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        ap.error("give the command after '--'")
    cut = argv.index("--")
    args = ap.parse_args(argv[:cut])
    command = argv[cut + 1:]
    space = Space.of(dict(parse_param(p) for p in args.param))
    runner = CommandRunner(command, timeout=600, use_time=args.time, split=args.split)
    configs = list(space.configs())
    runs: dict[tuple, list] = {tuple(c[n] for n in space.names): [] for c in configs}
    defaults: list = []
    load: list[float] = []
    t0 = time.time()
    first = {n: space.choices(n)[0] for n in space.names}
    for r in range(args.repeats):
        order: list = [*configs, None]  # None: the command as the user runs it
        random.Random(args.seed + r).shuffle(order)
        load.append(round(os.getloadavg()[0], 2))
        for i, cfg in enumerate(order, 1):
            if cfg is None:
                m = runner.defaults(first)
                defaults.append(m.value)
            else:
                m = runner.trial(cfg)
                runs[tuple(cfg[n] for n in space.names)].append(m.value)
            print(f"[round {r + 1}, {i}/{len(order)}] {cfg or 'defaults'} -> {m.value} {m.error or ''}",
                  file=sys.stderr, flush=True)
    load.append(round(os.getloadavg()[0], 2))

    rows = [[*cfg.values(), median(runs[tuple(cfg.values())])] for cfg in space.configs()]
    here = Topology.from_system()
    data = {"name": args.name, "title": args.title or f"recorded: {' '.join(command)}", "kind": "recording",
            "machine": here.describe(), "topology": args.synthetic,
            "direction": "minimize" if args.time else "maximize", "split": args.split, "time": args.time,
            "params": list(space.names), "space": space.to_dict(), "fixed": {}, "rows": rows,
            "repeats": args.repeats, "runs": [[*k, v] for k, v in runs.items()],
            "spread": [[*k, *spread(v)] for k, v in runs.items()], "spread_columns": ["q1/median", "q3/median"],
            "load": load, "command": command, "defaults": median(defaults), "defaults_runs": defaults,
            "recorded_seconds": round(time.time() - t0),
            "recorded_on": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    (HERE / f"{args.name}.json").write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print(f"wrote {args.name}.json: {len(rows)} configurations, defaults {median(defaults)}, load {load}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
