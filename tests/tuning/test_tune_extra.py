"""optuna is the ``tune`` extra: without it, ``affinity.tune()`` and ``affinity tune``
say so in one line naming the extra; everything else works."""

from __future__ import annotations

import subprocess
import sys

HIDE = "import sys; sys.modules['optuna'] = None; "  # import optuna now fails, as if not installed


def _py(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HIDE + code], capture_output=True, text=True, timeout=120)


def test_tune_without_optuna_is_one_line_naming_the_extra():
    r = _py("import affinity\n"
            "try:\n"
            "    affinity.tune(lambda c: 1.0, {'threads': [1]}, budget=1)\n"
            "except affinity.errors.TuneUnavailableError as e:\n"
            "    assert isinstance(e, (ImportError, affinity.AffinityError))\n"
            "    print(e)\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n") == 1 and "pip install 'kmp-affinity[tune]'" in r.stdout


def test_the_command_without_optuna_exits_1_with_one_line():
    r = _py("from affinity.tools.cli import main; sys.exit(main(['tune', '--budget', '1', '--', 'true']))")
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("affinity tune: error: the tuner needs optuna") and "kmp-affinity[tune]" in r.stderr


def test_the_rest_of_affinity_does_not_need_optuna():
    r = _py("import affinity; p = affinity.plan('compact', threads=2, "
            "topology=affinity.Topology.from_synthetic('package:1 core:2 pu:1')); print(p.threads)")
    assert r.returncode == 0 and r.stdout.strip() == "2", r.stderr
