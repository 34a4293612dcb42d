"""``affinity run`` with real PyTorch: torch's pool sizes from the plan (per instance; the
inter-op pool's when the program first makes TorchScript, unless it sized it itself),
the libgomp load-time pin of the importing thread undone (a forked child gets the
instance's CPUs, not the first place), libgomp's own team still on the places; a
sitecustomize of the user's own still runs; a program without torch is untouched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from affinity.launcher.torch_env import BOOT_DIR, torch_environment

CPUS = sorted(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="needs a process mask of at least 2 CPUs")

PROBE = r"""
import json, multiprocessing as mp, os, sys
before = sorted(os.sched_getaffinity(0))
import torch
after = sorted(os.sched_getaffinity(0))
ctx = mp.get_context("fork")
q = ctx.Queue()
p = ctx.Process(target=lambda: q.put(sorted(os.sched_getaffinity(0))))
p.start(); child = q.get(); p.join()
x = torch.randn(300, 300); (x @ x).sum()
torch.jit.trace(lambda t: t + 1, torch.ones(1))  # TorchScript made: the hook sizes the inter-op pool now
team = {t: sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}
# one write(2) for the whole line: two instances share the pipe, and print() may write the
# text and its newline apart (the lines interleaved)
os.write(1, (json.dumps({"before": before, "after": after, "child": child, "team": team, "pid": os.getpid(),
                         "sizes": [torch.get_num_threads(), torch.get_num_interop_threads()],
                         "instance": os.environ.get("AFFINITY_INSTANCE"),
                         "user_site": os.environ.get("USER_SITE_RAN")}) + "\n").encode())
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "GOMP_", "AFFINITY_", "MKL_"))}
    env.update(extra)
    return env


def _run(args: list[str], env: dict[str, str] | None = None) -> list[dict]:
    r = subprocess.run([sys.executable, "-m", "affinity", "run", *args], capture_output=True, text=True,
                       env=env or _env(), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def test_exports():
    class P:
        inter_op_threads = 2

    env = torch_environment(P(), {"PYTHONPATH": f"/a{os.pathsep}{BOOT_DIR}"})
    assert env == {"AFFINITY_TORCH_INTEROP_THREADS": "2", "PYTHONPATH": os.pathsep.join([BOOT_DIR, "/a"])}
    assert torch_environment(P(), {})["PYTHONPATH"] == BOOT_DIR
    assert (Path(BOOT_DIR) / "sitecustomize.py").is_file()


def test_one_process_pools_sized_and_no_one_cpu_mask_leaks():
    (out,) = _run(["granularity=fine,compact,1,0", "-t", "2", "--", sys.executable, "-c", PROBE])
    cpus = CPUS[:2]
    # libgomp bound the importing thread to the first place; the boot undid it
    assert out["before"] == cpus and out["after"] == cpus and out["child"] == cpus
    assert out["sizes"] == [2, 1]
    # libgomp's own team (created after the import) is still on the exported places
    others = sorted(m for t, m in out["team"].items() if int(t) != out["pid"] and len(m) == 1)
    assert [cpus[1]] in others


def test_instances_get_their_own_torch_pool_sizes():
    outs = _run(["--instances", "2", "--", sys.executable, "-c", PROBE])
    assert sorted(o["instance"] for o in outs) == ["0", "1"]
    for o in outs:
        assert o["sizes"] == [1, 1]  # each instance: its one CPU, one inter-op thread
        assert len(o["after"]) == 1 and o["after"] == o["before"] == o["child"]
    assert sorted(o["after"][0] for o in outs) == CPUS[:2]


def test_the_users_sitecustomize_still_runs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
    (out,) = _run(["compact", "--", sys.executable, "-c", PROBE], _env(PYTHONPATH=str(tmp_path)))
    assert out["user_site"] == "yes" and out["sizes"][1] == 1


def test_a_program_without_torch_is_untouched():
    code = "import sys, json; print(json.dumps(['torch' in sys.modules, type(sys.meta_path[0]).__name__]))"
    r = subprocess.run([sys.executable, "-m", "affinity", "run", "compact", "--", sys.executable, "-c", code],
                       capture_output=True, text=True, env=_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    loaded, first = json.loads(r.stdout)
    assert loaded is False and first == "_AfterTorch"  # only a finder waiting for `import torch`


LOADER = r"""
import json, os, sys
import torch
from torch.utils.data import DataLoader

def user_init(i):
    os.environ["USER_INIT_RAN"] = str(i)

class Masks(torch.utils.data.Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        return json.dumps({"worker": info.id, "mask": sorted(os.sched_getaffinity(0)),
                           "threads": torch.get_num_threads(), "user": os.environ.get("USER_INIT_RAN")})

if __name__ == "__main__":  # a spawned worker imports this module again
    seen = {}
    for item in DataLoader(Masks(), batch_size=None, num_workers=2, multiprocessing_context=sys.argv[1],
                           worker_init_fn=user_init):
        d = json.loads(item)
        seen[d["worker"]] = d
    print(json.dumps(seen))
"""


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_dataloader_workers_from_the_launcher(tmp_path, ctx):
    """issue #40 (3): ``affinity run --dataloader-workers 2`` was 'unrecognized arguments', and
    the workers inherited the whole mask; now each worker runs on its set of the layout that
    ``affinity plan --dataloader-workers 2`` shows, before the program's own worker_init_fn."""
    prog = tmp_path / "loader.py"
    prog.write_text(LOADER)
    plan = subprocess.run([sys.executable, "-m", "affinity", "plan", "compact", "-t", "2", "--dataloader-workers",
                           "2", "--json"],
                          capture_output=True, text=True, env=_env(), timeout=120)
    assert plan.returncode == 0, plan.stderr
    layout = json.loads(plan.stdout)["dataloader_workers"]["cpusets"]
    r = subprocess.run([sys.executable, "-m", "affinity", "run", "compact", "-t", "2", "--dataloader-workers", "2",
                        "--", sys.executable, str(prog), ctx], capture_output=True, text=True, env=_env(), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert {int(w): d["mask"] for w, d in seen.items()} == {0: layout[0], 1: layout[1]}
    assert all(d["threads"] == 1 and d["user"] == w for w, d in seen.items())
    # without it, every worker has the launched process's whole mask
    r = subprocess.run([sys.executable, "-m", "affinity", "run", "--", sys.executable, str(prog), ctx],
                       capture_output=True, text=True, env=_env(), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert all(d["mask"] == CPUS for d in json.loads(r.stdout.strip().splitlines()[-1]).values())


def test_the_programs_own_set_num_interop_threads_is_accepted():
    """torch accepts ``set_num_interop_threads`` once: the hook called it right after
    ``import torch``, and the program's own call raised "cannot set number of interop
    threads after ..." (plain Python accepts it).  Now the program's call is its own,
    and the plan's size waits for the first TorchScript (then refused: the program's stands)."""
    code = ("import json, torch; torch.set_num_interop_threads(3); a = torch.get_num_interop_threads(); "
            "torch.jit.trace(lambda t: t + 1, torch.ones(1)); "
            "print(json.dumps([a, torch.get_num_interop_threads()]))")
    r = subprocess.run([sys.executable, "-m", "affinity", "run", "compact", "--", sys.executable, "-c", code],
                       capture_output=True, text=True, env=_env(), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [3, 3]


def test_python_E_keeps_the_load_time_pin_and_says_so():
    """Under ``python -E`` the hook cannot load (no PYTHONPATH): libgomp's load-time pin of
    the main thread stays, as the warning says (and ``--pin-threads --no-pin-main``, which it
    names, has none: the main thread keeps the process's CPUs)."""
    code = ("import json, os, torch; print(json.dumps(sorted(os.sched_getaffinity(0))))")
    outs = {}
    for extra in ([], ["--pin-threads", "--no-pin-main"]):
        r = subprocess.run([sys.executable, "-m", "affinity", "run", "-t", "2", *extra, "--", sys.executable, "-E",
                            "-c", code], capture_output=True, text=True, env=_env(), timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        outs[bool(extra)] = (json.loads(r.stdout.strip().splitlines()[-1]), "hook cannot load" in r.stderr)
    assert outs[False] == ([CPUS[0]], True)  # pinned to the first place, and said
    assert outs[True] == (CPUS[:2], False)  # the preload's way: no load-time pin, nothing to say
