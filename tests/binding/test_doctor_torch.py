"""``affinity doctor`` on PyTorch's collapse, reproduced with the real torch in a child:
its libgomp binds the thread that imports it to its first place when ``OMP_PROC_BIND``
is set (pytorch#99625, ray#34201), and Intel's libiomp5 -- preloaded, as MKL's --
binds it at the first parallel region under ``KMP_AFFINITY``; the thread and the
child process started afterwards inherit the one CPU."""

from __future__ import annotations

import os

import pytest

from helpers.doctorjob import allowed_cpus, clean_env, job
from helpers.ompprog import iomp5_dir

from affinity import doctor
from affinity.planning.doctor.values import cpus_text

pytestmark = pytest.mark.torch

INTERVAL = 0.3


def _iomp() -> str:
    return str(iomp5_dir() / "libiomp5.so")


@pytest.mark.parametrize("setting, runtime", [("OMP_PROC_BIND=true", "libgomp"), ("KMP_AFFINITY=compact", "libiomp5")])
def test_torch_import_collapses_the_main_thread_and_what_it_starts_inherits_it(setting, runtime):
    name, value = setting.split("=")
    env = clean_env(**{name: value}, **({"LD_PRELOAD": _iomp()} if runtime == "libiomp5" else {}))
    with job(env=env, import_torch=True, idle=1, children=1) as j:
        found = doctor(j["pid"], interval=INTERVAL)
    collapse = [f for f in found.findings if f.kind == "collapsed-mask"]
    assert len(collapse) == 1, found.text()
    f = collapse[0]
    facts = dict(f.facts)
    assert f.severity == "error" and f.pids == (j["pid"], *j["children"])
    allowed, main = allowed_cpus(), facts["main_cpus"]
    assert facts["allowed"] == allowed and main < allowed and min(allowed) in main  # the first place
    assert set(j["idle"]) <= set(facts["inherited_tids"]) and facts["inherited_pids"] == tuple(j["children"])
    assert f.summary.startswith(f"pid {j['pid']}'s main thread was narrowed to {cpus_text(main)} of the "
                                f"{len(allowed)} CPUs it may use, and ")
    cause = f.evidence[0]
    assert cause.startswith(f"{setting} in its environment and {runtime} (")
    if runtime == "libgomp":
        assert "bundled by torch" in cause
        assert cause.endswith(f"binds the thread that loads it (import) to its first place, {cpus_text(main)}")
    else:
        assert cause.endswith(f"binds its primary thread to its first place at the first parallel region, "
                              f"{cpus_text(main)}")
        assert "two-openmp-runtimes" in found.kinds()  # torch's libgomp beside the preloaded libiomp5
        assert f"remove {_iomp()} from LD_PRELOAD" in next(g.fix for g in found.findings
                                                            if g.kind == "two-openmp-runtimes")
    assert f.fix.startswith("affinity run -- ") and f.fix.endswith(f"or unset {name}")


def test_kmp_affinity_does_not_bind_pytorchs_libgomp():
    """KMP_AFFINITY is Intel's: PyTorch's own libgomp ignores it, nothing collapses."""
    with job(env=clean_env(KMP_AFFINITY="compact"), import_torch=True, idle=1, children=1) as j:
        found = doctor(j["pid"], interval=INTERVAL)
    assert found.findings == (), found.text()
    assert [p.main.cpus for p in found.snapshot.processes] == [frozenset(os.sched_getaffinity(0))] * 2
