"""``affinity run``'s start-up: a launch remembered from an earlier run with the
same inputs (:mod:`affinity.launcher.fastpath`) does exactly what the full path
does, and any change of an input sends the launch back to the full path.

Whether a run took the remembered launch is read from ``python -X importtime``:
the full path imports the planner, a remembered launch does not.  Nothing here
measures time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from affinity.launcher import fastpath
from affinity.planning.gpus import GPU_ENVIRONMENT

PROBE = ("import json, os; print(json.dumps({'mask': sorted(os.sched_getaffinity(0)), "
         "'env': {k: v for k, v in os.environ.items() if k.startswith(('OMP_', 'KMP_', 'GOMP_', 'TF_', "
         "'AFFINITY_', 'LD_PRELOAD'))}}, sort_keys=True))")


def _run(tmp_path: Path, *words: str, **env: str) -> tuple[dict, bool]:
    """Run ``affinity run WORDS -- python -c PROBE``; (what the probe saw, whether
    the launch was the remembered one)."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "GOMP_", "AFFINITY_"))}
    e.update(XDG_CACHE_HOME=str(tmp_path / "cache"), **env)
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "affinity", "run", *words, "--",
                        sys.executable, "-c", PROBE], capture_output=True, text=True, env=e, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout), "affinity.planning.planner" not in p.stderr


def _cache_files(tmp_path: Path) -> list[Path]:
    d = tmp_path / "cache" / "affinity"
    return sorted(d.iterdir()) if d.is_dir() else []


@pytest.mark.parametrize("words", [(), ("-t", "1", "granularity=fine,scatter")], ids=["default", "spec"])
def test_a_remembered_launch_is_the_full_paths(tmp_path: Path, words: tuple[str, ...]) -> None:
    first, hit1 = _run(tmp_path, *words)
    second, hit2 = _run(tmp_path, *words)
    assert (hit1, hit2) == (False, True)
    for seen in (first, second):  # the pinning library marks the process it runs in with its pid
        seen["env"].pop("AFFINITY_PIN_OWNER", None)
    assert second == first
    assert first["env"]["KMP_AFFINITY"] and first["env"]["OMP_NUM_THREADS"]


def test_a_changed_input_takes_the_full_path(tmp_path: Path) -> None:
    base, _ = _run(tmp_path)
    _, hit = _run(tmp_path)
    assert hit
    # another environment: planned again, with its own answer
    one, hit = _run(tmp_path, OMP_NUM_THREADS="1")
    assert not hit and one["env"]["OMP_NUM_THREADS"] == "1"
    # another process mask (the launcher started under taskset)
    cpu = str(min(os.sched_getaffinity(0)))
    e = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    p = subprocess.run(["taskset", "-c", cpu, sys.executable, "-X", "importtime", "-m", "affinity", "run", "--",
                        sys.executable, "-c", PROBE], capture_output=True, text=True, env=e, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "affinity.planning.planner" in p.stderr and json.loads(p.stdout)["mask"] == [int(cpu)]
    # and the first inputs still find their launch
    again, hit = _run(tmp_path)
    assert hit and again == base


def test_a_variable_no_launch_reads_may_change_every_run(tmp_path: Path) -> None:
    """hyperfine varies one variable per run, Slurm and MPI set per-job ones: the
    launch is still the remembered one, and the command still sees them."""
    base, hit = _run(tmp_path, HYPERFINE_RANDOMIZED_ENVIRONMENT_OFFSET="1", SLURM_JOB_ID="11")
    assert not hit
    for i in range(2, 4):
        seen, hit = _run(tmp_path, HYPERFINE_RANDOMIZED_ENVIRONMENT_OFFSET=str(i), SLURM_JOB_ID=str(i * 11))
        assert hit and seen == base


def test_every_variable_the_launch_names_is_in_the_key() -> None:
    """The key's variables (fastpath.READ_PREFIXES / READ_NAMES) cover every
    environment variable the launcher, the planner, the machine layer and the CLI
    read by name (``environ.get("X")``, ``environ["X"]``, ``"X" in environ``,
    ``getenv("X")``); the rank module's launcher variables are in the key by name
    (``tests/launcher/test_launch_ranks.py`` checks them)."""
    import re

    root = Path(fastpath.__file__).parent.parent
    files = [*root.glob("launcher/*.py"), *root.glob("machine/*.py"), *root.glob("planning/**/*.py"),
             root / "tools" / "cli.py", root / "__main__.py", root / "cpulist.py"]
    reads = (r'environ\w*\s*(?:\.get\(|\[)\s*"([A-Z][A-Z0-9_]+)"',
             r'"([A-Z][A-Z0-9_]+)"\s+(?:not\s+)?in\s+[\w.]*environ',
             r'getenv\(\s*"([A-Z][A-Z0-9_]+)"')
    names = {(f.name, m) for f in files if f.name != "ranks.py" for pattern in reads
             for m in re.findall(pattern, f.read_text())}
    assert ("fastpath.py", "AFFINITY_LAUNCH_CACHE") in names  # the patterns find what they should
    uncovered = {(f, n) for f, n in names if not n.startswith(fastpath.READ_PREFIXES)
                 and n not in fastpath.READ_NAMES}
    # the width of --help's text: a launch that prints help exits, it is never remembered;
    # the GPU decision (planning/gpus.py, issue #37) is not called by affinity run yet: its
    # variables (GPU_ENVIRONMENT lists them all) join the key when it is
    gpu = {("gpus.py", n) for n in GPU_ENVIRONMENT}
    assert uncovered - gpu == {("cli.py", "COLUMNS")}


def test_what_is_not_remembered(tmp_path: Path) -> None:
    for words in (("-v",), ("--instances", "2"), ("--localalloc",), ("--pin-threads",),
                  ("--ranks", "0/1")):
        e = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
        p = subprocess.run([sys.executable, "-m", "affinity", "run", *words, "--", "true"], capture_output=True,
                           text=True, env=e, timeout=120)
        assert p.returncode == 0 or "memory policy" in p.stderr, p.stderr
    assert _cache_files(tmp_path) == []
    _run(tmp_path, AFFINITY_LAUNCH_CACHE="0")
    assert _cache_files(tmp_path) == []


def test_a_cache_others_may_write_is_ignored(tmp_path: Path) -> None:
    _run(tmp_path)
    (f,) = _cache_files(tmp_path)
    f.chmod(0o666)
    _, hit = _run(tmp_path)
    assert not hit
    assert f.stat().st_mode & 0o777 == 0o600  # rewritten, private again
    assert _run(tmp_path)[1]


class _Exec(Exception):
    pass


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An empty launch file, execve captured, the process mask put back."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("AFFINITY_LAUNCH_CACHE", raising=False)
    limit = tmp_path / "cpu.max"
    limit.write_text("max 100000\n")
    monkeypatch.setattr(fastpath, "_limit_files", lambda: (str(limit),))
    calls: list[tuple] = []

    def execve(exe: str, argv: list[str], env: dict[str, str]) -> None:
        calls.append((exe, argv, env, frozenset(os.sched_getaffinity(0))))
        raise _Exec

    monkeypatch.setattr(os, "execve", execve)
    mask = os.sched_getaffinity(0)
    yield limit, calls
    os.sched_setaffinity(0, mask)


def test_every_limit_file_is_read_again(cache) -> None:
    limit, calls = cache
    words = ["--", "true"]
    key = fastpath.exec_remembered(words)
    assert key is not None and calls == []  # nothing remembered yet
    cpu = min(os.sched_getaffinity(0))
    fastpath.remember(key, frozenset({cpu}), {"OMP_NUM_THREADS": "1"}, ("true",))
    mask_now = os.sched_getaffinity(0)
    with pytest.raises(_Exec):
        fastpath.exec_remembered(words)
    os.sched_setaffinity(0, mask_now)  # a real execve would not have come back
    exe, argv, env, mask = calls[-1]
    assert (os.path.basename(exe), argv, env["OMP_NUM_THREADS"], mask) == ("true", ["true"], "1", {cpu})
    limit.write_text("200000 100000\n")  # a CFS quota appeared: plan again
    before = os.sched_getaffinity(0)
    assert fastpath.exec_remembered(words) == key and len(calls) == 1
    assert os.sched_getaffinity(0) == before
    limit.unlink()
    assert fastpath.exec_remembered(words) == key and len(calls) == 1


def test_a_missing_command_takes_the_full_path(cache) -> None:
    _, calls = cache
    key = fastpath.exec_remembered(["--", "no-such-command-here"])
    fastpath.remember(key, frozenset(os.sched_getaffinity(0)), {}, ("no-such-command-here",))
    assert fastpath.exec_remembered(["--", "no-such-command-here"]) == key and calls == []


def test_the_fast_path_imports_only_builtins() -> None:
    code = ("import sys, affinity, affinity.launcher; before = set(sys.modules); import affinity.launcher.fastpath; "
            "print(sorted(m for m in set(sys.modules) - before if m != 'affinity.launcher.fastpath'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # userfiles: the one safe way to open the cache (os, stat, errno only; ~2% of a start-up, measured)
    assert set(eval(out)) <= {"marshal", "affinity.machine", "affinity.machine.userfiles"}


#: standard modules ``affinity run`` must start without, and why they were dropped:
#: dataclasses/inspect/ast (records: affinity.record), typing (annotations only),
#: shutil and its zlib/bz2/lzma (argparse's help width), json (only JSON output),
#: math (a dlopen for one ceiling)
_NOT_ON_THE_LAUNCH_PATH = ("dataclasses", "inspect", "ast", "typing", "shutil", "lzma", "bz2", "json", "math")


@pytest.mark.parametrize("words", [(), ("--membind", "0"), ("--instances", "2")], ids=["one", "membind", "instances2"])
def test_the_uncached_launch_imports_none_of_the_heavy_modules(words: tuple[str, ...]) -> None:
    """What each uncached launch imports, read from ``python -X importtime``."""
    env = dict(os.environ, AFFINITY_LAUNCH_CACHE="0")
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "affinity", "run", "--membind-optional", *words,
                        "--", "true"], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    imported = {line.rsplit("|", 1)[1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")}
    assert "affinity.planning.planner" in imported  # the launch was planned, not remembered
    allowed = {"math"} if "--instances" in words else set()  # subprocess (selectors) imports it: instances start so
    assert sorted(m for m in _NOT_ON_THE_LAUNCH_PATH if m in imported and m not in allowed) == []
