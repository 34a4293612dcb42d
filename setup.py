"""Build script: the cffi API-mode extension (csrc/) linked against hwloc.

Metadata lives in pyproject.toml; this file only wires the native build.
"""

from setuptools import setup

setup(cffi_modules=["csrc/build_native.py:ffibuilder"])
