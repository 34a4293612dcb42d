"""Models of the classic tuning cases, built from published tuning guides (issue 41).

Each surface models one case the guides discuss, with the guides' statements as its
mechanisms, not any single recording:

* TensorFlow's CPU performance guide and Intel's "Maximize TensorFlow performance on
  CPU" articles: intra-op threads = physical cores, inter-op threads = sockets,
  OMP_NUM_THREADS = physical cores, ``KMP_AFFINITY=granularity=fine,compact,1,0`` (one
  thread per core first), KMP_BLOCKTIME 0 a good default for CNNs, 1 for others, and
  30 ms best for AlexNet in TensorFlow's own tests; "start with those and tune";
  hyper-threads add little to oneDNN's vector kernels;
* the same guides and TensorFlow's issue tracker on concurrent ops: each op run side by
  side (inter-op) brings its own OpenMP team on the same places, so a graph with many
  independent ops wants several smaller teams, and intra = cores with inter > 1
  oversubscribes;
* on the Xeon Phi (Knights Landing): OMP_NUM_THREADS beyond the cores pays for some
  models (one thread per core issues at about 60 % of the core), and its slow wake-ups
  make spinning (a longer KMP_BLOCKTIME) pay while cores are not shared;
* AMD's EPYC guidance (ZenDNN): one instance per core complex (its own L3), its threads
  bound there, memory on its own NUMA node (NPS4);
* hybrid client CPUs: a statically scheduled OpenMP team runs at the pace of its
  slowest member, so keep a team on one kind of core.

``python bench/surfaces/guides.py`` rewrites the JSON files next to it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
if str(HERE.parent.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent.parent))

from hardware import Core, _sets, _shares, _spec, team_rate, thread_speeds, topology_of  # noqa: E402

__all__ = ["GUIDES", "build"]


@dataclass(frozen=True)
class TfCpu:
    """A TensorFlow job on a machine of ``cores`` cores (``tpc`` hardware threads each) in
    ``packages`` packages, as the guides describe it."""

    cores: int
    tpc: int
    packages: int
    smt: tuple[float, ...] = (1.0, 1.05)  #: a core's throughput with 1, 2, ... busy threads
    serial: float = 0.02  #: Amdahl's serial share of an OpenMP region
    sync: float = 0.0015  #: barrier cost per doubling of the team
    eigen: float = 0.15  #: share of the work on TensorFlow's own (Eigen) pool
    parallel_ops: float = 0.05  #: share of the graph made of ops that can run side by side
    wake: dict = field(default_factory=lambda: {0: 0.012, 1: 0.004, 30: 0.0, 200: 0.0, "infinite": 0.0})
    #: how much spinning workers slow the Eigen pool's threads on the same cores
    steal: dict = field(default_factory=lambda: {0: 0.0, 1: 0.15, 30: 0.6, 200: 1.5, "infinite": 2.5})
    #: how much a time-sliced spinning team loses per thread beyond the PUs
    spin: dict = field(default_factory=lambda: {0: 0.3, 1: 0.5, 30: 2.0, 200: 5.0, "infinite": 8.0})
    remote: float = 0.06  #: a team spanning packages pays this for remote memory

    @property
    def pus(self) -> int:
        return self.cores * self.tpc

    def _yield(self, per_core: float) -> float:
        """A core's throughput with ``per_core`` busy threads (interpolated)."""
        lo = max(1, min(int(per_core), len(self.smt)))
        y = self.smt[lo - 1]
        if lo < len(self.smt) and per_core > lo:
            y += (per_core - lo) * (self.smt[lo] - self.smt[lo - 1])
        return y

    def team(self, n: int, affinity: str, bt: Any, load: float = 1.0) -> tuple[float, bool]:
        """(speed of an OpenMP team of ``n`` threads in cores, whether it spans packages);
        ``load`` teams like it share the same places."""
        threads = n * load
        if affinity == "compact":  # fills a core's hardware threads first
            used = max(1.0, min(self.cores, math.ceil(min(threads, self.pus) / self.tpc)))
        else:  # scatter, balanced, none: a thread per core first
            used = min(threads, self.cores)
        per_core = min(threads, self.pus) / used
        speed = used * self._yield(per_core) / load
        if threads > self.pus:  # time-slicing: a spinning team burns its slices
            speed /= 1 + (threads / self.pus - 1) * self.spin[bt]
        if affinity == "none":
            speed *= 0.93  # threads migrate, caches go cold
        per_pkg = self.cores // self.packages
        spans = self.packages > 1 and (used > per_pkg or affinity == "scatter" and n > 1)
        return speed, spans

    def value(self, cfg: dict[str, Any]) -> float:
        omp, intra, inter, bt = cfg["omp"], cfg["intra"], cfg["inter"], cfg["blocktime"]
        affinity = cfg.get("affinity", "compact")
        gran_core = cfg.get("granularity") == "core"
        conc = max(1, min(inter, 4))

        def step(load: float) -> float:
            speed, spans = self.team(omp, affinity, bt, load)
            if gran_core and self.tpc > 1:
                speed *= 0.98  # threads float over a core's PUs
            t = (self.serial + (1 - self.serial) / max(speed, 1e-9) + self.sync * math.log2(omp + 1))
            return t * (1 + self.remote * spans) * (1 + self.wake[bt])

        # the graph: its sequential ops one at a time, its independent ops ``conc`` at a time, each
        # with a team on the same places
        t_omp = (1 - self.eigen) * ((1 - self.parallel_ops) * step(1.0) + self.parallel_ops * step(conc) / conc)
        eig = min(intra, self.cores) * self._yield(min(intra, self.pus) / min(intra, self.cores))
        if intra > self.cores:  # its extra threads take the hyper-threads the OpenMP team runs beside
            eig /= 1 + 0.08 * math.log2(min(intra, self.pus) / self.cores)
        if intra > self.pus:
            eig /= 1 + 0.2 * (intra / self.pus - 1)
        steal = 1 + self.steal[bt] * min(1.0, omp / self.cores)
        t_eig = self.eigen * (0.04 + 0.96 / eig) * steal
        t = (t_omp + t_eig) * (1 + 0.02 * max(0, inter - self.packages))  # inter-op threads beyond the sockets
        return 100.0 / t


XEON = "package:2 [numa] core:28 pu:2"
KNL = "package:1 [numa] core:68 pu:4"
XEON_SPACE = {"intra": [7, 14, 28, 56, 112], "inter": [1, 2, 4], "omp": [7, 14, 28, 56, 112],
              "blocktime": [0, 1, 30, 200], "affinity": ["compact", "scatter", "none"]}


def _epyc_ccd(cfg: dict[str, Any]) -> float | None:
    """Copies on 2 x 64-core EPYC in NPS4 (8 NUMA nodes, 2 core complexes of 8 cores with
    32 MB of L3 each per node): a team spanning complexes pays coherence traffic and
    remote L3; copies sharing a complex share its L3 (12 MB of weights each); a node's
    memory channels cap its copies; memory on the node or not."""
    topo = topology_of("package:2 numa:4 l3:2 core:8 pu:2")
    k, n, mb = cfg["instances"], cfg["threads"], cfg["membind"]
    shares = _shares(topo, k)
    if shares is None:
        return None
    node_of = {p: topo.numa_of(p).logical_index for p in topo.allowed}
    per_node: dict[int, float] = {}
    for share in shares:
        spec = None if cfg["affinity"] == "none" else "granularity=fine,compact,1,0"
        sets = _sets(share, spec, n)
        speeds = thread_speeds(share, sets, {None: Core(1.0, (1.0, 1.15))}, 1.0)
        if spec is None:
            speeds = [s * 0.95 for s in speeds]
        pus = {p for s in sets for p in s}
        ccds = len({share.pu(p).core // 8 for p in pus})
        nodes = sorted({node_of[p] for p in pus})
        far = {"interleave": 7 / 8, "local": (len(nodes) - 1) / len(nodes)}.get(
            mb, (len(nodes) - 1) / len(nodes) if len(nodes) > 1 else 0.0)
        sharing = max(1.0, k / 16)  # copies per complex
        miss = 1 - min(1.0, 32.0 / (12.0 * sharing))
        speeds = [s / (1 + 0.35 * far) / (1 + 1.5 * miss) for s in speeds]
        r = team_rate(speeds, serial=0.04, sync=0.002 + 0.004 * math.log2(ccds), wake=0.0)
        for m in nodes:
            per_node[m] = per_node.get(m, 0.0) + r / len(nodes)
    return 30.0 * sum(x / (1 + (x / 9.0) ** 4) ** 0.25 for x in per_node.values())


def _hybrid_8p8e(cfg: dict[str, Any]) -> float | None:
    """A 8P+8E client CPU (P-cores SMT2; an E-core at 0.55 of a P-core for vector code):
    a static team runs at its slowest member's pace; 32 GB hold 8 copies."""
    topo = topology_of("hybrid:8P2T+8E")
    k, n, bt = cfg["instances"], cfg["threads"], cfg["blocktime"]
    if 3.5 * k + 3.0 > 32:
        return None
    shares = _shares(topo, k)
    if shares is None:
        return None
    kinds = {None: Core(1.0, (1.0, 1.2)), "IntelCore": Core(1.0, (1.0, 1.2)), "IntelAtom": Core(0.55, (1.0,))}
    total = 0.0
    for share in shares:
        sets = _sets(share, _spec(cfg), n)
        speeds = thread_speeds(share, sets, kinds, {0: 0.3, 1: 0.5, 200: 5.0}[bt])
        if _spec(cfg) is None:
            speeds = [s * 0.95 for s in speeds]
        total += team_rate(speeds, serial=0.03, sync=0.002, wake={0: 0.03, 1: 0.01, 200: 0.0}[bt])
    return 10.0 * total / (1 + (total / 12.0) ** 4) ** 0.25


GUIDES: dict[str, dict[str, Any]] = {
    "guide_xeon2s_tf_cnn": {
        "title": "2-socket Xeon (2 x 28 cores, HT), TensorFlow CNN inference (guides: intra = OMP = cores, "
                 "inter = sockets, KMP_BLOCKTIME 0 for CNNs, hyper-threads add little)",
        "topology": XEON, "space": XEON_SPACE,
        "model": TfCpu(cores=56, tpc=2, packages=2, parallel_ops=0.02,
                       steal={0: 0.0, 1: 0.3, 30: 0.8, 200: 1.5, "infinite": 2.5}).value},
    "guide_xeon2s_tf_alexnet": {
        "title": "2-socket Xeon (2 x 28 cores, HT), TensorFlow AlexNet training (TensorFlow's tests: KMP_BLOCKTIME "
                 "30 ms best; short regions whose workers wake often)",
        "topology": XEON, "space": XEON_SPACE,
        "model": TfCpu(cores=56, tpc=2, packages=2, serial=0.03, eigen=0.1, parallel_ops=0.1,
                       wake={0: 0.09, 1: 0.05, 30: 0.0, 200: 0.0, "infinite": 0.0},
                       steal={0: 0.0, 1: 0.1, 30: 0.25, 200: 1.2, "infinite": 2.5}).value},
    "guide_xeon2s_tf_wide": {
        "title": "2-socket Xeon (2 x 28 cores, HT), TensorFlow model with many independent ops (a wide graph: "
                 "several smaller teams side by side beat one team of every core)",
        "topology": XEON, "space": XEON_SPACE,
        "model": TfCpu(cores=56, tpc=2, packages=2, serial=0.06, sync=0.004, eigen=0.2, parallel_ops=0.7,
                       wake={0: 0.03, 1: 0.01, 30: 0.0, 200: 0.0, "infinite": 0.0}).value},
    "guide_knl_tf": {
        "title": "Xeon Phi 7250 (68 cores x 4 threads), TensorFlow CNN training (guides: OMP beyond the cores pays "
                 "on KNL, slow wake-ups make spinning pay)",
        "topology": KNL,
        "space": {"intra": [17, 34, 68, 136, 272], "inter": [1, 2, 4], "omp": [34, 68, 136, 272],
                  "blocktime": [0, 1, 30, "infinite"], "affinity": ["compact", "scatter", "balanced"],
                  "granularity": ["fine", "core"]},
        "model": TfCpu(cores=68, tpc=4, packages=1, smt=(1.0, 1.45, 1.6, 1.65), serial=0.01, sync=0.001,
                       eigen=0.1, parallel_ops=0.15,
                       wake={0: 0.07, 1: 0.04, 30: 0.005, 200: 0.0, "infinite": 0.0},
                       steal={0: 0.0, 1: 0.05, 30: 0.1, 200: 0.6, "infinite": 0.9}, remote=0.0).value},
    "guide_epyc_ccd": {
        "title": "2 x 64-core EPYC (SMT2, NPS4: 8 NUMA nodes of 2 core complexes): instances per complex, memory "
                 "on the node (AMD's ZenDNN guidance)",
        "topology": "package:2 numa:4 l3:2 core:8 pu:2", "model": _epyc_ccd,
        "space": {"instances": [1, 2, 4, 8, 16, 32, 64], "threads": [1, 2, 4, 8, 16, 32, 64, 128],
                  "membind": ["none", "local", "interleave"], "affinity": ["none", "compact"]}},
    "guide_hybrid_8p8e": {
        "title": "hybrid client (8 P-cores SMT2 + 8 E-cores, 32 GB): a team paced by its slowest member, more than "
                 "8 copies out of memory",
        "topology": "hybrid:8P2T+8E", "model": _hybrid_8p8e,
        "out_of_memory": lambda cfg: 3.5 * cfg["instances"] + 3.0 > 32,
        "space": {"instances": [1, 2, 3, 4, 6, 8, 12], "threads": [1, 2, 4, 6, 8, 12, 16, 24],
                  "affinity": ["none", "compact", "scatter"], "blocktime": [0, 1, 200]}},
}


def _noise(cfg: dict[str, Any], name: str, amount: float = 0.01) -> float:
    h = hashlib.sha256((name + json.dumps(cfg, sort_keys=True, default=str)).encode()).digest()
    return 1 + amount * (2 * int.from_bytes(h[:8], "big") / 2 ** 64 - 1)


def build(name: str) -> dict[str, Any]:
    """The surface ``name`` as JSON-ready data (1 % deterministic noise on the values)."""
    s = GUIDES[name]
    names = list(s["space"])
    rows, oom = [], []
    for values in itertools.product(*(s["space"][n] for n in names)):
        cfg = dict(zip(names, values))
        v = s["model"](cfg)
        rows.append([*values, None if v is None else round(v * _noise(cfg, name), 4)])
        if v is None and "out_of_memory" in s and s["out_of_memory"](cfg):
            oom.append(list(values))
    data = {"name": name, "title": s["title"], "kind": "model from tuning guides", "topology": s["topology"],
            "direction": "maximize", "noise": 0.0, "params": names, "space": s["space"], "fixed": {}, "rows": rows}
    if oom:
        data["out_of_memory"] = oom
    return data


def main() -> int:
    for name in GUIDES:
        data = build(name)
        vals = [r[-1] for r in data["rows"] if r[-1] is not None]
        best = max(vals)
        bestrow = next(r for r in data["rows"] if r[-1] == best)
        near = sum(v >= 0.97 * best for v in vals)
        (HERE / f"{name}.json").write_text(json.dumps(data, separators=(",", ":")) + "\n")
        print(f"{name}: {len(data['rows'])} configurations, {len(data['rows']) - len(vals)} fail, best {best:.4g} at "
              f"{dict(zip(data['params'], bestrow))}, {near} within 3 %, worst {min(vals):.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
