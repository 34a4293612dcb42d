"""The ELF reader behind ``affinity run --runtime auto`` (affinity.launcher.elfneeds):
real executables built here, and crafted or truncated files (one line, never a
traceback, never a read beyond its bound)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from affinity.launcher import elfneeds
from affinity.launcher.elfneeds import command_runtime, needed_libraries

SRC = "#include <omp.h>\n#include <stdio.h>\nint main(void){printf(\"%d\\n\", omp_get_max_threads());return 0;}\n"


@pytest.fixture(scope="module")
def omp_prog(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("elf")
    (d / "p.c").write_text(SRC)
    subprocess.run(["gcc", "-O2", "-fopenmp", str(d / "p.c"), "-o", str(d / "omp_prog")], check=True)
    return d / "omp_prog"


def test_an_fopenmp_program_needs_libgomp(omp_prog):
    assert "libgomp.so.1" in needed_libraries(str(omp_prog))
    found = command_runtime(str(omp_prog))
    assert found.runtime == "gnu" and "DT_NEEDED" in found.why


def test_bin_true_links_no_openmp_runtime():
    assert not any("omp" in n for n in needed_libraries("/bin/true"))
    found = command_runtime("/bin/true")
    assert found.runtime is None and "no OpenMP runtime" in found.why


def test_a_shebang_script_is_followed_to_its_interpreter(tmp_path, omp_prog):
    script = tmp_path / "s"
    script.write_text(f"#!{omp_prog}\n")
    assert command_runtime(str(script)).runtime == "gnu"
    py = tmp_path / "py"
    py.write_text("#!/usr/bin/env python3\nimport torch\n")
    found = command_runtime(str(py))
    assert found.runtime is None and "Python interpreter" in found.why
    assert command_runtime(sys.executable).runtime is None


def _elf(needed_off: int = 1, strtab_vaddr: int = 0x200, phnum: int = 2, strsz: int = 16) -> bytes:
    """A minimal little-endian 64-bit ELF: one PT_LOAD over the file at vaddr 0, a
    PT_DYNAMIC with DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_NULL, the strings at 0x200."""
    hdr = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    hdr += struct.pack("<HHIQQQIHHHHHH", 2, 62, 1, 0, 64, 0, 0, 64, 56, phnum, 64, 0, 0)
    dyn_off = 64 + 56 * 2
    load = struct.pack("<IIQQQQQQ", 1, 5, 0, 0, 0, 0x210, 0x210, 0x1000)
    dynamic = struct.pack("<IIQQQQQQ", 2, 6, dyn_off, dyn_off, dyn_off, 64, 64, 8)
    dyn = struct.pack("<qQqQqQqQ", 1, needed_off, 5, strtab_vaddr, 10, strsz, 0, 0)
    body = hdr + load + dynamic + dyn
    return body + bytes(0x200 - len(body)) + b"\0libomp.so.5\0\0\0\0"


def test_a_crafted_elf_is_read(tmp_path):
    f = tmp_path / "ok"
    f.write_bytes(_elf())
    assert needed_libraries(str(f)) == ["libomp.so.5"]
    assert command_runtime(str(f)).runtime == "llvm"


@pytest.mark.parametrize("data,why", [
    (b"hello world\n", "not an ELF file"),
    (b"\x7fELF\x02\x01", "truncated"),
    (_elf()[:100], "truncated"),
    (_elf()[:0x180], "truncated"),
    (_elf(needed_off=500), "outside the string table"),
    (_elf(strtab_vaddr=0x9000), "in no loaded segment"),
    (_elf(phnum=60000), "implausible program header table"),
    (_elf(strsz=1 << 40)[:0x208], "truncated"),
])
def test_malformed_files_give_one_line_not_a_traceback(tmp_path, data, why):
    f = tmp_path / "bad"
    f.write_bytes(data)
    with pytest.raises(ValueError, match=why) as e:
        needed_libraries(str(f))
    assert "\n" not in str(e.value)
    found = command_runtime(str(f))
    assert found.runtime is None and why in found.why


def test_reads_are_bounded(tmp_path, monkeypatch):
    """A huge declared size is never read: each read is at most MAX_READ bytes."""
    sizes = []
    real = elfneeds._read

    def spy(fh, offset, size):
        sizes.append(size)
        return real(fh, offset, size)

    monkeypatch.setattr(elfneeds, "_read", spy)
    f = tmp_path / "big"
    f.write_bytes(_elf(strsz=1 << 40) + bytes(elfneeds.MAX_READ))
    needed_libraries(str(f))
    assert sizes and max(sizes) <= elfneeds.MAX_READ


def test_run_runtime_auto_says_which_and_plans_by_it(omp_prog):
    env = dict(os.environ, AFFINITY_NO_FASTPATH="1")
    words = [sys.executable, "-m", "affinity", "run", "OMP_PLACES=threads OMP_PROC_BIND=spread", "-t", "3",
             "--runtime", "auto", "-v", "--dry-run", "--json", "--"]
    r = subprocess.run(words + [str(omp_prog)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--runtime auto: gnu's rules" in r.stderr and "DT_NEEDED" in r.stderr
    by = {rt: subprocess.run(words[:8] + [rt, "--dry-run", "--json", "--", str(omp_prog)], capture_output=True,
                             text=True, env=env, timeout=120) for rt in ("gnu", "intel")}
    assert by["gnu"].returncode == 0 and by["gnu"].stdout == r.stdout
    assert by["intel"].returncode == 0 and by["intel"].stdout != r.stdout  # spread, 3 on 2: the rules differ
    r = subprocess.run(words + ["/bin/true"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--runtime auto: intel's rules" in r.stderr and "the default" in r.stderr


def test_plan_runtime_auto_says_it_is_this_process():
    r = subprocess.run([sys.executable, "-m", "affinity", "plan", "compact", "-t", "2", "--runtime", "auto"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--runtime auto: intel" in r.stderr and "(intel's rules)" in r.stdout

