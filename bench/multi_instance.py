"""Multi-instance A/B harness: K copies of an OpenMP workload on disjoint CPUs,
placed by each tool in turn, interleaved round by round.

Made for the 16-CPU benchmark machine (``../shared/bench16/README.md``: build
``.bench-kit/`` with ``../shared/bench16/prepare.sh``, take it along, start the
command with ``source .bench-kit/setup.sh;``)::

    python3 bench/multi_instance.py --rounds 6                 # ResNet-50, batch 16, K = 2, 4, 8
    python3 bench/multi_instance.py --rounds 2 --append        # two more rounds into the same file
    python3 bench/multi_instance.py --explain                  # what each variant sets, no timing

It writes ``bench/multi_instance.json`` (``make bench`` turns it into a section
of ``bench/RESULTS.md``)::

    {"machine": {"cpus": 16, "model": "...", "numa_nodes": 1, "smt": 1, "date": "..."},
     "rows": [{"label": "affinity run --instances 4", "values": [...], "unit": "images/sec"}, ...]}

Variants, for each K (T = CPUs / K threads per instance, instance i on CPUs
i*T .. i*T+T-1 of this process's mask):

* ``unpinned KxT``: K processes, ``OMP_NUM_THREADS=T``, no placement at all;
* ``numactl -C KxT``: each ``numactl -C <its CPUs> --`` by hand, ``OMP_NUM_THREADS=T``;
* ``libgomp OMP_PROC_BIND KxT``: no process mask; ``OMP_PLACES`` = its CPUs,
  one place each, ``OMP_PROC_BIND=close`` (libgomp binds its own threads);
* ``torch run_cpu KxT``: ``python -m torch.backends.xeon.run_cpu --ninstances K``
  (when PyTorch is there);
* ``affinity run --instances K``: one launcher starts the K copies (the default
  placement: process mask, thread places, memory bound to the share's node,
  ``KMP_BLOCKTIME=1``) and waits;
* ``affinity run -C KxT``: K launchers started by hand, each ``affinity run -C
  <its CPUs>`` (exec'd: no parent process, no memory policy) -- separates the
  launcher's own effects from the placement;
* ``affinity run --instances K --localalloc`` / ``--blocktime none`` (for the
  middle K only): the memory binding and ``KMP_BLOCKTIME`` taken out one at a time.

and one process on every CPU: ``defaults 1xC`` (nothing set), ``affinity run
1xC`` and, with PyTorch, ``affinity.apply 1xC`` (in process).

Each round runs every variant once, in an order rotated by one each round; a
variant's value is the sum over its instances of their own throughput (each
instance times its own steady-state loop and reports when it ran, so the start
skew between instances is recorded too).  The summary prints median and
spread (min-max) per variant: a difference smaller than the spread is noise.

``--workload omp`` replaces PyTorch by a small C OpenMP kernel built with
``gcc -fopenmp`` (libgomp, as PyTorch uses): the smoke run on a 2-CPU machine
(``--smoke``: K = 2, 3 short rounds, written to
``/tmp/multi_instance_smoke.json``, never to ``bench/multi_instance.json``).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = Path(__file__).resolve().parent / "mi_workload.py"
RESULT = "MI_RESULT "

KERNEL = r"""
#define _GNU_SOURCE
#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#define N 384
static float A[N][N], B[N][N], C[N][N];
static const char *heap_policy(void) {
    static char pol[64] = "unknown";
    char line[4096];
    FILE *f = fopen("/proc/self/numa_maps", "r");
    if (!f) return pol;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "heap")) { sscanf(line, "%*s %63s", pol); break; }
    fclose(f);
    return pol;
}
static double now(void) { struct timespec t; clock_gettime(CLOCK_REALTIME, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void step(void) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++)
        for (int k = 0; k < N; k++) { float a = A[i][k]; for (int j = 0; j < N; j++) C[i][j] += a * B[k][j]; }
}
int main(int argc, char **argv) {
    int warm = argc > 1 ? atoi(argv[1]) : 2, iters = argc > 2 ? atoi(argv[2]) : 20;
    for (int i = 0; i < N; i++) for (int j = 0; j < N; j++) { A[i][j] = (i + j) % 7; B[i][j] = (i * j) % 5; }
    for (int w = 0; w < warm; w++) step();
    double t0 = now();
    for (int it = 0; it < iters; it++) step();
    double t1 = now();
    printf("MI_RESULT {\"ips\": %.6f, \"t0\": %.6f, \"t1\": %.6f, \"pid\": %d, \"threads\": %d, \"probe\": {\"masks\": {",
           iters / (t1 - t0), t0, t1, (int)getpid(), omp_get_max_threads());
    int printed = 0;
    #pragma omp parallel
    {
        cpu_set_t s; sched_getaffinity(0, sizeof s, &s);
        char buf[4096]; int n = 0;
        for (int c = 0; c < CPU_SETSIZE && n < 4000; c++) if (CPU_ISSET(c, &s)) n += sprintf(buf + n, n ? ",%d" : "%d", c);
        #pragma omp critical
        printf("%s\"%d\": \"%s\"", printed++ ? ", " : "", omp_get_thread_num(), buf);
    }
    printf("}, \"mempolicy\": \"%s\", \"env\": {", heap_policy());
    extern char **environ;
    int first = 1;
    for (char **e = environ; *e; e++)
        if (!strncmp(*e, "OMP_", 4) || !strncmp(*e, "KMP_", 4) || !strncmp(*e, "GOMP_", 5)) {
            char *eq = strchr(*e, '=');
            printf("%s\"%.*s\": \"%s\"", first ? "" : ", ", (int)(eq - *e), *e, eq + 1);
            first = 0;
        }
    printf("}}}\n");
    return 0;
}
"""


FAULTS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
/* page faults: map, touch and unmap 256 MiB, as a CPU tensor library does with
   large activations (glibc serves them with mmap and returns them with munmap) */
int main(int argc, char **argv) {
    size_t n = 256ul << 20;
    int reps = argc > 1 ? atoi(argv[1]) : 8;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int r = 0; r < reps; r++) {
        char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return 1;
        for (size_t i = 0; i < n; i += 4096) p[i] = 1;
        munmap(p, n);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.3f\n", reps * (n >> 20) / 1024.0 / ((b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9));
    return 0;
}
"""


# ------------------------------------------------------------------ the machine

def machine_info() -> dict[str, Any]:
    cpus = sorted(os.sched_getaffinity(0))
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    nodes = [d for d in Path("/sys/devices/system/node").glob("node[0-9]*")] if Path(
        "/sys/devices/system/node").is_dir() else []
    smt = 1
    try:
        sib = Path(f"/sys/devices/system/cpu/cpu{cpus[0]}/topology/thread_siblings_list").read_text().strip()
        smt = sum(1 + int(b) - int(a) if "-" in p else 1 for p in sib.split(",")
                  for a, _, b in [p.partition("-")])
    except OSError:
        pass
    return {"cpus": len(cpus), "model": model, "numa_nodes": max(1, len(nodes)), "smt": smt,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "python": sys.version.split()[0]}


def have_torch() -> bool:
    try:
        import torch  # noqa: F401
        import torchvision  # noqa: F401
    except ImportError:
        return False
    return True


def build_kernel(source: str = KERNEL) -> str:
    """A C program of this file, built once per source (``gcc -O2 -fopenmp``)."""
    digest = hashlib.sha1(source.encode()).hexdigest()[:12]
    d = Path(tempfile.gettempdir()) / f"mi-kernel-{digest}"
    exe = d / "kernel"
    if not exe.exists():
        d.mkdir(exist_ok=True)
        (d / "kernel.c").write_text(source)
        subprocess.run(["gcc", "-O2", "-fopenmp", str(d / "kernel.c"), "-o", str(exe)], check=True)
    return str(exe)


def membind_check(rounds: int) -> dict[str, Any]:
    """Page-fault throughput (GiB/s mapped, touched and unmapped) with the memory
    policy ``affinity run --instances`` gives each instance (bound to its node)
    and without, interleaved: on a machine with one NUMA node the binding
    changes no page's place, only the kernel's path to it."""
    exe = build_kernel(FAULTS)
    node = "0"
    variants = {"default policy": [exe], "numactl --membind 0": ["numactl", "--membind", node, exe],
                "numactl --localalloc": ["numactl", "--localalloc", exe],
                "affinity run --membind 0": affinity_cmd() + ["--membind", node, "--", exe]}
    if not shutil.which("numactl"):
        variants = {k: v for k, v in variants.items() if not k.startswith("numactl")}
    vals: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(rounds):
        for k, argv in variants.items():
            out = subprocess.run(argv, capture_output=True, text=True, check=True, env=_clean_env({})).stdout
            vals[k].append(float(out.split()[-1]))
    for k, v in vals.items():
        print(f"{k:28s} median {statistics.median(v):7.2f} GiB/s  spread {min(v):.2f}-{max(v):.2f}  ({len(v)} rounds)")
    return {"unit": "GiB/s", "rows": [{"label": k, "values": v} for k, v in vals.items()]}


# ------------------------------------------------------------------ variants

def cpulist(cpus: list[int]) -> str:
    return ",".join(map(str, cpus))


def workload_cmd(a: argparse.Namespace, *, apply: bool = False) -> list[str]:
    if a.workload == "omp":
        return [a.kernel, str(a.warmup), str(a.iters)]
    cmd = [sys.executable, str(WORKLOAD), "--model", a.model, "--batch", str(a.batch), "--size", str(a.size),
           "--warmup", str(a.warmup), "--iters", str(a.iters)]
    return cmd + (["--apply"] if apply else []) + (["--probe"] if a.explain else [])


def affinity_cmd() -> list[str]:
    return [sys.executable, "-m", "affinity", "run"]


def variants(a: argparse.Namespace) -> list[dict[str, Any]]:
    """Every variant: a label, and either ``launches`` (one argv+env per process
    the harness starts) or one ``launch`` that starts all instances itself."""
    cpus = sorted(os.sched_getaffinity(0))
    out: list[dict[str, Any]] = []
    w = workload_cmd(a)
    for k in a.ks:
        t = len(cpus) // k
        if t < 1:
            continue
        shares = [cpus[i * t:(i + 1) * t] for i in range(k)]
        n = f"{k}x{t}"
        omp = {"OMP_NUM_THREADS": str(t)}
        out.append({"label": f"unpinned {n}", "launches": [(w, omp) for _ in shares]})
        if shutil.which("numactl"):
            out.append({"label": f"numactl -C {n}",
                        "launches": [(["numactl", "-C", cpulist(s), "--"] + w, omp) for s in shares]})
        out.append({"label": f"libgomp OMP_PROC_BIND {n}",
                    "launches": [(w, dict(omp, OMP_PLACES=",".join(f"{{{c}}}" for c in s), OMP_PROC_BIND="close"))
                                 for s in shares]})
        if a.workload == "torch":
            out.append({"label": f"torch run_cpu {n}",
                        "launch": ([sys.executable, "-m", "torch.backends.xeon.run_cpu", "--ninstances", str(k),
                                    "--ncores-per-instance", str(t)] + w[1:], {})})
        out.append({"label": f"affinity run --instances {k}",
                    "launch": (affinity_cmd() + ["--instances", str(k), "--"] + w, {})})
        out.append({"label": f"affinity run -C {n}",
                    "launches": [(affinity_cmd() + ["-C", cpulist(s), "--"] + w, {}) for s in shares]})
        if k == a.ks[len(a.ks) // 2] and not a.smoke:
            for extra in (["--localalloc"], ["--blocktime", "none"]):
                out.append({"label": f"affinity run --instances {k} {' '.join(extra)}",
                            "launch": (affinity_cmd() + ["--instances", str(k)] + extra + ["--"] + w, {})})
    n = f"1x{len(cpus)}"
    out.append({"label": f"defaults {n}", "launches": [(w, {})]})
    out.append({"label": f"affinity run {n}", "launches": [(affinity_cmd() + ["--"] + w, {})]})
    if a.workload == "torch":
        out.append({"label": f"affinity.apply {n}", "launches": [(workload_cmd(a, apply=True), {})]})
    return out


# ------------------------------------------------------------------ running

def _clean_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMP_", "KMP_", "GOMP_", "AFFINITY_", "TF_NUM_"))}
    env.update(extra)
    return env


def _results(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[len(RESULT):]) for line in text.splitlines() if line.startswith(RESULT)]


def run_variant(v: dict[str, Any], expect: int, timeout: float) -> dict[str, Any]:
    """Start the variant's processes together, wait, collect each instance's result."""
    procs = []
    launches = v["launches"] if "launches" in v else [v["launch"]]
    for argv, env in launches:
        procs.append(subprocess.Popen(argv, env=_clean_env(env), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, cwd=ROOT))
    res: list[dict[str, Any]] = []
    errors = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        res.extend(_results(out))
        if p.returncode:
            errors.append(err[-500:])
    if len(res) != expect:
        raise RuntimeError(f"{v['label']}: {len(res)} results for {expect} instances; {errors}")
    t0s = [r["t0"] for r in res]
    t1s = [r["t1"] for r in res]
    overlap = max(0.0, min(t1s) - max(t0s)) / max(1e-9, max(t1s) - min(t0s))
    return {"value": sum(r["ips"] for r in res), "skew_s": max(t0s) - min(t0s), "overlap": overlap,
            "instances": res}


def instances_of(label: str) -> int:
    if "--instances" in label:
        return int(label.split("--instances ")[1].split()[0])
    return int(label.rsplit(" ", 1)[1].split("x")[0])


def rounds(a: argparse.Namespace, vs: list[dict[str, Any]], doc: dict[str, Any]) -> None:
    """Interleaved rounds (the order rotated by one each round), each variant's
    value appended to its row as soon as it is measured."""
    rows = {r["label"]: r for r in doc["rows"]}
    for r in range(a.rounds):
        shift = (len(next(iter(rows.values()))["values"]) if rows else 0) + r
        order = vs[shift % len(vs):] + vs[:shift % len(vs)]
        for v in order:
            m = run_variant(v, instances_of(v["label"]), a.timeout)
            row = rows.setdefault(v["label"], {"label": v["label"], "values": [], "unit": doc["unit"],
                                               "skew_s": [], "overlap": []})
            if row not in doc["rows"]:
                doc["rows"].append(row)
            row["values"].append(round(m["value"], 3))
            row["skew_s"].append(round(m["skew_s"], 3))
            row["overlap"].append(round(m["overlap"], 3))
            print(f"round {r + 1}/{a.rounds}  {v['label']:45s} {m['value']:9.2f} {doc['unit']}"
                  f"  (start skew {m['skew_s']:.2f} s, overlap {m['overlap']:.0%})", flush=True)
            write(a.out, doc)


def summary(doc: dict[str, Any]) -> str:
    lines = [f"{'variant':45s} {'median':>9s}  spread (min-max)  rounds"]
    for row in doc["rows"]:
        v = row["values"]
        if v:
            lines.append(f"{row['label']:45s} {statistics.median(v):9.2f}  {min(v):.2f}-{max(v):.2f}"
                         f"  {len(v)}")
    return "\n".join(lines)


def write(path: str, doc: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    os.replace(tmp, path)


def explain(a: argparse.Namespace, vs: list[dict[str, Any]]) -> dict[str, Any]:
    """Run every variant once and record, per instance, what it was given: the
    OpenMP/placement variables, the memory policy and each thread's mask."""
    out = {}
    for v in vs:
        m = run_variant(v, instances_of(v["label"]), a.timeout)
        out[v["label"]] = [{"threads": r.get("threads"), **r.get("probe", {})} for r in m["instances"]]
        print(f"{v['label']}:", flush=True)
        for i, p in enumerate(out[v["label"]]):
            masks = p.get("masks", {})
            print(f"  instance {i}: memory {p.get('mempolicy', '?')}; masks " +
                  " ".join(sorted(set(masks.values()), key=lambda s: (len(s), s))) +
                  (f"; env {p['env']}" if p.get("env") else ""), flush=True)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--ks", default="2,4,8", help="instance counts (default 2,4,8)")
    ap.add_argument("--workload", choices=("torch", "omp"), default=None,
                    help="torch (default when PyTorch is there) or the C OpenMP kernel")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--only", default=None, help="run only variants whose label contains this")
    ap.add_argument("--out", default=None, help="default bench/multi_instance.json (smoke: /tmp/...)")
    ap.add_argument("--append", action="store_true", help="add rounds to the rows already in --out")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--smoke", action="store_true",
                    help="a harness check on a small machine: K=2, the C kernel, 3 short rounds, /tmp output")
    ap.add_argument("--explain", action="store_true", help="one run per variant: what it sets, no timing")
    ap.add_argument("--membind-check", action="store_true",
                    help="page-fault throughput with and without the instances' memory binding, then exit")
    a = ap.parse_args(argv)
    if a.smoke:
        a.ks, a.rounds, a.iters, a.warmup = "2", min(a.rounds, 3), 30, 3
        a.workload = a.workload or "omp"
        a.out = a.out or str(Path(tempfile.gettempdir()) / "multi_instance_smoke.json")
    a.workload = a.workload or ("torch" if have_torch() else "omp")
    a.ks = [int(x) for x in str(a.ks).split(",") if x]
    a.out = a.out or str(ROOT / "bench" / "multi_instance.json")
    a.kernel = build_kernel() if a.workload == "omp" else None
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.membind_check:
        doc = {"machine": machine_info(), "membind_check": membind_check(max(a.rounds, 3))}
        path = a.out if a.out.endswith("membind.json") else str(Path(a.out).with_suffix("")) + ".membind.json"
        write(path, doc)
        print(f"wrote {path}")
        return 0
    vs = [v for v in variants(a) if not a.only or a.only in v["label"]]
    unit = "images/sec" if a.workload == "torch" else "iterations/sec"
    if a.explain:
        doc = {"machine": machine_info(), "explain": explain(a, vs)}
        print(json.dumps(doc["machine"]))
        return 0
    doc: dict[str, Any] = {"machine": machine_info(), "rows": [], "unit": unit}
    if a.append and os.path.exists(a.out):
        with open(a.out) as fh:
            doc = json.load(fh)
        doc["machine"]["date"] = machine_info()["date"]
    doc["workload"] = {"kind": a.workload, "model": a.model if a.workload == "torch" else "omp-kernel",
                       "batch": a.batch, "size": a.size, "warmup": a.warmup, "iters": a.iters}
    doc["smoke"] = a.smoke
    doc["command"] = " ".join(["python3", "bench/multi_instance.py"] + (argv if argv is not None else sys.argv[1:]))
    t = time.time()
    rounds(a, vs, doc)
    print(summary(doc))
    print(f"{time.time() - t:.0f} s; wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
