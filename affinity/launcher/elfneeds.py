"""Which OpenMP runtime a command will load, read from its executable without running it.

``affinity run --runtime auto`` plans with the rules of the command's runtime when
its file says: the ``DT_NEEDED`` entries of an ELF executable's dynamic section
(the libraries it links directly), read here in pure Python with bounded reads
(at most :data:`MAX_READ` bytes per read, :data:`MAX_ENTRIES` program headers or
dynamic entries).  A script's ``#!`` line is followed to its interpreter (once,
``/usr/bin/env NAME`` through ``PATH``).  A Python interpreter loads its runtime
only when the program imports one (torch, numpy's MKL...), so it is *unknown*, as
is a static executable, a file that is not ELF, or one truncated or malformed:
never an exception, one line saying why.
"""

from __future__ import annotations

import os
import shutil
import struct

from ..machine.loaded import family_of
from ..record import record

__all__ = ["CommandRuntime", "MAX_ENTRIES", "MAX_READ", "command_runtime", "needed_libraries"]

MAX_READ = 1 << 16  #: bytes at most in one read of the file
MAX_ENTRIES = 4096  #: program headers / dynamic entries read at most
_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_STRSZ = 0, 1, 5, 10


@record
class CommandRuntime:
    """What ``--runtime auto`` found for a command."""

    runtime: str | None  #: the planner's rule-set name, or None when it cannot be told
    why: str  #: one line: which file said so, or why it cannot be told


def _read(fh: object, offset: int, size: int) -> bytes:
    if offset < 0 or size < 0 or size > MAX_READ:
        raise ValueError(f"a read of {size} bytes at offset {offset} is out of bounds")
    fh.seek(offset)  # type: ignore[attr-defined]
    data = fh.read(size)  # type: ignore[attr-defined]
    if len(data) != size:
        raise ValueError(f"truncated: {size} bytes wanted at offset {offset}, {len(data)} there")
    return data


def _header(fh: object) -> tuple[str, bool, int, int, int]:
    """(byte order, 64-bit, phoff, phentsize, phnum) of the ELF header."""
    fh.seek(0)  # type: ignore[attr-defined]
    if fh.read(4) != b"\x7fELF":  # type: ignore[attr-defined]
        raise ValueError("not an ELF file")
    ident = _read(fh, 0, 16)
    if ident[4] not in (1, 2) or ident[5] not in (1, 2):
        raise ValueError(f"unknown ELF class {ident[4]} or byte order {ident[5]}")
    is64, end = ident[4] == 2, "<" if ident[5] == 1 else ">"
    if is64:
        phoff, = struct.unpack(end + "Q", _read(fh, 32, 8))
        phentsize, phnum = struct.unpack(end + "HH", _read(fh, 54, 4))
    else:
        phoff, = struct.unpack(end + "I", _read(fh, 28, 4))
        phentsize, phnum = struct.unpack(end + "HH", _read(fh, 42, 4))
    if phnum > MAX_ENTRIES or phentsize < (56 if is64 else 32):
        raise ValueError(f"implausible program header table ({phnum} entries of {phentsize} bytes)")
    return end, is64, phoff, phentsize, phnum


def _segments(fh: object) -> tuple[str, bool, list[tuple[int, int, int, int, int]]]:
    """(byte order, 64-bit, [(type, offset, vaddr, filesz, memsz)])."""
    end, is64, phoff, phentsize, phnum = _header(fh)
    table = _read(fh, phoff, phentsize * phnum)
    segs = []
    for i in range(phnum):
        raw = table[i * phentsize:(i + 1) * phentsize]
        if is64:
            typ, _f, off, vaddr, _p, filesz, memsz = struct.unpack(end + "IIQQQQQ", raw[:48])
        else:
            typ, off, vaddr, _p, filesz, memsz = struct.unpack(end + "IIIIII", raw[:24])
        segs.append((typ, off, vaddr, filesz, memsz))
    return end, is64, segs


def _file_offset(segs: list[tuple[int, int, int, int, int]], vaddr: int) -> int:
    for typ, off, va, filesz, _m in segs:
        if typ == _PT_LOAD and va <= vaddr < va + filesz:
            return off + (vaddr - va)
    raise ValueError(f"the string table's address {vaddr:#x} is in no loaded segment")


def _needed(fh: object) -> list[str]:
    end, is64, segs = _segments(fh)
    dyn = [s for s in segs if s[0] == _PT_DYNAMIC]
    if not dyn:
        return []  # static: links nothing
    size = 16 if is64 else 8
    count = min(dyn[0][3] // size, MAX_ENTRIES)
    data = _read(fh, dyn[0][1], count * size)
    fmt = end + ("qQ" if is64 else "iI")
    tags: dict[int, int] = {}
    needed: list[int] = []
    for i in range(count):
        tag, val = struct.unpack(fmt, data[i * size:(i + 1) * size])
        if tag == _DT_NULL:
            break
        if tag == _DT_NEEDED:
            needed.append(val)
        else:
            tags.setdefault(tag, val)
    if not needed:
        return []
    if _DT_STRTAB not in tags:
        raise ValueError("DT_NEEDED entries but no DT_STRTAB")
    strsz = min(tags.get(_DT_STRSZ, MAX_READ), MAX_READ)
    strtab = _read(fh, _file_offset(segs, tags[_DT_STRTAB]), strsz)
    out = []
    for off in needed:
        if off >= len(strtab) or b"\0" not in strtab[off:]:
            raise ValueError(f"DT_NEEDED name at {off} outside the string table ({len(strtab)} bytes)")
        out.append(strtab[off:strtab.index(b"\0", off)].decode("utf-8", "replace"))
    return out


def needed_libraries(path: str) -> list[str]:
    """The ``DT_NEEDED`` names of ELF file ``path`` (``[]`` for a static one).

    Raises ``ValueError`` with one line for a file that is not ELF or is
    malformed, ``OSError`` for one that cannot be read."""
    with open(path, "rb") as fh:
        try:
            return _needed(fh)
        except (ValueError, struct.error) as e:  # not ELF, malformed, truncated: one line
            raise ValueError(f"{path}: {e}") from None


def _shebang(path: str) -> str | None:
    """The interpreter a ``#!`` script names (``env NAME`` looked up in PATH), or None."""
    with open(path, "rb") as fh:
        first = fh.read(256)
    if not first.startswith(b"#!"):
        return None
    words = first[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if not words:
        return None
    if os.path.basename(words[0]) == "env":
        rest = [w for w in words[1:] if not w.startswith("-")]
        return shutil.which(rest[0]) if rest else None
    return words[0]


def _rules_of_needed(names: list[str]) -> list[str]:
    rules = []
    for n in names:
        found = family_of("/" + n)
        if found is not None and found[1] not in rules:
            rules.append(found[1])  # "gnu", "intel", "llvm": a bare libgomp.so.1 is the system's
    return rules


def command_runtime(command: str) -> CommandRuntime:
    """The rules of the OpenMP runtime ``command`` links directly, or ``runtime=None`` with why not."""
    path = command if os.sep in command else shutil.which(command)
    if path is None:
        return CommandRuntime(None, f"{command}: not found in PATH")
    try:
        interp = _shebang(path)
        if interp is not None:
            path = interp
        if os.path.basename(path).startswith("python"):
            return CommandRuntime(None, f"{path} is a Python interpreter: its runtime is whatever the program "
                                        f"imports")
        rules = _rules_of_needed(needed_libraries(path))
    except (OSError, ValueError) as e:
        return CommandRuntime(None, f"cannot read {path}: {e}")
    if not rules:
        return CommandRuntime(None, f"{path} links no OpenMP runtime directly")
    if len(rules) > 1:
        return CommandRuntime(None, f"{path} links several OpenMP runtimes ({', '.join(rules)})")
    return CommandRuntime(rules[0], f"{path} links the {rules[0]} OpenMP runtime (DT_NEEDED)")
