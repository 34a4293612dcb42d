"""NUMA memory policies, like ``numactl``, through the native core.

Linux memory policy is per thread and inherited by threads created later, so
bind memory *before* starting thread pools (or in a launcher).  Policies:

``bind``        allocate only on the given nodes (``MPOL_BIND``; ``numactl --membind``)
``preferred``   prefer the given nodes, fall back elsewhere (``numactl --preferred``)
``interleave``  round-robin pages over the nodes (``numactl --interleave``)
``local``       allocate on the node of the CPU that touches the page
                (first touch, the kernel default; ``numactl --localalloc``)
"""

from __future__ import annotations

import errno
from collections.abc import Iterable
from dataclasses import dataclass

from . import _native
from .cpulist import format_list
from .errors import UnsupportedError
from .threads import require_system
from .topology import Topology

__all__ = ["POLICIES", "MemPolicy", "area_location", "area_policy", "bind_area", "get_membind",
           "set_membind"]

POLICIES = ("bind", "preferred", "interleave", "local")


@dataclass(frozen=True)
class MemPolicy:
    """A memory policy read back from the kernel: ``policy`` and its ``nodes``
    (empty for ``default``/``local``)."""

    policy: str
    nodes: frozenset[int]

    def __str__(self) -> str:
        return self.policy if not self.nodes else f"{self.policy}:{format_list(self.nodes)}"


def _policy(policy: str) -> str:
    p = policy.lower()
    if p in ("firsttouch", "first-touch", "first_touch"):
        p = "local"
    if p not in POLICIES and p != "default":
        raise ValueError(f"unknown memory policy {policy!r}; expected one of {', '.join(POLICIES)}")
    return p


def _nodes(nodes: Iterable[int], policy: str) -> frozenset[int]:
    s = frozenset(int(n) for n in nodes)
    if policy in ("bind", "preferred", "interleave") and not s:
        raise ValueError(f"memory policy {policy!r} needs at least one NUMA node")
    if s and min(s) < 0:
        raise ValueError(f"negative NUMA node index in {sorted(s)}")
    return s


def get_membind() -> MemPolicy:
    """The calling thread's memory policy, as the kernel reports it."""
    pol, nodes = _native.get_mempolicy()
    return MemPolicy(pol, nodes if pol not in ("default", "local") else frozenset())


def set_membind(nodes: Iterable[int] = (), policy: str = "bind", *, scope: str = "thread",
                strict: bool = False, topology: Topology | None = None) -> MemPolicy:
    """Set the memory policy and return it read back.

    ``scope="thread"`` sets the calling thread's policy (threads it creates later
    inherit it).  ``scope="process"`` is the same call, accepted only while the
    process has a single thread: Linux cannot change the policy of other running
    threads, so a multi-threaded process gets :class:`UnsupportedError` (set the
    policy before starting threads, or launch with ``affinity run --membind``).
    ``strict=True`` fails (``EXDEV``) where the policy could only be approximated.
    """
    require_system(topology, "memory binding")
    pol = _policy(policy)
    ns = _nodes(nodes, pol)
    if scope not in ("thread", "process"):
        raise ValueError(f"scope must be 'thread' or 'process', not {scope!r}")
    if scope == "process":
        tids = _native.list_threads()
        if len(tids) > 1:
            raise UnsupportedError(
                f"set_membind(scope='process'): this process already runs {len(tids)} threads and "
                f"Linux memory policies are per thread; set the policy before starting threads, or "
                f"launch with 'affinity run --membind'", call="set_mempolicy", err=errno.ENOSYS)
    _native.set_membind(ns, pol, _native.MEMF_STRICT if strict else 0)
    return get_membind()


def bind_area(addr: int, length: int, nodes: Iterable[int], policy: str = "bind", *,
              migrate: bool = False, strict: bool = False) -> None:
    """Bind the memory area ``[addr, addr+length)`` to ``nodes`` (``mbind``).

    ``migrate=True`` also moves pages already allocated there."""
    pol = _policy(policy)
    ns = _nodes(nodes, pol)
    if length <= 0:
        raise ValueError(f"bind_area: length must be positive, got {length}")
    flags = (_native.MEMF_STRICT if strict else 0) | (_native.MEMF_MIGRATE if migrate else 0)
    _native.set_area_membind(addr, length, ns, pol, flags)


def area_policy(addr: int, length: int) -> MemPolicy:
    """The policy of a memory area (hwloc reports ``bind`` for bind and preferred)."""
    pol, nodes = _native.get_area_membind(addr, length)
    return MemPolicy(pol, nodes)


def area_location(addr: int, length: int) -> frozenset[int]:
    """The NUMA nodes where the (touched) pages of an area physically are."""
    return _native.get_area_memlocation(addr, length)
