"""Record a response surface: run a command once per configuration of a space, through
``affinity run`` exactly as ``affinity tune`` runs a trial, and write the table.

    python bench/surfaces/record.py NAME --synthetic "package:1 [numa] core:2 pu:1" \\
        --param instances=1,2 --param threads=1,2 ... -- CMD ...

Configurations run in a shuffled (seeded) order, so that a drift of the machine
does not line up with one parameter; with ``--repeats N`` the whole space runs N
times, each round in its own order, and the table holds each configuration's median
(every run is kept under ``"runs"``).  The file is labelled ``"kind": "recording"``
and names the machine it was recorded on; ``--synthetic`` is the hwloc description
the benchmark reads that machine back with.
"""

from __future__ import annotations

import argparse
import json
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name")
    ap.add_argument("--synthetic", required=True, help="hwloc synthetic description of this machine")
    ap.add_argument("--param", action="append", default=[])
    ap.add_argument("--title", default="")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1)
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        ap.error("give the command after '--'")
    cut = argv.index("--")
    args = ap.parse_args(argv[:cut])
    command = argv[cut + 1:]
    space = Space.of(dict(parse_param(p) for p in args.param))
    runner = CommandRunner(command, timeout=600)
    configs = list(space.configs())
    runs: dict[tuple, list] = {tuple(c[n] for n in space.names): [] for c in configs}
    t0 = time.time()
    defaults = runner.defaults()
    for r in range(args.repeats):
        order = list(configs)
        random.Random(args.seed + r).shuffle(order)
        for i, cfg in enumerate(order, 1):
            m = runner.trial(cfg)
            runs[tuple(cfg[n] for n in space.names)].append(m.value)
            print(f"[round {r + 1}, {i}/{len(order)}] {cfg} -> {m.value} {m.error or ''}", file=sys.stderr, flush=True)

    def median(vals: list) -> float | None:
        """The median of the runs, None when most of them failed."""
        ok = [v for v in vals if v is not None]
        return statistics.median(ok) if len(ok) * 2 > len(vals) else None

    rows = [[*cfg.values(), median(runs[tuple(cfg.values())])] for cfg in space.configs()]
    here = Topology.from_system()
    data = {"name": args.name, "title": args.title or f"recorded: {' '.join(command)}", "kind": "recording",
            "machine": here.describe(), "topology": args.synthetic, "direction": "maximize",
            "params": list(space.names), "space": space.to_dict(), "fixed": {}, "rows": rows,
            "repeats": args.repeats, "runs": [[*k, v] for k, v in runs.items()],
            "command": command, "defaults": defaults.value, "recorded_seconds": round(time.time() - t0),
            "recorded_on": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    (HERE / f"{args.name}.json").write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print(f"wrote {args.name}.json: {len(rows)} configurations, defaults {defaults.value}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
