"""What the kernel says of any process of this user, from ``/proc/PID``: where its
memory is (``numa_maps``), its environment, command line, owner and children.

The parsers take the files' text, so canned files stand in for other machines in
tests (a 2-node ``numa_maps`` on a 1-node machine); the readers are one ``open``
each and raise ``OSError`` as the kernel says it (``FileNotFoundError`` for a
process that is gone, ``PermissionError`` for another user's ``numa_maps`` or
``environ``).  The threads of a process (``/proc/PID/task``) are read by
:mod:`affinity.binding.threads`, the one reader of them.

What it cannot do: ``numa_maps`` is the kernel's count of the pages mapped now,
per node; pages swapped out or not yet touched are on no node, and a huge page
counts as its size.  Reading it walks the process's page tables: about 1 ms per
GB mapped.
"""

from __future__ import annotations

import os
import re

from ..record import record

__all__ = ["NumaMemory", "children_of", "parse_numa_maps", "process_owner", "read_cmdline", "read_environ",
           "read_numa_maps"]

#: the most bytes read of an ``environ``, ``cmdline`` or ``numa_maps`` file (a process with a
#: million mappings writes ~100 MB of numa_maps: the first 64 MiB are read)
MAX_PROC_READ = 64 << 20
#: a shared object's file name (``libc.so.6``, ``libtorch_cpu.so``): its pages are code
#: and read-only data, shared with every process that maps it, wherever they were first read
_SHARED_OBJECT = re.compile(r"\.so(\.[0-9.]+)?$")


@record
class NumaMemory:
    """A process's mapped pages, in bytes per NUMA node (``numa_maps``), shared
    objects' mappings left out (counted apart in ``libraries``)."""

    by_node: tuple[tuple[int, int], ...]  #: (node, bytes), by node id
    by_policy: tuple[tuple[str, int], ...]  #: (memory policy as numa_maps writes it, bytes): bind:1, default...
    libraries: int = 0  #: bytes of shared objects' mappings, left out of ``by_node``

    @property
    def total(self) -> int:
        return sum(b for _, b in self.by_node)

    def on(self, nodes: frozenset[int] | set[int]) -> int:
        """Bytes on ``nodes``."""
        return sum(b for n, b in self.by_node if n in nodes)

    def to_dict(self) -> dict[str, object]:
        return {"bytes_by_node": {str(n): b for n, b in self.by_node},
                "bytes_by_policy": dict(self.by_policy), "library_bytes": self.libraries}


def parse_numa_maps(text: str) -> NumaMemory:
    """The text of ``/proc/PID/numa_maps``: one line per mapping, ``ADDR POLICY
    [file=PATH|heap|stack|anon=N ...] N0=PAGES N1=PAGES ... kernelpagesize_kB=K``.
    Pages count ``kernelpagesize_kB`` each (4, or 2048 for a huge page).  Lines
    that are not of that form are skipped (the file is read while it changes)."""
    nodes: dict[int, int] = {}
    policies: dict[str, int] = {}
    libraries = 0
    for line in text.splitlines():
        words = line.split()
        if len(words) < 3:
            continue
        pages: dict[int, int] = {}
        page_kb, shared_object = 4, False
        for w in words[2:]:
            key, eq, value = w.partition("=")
            if not eq:
                continue
            if key == "kernelpagesize_kB" and value.isdigit():
                page_kb = int(value)
            elif key == "file":
                shared_object = bool(_SHARED_OBJECT.search(value))
            elif key[:1] == "N" and key[1:].isdigit() and value.isdigit():
                pages[int(key[1:])] = pages.get(int(key[1:]), 0) + int(value)
        size = {n: p * page_kb * 1024 for n, p in pages.items()}
        if shared_object:
            libraries += sum(size.values())
            continue
        for n, b in size.items():
            nodes[n] = nodes.get(n, 0) + b
        if size:
            policies[words[1]] = policies.get(words[1], 0) + sum(size.values())
    return NumaMemory(tuple(sorted(nodes.items())), tuple(sorted(policies.items(), key=lambda kv: -kv[1])),
                      libraries)


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(MAX_PROC_READ)


def read_numa_maps(pid: int) -> NumaMemory:
    """Where process ``pid``'s memory is (:func:`parse_numa_maps` of its file)."""
    return parse_numa_maps(_read(f"/proc/{int(pid)}/numa_maps").decode("ascii", "replace"))


def read_environ(pid: int) -> dict[str, str]:
    """The environment process ``pid`` was started with (``/proc/PID/environ``: what it
    was exec'd with; a change it made later to its own ``os.environ`` is not there)."""
    out: dict[str, str] = {}
    for item in _read(f"/proc/{int(pid)}/environ").split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq and key:
            out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return out


def read_cmdline(pid: int) -> tuple[str, ...]:
    """Process ``pid``'s command line, word by word (empty for a kernel thread)."""
    raw = _read(f"/proc/{int(pid)}/cmdline")
    return tuple(w.decode("utf-8", "replace") for w in raw.rstrip(b"\0").split(b"\0")) if raw else ()


def process_owner(pid: int) -> int:
    """The real user id of process ``pid`` (the owner of its ``/proc`` folder)."""
    return os.stat(f"/proc/{int(pid)}").st_uid


def children_of(pid: int) -> list[int]:
    """The child processes of ``pid``, in increasing order: every thread's
    ``/proc/PID/task/TID/children`` (a child belongs to the thread that forked it),
    or, on a kernel without those files, every process whose parent is ``pid``."""
    base = f"/proc/{int(pid)}/task"
    found: set[int] = set()
    try:
        tids = os.listdir(base)
    except OSError:
        return []
    listed = False
    for tid in tids:
        try:
            words = _read(f"{base}/{tid}/children").split()
        except OSError:
            continue  # a kernel without the file, or a thread that exited
        listed = True
        found.update(int(w) for w in words)
    if not listed:
        found = set(_children_by_scan(int(pid)))
    return sorted(found)


def _children_by_scan(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            raw = _read(f"/proc/{d}/stat")
        except OSError:
            continue
        rest = raw[raw.rfind(b")") + 2:].split()
        if len(rest) > 1 and rest[1].isdigit() and int(rest[1]) == pid:
            out.append(int(d))
    return out
