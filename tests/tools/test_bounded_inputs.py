"""Counts and indexes the user gives are bounded before the work that grows with them
(issue 42, point 4): each case runs the real command under a memory limit
(``RLIMIT_AS``, 1 GiB) and a CPU limit (``RLIMIT_CPU``, 20 s) and must answer with a
one-line error -- before the bounds it was a ``MemoryError`` traceback, a segfault in
hwloc, or minutes of work (measured without limits: 62 s and 16.7 GB, 14 s and
1.9 GB, 7.7 s and 4.7 GB, 1 GB of RSS before the refusal)."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

GOLDEN_XML = Path(__file__).resolve().parents[1] / "golden" / "hwloc" / "1s4c1t.xml"
SYNTH = "synthetic:pack:1 core:6 pu:2"
MEMORY = 1 << 30  # the command needs about 150 MB of address space


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))
    resource.setrlimit(resource.RLIMIT_CPU, (20, 20))


def bounded(*argv: str, code: str | None = None) -> str:
    """Run ``affinity ARGV`` (or ``python -c CODE``) under the limits; its one line of error."""
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "affinity", *argv]
    r = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=_limits, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr[-2000:]
    return lines[0]


@pytest.mark.parametrize("spec,what,value", [("compact,2147483648", "permute", -2147483648),
                                             ("scatter,4294967295", "permute", -1),
                                             ("compact,0,2147483648", "offset", -2147483648)])
def test_llvm_wrapped_permute_and_offset(spec, what, value):
    """libomp reads 2147483648 as a negative C int: the planner's sort key was 2**31 long."""
    line = bounded("plan", spec, "--runtime", "llvm", "--topology", SYNTH)
    assert f"reads the {what} as a C int that wraps around to {value}" in line


@pytest.mark.parametrize("count", ["10000000", "99999999999999999999"])
def test_dataloader_workers(count):
    assert f"{count} DataLoader workers: at most 32768" in bounded("plan", "compact", "--dataloader-workers",
                                                                   count, "--topology", SYNTH)


def test_dataloader_workers_in_process():
    code = ("import affinity\n"
            "try:\n    affinity.apply('compact', dataloader_workers=10**7, tensorflow=False)\n"
            "except affinity.AffinityError as e:\n"
            "    import sys; print(e, file=sys.stderr); assert not affinity.binding.registry.active(); sys.exit(1)")
    assert "10000000 DataLoader workers: at most 32768" in bounded(code=code)


@pytest.mark.parametrize("indexes,shown", [(" 4294967295,0", "4294967295"), (" -1,0", "-1"),
                                           ("  99999999999999,0", "99999999999999")])
def test_synthetic_indexes_after_a_blank(indexes, shown):
    """hwloc takes an empty ``indexes=`` value for an explicit list and reads it with
    strtoul, which skips the blank: the index was past the check (a segfault in hwloc
    under the limit)."""
    line = bounded("plan", "compact", "--topology", f"synthetic:pu:2(indexes={indexes})")
    assert f"index {shown} in indexes= is out of range" in line


@pytest.mark.parametrize("kind,old,value", [("PU", 'type="PU" os_index="3"', "4294967294"),
                                            ("NUMANode", 'type="NUMANode" os_index="0"', "4294967294"),
                                            ("PU", 'type="PU" os_index="3"', " +99999999999999999999"),
                                            ("NUMANode", 'type="NUMANode" os_index="0"', "1024")])
def test_xml_os_index_checked_before_hwloc(tmp_path, kind, old, value):
    """hwloc sets bit os_index of a bitmap: 4294967294 made it allocate half a gigabyte
    per bitmap before the PU was refused (and a NUMA node's was accepted)."""
    text = GOLDEN_XML.read_text()
    assert old in text
    path = tmp_path / "crafted.xml"
    path.write_text(text.replace(old, old.split(" os_index=")[0] + f' os_index="{value}"', 1))
    line = bounded("plan", "compact", "--topology", str(path))
    assert f'a {kind} with os_index="{value}": out of range' in line and "crafted.xml:" in line
