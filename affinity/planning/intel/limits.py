"""The thread limits of Intel's runtime (and LLVM's libomp): how many threads a
team may have, whatever ``OMP_NUM_THREADS`` asks for.

* ``KMP_DEVICE_THREAD_LIMIT`` (its old name ``KMP_ALL_THREADS``, ignored with
  ``OMP: Warning #182`` when both are set) caps every thread of the process
  (``__kmp_max_nth``); ``all`` (in any case, nothing around it) means the
  runtime's CPU count, ``__kmp_xproc``, which counts offline CPUs too;
* ``OMP_THREAD_LIMIT`` caps the threads of the contention group
  (``__kmp_cg_max_nth``).

Both are read by ``__kmp_stg_parse_int`` (``kmp_settings.cpp``): leading blanks
are skipped (libiomp5 2026 takes none before an ``OMP_THREAD_LIMIT``; libomp 19
does), then a value that does not start with a digit (a sign, ``all`` for
``OMP_THREAD_LIMIT``) is "not a number", one with other characters after its
digits and blanks has "illegal characters" -- both leave the limit as it was
(none); 0 is "value too small" (the limit becomes 1); above ``INT_MAX`` is
"value too large" (no limit).  Each prints ``OMP: Warning #80``.

When the first parallel region forks, ``__kmp_reserve_threads``
(``kmp_runtime.cpp``) checks the device limit, then the contention-group limit;
the first that cuts the team prints ``OMP: Warning #96: Cannot form a team with
N threads, using M instead.`` once (N: the team asked for, M: that limit), and
the smaller limit wins.  ``KMP_AFFINITY=nowarnings`` does not silence it.

The runtime also reads an environment variable only when its ``NAME=VALUE`` fits
in :data:`ENV_ENTRY_MAX` bytes (measured with libiomp5 2026.2 on a real process:
``KMP_AFFINITY`` of 4,083 characters is read; longer, it is "syntax error, not
using affinity", ``OMP: Warning #65``, and ``OMP_PLACES`` "syntax error, using
threads", #251).  LLVM's libomp 19 and libgomp read far longer values; an
explicit proclist with many CPUs per thread passes the limit on ordinary machines
(:func:`affinity.planning.envvars.plan_environment` exports a shorter form then).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ...errors import SpecError

__all__ = ["ALL", "ENV_ENTRY_MAX", "LIMIT_VARIABLES", "cap_team", "fits_env", "read_limits"]

#: The longest ``NAME=VALUE`` environment entry libiomp5 reads, in bytes.
ENV_ENTRY_MAX = 4096


def fits_env(name: str, value: str) -> bool:
    """Whether libiomp5 reads ``name=value`` (:data:`ENV_ENTRY_MAX`)."""
    return len(name) + 1 + len(value.encode()) <= ENV_ENTRY_MAX


#: The variables that cap the team, in name order.
LIMIT_VARIABLES = ("KMP_ALL_THREADS", "KMP_DEVICE_THREAD_LIMIT", "OMP_THREAD_LIMIT")
#: ``__kmp_sys_max_nth`` on Linux: the largest limit the runtime takes.
_INT_MAX = 2**31 - 1
#: ``KMP_DEVICE_THREAD_LIMIT=all``: the runtime's CPU count (resolved at planning time).
ALL = -1


def _parse_int(name: str, value: str, say: Callable[[str, str], None], strict: bool,
               blanks: bool = True) -> int | None:
    """``__kmp_stg_parse_int(name, value, 1, INT_MAX)``: the limit, ``None`` for none
    (``blanks``: leading blanks are skipped)."""
    i, n = 0, len(value)
    while blanks and i < n and value[i] in " \t":
        i += 1
    start = i
    problem = None
    if not "0" <= value[i:i + 1] <= "9":
        problem = "not a number"
    else:
        while i < n and "0" <= value[i] <= "9":
            i += 1
        j = i
        while j < n and value[j] in " \t":
            j += 1
        if j != n:
            problem = "illegal characters"
    if problem is None:
        number = int(value[start:i])
        if number < 1:
            problem, limit = "value too small", 1
        elif number > _INT_MAX:
            problem, limit = "value too large", None
        else:
            return number
    else:
        limit = None
    if strict:
        raise SpecError(f"{problem} (a thread limit is a whole number of at least 1)", value, 0, what=name)
    say(name, f'{name}="{value}": {problem}.')
    return limit


def read_limits(env: Mapping[str, str], say: Callable[[str, str], None], strict: bool,
                libiomp5: bool = True) -> tuple[int | None, int | None]:
    """The device and contention-group limits of ``env`` (see the module); each
    message printed while reading them goes to ``say(variable, text)``
    (``libiomp5``: Intel's build, whose ``OMP_THREAD_LIMIT`` takes no leading blank)."""
    device = None
    for name in LIMIT_VARIABLES[:2]:
        value = env.get(name)
        if value is None:
            continue
        if name == "KMP_ALL_THREADS" and env.get("KMP_DEVICE_THREAD_LIMIT") is not None:
            say(name, "KMP_ALL_THREADS: ignored because KMP_DEVICE_THREAD_LIMIT has been defined")
            if strict:
                raise SpecError("ignored because KMP_DEVICE_THREAD_LIMIT has been defined", value, 0,
                                what=name)
            continue
        device = ALL if value.lower() == "all" else _parse_int(name, value, say, strict)
    value = env.get("OMP_THREAD_LIMIT")
    cg = None if value is None else _parse_int("OMP_THREAD_LIMIT", value, say, strict, not libiomp5)
    return device, cg


def cap_team(n: int, device: int | None, cg: int | None, xproc: int) -> tuple[int, list[str]]:
    """``__kmp_reserve_threads``: the team of ``n`` the limits allow, and the
    warning it prints (``xproc``: the runtime's CPU count, for ``all``)."""
    if n <= 1:
        return n, []
    texts: list[str] = []
    got = n
    for limit in (xproc if device == ALL else device, cg):
        if limit is not None and got > limit:
            if not texts:
                texts.append(f"Cannot form a team with {n} threads, using {limit} instead.")
            got = limit
    return got, texts
