"""The PyTorch hook ``affinity run`` puts in the Python processes it starts
(``affinity/launcher/torchboot``), without PyTorch: where it cannot load (``python
-E``/``-I``/``-S``, such a ``#!`` line) ``affinity run`` says so, checked against a real
interpreter; it keeps an empty ``PYTHONPATH`` entry (the working directory) and lets an
error in the user's own ``sitecustomize`` be reported as plain Python reports it
(issue 42, points 3 and 5)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from affinity.launcher.torch_env import BOOT_DIR, hook_unreachable, python_argv, torch_environment

PROBE = "import sys; m = sys.modules.get('sitecustomize'); print('torchboot' in (getattr(m, '__file__', '') or ''))"
ENV = {"AFFINITY_TORCH_INTEROP_THREADS": "1", "OMP_PLACES": "{0}", "OMP_PROC_BIND": "close"}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMP_", "KMP_", "GOMP_", "AFFINITY_", "PYTHON"))}
    env["AFFINITY_LAUNCH_CACHE"] = "0"
    env.update(extra)
    return env


def _run(cmd: list[str], cwd: str | None = None, **extra: str) -> subprocess.CompletedProcess:
    # (the launcher itself under -E: the PYTHONPATH given is the command's alone)
    return subprocess.run([sys.executable, "-E", "-m", "affinity", "run", "--", *cmd], capture_output=True,
                          text=True, env=_env(**extra), cwd=cwd, timeout=120)


@pytest.mark.parametrize("options", [["-E"], ["-I"], ["-S"], ["-sE"], ["-X", "dev", "-E"], ["-Wignore", "-I"],
                                     ["-u"], ["-s"], ["-W", "-E"]])
def test_said_exactly_when_the_hook_does_not_load(options):
    """A real interpreter decides: the warning is given iff the hook did not load
    (``-W -E``: ``-E`` is the warning filter's value; ``-s``, ``-u``: the hook loads)."""
    r = _run([sys.executable, *options, "-c", PROBE])
    assert r.returncode == 0, r.stderr
    loaded = r.stdout.strip() == "True"
    said = [line for line in r.stderr.splitlines() if "hook cannot load" in line]
    assert bool(said) is (not loaded), (options, r.stdout, r.stderr)
    assert len(said) <= 1 and all(line.startswith("affinity run: warning: ") for line in said)


@pytest.mark.parametrize("line,loads", [("#!{py} -Es", False), ("#!{py} -s", True), ("#!{py}", True)])
def test_a_script_s_hash_bang_line(tmp_path, line, loads):
    """``#!/usr/bin/python3 -Es`` scripts (Debian's system scripts): the options are on the
    script's first line, which affinity run reads (the first 256 bytes, as Linux does)."""
    script = tmp_path / "prog"
    script.write_text(line.format(py=sys.executable) + "\n" + PROBE + "\n")
    script.chmod(0o755)
    r = _run([str(script)])
    assert r.returncode == 0, r.stderr
    assert (r.stdout.strip() == "True") is loads
    assert ("hook cannot load" in r.stderr) is (not loads)


def test_the_rule_without_a_process():
    assert python_argv(["./x"], b"#!/usr/bin/env -S python3 -I\n") == ["python3", "-I", "./x"]
    assert python_argv(["./x"], b"#!/usr/bin/env python3\n") == ["python3", "./x"]
    assert python_argv(["ls", "-E"], None) is None and python_argv([], None) is None
    assert hook_unreachable(["python3", "-c", "pass", "-E"], None, ENV) is None  # -E: the program's argument
    assert hook_unreachable(["python3", "-m", "mod", "-I"], None, ENV) is None
    assert "without -E" in hook_unreachable(["python3", "-E", "x.py"], None, ENV)
    # libgomp binds nothing at load (--pin-threads exports OMP_PROC_BIND=false): nothing to say
    assert hook_unreachable(["python3", "-E"], None, {**ENV, "OMP_PROC_BIND": "false"}) is None
    assert hook_unreachable(["python3", "-E"], None, {k: v for k, v in ENV.items() if k != "OMP_PLACES"
                                                      and k != "OMP_PROC_BIND"}) is None


def test_an_empty_pythonpath_entry_is_kept(tmp_path):
    """``PYTHONPATH=:/x``: Python reads the empty entry as the working directory; the hook's
    PYTHONPATH dropped it, and imports from the working directory failed."""
    (tmp_path / "here_only.py").write_text("VALUE = 42\n")
    r = _run([sys.executable, "-c", "import here_only; print(here_only.VALUE)"], cwd=str(tmp_path),
             PYTHONPATH=os.pathsep + "/nonexistent")
    assert r.returncode == 0 and r.stdout.strip() == "42", r.stderr
    env = torch_environment(type("P", (), {"inter_op_threads": 1})(), {"PYTHONPATH": f":/a:{BOOT_DIR}:"})
    assert env["PYTHONPATH"] == os.pathsep.join([BOOT_DIR, "", "/a", ""])


def test_an_import_error_in_the_users_sitecustomize_is_reported_as_python_does(tmp_path):
    """Plain Python prints "Error in sitecustomize" for an ImportError raised inside the
    user's sitecustomize; the hook swallowed it (it took it for "there is none")."""
    (tmp_path / "sitecustomize.py").write_text("import no_such_module_anywhere\n")
    plain = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True, text=True,
                           env=_env(PYTHONPATH=str(tmp_path)), timeout=60)
    r = _run([sys.executable, "-c", "print('ran')"], PYTHONPATH=str(tmp_path))
    said = [line for line in plain.stderr.splitlines() if line]
    assert said[0].startswith("Error in sitecustomize") and "no_such_module_anywhere" in said[1]
    assert r.returncode == plain.returncode == 0 and r.stdout == plain.stdout == "ran\n"
    assert [line for line in r.stderr.splitlines() if line] == said
