"""What a study of ``affinity tune -- CMD`` is keyed by: everything that can change the
answer -- the command's words, the content of the files it names, the environment it
runs in, the metric, whether the work splits, the machine (the search adds the
machine and the space) -- and, for a resume or a new study, what is the same and
what changed.

The environment is kept as one hash per variable (values are never stored: they
may be secrets); variables of the login session (``SSH_*``, ``XDG_*``, ``TERM``,
``PWD`` ...) are left out, they do not change what a command computes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from importlib.machinery import PathFinder
from typing import Any

from ..record import record

__all__ = ["SHARE_VAR", "StudyKey", "command_files", "command_sources", "reads_instance_share", "unkeyed_modules"]

_SESSION_PREFIXES = ("SSH_", "XDG_", "DBUS_", "GPG_", "KRB5", "VTE_", "WSL", "PYTEST_", "SUDO_", "SYSTEMD_",
                     "HIST", "TMUX", "TERM", "LESS", "MOTD_", "COLORTERM")
_SESSION_NAMES = frozenset({"DISPLAY", "WINDOWID", "SHLVL", "PWD", "OLDPWD", "_", "LS_COLORS", "PS1", "PS2",
                            "PROMPT_COMMAND", "COLUMNS", "LINES", "MAIL", "SESSION_MANAGER", "STY", "LOGNAME",
                            "EDITOR", "VISUAL", "PAGER", "INVOCATION_ID", "JOURNAL_STREAM"})
_MAX_FILE = 64 << 20  # larger files are keyed by size and modification time
#: what a command reads to take its share of the work (a share needs the count)
SHARE_VAR = "AFFINITY_NUM_INSTANCES"
_PYTHON = re.compile(r"python[0-9.]*$")


def _session_variable(name: str) -> bool:
    return name in _SESSION_NAMES or name.startswith(_SESSION_PREFIXES)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def command_files(command: Sequence[str]) -> list[str]:
    """The words of ``command`` that name regular files (the program, its scripts, inputs),
    and the files of the modules it runs with ``python -m``."""
    out = []
    for w in command:
        if "=" in w and not os.path.exists(w):
            w = w.split("=", 1)[1]
        if w and os.path.isfile(w) and w not in out:
            out.append(w)
    return out + [f for f in map(_module_file, command_modules(command)) if f and f not in out]


def command_modules(command: Sequence[str]) -> list[str]:
    """The modules ``command`` runs with ``python -m NAME`` (``-mNAME``)."""
    out = []
    for i, w in enumerate(command):
        j = i + 1
        while _PYTHON.match(os.path.basename(w)) and j < len(command) and command[j].startswith("-"):
            if command[j].startswith("-m"):
                out.append(command[j][2:] or (command[j + 1] if j + 1 < len(command) else ""))
                break
            j += 2 if command[j] in ("-W", "-X") else 1
    return [m for m in out if m]


def unkeyed_modules(command: Sequence[str]) -> list[str]:
    """The modules of ``command``'s ``python -m`` whose file is not found (not keyed)."""
    return [m for m in command_modules(command) if _module_file(m) is None]


def _module_file(name: str) -> str | None:
    """The file ``python -m name`` runs from the current folder (a package's
    ``__main__.py``), found as Python would without running any of it; else None."""
    path: list[str] | None = [os.getcwd(), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)),
                              *sys.path]
    parts = name.split(".")
    spec = None
    for i in range(len(parts)):
        spec = PathFinder.find_spec(".".join(parts[:i + 1]), path) if path is not None else None
        if spec is None:
            return None
        path = spec.submodule_search_locations
    if path is not None:  # a package: its __main__
        spec = PathFinder.find_spec(f"{name}.__main__", path)
    origin = spec.origin if spec is not None else None
    return origin if origin and os.path.isfile(origin) else None


def _file_key(path: str) -> str:
    st = os.stat(path)
    if st.st_size > _MAX_FILE:
        return f"size {st.st_size} mtime {st.st_mtime_ns}"
    with open(path, "rb") as fh:
        return _digest(fh.read())


def command_sources(command: Sequence[str]) -> list[str]:
    """The text of each file :func:`command_files` names (up to 64 MiB each, unreadable
    ones left out), and the code of ``python -c CODE``: what
    :func:`affinity.tuning.forms.frameworks_in` reads to tell the framework."""
    texts = []
    for i, w in enumerate(command[:-1]):
        if _PYTHON.match(os.path.basename(w)) and command[i + 1] == "-c" and i + 2 < len(command):
            texts.append(command[i + 2])
    for path in command_files(command):
        try:
            if os.path.getsize(path) > _MAX_FILE:
                continue
            with open(path, "rb") as fh:
                texts.append(fh.read().decode(errors="replace"))
        except OSError:
            continue
    return texts


def reads_instance_share(command: Sequence[str]) -> str | None:
    """The first file of ``command`` that mentions :data:`SHARE_VAR` (it takes its share
    of the work; ``AFFINITY_INSTANCE`` alone may number copies), else None."""
    for path in command_files(command):
        try:
            if os.path.getsize(path) > _MAX_FILE:
                continue
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        if SHARE_VAR.encode() in data:
            return path
    return None


@record
class StudyKey:
    """What can change ``affinity tune``'s answer for one command on one machine.

    Parameters
    ----------
    command : tuple of str
        The command's words.
    files : tuple of (str, str)
        Each file it names, with its content's hash.
    env : tuple of (str, str)
        Each variable of the environment (session variables left out), with its
        value's hash.
    measure : str
        The metric (``--metric``, ``--time`` or the default), and copies or split.
    """

    command: tuple[str, ...]
    files: tuple[tuple[str, str], ...]
    env: tuple[tuple[str, str], ...]
    measure: str

    @classmethod
    def of(cls, command: Sequence[str], environ: Mapping[str, str], measure: str) -> StudyKey:
        files = tuple((os.path.abspath(p), _file_key(p)) for p in command_files(command))
        env = tuple(sorted((k, _digest(v.encode(errors="surrogateescape"))) for k, v in environ.items()
                           if not _session_variable(k)))
        return cls(tuple(command), files, env, measure)

    def text(self) -> str:
        """The key as text (what the study's name is made from)."""
        return json.dumps({"command": self.command, "files": self.files, "env": self.env,
                           "measure": self.measure}, sort_keys=True)

    def to_attr(self) -> dict[str, Any]:
        """The key as a study attribute (hashes only)."""
        return {"command": list(self.command), "files": dict(self.files), "env": dict(self.env),
                "measure": self.measure}

    def changes(self, stored: Mapping[str, Any]) -> list[str]:
        """What differs from a stored key: the command, files, variables, the measure."""
        out = []
        if stored.get("command") != list(self.command):
            out.append(f"command was {' '.join(stored.get('command') or [])!r}")
        files, before = dict(self.files), dict(stored.get("files") or {})
        out += [f"{os.path.basename(p)} changed" for p in files if p in before and before[p] != files[p]]
        out += [f"{os.path.basename(p)} is new" for p in files if p not in before]
        env, was = dict(self.env), dict(stored.get("env") or {})
        changed = sorted(k for k in env.keys() & was.keys() if env[k] != was[k])
        added, gone = sorted(env.keys() - was.keys()), sorted(was.keys() - env.keys())
        if changed:
            out.append("variables changed: " + ", ".join(changed[:6]) + (" ..." if len(changed) > 6 else ""))
        if added:
            out.append("variables set now: " + ", ".join(added[:6]) + (" ..." if len(added) > 6 else ""))
        if gone:
            out.append("variables no longer set: " + ", ".join(gone[:6]) + (" ..." if len(gone) > 6 else ""))
        if stored.get("measure") != self.measure:
            out.append(f"measured as {stored.get('measure')}, now {self.measure}")
        return out
