"""The version of affinity, from the installed package's metadata (defined once, in
``pyproject.toml``)."""

from __future__ import annotations

from importlib import metadata

#: the distribution name (``pip install <this>``); the import name is ``affinity``
DISTRIBUTION = "kmp-affinity"

try:
    __version__ = metadata.version(DISTRIBUTION)
except metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
