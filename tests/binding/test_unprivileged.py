"""The binding API in unprivileged containers (issue 14, item 4).

Each case runs in a fresh interpreter started as a container would start it: as
root without ``CAP_SYS_NICE`` (Docker's default) or as a user with no capability
at all (``nobody``), optionally under a seccomp filter that refuses the memory
policy calls as Docker's default profile does (tests/helpers/unprivileged.py).
What must hold there:

* binding a thread of another user's process is refused with a
  ``PermissionError`` (errno ``EPERM``) naming the thread, and a many-thread bind
  that includes it changes nothing, here or there;
* ``apply(membind=...)`` refused by the filter raises a ``PermissionError`` that
  says why (the container, ``CAP_SYS_NICE``) and leaves nothing applied: every
  thread's mask, the whole environment, the memory policy, the OpenMP team size
  and the list of active bindings are as before;
* without ``membind`` the same process is pinned and restored exactly: nothing
  asks the kernel for a memory policy unless memory binding was asked for;
* a memory policy that cannot be put back at restore (the filter arrived after
  apply) is a warning; everything else is restored.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.ompprog import build
from helpers.unprivileged import build_deny, process_of_another_user, shared_dir

CPUS = sorted(os.sched_getaffinity(0))


@pytest.fixture(scope="module")
def shared():
    with shared_dir() as d:
        deny, libdeny = build_deny(d)
        yield {"dir": d, "deny": deny, "libdeny": libdeny, "omp": build("libgomp", d)}


def run_script(shared, who, script: str, *args: str, deny: str | None = None) -> dict:
    cmd = [*who.prefix, sys.executable, "-c", script, *args]
    if deny:
        cmd = [str(shared["deny"]), deny, *cmd]  # the filter first: setpriv then runs under it
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "GOMP_", "TF_NUM_"))}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=shared["dir"], env=env)
    assert r.returncode == 0, f"{who}: exit {r.returncode}\n{r.stdout}\n{r.stderr[-4000:]}"
    return json.loads(r.stdout.splitlines()[-1])


# ------------------------------------------------------ another user's process

FOREIGN = r"""
import json, os, sys
from affinity.binding import threads
target, cpu = int(sys.argv[1]), int(sys.argv[2])
out = {"uid": os.geteuid()}
def caught(fn):
    try:
        fn()
    except Exception as e:
        return {"type": type(e).__name__, "permission": isinstance(e, PermissionError),
                "oserror": isinstance(e, OSError), "errno": getattr(e, "errno", None), "text": str(e)}
    return None
own = threads.get_process_affinity()
out["single"] = caught(lambda: threads.set_affinity({cpu}, tid=target))
# all or nothing: this thread first (it may be changed), then the other user's
out["many"] = caught(lambda: threads.set_threads_affinity({threads.current_tid(): {cpu}, target: {cpu}}))
out["own_unchanged"] = threads.get_process_affinity() == own
print(json.dumps(out))
"""


@pytest.mark.skipif(len(CPUS) < 2, reason="needs a process mask of at least 2 CPUs")
def test_binding_another_users_process_is_a_permission_error_and_changes_nothing(shared, who):
    with process_of_another_user(who) as pid:
        before = os.sched_getaffinity(pid)
        out = run_script(shared, who, FOREIGN, str(pid), str(CPUS[-1]))
        assert os.sched_getaffinity(pid) == before  # the other process: untouched
    assert out["own_unchanged"]  # this one too: the many-thread bind was undone
    for case in ("single", "many"):
        e = out[case]
        assert e is not None, f"{who}: binding pid {pid} of another user succeeded ({case})"
        assert e["errno"] == errno.EPERM, e
        assert e["permission"], f"{case}: {e['type']} is not a PermissionError: {e['text']}"
        assert str(pid) in e["text"], e["text"]


# ------------------------------------------------- memory policy refused (seccomp)

APPLY = r"""
import ctypes, json, os, sys, warnings
omp = ctypes.CDLL(sys.argv[1])        # an OpenMP runtime, its team running
omp.report((ctypes.c_int * 8)(), (ctypes.c_ulong * 8)(), 8)
import affinity
from affinity.binding import openmp, registry
(rt,) = openmp.loaded_runtimes()

def policy():
    with open("/proc/thread-self/numa_maps") as fh:
        return next(l.split()[1] for l in fh if "stack" in l.split())

def c_environ():
    env = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
    out, i = [], 0
    while env[i] is not None:
        out.append(env[i].decode(errors="replace"))
        i += 1
    return sorted(out)

def state():
    masks = {}
    for t in os.listdir("/proc/self/task"):
        try:
            masks[t] = sorted(os.sched_getaffinity(int(t)))
        except OSError:
            pass
    return {"masks": masks, "environ": sorted(os.environ.items()), "c_environ": c_environ(),
            "policy": policy(), "omp_max": rt.max_threads(), "active": len(registry.active())}

out = {}
kw = dict(tensorflow=False, openmp="auto", blas=False)
for membind in sys.argv[2].split(","):
    before = state()
    try:
        with affinity.pinned("granularity=fine,compact", membind=membind or None, **kw) as b:
            inside = state()
        out[membind] = {"raised": None, "pinned": inside["masks"] != before["masks"]}
    except Exception as e:
        out[membind] = {"raised": {"type": type(e).__name__, "permission": isinstance(e, PermissionError),
                                   "errno": getattr(e, "errno", None), "text": str(e)}}
    after = state()
    out[membind]["changed"] = {k: [before[k], after[k]] for k in before if before[k] != after[k]}
print(json.dumps(out))
"""


@pytest.mark.parametrize("deny", ["docker", "set"])
def test_refused_membind_is_a_clear_error_and_nothing_is_applied(shared, who, deny):
    out = run_script(shared, who, APPLY, str(shared["omp"]), "auto,bind:0,interleave:all", deny=deny)
    for membind, got in out.items():
        assert got["changed"] == {}, f"{who}, {deny} filter, membind={membind}: half-applied {got['changed']}"
        e = got["raised"]
        assert e is not None, f"membind={membind} under the {deny} filter did not raise"
        assert e["errno"] == errno.EPERM and e["permission"], e
        # it names the call and says why, as `affinity run` does (docs/launcher.md)
        assert "mempolicy" in e["text"] or "membind" in e["text"], e["text"]
        assert "CAP_SYS_NICE" in e["text"], f"the error does not say why: {e['text']}"


@pytest.mark.skipif(len(CPUS) < 2, reason="needs a process mask of at least 2 CPUs")
def test_without_membind_everything_works_and_is_restored_exactly(shared, who):
    out = run_script(shared, who, APPLY, str(shared["omp"]), "", deny="docker")
    got = out[""]
    assert got["raised"] is None, got["raised"]
    assert got["pinned"]  # the team really was pinned inside
    assert got["changed"] == {}, got["changed"]


RESTORE = r"""
import ctypes, json, os, sys, warnings
import affinity
from affinity.binding import numa
deny = ctypes.CDLL(sys.argv[1], use_errno=True)
env0, masks0 = dict(os.environ), {t: os.sched_getaffinity(int(t)) for t in os.listdir("/proc/self/task")}
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    b = affinity.apply("granularity=fine,compact", membind="interleave:all", tensorflow=False,
                       openmp=False, blas=False)
    applied = str(numa.get_membind())
    assert deny.deny_mempolicy(b"docker") == 0, ctypes.get_errno()  # the container closes the door
    b.restore()
out = {"applied": applied, "active": b.active, "env_same": dict(os.environ) == env0,
       "masks_same": {t: os.sched_getaffinity(int(t)) for t in os.listdir("/proc/self/task")} == masks0,
       "warnings": [str(x.message) for x in w if "restore" in str(x.message)]}
print(json.dumps(out))
"""


def test_a_policy_that_cannot_be_put_back_is_a_warning_and_the_rest_is_restored(shared, who):
    out = run_script(shared, who, RESTORE, str(shared["libdeny"]))
    assert out["applied"].startswith("interleave")
    assert out["active"] is False and out["env_same"] and out["masks_same"]
    assert len(out["warnings"]) == 1 and "memory policy" in out["warnings"][0], out["warnings"]
