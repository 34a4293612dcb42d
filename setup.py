"""Build script: the cffi API-mode extension (csrc/) linked against hwloc.

Metadata lives in pyproject.toml; this file only wires the native build.
"""

import os

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
        super().build_extensions()
        regular, _ = self._preload_paths()
        objects = self.compiler.compile(["csrc/pinthreads.c"], output_dir=self.build_temp,
                                        extra_postargs=["-O2", "-Wall", "-fPIC", "-fvisibility=hidden"])
        self.compiler.link_shared_object(objects, regular, libraries=["dl", "pthread"])

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


setup(cffi_modules=["csrc/build_native.py:ffibuilder"],
      cmdclass={"build_ext": build_ext_with_preload})
