"""``norespect`` on a machine described from inside a cgroup cpuset (issue 42, point 13).

``lstopo`` run inside a cpuset (without ``--whole-system``) writes only the allowed PUs;
its root's ``complete_cpuset`` still counts every CPU of the machine.  libiomp5 with
``norespect`` binds to every CPU the machine has configured (``__kmp_xproc``) while
reading the topology and aborts on the first the kernel refuses (``OMP: Error #179``);
the planner planned ``[0], [1]`` without a word (14 cases of a held-back real-machine set).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import affinity
from affinity.errors import PlanError
from affinity.machine.topology import Topology

GOLDEN_XML = Path(__file__).resolve().parents[1] / "golden" / "hwloc" / "1s4c1t.xml"
SPEC = "norespect,granularity=fine,compact"


def _inside_a_cpuset(tmp_path: Path, complete: str = "0x0000000f") -> Path:
    """1s4c1t as lstopo writes it inside a cpuset of CPUs 0-1: PUs 2-3 and their cores left
    out, the root's complete_cpuset still the machine's."""
    lines, out, skip = GOLDEN_XML.read_text().splitlines(), [], False
    for line in lines:
        if 'type="Core" os_index="2"' in line or 'type="Core" os_index="3"' in line:
            skip = True
        if skip:
            skip = line.strip() != "</object>"
            continue
        out.append(line)
    text = "\n".join(out) + "\n"
    root = 'cpuset="0x0000000f" complete_cpuset="0x0000000f" allowed_cpuset="0x0000000f"'
    assert root in text
    text = text.replace(root, f'cpuset="0x00000003" complete_cpuset="{complete}" allowed_cpuset="0x00000003"')
    for kind in ("Package", "NUMANode"):
        text = text.replace(f'type="{kind}" os_index="0" cpuset="0x0000000f"', f'type="{kind}" os_index="0" cpuset="0x00000003"')
    path = tmp_path / "inside.xml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("runtime", ["intel", "llvm"])
def test_refused_where_the_runtime_aborts(tmp_path, runtime):
    t = Topology.from_xml(_inside_a_cpuset(tmp_path))
    assert sorted(t.cpuset) == [0, 1] and t.offline_cpus == 2
    with pytest.raises(PlanError, match="Error #179"):
        affinity.plan(SPEC, topology=t, initial_mask={0, 1}, runtime=runtime)
    with pytest.raises(PlanError, match="2 more than the 2 PUs described"):
        affinity.plan_env({"KMP_AFFINITY": SPEC}, topology=t, runtime=runtime)
    # respecting the mask is what the runtime does there: planned
    assert [sorted(s) for s in affinity.plan("granularity=fine,compact", topology=t, runtime=runtime).cpusets] == \
        [[0], [1]]


def test_the_whole_machine_described_plans(tmp_path):
    """The same PUs with a complete_cpuset that is only them: nothing is left out, norespect plans."""
    t = Topology.from_xml(_inside_a_cpuset(tmp_path, complete="0x00000003"))
    assert [sorted(s) for s in affinity.plan(SPEC, topology=t).cpusets] == [[0], [1]]


def test_affinity_plan_says_it_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "affinity", "plan", SPEC, "--topology", str(_inside_a_cpuset(tmp_path))],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "Error #179" in r.stderr, r.stderr
