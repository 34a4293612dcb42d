"""``make sanitize``: the C core under AddressSanitizer and UBSan, driven by the tests.

What it does (docs/hardening.md says why each step is needed):

1. copies the checkout (tracked and untracked, not ignored files) to
   ``build/sanitize/tree`` -- the editable install in ``.venv`` is never touched;
2. builds both C parts there (``python setup.py build_ext --inplace``) with
   ``CFLAGS``/``LDFLAGS`` = ``-fsanitize=address,undefined -fno-omit-frame-pointer
   -fno-sanitize-recover=all``: the cffi extension and ``libaffinity_pin.so``, each
   linked to the shared ASan and UBSan runtimes (checked with ``readelf``);
3. writes ``build/sanitize/venv/bin/python``, a wrapper around this interpreter that
   preloads the two runtimes (ASan must be the first library of a process that loads
   an instrumented extension), puts the tree first on ``PYTHONPATH`` and sets
   ``PYTHONMALLOC=malloc`` (every Python allocation, cffi buffers included, gets
   redzones).  It runs the interpreter with ``argv[0]`` = the wrapper, so
   ``sys.executable`` is the wrapper and every Python child a test starts
   (``python -m affinity run``, probes, setpriv, seccomp) is sanitized too.  A start-up
   hook (a ``.pth`` file) puts the environment back as the caller passed it, so tests
   that compare environments see no difference, adds ``.venv``'s site-packages (but
   not its editable-install finder: an ``affinity`` that is not the tree's fails to
   import instead of running unsanitized) and hides ``os.RTLD_DEEPBIND``
   (ASan aborts on ``dlopen(RTLD_DEEPBIND)``, which ``machine/_native.py`` uses);
4. runs the native, bind, NUMA, OpenMP, launch, pin-threads, churn and unprivileged
   tests with that interpreter, every report of every process written under
   ``build/sanitize/reports`` (``log_path``), ASan aborting on the first error;
5. runs ``libaffinity_pin.so`` once more with the ASan runtime first in
   ``LD_PRELOAD`` (the pin-threads tests preload it alone, so in there ASan's
   allocator is not the process's), over its configurations: slots, skip mask,
   fork, bad configuration, failed pin;
6. with ``--leaks``: LeakSanitizer at the exit of every Python process, with
   ``tools/lsan.supp`` suppressing the interpreter's, NumPy's and the OpenMP
   runtimes' own allocations; stacks are cut to 3 frames so that an allocation of
   the C core (malloc <- hwloc/aff_* <- the cffi wrapper) is never suppressed just
   because Python called it.

Exit status 0 only when pytest passed and no process wrote a report.

Usage: ``python tools/sanitize.py [--leaks] [--build-only | --reuse] [pytest args or test paths...]``
(``--reuse``: run again on the tree and build of the last run, without copying or building).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(os.environ.get("SANITIZE_DIR", ROOT / "build" / "sanitize")).resolve()
SAN = "-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all -g"

#: the tests that drive the C core (a file that does not exist yet is left out)
TESTS = [
    "tests/machine/test_native.py",
    "tests/binding/test_bind.py",
    "tests/binding/test_numa_numpy.py",
    "tests/binding/test_openmp.py",
    "tests/binding/test_churn.py",
    "tests/binding/test_unprivileged.py",
    "tests/launcher/test_launch.py",
    "tests/launcher/test_launch_numactl.py",
    "tests/launcher/test_pinthreads.py",
    "tests/launcher/test_unprivileged_launch.py",
]

EXTENSION = "affinity/machine/_affinity_native.abi3.so"
PRELOAD = "affinity/launcher/libaffinity_pin.so"


def say(text: str) -> None:
    print(f"sanitize: {text}", flush=True)


def runtime(cc: str, name: str) -> str:
    """The shared sanitizer runtime the compiler links (``libasan.so.8``...)."""
    out = subprocess.run([cc, f"-print-file-name={name}"], capture_output=True, text=True,
                         check=True).stdout.strip()
    path = Path(out)
    if not path.is_absolute() or not path.exists():
        raise SystemExit(f"sanitize: {cc} has no {name} (Debian: apt-get install libasan8 libubsan1)")
    return str(path.resolve())


def copy_tree(dst: Path) -> None:
    """The checkout's files (tracked and untracked, not ignored) into ``dst``."""
    try:
        names = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT,
                               capture_output=True, check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an sdist)
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()
                 and not {".venv", "build", ".git"} & set(p.relative_to(ROOT).parts)]
    if dst.exists():
        shutil.rmtree(dst)
    for name in filter(None, names):
        src = ROOT / name
        if not src.is_file():
            continue  # deleted in the work tree, not yet in the index
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst / name)


def build(tree: Path, temp: Path) -> None:
    env = dict(os.environ, CFLAGS=SAN, LDFLAGS=SAN.replace(" -g", ""))
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace", "--force",
                    "--build-temp", str(temp)], cwd=tree, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    for so in (EXTENSION, PRELOAD):
        dyn = subprocess.run(["readelf", "-d", str(tree / so)], capture_output=True, text=True,
                             check=True).stdout
        if "libasan.so" not in dyn or "libubsan.so" not in dyn:
            raise SystemExit(f"sanitize: {so} is not linked to the ASan/UBSan runtimes")


SITE_HOOK = '''\
"""Start-up hook of the sanitized interpreter (written by tools/sanitize.py)."""
import os
import site
import sys

for _name in ("LD_PRELOAD", "PYTHONPATH", "PYTHONMALLOC", "ASAN_OPTIONS"):
    _saved = os.environ.pop("_SANITIZE_ORIG_" + _name, None)
    if _saved is None:
        continue
    if _saved.startswith("="):
        os.environ[_name] = _saved[1:]
    else:
        os.environ.pop(_name, None)

# .venv's packages, but not its editable-install finders (they would map
# ``affinity`` to the unsanitized checkout)
_SP = {site_packages!r}
sys.path.append(_SP)
for _pth in sorted(os.listdir(_SP)):
    if _pth.endswith(".pth") and not _pth.startswith("__editable__"):
        site.addpackage(_SP, _pth, None)

# ASan aborts on dlopen(RTLD_DEEPBIND) (google/sanitizers#611); without the attribute
# machine/_native.py loads the extension without it
if hasattr(os, "RTLD_DEEPBIND"):
    del os.RTLD_DEEPBIND
'''

WRAPPER = '''\
#!/bin/bash
# python under ASan/UBSan for `make sanitize` (written by tools/sanitize.py): the
# sanitizer runtimes first in LD_PRELOAD, the sanitized tree first on PYTHONPATH;
# the start-up hook puts the caller's values back into os.environ.
for v in LD_PRELOAD PYTHONPATH PYTHONMALLOC ASAN_OPTIONS; do
  if [ "${{!v+set}}" = set ]; then export "_SANITIZE_ORIG_$v==${{!v}}"; else export "_SANITIZE_ORIG_$v=-"; fi
done
case " ${{LD_PRELOAD//:/ }} " in
  *" {asan} "*) ;;
  *) export LD_PRELOAD="{asan} {ubsan}${{LD_PRELOAD:+ $LD_PRELOAD}}" ;;
esac
export PYTHONPATH="{tree}${{PYTHONPATH:+:$PYTHONPATH}}"
export PYTHONMALLOC=malloc
export ASAN_OPTIONS="${{ASAN_OPTIONS}}{python_asan}"
exec -a "$0" {real} "$@"
'''


def make_interpreter(venv: Path, tree: Path, asan: str, ubsan: str, leaks: bool) -> Path:
    """``venv/bin/python``: this interpreter, sanitized (see the module docstring)."""
    if venv.exists():
        shutil.rmtree(venv)
    ver = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    site_packages = sysconfig.get_paths()["purelib"]
    (venv / "bin").mkdir(parents=True)
    sp = venv / "lib" / ver / "site-packages"
    sp.mkdir(parents=True)
    cfg = Path(sys.prefix) / "pyvenv.cfg"
    home = Path(os.path.realpath(sys.executable)).parent
    (venv / "pyvenv.cfg").write_text(
        cfg.read_text() if cfg.exists() else f"home = {home}\ninclude-system-site-packages = false\n")
    for entry in (Path(sys.prefix) / "lib").iterdir():  # libiomp5.so of the intel-openmp wheel...
        if entry.name != ver:
            (venv / "lib" / entry.name).symlink_to(entry)
    (sp / "_affinity_sanitize.py").write_text(SITE_HOOK.format(site_packages=site_packages))
    (sp / "_affinity_sanitize.pth").write_text("import _affinity_sanitize\n")
    py = venv / "bin" / "python"
    # exec'd through a link named like the interpreter the tests normally run (the
    # kernel names a process -- /proc/PID/comm -- after the file exec'd)
    (venv / "real").mkdir()
    real = venv / "real" / Path(sys.executable).name
    real.symlink_to(os.path.realpath(sys.executable))
    py.write_text(WRAPPER.format(asan=asan, ubsan=ubsan, tree=tree, real=real,
                                 python_asan=":detect_leaks=1" if leaks else ""))
    py.chmod(py.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    (venv / "bin" / "python3").symlink_to("python")
    return py


def sanitizer_env(reports: Path, leaks: bool) -> dict[str, str]:
    asan = ["detect_leaks=0", "abort_on_error=1", "halt_on_error=1",
            # affinity run --pin-threads puts libaffinity_pin.so before an inherited
            # LD_PRELOAD (launcher/preload.py); the order is harmless (pthread_create:
            # ours -> ASan's -> libc's), only ASan's start-up check objects to it
            "verify_asan_link_order=0",
            f"log_path={reports}/asan"]
    ubsan = ["halt_on_error=1", "print_stacktrace=1", f"log_path={reports}/ubsan"]
    env = dict(os.environ, ASAN_OPTIONS=":".join(asan), UBSAN_OPTIONS=":".join(ubsan))
    if leaks:  # detect_leaks=1 itself is added by the wrapper, for Python processes only
        env["LSAN_OPTIONS"] = ":".join([f"suppressions={ROOT / 'tools' / 'lsan.supp'}",
                                        "malloc_context_size=3", "print_suppressions=0"])
    env.pop("PYTHONPATH", None)
    return env


PIN_CONFIGS = [
    ("slots", ["4"], {"AFFINITY_PIN_SLOTS": "{c1};{c0};{c0}-{cl}"}),
    ("skip+verbose", ["4"], {"AFFINITY_PIN_SLOTS": "{c0};{cl}", "AFFINITY_PIN_SKIP": "0x5",
                             "AFFINITY_PIN_VERBOSE": "1"}),
    ("no main", ["3"], {"AFFINITY_PIN_SLOTS": "{c0};{cl}", "AFFINITY_PIN_MAIN": "0"}),
    ("fork", ["3", "fork"], {"AFFINITY_PIN_SLOTS": "{c0};{cl}"}),
    ("long list", ["2"], {"AFFINITY_PIN_SLOTS": ";".join(["{c0}-{cl}"] * 200)}),
    ("bad slots", ["2"], {"AFFINITY_PIN_SLOTS": "0;x"}),
    ("bad skip", ["2"], {"AFFINITY_PIN_SLOTS": "{c0}", "AFFINITY_PIN_SKIP": "0xzz"}),
    ("failed pin", ["1"], {"AFFINITY_PIN_SLOTS": "4096;{c0}"}),
    ("none", ["2"], {}),
]


def check_preload(tree: Path, work: Path, env: dict[str, str], asan: str, ubsan: str) -> list[str]:
    """The pin library with ASan's allocator in charge (runtime first in LD_PRELOAD)."""
    sys.path.insert(0, str(tree / "tests"))
    from helpers.pinprog import PROGRAM  # the test program of tests/launcher/test_pinthreads.py

    src = work / "threads.c"
    src.write_text(PROGRAM)
    exe = work / "threads"
    subprocess.run(["gcc", "-O1", "-pthread", str(src), "-o", str(exe)], check=True)
    cpus = sorted(os.sched_getaffinity(0))
    fill = {"c0": cpus[0], "c1": cpus[1 % len(cpus)], "cl": cpus[-1]}
    failed = []
    for what, args, extra in PIN_CONFIGS:
        e = {k: v for k, v in env.items() if not k.startswith("AFFINITY_PIN_")}
        e.update({k: v.format(**fill) for k, v in extra.items()})
        e["LD_PRELOAD"] = f"{asan} {ubsan} {tree / PRELOAD}"
        r = subprocess.run([str(exe), *args], env=e, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            failed.append(f"{what}: exit {r.returncode}: {r.stderr.strip()}")
    return failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("--leaks", action="store_true", help="LeakSanitizer at the exit of every Python process")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--build-only", action="store_true", help="copy and build, run nothing")
    g.add_argument("--reuse", action="store_true", help="run on the last copy and build")
    ap.epilog = "Other arguments go to pytest as they are; without a test path, the C-core tests run."
    a, a.pytest_args = ap.parse_known_args(argv)
    t0 = time.monotonic()
    cc = (sysconfig.get_config_var("CC") or "gcc").split()[0]
    asan, ubsan = runtime(cc, "libasan.so"), runtime(cc, "libubsan.so")
    tree, reports = OUT / "tree", OUT / "reports"
    if not (a.reuse and (tree / EXTENSION).exists()):
        say(f"copying the checkout to {tree}")
        copy_tree(tree)
        say(f"building the extension and the preload library with {SAN}")
        build(tree, OUT / "temp")
    if a.build_only:
        return 0
    if reports.exists():
        shutil.rmtree(reports)
    reports.mkdir(parents=True)
    reports.chmod(0o1777)  # processes of the unprivileged tests write their reports too
    py = make_interpreter(OUT / "venv", tree, asan, ubsan, a.leaks)
    env = sanitizer_env(reports, a.leaks)
    given = [x for x in a.pytest_args if (tree / x.split("::")[0]).exists()]
    tests = a.pytest_args if given else [*(t for t in TESTS if (tree / t).exists()), *a.pytest_args]
    say(f"{py} -m pytest {' '.join(tests)}")
    t1 = time.monotonic()
    limit = int(os.environ.get("SANITIZE_TIMEOUT", "1800"))  # a hang must not hold CI forever
    proc = subprocess.Popen([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                            cwd=tree, env=env, start_new_session=True)
    try:
        rc = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        say(f"pytest did not finish in {limit} s (SANITIZE_TIMEOUT): killed")
        rc = 124
    say(f"pytest exit status {rc} ({time.monotonic() - t1:.0f} s)")
    work = OUT / "pinprog"
    work.mkdir(exist_ok=True)
    pin_failed = check_preload(tree, work, env, asan, ubsan)
    for f in pin_failed:
        say(f"libaffinity_pin.so with ASan first: {f}")
    found = sorted(p for p in reports.iterdir() if p.is_file())
    for p in found:
        say(f"report {p.name}:")
        print(textwrap.indent(p.read_text(errors="replace"), "    "), flush=True)
    say(f"{len(found)} sanitizer report(s); {time.monotonic() - t0:.0f} s in all")
    return 0 if rc == 0 and not found and not pin_failed else 1


if __name__ == "__main__":
    sys.exit(main())
