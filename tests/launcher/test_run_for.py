"""``affinity run --for vllm|sglang|llama.cpp``: the decision (one server process, or
one process per llama.cpp instance), what each is told in the engine's own words,
read back by the engine's parsing rules on described machines (2x28x2 Xeon, EPYC
NPS4 and its CCXs, SNC2, KNL, hybrid P/E); the same words as ``affinity plan
--for`` (a differential test over machines x engines x options, through both
command lines); what cannot be said refused, naming it; and real runs of a fake
engine that binds its threads by the words as vLLM, SGLang and llama.cpp do, every
thread's mask read back from the kernel.

The readers are ``tests/helpers/engine_readers.py`` (the sources' lines named in
``tests/planning/test_engine_words.py``)."""

from __future__ import annotations

import argparse
import itertools
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from affinity.cpulist import format_list, parse_list
from affinity.launcher.build import Context, build_launch
from affinity.launcher.numactl import shell_text
from affinity.launcher.options import RunOptions, options_from_args
from affinity.launcher.run import add_run_parser
from affinity.machine.topology import Topology
from affinity.planning.decide import Request, Situation, decide
from affinity.planning.engines.serve import plan_serving
from affinity.planning.serving import Serving
from affinity.tools.cli import main
from helpers.engine_readers import hybrid, llama_threads, sglang_reads, vllm_reads
from helpers.launch import affinity_run, clean_env

XEON = "pack:2 [numa] core:28 pu:2(indexes=2*56:1*2)"  # siblings i and i+56
EPYC_NPS4 = "pack:2 group:4 [numa] l3:2 core:4 pu:2(indexes=2*64:1*2)"  # 8 nodes of 2 CCX of 4 cores
SNC2 = "pack:2 group:2 [numa] core:6 pu:2(indexes=2*24:1*2)"
KNL = "pack:1 [numa] core:68 pu:4(indexes=4*68:1*4)"
FAKE = str(Path(__file__).resolve().parents[1] / "helpers" / "fake_engine.py")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "engines.md"
#: what a plan's launch exports and an engine's must not: it binds its own threads
PLAN_VARIABLES = ("OMP_", "KMP_", "GOMP_", "TF_NUM_", "PYTHONPATH", "AFFINITY_TORCH")


def parse(*argv: str, environ=None) -> RunOptions:
    parser = argparse.ArgumentParser(prog="affinity")
    add_run_parser(parser.add_subparsers(dest="command"))
    return options_from_args(parser.parse_args(["run", *argv]), {} if environ is None else environ)


def launch(topology: Topology, *argv: str, environ=None, command=("server",)):
    return build_launch(parse(*argv, "--", *command), topology, Context(environ or {}))


def engine_part(argv: tuple[str, ...], command: tuple[str, ...]) -> tuple[str, ...]:
    assert argv[:len(command)] == command
    return argv[len(command):]


# ------------------------------------------------------------ the decision

@pytest.mark.parametrize("engine", ["vllm", "sglang", "llama.cpp"])
def test_the_decision_holds_the_layout_and_the_words_of_plan_serving(engine):
    t = Topology.from_synthetic(EPYC_NPS4)
    serving = Serving(engine=engine, count=4, reserve=1)
    d = decide(Request(serving=serving), Situation(topology=t))
    sp = plan_serving(t, serving)  # what affinity plan --for shows
    assert d.serving.words == sp.words and d.serving.layout.lines() == sp.layout.lines()
    assert [pl.exports.get(k) for pl in d.placements for k in sp.words.environ] == list(sp.words.environ.values())
    assert [pl.flags for pl in d.placements] == (list(sp.words.argv) if engine == "llama.cpp" else [()])


# ------------------------------------------------------------ vLLM and SGLang: one server process

def test_vllm_tp2_xeon_one_server_process_masked_to_the_engine_and_kept_cpus():
    t = Topology.from_synthetic(XEON)
    la = launch(t, "--for", "vllm", "--tp", "2", "--reserve", "2")
    (inst,) = la.instances  # one process: vLLM starts its rank workers itself
    layout = la.serving.layout
    assert inst.env == {"VLLM_CPU_OMP_THREADS_BIND": "0-25|28-53"}  # no OpenMP variable, no PyTorch hook
    assert inst.cpus == frozenset(range(0, 56)) | {82, 83, 110, 111}  # engine cores + kept cores (both PUs)
    assert inst.cpus == frozenset().union(*(s.cpus for s in layout.shares)) | layout.reserved
    assert inst.mempolicy is None and inst.argv == ("server",)  # memory: vLLM binds each rank's itself
    offset = 0
    for r, share in enumerate(layout.shares):
        threads = vllm_reads(inst.env, r)  # cpu_worker.py: entry r; utils.cpp: thread i on the i-th CPU
        assert set(threads) == share.cpus and not set(threads) & layout.reserved
        assert list(inst.slots[offset:offset + len(threads)]) == [frozenset({c}) for c in threads]
        assert {t.pu(c).numa for c in threads} == {r}  # memory on the node of its lowest CPU: its own
        offset += len(threads)
    assert offset == inst.threads == 52
    assert any(n.startswith("memory: the server process's own policy is left as it is; vLLM binds each rank's "
                            "strictly to the node of the rank's lowest CPU: rank 0 on node 0; rank 1 on node 1")
               for n in la.notices)
    assert shell_text(la) == "taskset -c 0-55,82-83,110-111 env 'VLLM_CPU_OMP_THREADS_BIND=0-25|28-53' server"


def test_sglang_snc2_reserve_per_node_and_an_explicit_membind():
    t = Topology.from_synthetic(SNC2)
    la = launch(t, "--for", "sglang", "--reserve", "1", "--reserve-per", "node", "-m", "0,1")
    (inst,) = la.instances
    value = inst.env["SGLANG_CPU_OMP_THREADS_BIND"]
    assert len(value.split("|")) == 4  # one rank per SNC domain
    kept = la.serving.layout.node_reserved
    assert len(kept) == 8  # the last core of each of the 4 nodes, both PUs
    for r, node in enumerate(t.numa_nodes):
        threads = sglang_reads(inst.env, r)
        assert set(threads) <= node.cpuset and not set(threads) & kept and len(threads) == 5
    assert kept <= inst.cpus
    assert (inst.mempolicy, inst.mem_nodes, inst.mem_required) == ("bind", frozenset({0, 1}), True)  # as asked
    assert any(n.startswith("memory: the server process's policy as asked (--membind 0-1); SGLang binds each "
                            "rank's strictly") for n in la.notices)


def test_a_value_of_the_users_is_replaced_and_said():
    t = Topology.from_synthetic(XEON)
    la = launch(t, "--for", "vllm", environ={"VLLM_CPU_OMP_THREADS_BIND": "auto"})
    assert la.instances[0].env["VLLM_CPU_OMP_THREADS_BIND"] == "0-27|28-55"
    assert "VLLM_CPU_OMP_THREADS_BIND=auto from the environment replaced by VLLM_CPU_OMP_THREADS_BIND=0-27|28-55" \
        in la.warnings


# ------------------------------------------------------------ llama.cpp: one process per instance

@pytest.mark.parametrize("by, count", [("numa", 8), ("llc", 16)])
def test_llamacpp_epyc_nps4_one_instance_per_node_or_ccx(by, count):
    t = Topology.from_synthetic(EPYC_NPS4)
    command = ("llama-server", "-m", "model.gguf")
    la = launch(t, "--for", "llama.cpp", "--by", by, "--reserve", "1", command=command)
    assert len(la.instances) == count and la.spawn
    seen: set[int] = set()
    for inst, share in zip(la.instances, la.serving.layout.shares):
        flags = engine_part(inst.argv, command)
        threads = llama_threads(flags)  # arg.cpp + ggml_thread_cpumask_next: thread j on the j-th CPU
        assert [frozenset({c}) for c in threads] == list(inst.slots)
        assert set(threads) == share.cpus and not set(threads) & share.reserved
        assert inst.cpus == share.cpus | share.reserved  # the instance's kept core is in its mask
        node = {t.pu(c).numa for c in inst.cpus}
        assert len(node) == 1 and inst.mempolicy == "bind" and inst.mem_nodes == frozenset(
            t.numa_nodes[n].os_index for n in node)  # llama.cpp binds none: the launcher does
        if by == "llc":
            assert sum(1 for llc in t.llcs if inst.cpus <= llc.cpuset) == 1  # one CCX each
        assert not seen & inst.cpus
        seen |= inst.cpus
        assert inst.env == {"AFFINITY_INSTANCE": str(inst.index), "AFFINITY_NUM_INSTANCES": str(count)}
    assert any("bound by affinity run, as llama.cpp binds none" in n for n in la.notices)


def test_llamacpp_on_knl_as_ranges_and_the_commands_own_flags():
    t = Topology.from_synthetic(KNL)
    la = launch(t, "--for", "llama.cpp", "--form", "range", command=("llama-cli", "-t", "4", "--numa", "isolate"))
    (inst,) = la.instances
    assert engine_part(inst.argv, ("llama-cli", "-t", "4", "--numa", "isolate"))[:6] == (
        "--threads", "68", "--cpu-range", "0-67", "--cpu-strict", "1")
    assert any("the command's -t 4 is replaced by the layout's" in w for w in la.warnings)
    assert any("the command's --numa isolate re-pins every thread" in w for w in la.warnings)
    assert main(["run", "--for", "llama.cpp", "--topology", f"synthetic:{KNL}", "--dry-run", "--",
                 "llama-server", "--cpu-mask", "0xff"]) == 2  # llama.cpp would OR it into the instance's mask


# ------------------------------------------------------------ hybrid P/E

@pytest.mark.parametrize("engine", ["vllm", "llama.cpp"])
def test_hybrid_engine_threads_on_p_cores_first_kept_cores_from_e_cores(engine, tmp_path, capsys):
    path = tmp_path / "hybrid.json"
    path.write_text(hybrid(8, 16).to_json())  # 8 P-cores, 16 E-cores (every PU allowed once read back)
    t = Topology.load(str(path))
    assert main(["run", "--for", engine, "--reserve", "4", "--topology", str(path), "--dry-run", "--json",
                 "--", "server"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (inst,) = doc["instances"]
    threads = [c for s in inst["slots"] for c in parse_list(s)]
    assert {min(c.cpuset) for c in t.cores if c.efficiency == 1} <= set(threads)  # every P-core runs one
    kept = parse_list(doc["serving"]["layout"]["reserved"])
    kept_cores = {t.core_of(c).logical_index for c in kept}
    assert len(kept_cores) == 4 and all(t.cores[i].efficiency == 0 for i in kept_cores)  # taken from E-cores
    assert len(threads) == 20 and not set(threads) & kept and set(threads) | kept <= parse_list(inst["cpus"])
    assert any(n.startswith("hybrid machine: engine threads on the fastest cores first") for n in doc["notices"])


# ------------------------------------------------------------ the same words as affinity plan --for

MACHINES = {"xeon": f"synthetic:{XEON}", "epyc-nps4": f"synthetic:{EPYC_NPS4}", "snc2": f"synthetic:{SNC2}",
            "knl": f"synthetic:{KNL}", "small": "synthetic:pack:1 [numa] core:4 pu:1", "hybrid": None}
OPTIONS = [(), ("--tp", "2"), ("--tp", "3"), ("--reserve", "1"), ("--reserve", "2", "--reserve-per", "node"),
           ("--by", "llc"), ("--smt",), ("--smt", "--tp", "2")]


def _outcome(capsys, argv: list[str]) -> tuple[int, object]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else [line for line in err.splitlines() if "error: " in line][-1])


def test_plan_for_and_run_for_dry_run_say_the_same_words(capsys, tmp_path):
    hyb = tmp_path / "hybrid.json"
    hyb.write_text(hybrid(4, 8).to_json())
    compared = refused = 0
    for (name, src), engine, options in itertools.product(MACHINES.items(), ("vllm", "sglang", "llama.cpp"),
                                                           OPTIONS + [("--form", "range"), ("--form", "range",
                                                                                            "--smt")]):
        if "--form" in options and engine != "llama.cpp":
            continue
        words = ["--for", engine, *options, "--topology", src or str(hyb)]
        rc_plan, plan = _outcome(capsys, ["plan", *words, "--json"])
        rc_run, run = _outcome(capsys, ["run", *words, "--dry-run", "--json", "--", "server", "-x"])
        assert rc_plan == rc_run, (name, engine, options, plan, run)
        if rc_plan != 0:  # refused alike, naming the same thing
            assert plan.split("error: ", 1)[-1] == run.split("error: ", 1)[-1], (name, engine, options)
            refused += 1
            continue
        assert run["serving"] == {k: v for k, v in plan.items() if k != "engine_default"}
        words_env, argv = plan["words"]["env"], plan["words"]["argv"]
        if engine == "llama.cpp":
            assert [i["argv"] for i in run["instances"]] == [["server", "-x", *a] for a in argv]
        else:
            (inst,) = run["instances"]
            assert {k: v for k, v in inst["env"].items() if k in words_env} == words_env
            assert not [k for k in inst["env"] if k.startswith(PLAN_VARIABLES)]
        compared += 1
    assert compared >= 100 and refused >= 3  # both sides of the comparison were exercised


# ------------------------------------------------------------ docs/engines.md, run

def _console_blocks() -> list[tuple[str, list[str]]]:
    out = []
    for block in re.findall(r"```console\n(.*?)```", DOCS.read_text(), re.S):
        first, *lines = block.splitlines()
        assert first.startswith("$ affinity "), first
        out.append((first[2:], lines))
    return out


@pytest.mark.parametrize("command, output", _console_blocks(), ids=lambda x: x.split(" -- ")[0][:40]
                         if isinstance(x, str) else None)
def test_the_pages_commands_print_what_the_page_shows(command, output, capsys):
    """Every ``affinity`` command of docs/engines.md, as written: what it says on stderr
    (said first), then what it prints."""
    assert main(shlex.split(command)[1:]) == 0
    out, err = capsys.readouterr()
    assert (err + out).splitlines() == output


def test_the_page_has_a_recipe_per_engine_for_run():
    commands = [c for c, _ in _console_blocks() if c.startswith("affinity run --for")]
    assert {shlex.split(c)[3] for c in commands} == {"vllm", "sglang", "llama.cpp"}


# ------------------------------------------------------------ refused, naming it

@pytest.mark.parametrize("extra, named", [
    (("granularity=fine",), "SPEC"), (("-t", "4"), "--threads"), (("--instances", "2"), "--instances"),
    (("--pin-threads",), "--pin-threads"), (("--dataloader-workers", "2"), "--dataloader-workers"),
    (("--ranks", "0/2"), "--ranks")])
def test_what_does_not_go_with_for_is_a_usage_error_naming_it(extra, named, capsys):
    spec, rest = (list(extra), []) if extra[0] == "granularity=fine" else ([], list(extra))
    assert main(["run", *spec, "--for", "vllm", *rest, "--topology", f"synthetic:{XEON}", "--dry-run", "--",
                 "x"]) == 2
    err = capsys.readouterr().err
    assert "--for vllm: the engine binds its own threads" in err and named in err


def test_what_the_engine_cannot_say_is_refused_naming_it(capsys):
    # llama.cpp's -Cr takes one range: both PUs of each core are two runs on the Xeon
    assert main(["run", "--for", "llama.cpp", "--smt", "--form", "range", "--topology", f"synthetic:{XEON}",
                 "--dry-run", "--", "x"]) == 1
    assert "-Cr/--cpu-range takes one lo-hi range" in capsys.readouterr().err
    assert main(["run", "--for", "sglang", "--reserve", "6", "--topology", f"synthetic:{SNC2}", "--dry-run",
                 "--", "x"]) == 1
    assert "cannot be kept for the server" in capsys.readouterr().err
    for words, said in ((["--tp", "2"], "--tp goes with --for ENGINE"),
                        (["--for", "vllm", "--form", "range"], "--form range is llama.cpp's")):
        with pytest.raises(SystemExit) as e:
            main(["run", *words, "--dry-run", "--", "x"])
        assert e.value.code == 2 and said in capsys.readouterr().err


def test_run_options_words_round_trip_with_for():
    opts = parse("--for", "llama.cpp", "--tp", "3", "--reserve", "2", "--reserve-per", "node", "--by", "llc",
                 "--smt", "--form", "range", "--", "llama-server")
    assert opts.serving == Serving(engine="llama.cpp", count=3, reserve=2, reserve_per="node", by="llc", smt=True,
                                   form="range")
    assert parse(*opts.to_words()) == opts


# ------------------------------------------------------------ real runs: a fake engine binds by the words

def _cores() -> int:
    t = Topology.from_system()
    return sum(1 for c in t.cores if c.cpuset & t.allowed)


def _expected(*argv: str):
    """The launch ``affinity run`` decides here for these options (this machine, this process's limits)."""
    return build_launch(parse(*argv, "--", "cmd"), Topology.from_system(), Context.of_this_process())


def _fake(out: Path, *argv: str):
    """``affinity run ARGV`` of the fake engine, and what each of its processes reported."""
    r = affinity_run(*argv, env=clean_env(FAKE_ENGINE_OUT=str(out)))
    assert r.returncode == 0, f"rc={r.returncode}\nstdout={r.stdout}\nstderr={r.stderr}"
    return r, [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]


def _bound_as_asked(threads: list[dict]) -> list[int]:
    """Every thread's mask as the kernel reports it is the one CPU it asked for."""
    for t in threads:
        assert parse_list(t["kernel"]) == {t["asked"]}, t
    return [t["asked"] for t in threads]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("options", [("--tp", "2"), ("--reserve", "1")], ids=["tp2", "reserve1"])
def test_a_fake_vllm_binds_each_ranks_threads_from_the_variable(engine, options, tmp_path):
    if _cores() < 2:
        pytest.skip("needs two cores allowed to this process (a rank each, or one kept for the server)")
    expected = _expected("--for", engine, *options)
    (inst,) = expected.instances
    world = len(expected.serving.layout.shares)
    _, lines = _fake(tmp_path, "--for", engine, *options, "--", sys.executable, FAKE, engine, str(world))
    (server,) = [x for x in lines if "server" in x]
    assert set(server["mask"]) == inst.cpus  # the server process: engine CPUs and kept ones
    assert server["policy"] == "default"  # its memory left to the engine
    ranks = sorted((x for x in lines if "rank" in x), key=lambda x: x["rank"])
    assert [x["rank"] for x in ranks] == list(range(world))
    got = [c for x in ranks for c in _bound_as_asked(x["threads"])]
    assert [frozenset({c}) for c in got] == list(inst.slots)  # rank after rank, thread i on the i-th CPU
    assert not set(got) & expected.serving.layout.reserved  # the kept CPUs run no engine thread


@pytest.mark.parametrize("options", [("--tp", "2"), ("--reserve", "1", "--form", "range")], ids=["tp2", "reserve1"])
def test_a_fake_llamacpp_binds_its_threads_from_the_flags_memory_on_its_node(options, tmp_path):
    if _cores() < 2:
        pytest.skip("needs two cores allowed to this process (an instance each, or one kept for the server)")
    expected = _expected("--for", "llama.cpp", *options)
    r, lines = _fake(tmp_path, "--for", "llama.cpp", *options, "--", sys.executable, FAKE, "llama.cpp")
    assert len(lines) == len(expected.instances)
    by_index = {int(x["instance"] or 0): x for x in lines}
    for inst in expected.instances:
        x = by_index[inst.index]
        assert set(x["mask"]) == inst.cpus
        assert [frozenset({c}) for c in _bound_as_asked(x["threads"])] == list(inst.slots)
        assert x["policy"] in (f"bind:{format_list(inst.mem_nodes)}", "default")
        if x["policy"] == "default":  # a container that refuses set_mempolicy: said, not silent
            assert "memory policy bind" in r.stderr


def test_the_launch_the_real_runs_are_compared_with_is_what_dry_run_shows():
    r = affinity_run("--for", "llama.cpp", "--tp", "1", "--dry-run", "--json", "--", "cmd", env=clean_env())
    (inst,) = json.loads(r.stdout)["instances"]
    (expected,) = _expected("--for", "llama.cpp", "--tp", "1").instances
    assert parse_list(inst["cpus"]) == expected.cpus and inst["argv"] == list(expected.argv)
    assert [parse_list(s) for s in inst["slots"]] == list(expected.slots)
