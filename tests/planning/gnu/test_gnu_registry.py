"""runtime="gnu" / "gnu-torch" through the planner's registry and the command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from affinity import plan, plan_env
from affinity.errors import PlanError, SpecError
from affinity.planning.gnu import plan_gomp
from affinity.planning.planner import RUNTIMES
from affinity.tools.cli import main
from gnu_golden import GOLDEN, topology

XML = str(GOLDEN / "hwloc" / "2s4c2t_linux.xml")


def test_registered_once_per_build():
    assert RUNTIMES["gnu"].build == "gcc12" and RUNTIMES["gnu-torch"].build == "torch"
    assert "intel" in RUNTIMES


@pytest.mark.parametrize("runtime,build", [("gnu", "gcc12"), ("gnu-torch", "torch")])
def test_plan_and_plan_env_follow_libgomp(runtime, build):
    t = topology("2s4c2t_linux")
    env = {"OMP_PLACES": "cores", "OMP_PROC_BIND": "spread", "OMP_NUM_THREADS": "5"}
    p = plan_env(env, topology=t, runtime=runtime)
    g = plan_gomp(env, t, build=build)
    assert p.runtime == runtime and p.cpusets == g.cpusets and p.places == g.places
    assert list(p.place_nums) == [0, 2, 4, 6, 7] and p.proc_bind == "spread"
    q = plan("OMP_PLACES=cores OMP_PROC_BIND=spread", threads=5, topology=t, runtime=runtime)
    assert q.cpusets == p.cpusets
    assert "initial thread bound at load to {0,8}" in p.explain()
    assert p.to_dict()["runtime"] == runtime


def test_intel_settings_mean_nothing_to_libgomp():
    t = topology("2s4c2t_linux")
    p = plan("granularity=fine,compact", threads=2, topology=t, runtime="gnu")
    assert p.places is None and set(p.cpusets) == {t.cpuset} and p.affinity_type == "disabled"


def test_strict_and_refusals():
    t = topology("2s4c2t_linux")
    with pytest.raises(SpecError, match="OMP_PROC_BIND='primary'"):
        plan("OMP_PROC_BIND=primary", threads=2, topology=t, runtime="gnu-torch")
    lenient = plan("OMP_PROC_BIND=primary", threads=2, topology=t, runtime="gnu-torch", strict=False)
    assert lenient.warnings == ("Invalid value for environment variable OMP_PROC_BIND",)
    with pytest.raises(PlanError, match="never returns"):
        plan_env({"GOMP_CPU_AFFINITY": "0-3 junk"}, topology=t, runtime="gnu-torch")
    with pytest.raises(PlanError, match="unknown runtime 'gcc'"):
        plan_env({}, topology=t, runtime="gcc")


def test_cli_plan_runtime_gnu_json(capsys):
    assert main(["plan", "OMP_PLACES={0},{1},{2},{3} OMP_PROC_BIND=close", "-t", "10", "--topology", XML,
                 "--runtime", "gnu", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["runtime"] == "gnu" and d["place_nums"] == [0, 0, 1, 1, 2, 2, 3, 3, 0, 1]


def test_cli_compare_side_by_side():
    r = subprocess.run([sys.executable, "-m", "affinity", "plan", "--env", "GOMP_CPU_AFFINITY=1 0", "-t", "4",
                        "--topology", XML, "--runtime", "gnu", "--compare", "intel"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()[1:6]]
    assert rows[0] == ["thread", "gnu", "intel"]
    assert rows[1:] == [["0", "{1}", "{1}"], ["1", "{1}", "{0}", "differs"], ["2", "{0}", "{1}", "differs"],
                        ["3", "{0}", "{0}"]]
    assert r.stdout.splitlines()[6] == "different placement"


def test_cli_compare_with_a_refusing_runtime():
    r = subprocess.run([sys.executable, "-m", "affinity", "plan", "--env", "GOMP_CPU_AFFINITY=x", "-t", "2",
                        "--topology", XML, "--lenient", "--compare", "gnu-torch"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "gnu-torch refuses: GOMP_CPU_AFFINITY='x'" in r.stdout


def test_which_rules_a_loaded_libgomp_follows():
    from affinity.planning.gnu.rules import runtime_for_library

    assert runtime_for_library("/venv/lib/python3.11/site-packages/torch/lib/libgomp.so.1") == "gnu-torch"
    assert runtime_for_library("/venv/site-packages/torch.libs/libgomp-a34b3233.so.1") == "gnu-torch"
    assert runtime_for_library("/usr/lib/x86_64-linux-gnu/libgomp.so.1") == "gnu"
