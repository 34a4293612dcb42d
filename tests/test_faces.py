"""One decision, two faces: ``apply()`` and ``affinity run`` given the same inputs plan the
same, export the same and say the same (issue #36).

Each face translates its own words into the decision's request (``apply``'s keyword
arguments: :func:`affinity.binding.apply.request_of`; ``run``'s command line:
:func:`affinity.launcher.build.request_of`, through the real parser) and performs what
:func:`affinity.planning.decide.decide` returns.  Here both translations run on described
machines (no process is bound) against a corpus of specs taken from the real runtimes'
recorded cases, with user environments, thread counts, runtimes, ranks and cgroups; the
last tests run the two faces for real on this machine, the reproductions of the issue
among them."""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from affinity.binding.apply import request_of as apply_request
from affinity.binding.launchvars import read_job
from affinity.errors import AffinityError
from affinity.launcher.build import Context, build_launch
from affinity.launcher.options import options_from_args
from affinity.launcher.run import add_run_parser
from affinity.machine.cgroup import CpuQuota
from affinity.machine.topology import Topology
from affinity.planning.decide import Situation, decide
from affinity.record import replace

GOLDEN = Path(__file__).resolve().parent / "golden"
#: what ``affinity run`` adds to perform the decision in a process it starts (PyTorch's hook)
LAUNCHER_MECHANISM = ("PYTHONPATH", "AFFINITY_TORCH_INTEROP_THREADS")


def _hybrid() -> Topology:
    t = Topology.from_synthetic("pack:1 [numa] core:12 pu:2")
    cores = tuple(replace(c, kind="IntelCore" if c.logical_index < 4 else "IntelAtom",
                          efficiency=1 if c.logical_index < 4 else 0) for c in t.cores)
    allowed = frozenset(x for c in cores for x in (c.cpuset if c.efficiency else {min(c.cpuset)}))
    return replace(t, cores=cores, allowed=allowed, source="hybrid 4P+8E")


MACHINES = {
    "xeon 2x28x2": Topology.from_synthetic("pack:2 [numa] core:28 pu:2(indexes=2*56:1*2)"),
    "epyc nps4 2x(4x l3:2 x4)": Topology.from_synthetic("pack:2 group:4 [numa] l3:2 core:4 pu:2"),
    "knl 1x68x4": Topology.from_synthetic("pack:1 [numa] core:68 pu:4(indexes=4*68:1*4)"),
    "hybrid 4P+8E": _hybrid(),
    "xeon 2x28x2, mask of package 1": Topology.from_synthetic(
        "pack:2 [numa] core:28 pu:2(indexes=2*56:1*2)").with_allowed(range(28, 56)),
    "small 1x4": Topology.from_synthetic("pack:1 [numa] core:4 pu:1"),
}


def _corpus(n: int = 24) -> list[str]:
    """``n`` specs the real runtimes were recorded with (well-formed and malformed),
    drawn once with a fixed seed from the golden cases."""
    specs: set[str] = set()
    for f in sorted(GOLDEN.glob("*.json")):
        data = json.loads(f.read_text())
        for case in data.get("cases", []):
            if isinstance(case, dict) and isinstance(case.get("spec"), str) and case["spec"].strip():
                specs.add(case["spec"])
    ordered = sorted(specs)
    return random.Random(36).sample(ordered, min(n, len(ordered))) + ["compact,1,0", "explicit,proclist=[0]"]


#: (user environment, thread count, runtime, rank): what varies around a spec
CONTEXTS = [
    ({}, None, "intel", None),
    ({"OMP_NUM_THREADS": "3"}, None, "intel", None),
    ({"KMP_AFFINITY": "scatter", "KMP_BLOCKTIME": "0"}, 2, "intel", None),
    ({"OMP_PLACES": "cores"}, 5, "gnu", None),
    ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}, None, "intel", "auto"),
    ({}, 2, "llvm", "0/3"),
]


def _run_face(spec: str, environ: dict, threads, runtime: str, rank, topology: Topology, ctx: Context):
    argv = ["run", spec] + ([f"--threads={threads}"] if threads is not None else []) + [f"--runtime={runtime}"]
    argv += [f"--ranks={rank}"] if rank is not None else []
    parser = argparse.ArgumentParser(prog="affinity")
    add_run_parser(parser.add_subparsers(dest="command"))
    opts = options_from_args(parser.parse_args([*argv, "--", "prog"]), environ)
    ln = build_launch(opts, topology, ctx)
    (inst,) = ln.instances
    env = {k: v for k, v in inst.env.items() if k not in LAUNCHER_MECHANISM}
    return (inst.cpus, inst.slots, inst.threads, env, inst.mempolicy, inst.mem_nodes, list(ln.warnings),
            list(ln.notices))


def _apply_face(spec: str, environ: dict, threads, runtime: str, rank, topology: Topology, ctx: Context):
    req = apply_request(spec, threads=threads, runtime=runtime, strict=True, blocktime="default", membind=None,
                        rank=rank, dataloader_workers=None, export=True)
    d = decide(req, Situation(topology=topology, environ=environ, cgroup_cpus=ctx.cgroup_cpus, quota=ctx.quota,
                              mems_allowed=ctx.mems_allowed, job=read_job(environ, topology)))
    (pl,) = d.placements
    mem = pl.memory
    return (pl.cpus, pl.slots, pl.threads, dict(pl.exports), mem.policy if mem else None,
            mem.nodes if mem else frozenset(), list(d.warnings), list(d.notices))


def _outcome(face, *args):
    try:
        return face(*args)
    except AffinityError as e:
        return (type(e).__name__, str(e))


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_both_faces_decide_alike_on_described_machines(name):
    topology = MACHINES[name]
    cases = 0
    for spec in _corpus():
        for environ, threads, runtime, rank in CONTEXTS:
            for ctx in (Context(environ=environ),
                        Context(environ=environ, cgroup_cpus=topology.cpuset,
                                quota=CpuQuota(300000, 100000, "/sys/fs/cgroup/x", 2))):
                args = (spec, environ, threads, runtime, rank, topology, ctx)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # plan()'s own warnings: the faces' are compared
                    ran, applied = _outcome(_run_face, *args), _outcome(_apply_face, *args)
                assert ran == applied, (name, spec, environ, threads, runtime, rank, ctx)
                cases += 1
    assert cases == len(_corpus()) * len(CONTEXTS) * 2


def test_the_corpus_holds_recorded_specs_well_formed_and_malformed():
    specs = _corpus()
    assert len(specs) >= 20
    assert any("proclist" in s for s in specs) and any("granularity" in s for s in specs)


# ---------------------------------------------------------------- for real, on this machine

def _apply_here(code: str, env: dict) -> dict:
    """apply() in a fresh process: its warnings and exports, as JSON."""
    prog = ("import json, os, warnings, affinity\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            f"    b = {code}\n"
            "print(json.dumps({'warnings': [str(x.message) for x in w], 'env': b.env_set, "
            "'slots': [sorted(s) for s in b.plan.cpusets]}))\n")
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _run_here(argv: list[str], env: dict) -> dict:
    r = subprocess.run([sys.executable, "-m", "affinity", "run", "--dry-run", "--json", *argv, "--", "true"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("KMP_", "OMP_", "GOMP_", "TF_NUM_", "AFFINITY_", "SLURM_", "OMPI_", "PMI_"))
           and k not in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")}
    env.update(extra)
    return env


@pytest.mark.parametrize("spec, threads, extra", [
    ("explicit,proclist=[0]", 2, {}),  # oversubscription: apply() warned, run said nothing
    ("compact", None, {"KMP_AFFINITY": "scatter"}),  # a replaced user value: run said it only with -v
    ("compact,1,0", None, {"KMP_BLOCKTIME": "0", "OMP_NUM_THREADS": "2"}),
])
def test_the_faces_say_the_same_for_real(spec, threads, extra):
    env = _clean_env(**extra)
    thr = f", threads={threads}" if threads else ""
    applied = _apply_here(f"affinity.apply({spec!r}{thr}, tensorflow=False, torch=False)", env)
    ran = _run_here([spec] + ([f"--threads={threads}"] if threads else []), env)
    (inst,) = ran["instances"]
    said = [w for w in ran["warnings"]]
    assert [w.removeprefix("affinity: ") for w in applied["warnings"]] == said
    assert {k: v for k, v in inst["env"].items() if k not in LAUNCHER_MECHANISM} == applied["env"]
    assert [sorted(map(int, _expand(s))) for s in inst["slots"]] == applied["slots"]
    if spec.startswith("explicit") and threads == 2:
        assert any("threads=2 on 1 CPU oversubscribes them" in w for w in said)
    if "KMP_AFFINITY" in extra:
        assert any("KMP_AFFINITY=scatter from the environment replaced by" in w for w in said)


def _expand(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out
