"""Crafted inputs are one-line AffinityErrors, never tracebacks or hangs (issue 24,
items 8 and 9).

Before: an XML PU with ``os_index="-1"`` or a garbage cpuset was a ``KeyError`` from
``topology._assemble``; cpuinfo ``processor : ²`` a ``ValueError``; ``--topology
/dev/zero`` read forever; ``--log-dir /proc/1`` a traceback; ``--blocktime 'x;rm -rf /'``
was exported; ``plan(threads=1.5)`` a bare ``TypeError``; an unreadable file was "no
such file".
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import affinity
from affinity.binding import threads
from affinity.errors import AffinityError, ArgumentTypeError, SpecError, TopologyError
from affinity.machine import userfiles
from affinity.machine.topology import Topology

GOLDEN_XML = Path(__file__).resolve().parents[1] / "golden" / "hwloc" / "1s4c1t.xml"


def cli(*argv: str, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "affinity", *argv], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode not in (0, -9), r
    assert "Traceback" not in r.stderr, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip() and not line.startswith(("usage:", "(see"))]
    assert len(lines) == 1, r.stderr
    return lines[0]


@pytest.fixture
def xml_pu(tmp_path):
    text = GOLDEN_XML.read_text()

    def make(old: str, new: str) -> str:
        assert old in text
        p = tmp_path / "crafted.xml"
        p.write_text(text.replace(old, new, 1))
        return str(p)

    return make


def test_xml_pu_os_index_minus_one(xml_pu):
    path = xml_pu('type="PU" os_index="1"', 'type="PU" os_index="-1"')
    with pytest.raises(TopologyError, match='a PU with os_index="-1": out of range'):
        Topology.from_xml(path)
    assert 'os_index="-1"' in one_line_error(cli("plan", "compact", "--topology", path))


def test_xml_garbage_cpuset(xml_pu):
    path = xml_pu('cpuset="0x00000002"', 'cpuset="0xzzzz"')
    with pytest.raises(TopologyError, match="no PU|not its own CPU"):
        Topology.from_xml(path)
    one_line_error(cli("plan", "compact", "--topology", path))


@pytest.mark.parametrize("value", ["²", "٣", "1" * 5000])
def test_cpuinfo_processor_not_ascii_digits(tmp_path, value):
    p = tmp_path / "cpuinfo"
    p.write_text(f"processor : {value}\nphysical id : 0\ncore id : 0\n\n")
    with pytest.raises(TopologyError, match="non-negative integer"):
        Topology.from_cpuinfo(p)
    assert "non-negative integer" in one_line_error(cli("plan", "compact", "--topology", str(p)))


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null", "/proc/self"])
def test_not_a_regular_file_refused_without_reading(path):
    with pytest.raises(TopologyError, match="not a regular file"):
        Topology.load(path)
    assert "not a regular file" in one_line_error(cli("plan", "compact", "--topology", path))


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(TopologyError, match="a FIFO"):  # open() would block without O_NONBLOCK
        Topology.load(str(fifo))


def test_a_large_file_is_refused_after_the_bound(tmp_path):
    p = tmp_path / "big"
    p.write_bytes(b"processor : 0\n" * 10)
    with pytest.raises(TopologyError, match="larger than"):
        userfiles.read_file(p, limit=64)
    assert userfiles.read_file(p) == b"processor : 0\n" * 10


def test_eacces_is_said_as_eacces(tmp_path, monkeypatch):
    real = os.open

    def denied(path, *a, **k):
        if str(path).endswith("secret"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(TopologyError, match=r"permission denied \(EACCES\)"):
        Topology.load(str(tmp_path / "secret"))


def test_eacces_for_real_as_another_user(tmp_path):
    """As root here: the file is read by ``nobody`` through setpriv (a folder it
    cannot enter); elsewhere the same message comes from this user's own view."""
    d = Path(tmp_path) / "private"
    d.mkdir(mode=0o700)
    (d / "topo.xml").write_text(GOLDEN_XML.read_text())
    setpriv = shutil.which("setpriv")
    if os.geteuid() == 0 and setpriv:
        tmp_path.chmod(0o755)
        cmd = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
               "import sys; from affinity.machine.topology import Topology\n"
               "try: Topology.load(sys.argv[1])\nexcept Exception as e: print(e)", str(d / "topo.xml")]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd="/")
        assert "permission denied (EACCES)" in r.stdout, (r.stdout, r.stderr)
    d.chmod(0)
    if os.geteuid() != 0:
        with pytest.raises(TopologyError, match=r"permission denied \(EACCES\)"):
            Topology.load(str(d / "topo.xml"))
    d.chmod(stat.S_IRWXU)


@pytest.mark.parametrize("log_dir", ["/proc/1", "/dev/null/x"])
def test_log_dir_that_cannot_be_written(log_dir):
    assert "--log-dir" in one_line_error(cli("run", "--log-dir", log_dir, "--", "true"))


@pytest.mark.parametrize("value", ["x;rm -rf /", "-1", "1.5", "٣", "200s"])
def test_blocktime_validated(value):
    assert "not a KMP_BLOCKTIME" in one_line_error(cli("run", "--blocktime", value, "--", "true"))
    from affinity.planning.envvars import check_blocktime
    with pytest.raises(SpecError):
        check_blocktime(value)
    with pytest.raises(SpecError):  # the API exports it through the same check
        affinity.apply("compact", blocktime=value, tensorflow=False, openmp=False, blas=False)


@pytest.mark.parametrize("value", ["0", "200", "infinite", "Infinity", "5ms", "100us"])
def test_blocktime_accepted(value):
    from affinity.planning.envvars import check_blocktime
    assert check_blocktime(value) == value


def test_api_inputs_are_affinity_errors():
    t = Topology.from_synthetic("pack:1 core:2 pu:1")
    with pytest.raises(ArgumentTypeError) as ei:
        affinity.plan("compact", threads=1.5, topology=t)
    assert isinstance(ei.value, TypeError) and isinstance(ei.value, AffinityError)
    with pytest.raises(SpecError):
        affinity.apply("compact", membind="bind:-1", tensorflow=False, openmp=False, blas=False)
    for call in (lambda: threads.set_affinity({10**6}), lambda: threads.set_affinity({0}, tid=2**40),
                 lambda: threads.set_process_affinity({1.5}), lambda: threads.set_affinity({True})):
        with pytest.raises(AffinityError):
            call()


def _fake_cgroup(tmp_path: Path, files: dict[str, str]) -> str:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text("0::/job\n")
    (tmp_path / "proc/self/mountinfo").write_text(
        "30 23 0:27 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n")
    d = tmp_path / "sys/fs/cgroup/job"
    d.mkdir(parents=True)
    (tmp_path / "sys/fs/cgroup/cgroup.controllers").write_text("cpuset cpu memory\n")
    for name, text in files.items():
        (d / name).write_text(text)
    return str(tmp_path)


@pytest.mark.parametrize("files", [{"cpu.max": "² 100000\n"}, {"cpu.max": "50000 x\n"},
                                   {"cpu.max": "9" * 5000 + " 100000\n"}])
def test_crafted_cgroup_quota(tmp_path, files):
    from affinity.machine import cgroup
    with pytest.raises(TopologyError, match="cpu.max: not a number"):
        cgroup.cpu_quota(root=_fake_cgroup(tmp_path, files))


@pytest.mark.parametrize("text", ["0-99999999\n", "٣\n"])
def test_crafted_cgroup_cpuset(tmp_path, text):
    from affinity.machine import cgroup
    with pytest.raises(TopologyError, match="cpuset.cpus"):
        cgroup.cpuset_cpus(root=_fake_cgroup(tmp_path, {"cpuset.cpus.effective": text}))


@pytest.mark.parametrize("mask", ["0x" + "f" * 100000, "0x1" + "0" * 2048])
def test_a_huge_hex_mask_is_refused(mask):
    err = one_line_error(cli("run", "--pin-threads", "--pin-skip", mask, "--dry-run", "--", "true"))
    assert "at most 8192 bits" in err
