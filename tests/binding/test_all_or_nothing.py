"""apply() is all or nothing: whichever step fails, the masks, the memory policy
and the environment it already changed are back as they were, and the error is
the step's own."""

from __future__ import annotations

import os

import pytest

import affinity
from affinity.binding import apply as apply_mod
from affinity.binding import numa
from affinity import record
from helpers.threads import Parked, all_masks, in_thread

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a process mask of at least 2 CPUs")

SPEC = "explicit,proclist=[1,0]"


class Boom(RuntimeError):
    pass


def _failing(step_name, real=None):
    """A replacement for one step of apply() that first does what the real step
    does (when there is one) or pins a thread, then fails."""

    def step(b, *a, **k):
        if real is not None:
            real(b, *a, **k)
        else:
            b._pin({os.getpid(): frozenset({1})})
        raise Boom(step_name)

    return step


@pytest.mark.parametrize("step", ["_attach_tensorflow", "_pin_openmp", "_limit_blas", "_set_env"])
def test_a_failing_step_undoes_everything(monkeypatch, step):
    real = {"_set_env": apply_mod._set_env}.get(step)
    monkeypatch.setattr(apply_mod, step, _failing(step, real))

    def go():
        env0, masks0, mem0 = dict(os.environ), all_masks(), numa.get_membind()
        with pytest.raises(Boom, match=step):
            affinity.apply(SPEC, threads=2, membind="auto", blas=True, openmp=True,
                           tensorflow=step == "_attach_tensorflow")  # (the real one would start TF here)
        return env0, masks0, mem0, dict(os.environ), all_masks(), numa.get_membind()

    with Parked("bystander"):
        env0, masks0, mem0, env1, masks1, mem1 = in_thread(go)
    assert env1 == env0  # the whole environment, byte for byte
    assert same_masks(masks0, masks1)
    assert mem1 == mem0
    assert affinity.binding.apply.active_bindings() == []


def test_a_failing_refresh_undoes_everything(monkeypatch):
    def refresh(self):
        raise Boom("refresh")

    monkeypatch.setattr(apply_mod.Binding, "refresh", refresh)
    env0, masks0 = dict(os.environ), all_masks()
    with pytest.raises(Boom):
        affinity.apply(SPEC, threads=2, tensorflow=False)
    assert dict(os.environ) == env0
    assert same_masks(masks0, all_masks())


def same_masks(before, after):
    """Every thread alive before and after has its mask back (a thread of an earlier
    test may exit meanwhile, and none is born here)."""
    return {t: m for t, m in after.items() if t in before} == {t: m for t, m in before.items() if t in after}


def test_the_snapshot_is_not_part_of_the_constructor():
    fields = {f.name: f for f in record.fields(affinity.Binding)}
    assert all(not f.init for name, f in fields.items() if name.startswith("_"))
    with pytest.raises(TypeError):
        affinity.Binding(plan=None, _snapshot=None)  # type: ignore[call-arg]


def test_restore_leaves_the_environment_byte_for_byte():
    """Importing threadpoolctl during apply() sets KMP_DUPLICATE_LIB_OK=True -- the
    variable that hides Intel's duplicate-runtime error; restore takes it back too.
    In a fresh interpreter, where nothing imported threadpoolctl before."""
    import subprocess
    import sys

    code = ("import os, json, affinity\n"
            "env0 = dict(os.environ)\n"
            "with affinity.pinned('explicit,proclist=[1,0]', threads=2, tensorflow=False): pass\n"
            "b = affinity.apply('scatter', tensorflow=False); b.restore()\n"
            "print(json.dumps([sorted(set(os.environ.items()) ^ set(env0.items()))]))")
    env = {k: v for k, v in os.environ.items() if k != "KMP_DUPLICATE_LIB_OK"}
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[[]]"
