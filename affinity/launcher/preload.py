"""``--pin-threads``: the Python side of the preloaded pinning library.

``csrc/pinthreads.c`` is built by ``setup.py`` into ``libaffinity_pin.so`` next to
this module; :func:`pin_environment` preloads it and tells it the plan's slots
(``AFFINITY_PIN_*``).  The main thread takes the first slot (unless told not to),
each new pthread the next one, in creation order.

The C side parses the same ``format_list`` output with its own small cpulist parser: C cannot call Python.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from ..cpulist import format_list
from ..errors import NativeUnavailableError

__all__ = ["PIN_LIBRARY", "pin_environment", "pin_library"]

#: the preload library's file name, next to this module
PIN_LIBRARY = "libaffinity_pin.so"


def pin_library() -> Path:
    """The preload library built with the package (``affinity/launcher/libaffinity_pin.so``).

    Returns
    -------
    pathlib.Path
        Its absolute path.

    Raises
    ------
    NativeUnavailableError
        The library was not built (the package was not installed with its C parts).
    """
    path = Path(__file__).resolve().parent / PIN_LIBRARY
    if not path.is_file():
        raise NativeUnavailableError(
            f"{path} is missing: the thread-pinning library is built with the package "
            f"(reinstall with 'pip install .', or 'make' in a checkout)")
    return path


def pin_environment(slots: Sequence[frozenset[int]], environ: Mapping[str, str], *, skip: int = 0,
                    main: bool = True, verbose: bool = False, children: bool = False) -> dict[str, str]:
    """The variables that preload the pinning library and give it the plan.

    Parameters
    ----------
    slots : sequence of frozenset of int
        One CPU set per thread, in pinning order.
    environ : mapping of str to str
        The launcher's environment: an ``LD_PRELOAD`` there is kept, after ours.
    skip : int
        Threads to leave unpinned: bit *i* = the *i*-th ``pthread_create``.
    main : bool
        Pin the main thread to the first slot (else created threads start there).
    verbose : bool
        Have the library report every pin on stderr.
    children : bool
        Processes the command starts pin their threads too (each from the first
        slot again); by default only the command's own process (and what it
        exec's) pins, and its children are left alone.

    Returns
    -------
    dict of str to str
        ``LD_PRELOAD`` and the ``AFFINITY_PIN_*`` variables.

    Raises
    ------
    NativeUnavailableError
        The library was not built.
    """
    lib = str(pin_library())
    old = environ.get("LD_PRELOAD", "").strip()
    env = {
        "LD_PRELOAD": lib + (":" + old if old else ""),
        "AFFINITY_PIN_SLOTS": ";".join(format_list(s) for s in slots),
        "AFFINITY_PIN_SKIP": f"{skip:#x}",
        "AFFINITY_PIN_MAIN": "1" if main else "0",
        "AFFINITY_PIN_OWNER": "",  # the command's process becomes the owner (an outer run's is not)
    }
    if verbose:
        env["AFFINITY_PIN_VERBOSE"] = "1"
    if children:
        env["AFFINITY_PIN_CHILDREN"] = "1"
    return env


