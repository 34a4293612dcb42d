"""The space a tuner searches: parameter name -> the choices it may take.

Twelve names mean something to the tuner (:data:`KNOWN`); their choices are
checked here, and :mod:`~affinity.tuning.priors` reads them with the machine.
Any other name is tuned as a plain choice (values optuna can store: ``None``,
``bool``, ``int``, ``float``, ``str``).

:func:`default_space` builds a space from a topology: counts that divide the
cores, PUs and packages, the seeds' rules among them.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from ..errors import SpaceError, SpecError
from ..machine.topology import Topology
from ..planning.spec import parse_kmp_affinity
from ..record import record
from .names import KNOWN

__all__ = ["AFFINITY_TYPES", "ENV_PREFIX", "KNOWN", "MEMBIND", "Space", "default_space", "describe", "parse_param"]

#: the prefix of a parameter that is an environment variable of the command (``env:NAME``)
ENV_PREFIX = "env:"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
COUNTS = ("intra", "inter", "omp", "instances", "threads", "torch_threads", "interop")
AFFINITY_TYPES = ("none", "disabled", "compact", "scatter", "balanced")
MEMBIND = ("none", "local", "interleave")
_PLAIN = (type(None), bool, int, float, str)


def describe(config: Mapping[str, Any] | None) -> str:
    """``name=value`` pairs of a configuration, space-separated (``-`` for None)."""
    if config is None:
        return "-"
    return " ".join(f"{k}={v}" for k, v in config.items())


def _check_choice(name: str, v: Any) -> Any:
    """``v`` as a valid choice of the known parameter ``name`` (raises SpaceError)."""
    if name in COUNTS:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SpaceError(f"space: {name!r} takes positive integers, got {v!r}")
        return v
    if name == "dataloader_workers":
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise SpaceError(f"space: 'dataloader_workers' takes integers >= 0, got {v!r}")
        return v
    if name == "blocktime":
        if isinstance(v, str) and v.strip().lower() == "infinite":
            return "infinite"
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise SpaceError(f"space: 'blocktime' takes milliseconds (integers >= 0) or 'infinite', got {v!r}")
        return v
    if not isinstance(v, str) or not v.strip():
        raise SpaceError(f"space: {name!r} takes strings, got {v!r}")
    if name == "membind" and v not in MEMBIND:
        raise SpaceError(f"space: 'membind' takes {', '.join(MEMBIND)}, got {v!r}")
    if name == "affinity" and v not in AFFINITY_TYPES:
        try:
            parse_kmp_affinity(v, strict=True)
        except SpecError as e:
            raise SpaceError(f"space: 'affinity' choice {v!r} is not a KMP_AFFINITY type or string: {e}") from None
    if name == "granularity":
        try:
            parse_kmp_affinity(f"granularity={v},compact", strict=True)
        except SpecError:
            raise SpaceError(f"space: 'granularity' choice {v!r} is not a KMP_AFFINITY granularity "
                             f"(fine, thread, core, tile, die, socket, ...)") from None
    return v


@record
class Space:
    """A checked space: parameters in order, each with its choices (duplicates removed).

    Parameters
    ----------
    params : tuple of (str, tuple)
        ``(name, choices)`` pairs.
    """

    params: tuple[tuple[str, tuple[Any, ...]], ...]

    @classmethod
    def of(cls, space: Mapping[str, Sequence[Any]] | Space) -> Space:
        """Check a mapping of name -> choices and return it as a :class:`Space`.

        Parameters
        ----------
        space : mapping of str to sequence, or Space
            What :func:`affinity.tune` was given.

        Returns
        -------
        Space

        Raises
        ------
        SpaceError
            Not a mapping, empty, a name that is not a string, choices that are not a
            non-empty list of plain values, or a choice a known parameter cannot take.
        """
        if isinstance(space, Space):
            return space
        if not isinstance(space, Mapping):
            raise SpaceError(f"space: expected a mapping of parameter name -> list of choices, "
                             f"got {type(space).__name__}")
        if not space:
            raise SpaceError("space: empty (give at least one parameter with its choices)")
        out = []
        for name, choices in space.items():
            if not isinstance(name, str) or not name.strip():
                raise SpaceError(f"space: parameter names are non-empty strings, got {name!r}")
            if name.startswith(ENV_PREFIX) and not _ENV_NAME.match(name[len(ENV_PREFIX):]):
                raise SpaceError(f"space: {name!r} is not an environment variable name "
                                 f"(env:NAME, NAME letters, digits and '_')")
            if isinstance(choices, (str, bytes, Mapping)) or not isinstance(choices, Iterable):
                raise SpaceError(f"space: {name!r}: expected a list of choices, got {type(choices).__name__} "
                                 f"{choices!r}")
            seen: list[Any] = []
            for v in choices:
                if type(v) not in _PLAIN and callable(getattr(v, "item", None)):
                    v = v.item()  # numpy scalars -> the Python value optuna can store
                if not isinstance(v, _PLAIN) or (isinstance(v, float) and not math.isfinite(v)):
                    raise SpaceError(f"space: {name!r}: choice {v!r} of type {type(v).__name__} cannot be "
                                     f"tuned (use None, bool, int, float or str)")
                v = _check_choice(name, v) if name in KNOWN else v
                if not any(type(v) is type(s) and v == s for s in seen):
                    seen.append(v)
            if not seen:
                raise SpaceError(f"space: {name!r} has no choices")
            out.append((name, tuple(seen)))
        return cls(tuple(out))

    @property
    def names(self) -> tuple[str, ...]:
        """The parameter names, in order."""
        return tuple(n for n, _ in self.params)

    def choices(self, name: str) -> tuple[Any, ...]:
        """The choices of ``name``."""
        return dict(self.params)[name]

    @property
    def size(self) -> int:
        """How many configurations the space holds."""
        return math.prod(len(c) for _, c in self.params)

    def configs(self) -> Iterator[dict[str, Any]]:
        """Every configuration, in ``itertools.product`` order."""
        for values in itertools.product(*(c for _, c in self.params)):
            yield dict(zip(self.names, values))

    def key(self, config: Mapping[str, Any]) -> tuple[int, ...]:
        """The configuration as indices into each parameter's choices (raises KeyError outside)."""
        out = []
        for name, choices in self.params:
            v = config[name]
            for i, c in enumerate(choices):
                if type(c) is type(v) and c == v:
                    out.append(i)
                    break
            else:
                raise KeyError(f"{name}={v!r} is not one of {list(choices)}")
        return tuple(out)

    def config(self, key: Sequence[int]) -> dict[str, Any]:
        """The configuration at ``key`` (indices)."""
        return {name: choices[i] for (name, choices), i in zip(self.params, key)}

    def contains(self, config: Mapping[str, Any]) -> bool:
        """Whether ``config`` names every parameter with one of its choices (and nothing else)."""
        if set(config) != set(self.names):
            return False
        try:
            self.key(config)
        except KeyError:
            return False
        return True

    def to_dict(self) -> dict[str, list[Any]]:
        """The space as a plain mapping."""
        return {n: list(c) for n, c in self.params}


def _counts(cores: int, pus: int) -> list[int]:
    """Team sizes worth trying: the divisors of the core count down to an eighth of it
    (at least 1), and every PU when cores have several."""
    low = max(1, cores // 8)
    out = {d for d in range(low, cores + 1) if cores % d == 0}
    if pus > cores:
        out.add(pus)
    return sorted(out)


def default_space(topology: Topology, *, instances: bool = False, tensorflow: bool = True) -> Space:
    """A space built from a machine: counts that divide its cores, PUs and packages.

    Parameters
    ----------
    topology : Topology
        The machine (its allowed PUs).
    instances : bool
        Include ``instances`` (processes on disjoint cores): only where the work
        splits between them (``affinity tune --split``, ``tune(work="split")``);
        copies of a job are not a faster job.  ``membind`` is included with several
        NUMA nodes either way.
    tensorflow : bool
        Include ``inter`` (TensorFlow's inter-op pool).

    Returns
    -------
    Space
        ``threads`` (per instance: divisors of the cores, all PUs), ``inter``
        (1, the packages, twice the packages), ``blocktime`` (0, 1, 200),
        ``affinity`` (none, compact, scatter), ``instances`` (divisors of the cores;
        with many, the powers of two and the node, package and per-package core
        counts) and ``membind`` (with several NUMA nodes).
    """
    allowed = topology.allowed
    cores = max(1, sum(1 for c in topology.cores if c.cpuset & allowed))
    pus = max(1, len(allowed))
    packages = max(1, sum(1 for p in topology.packages if p.cpuset & allowed))
    nodes = max(1, sum(1 for n in topology.numa_nodes if n.cpuset & allowed))
    space: dict[str, list[Any]] = {"threads": _counts(cores, pus)}
    if tensorflow:
        space["inter"] = sorted({1, packages, 2 * packages})
    space["blocktime"] = [0, 1, 200]
    space["affinity"] = ["none", "compact", "scatter"]
    if instances and cores > 1:
        ks = {k for k in range(1, cores + 1) if cores % k == 0}
        if len(ks) > 10:  # many divisors: powers of two and the machine's own counts
            ks = {k for k in ks if k & (k - 1) == 0} | {nodes, packages, cores // packages, cores}
        space["instances"] = sorted(k for k in ks if 1 <= k <= cores)
    if nodes > 1:
        space["membind"] = ["none", "local", "interleave"]
    return Space.of(space)


def parse_param(text: str) -> tuple[str, list[Any]]:
    """``NAME=v1,v2,...`` (``--param``) as (name, choices): integers and floats where the
    text is one, other words as strings.

    Parameters
    ----------
    text : str
        The option's value.

    Returns
    -------
    (str, list)

    Raises
    ------
    SpaceError
        No ``=``, an empty name or an empty choice.
    """
    name, sep, values = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise SpaceError(f"--param {text!r}: expected NAME=v1,v2,... (e.g. intra=14,28,56)")
    # a full KMP_AFFINITY string has commas of its own: affinity choices are separated by ';'
    parts = values.split(";") if name == "affinity" and ";" in values else values.split(",")
    if name == "affinity" and ";" not in values and any(p.strip() not in AFFINITY_TYPES for p in parts):
        parts = [values]
    out: list[Any] = []
    for raw in parts:
        v = raw.strip()
        if not v:
            raise SpaceError(f"--param {text!r}: empty choice")
        out.append(_word(v))
    return name, out


def _word(v: str) -> Any:
    try:
        return int(v)
    except ValueError:
        pass
    try:
        f = float(v)
    except ValueError:
        return v
    return f if math.isfinite(f) else v
