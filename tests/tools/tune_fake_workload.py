"""A workload for ``affinity tune``'s tests: prints a throughput computed from the
placement it was given, in a tenth of a second.

Throughput: 100 per thread of the team (``OMP_NUM_THREADS``) up to the CPUs of its
mask, halved when the team is larger than the mask; +10 % with ``KMP_BLOCKTIME=0``;
``--rate X`` multiplies.  Options make it misbehave: ``--fail`` (exit 3),
``--fail-placed`` (exit 4 when started by ``affinity run``), ``--fail-if-env VAR`` (exit 5 when VAR=1),
``--oom-if-env VAR`` (killed by SIGKILL, as by the out-of-memory killer, when VAR=1), ``--no-metric``,
``--sleep S``, ``--json`` (a JSON line), ``--unit U``, ``--steps N`` (N values first, one
every ``--step-sleep`` seconds).
"""

import json
import os
import signal
import sys
import time

args = sys.argv[1:]


def opt(name, default=None):
    return args[args.index(name) + 1] if name in args else default


time.sleep(float(opt("--sleep", "0.05")))
if "--fail" in args:
    print("failing as asked", file=sys.stderr)
    sys.exit(3)
if "--fail-if-env" in args and os.environ.get(opt("--fail-if-env")) == "1":
    print("failing as the environment asks", file=sys.stderr)
    sys.exit(5)
if "--oom-if-env" in args and os.environ.get(opt("--oom-if-env")) == "1":
    os.kill(os.getpid(), signal.SIGKILL)
if "--fail-placed" in args and "KMP_AFFINITY" in os.environ:
    print("failing under affinity run", file=sys.stderr)
    sys.exit(4)
cpus = len(os.sched_getaffinity(0))
team = int(os.environ.get("OMP_NUM_THREADS", cpus))
value = 100.0 * min(team, cpus) * (0.5 if team > cpus else 1.0) * float(opt("--rate", "1"))
if os.environ.get("KMP_BLOCKTIME") == "0":
    value *= 1.1
for step in range(int(opt("--steps", "0"))):  # values as it goes, for multi-fidelity
    print(f"step {step}: {value:.2f} images/sec", flush=True)
    time.sleep(float(opt("--step-sleep", "0.05")))
if "--no-metric" in args:
    print("done, but no number")
elif "--json" in args:
    print(json.dumps({"throughput": value, "team": team}))
else:
    print(f"total {opt('--unit', 'images/sec')}: {value:.2f}")
