"""Memory policies as values: their names, and NUMA node sets checked against a machine.

Pure (no system call): the one place where a policy name and its nodes are
validated, for :func:`affinity.apply` (``membind=``), :mod:`affinity.binding.numa`
and ``affinity run`` (``--membind``/``--interleave``/``--preferred``/``--localalloc``)
alike, so that each says the same thing about the same mistake.

=============  ============================================================
``bind``       allocate only on the given nodes (``MPOL_BIND``; ``numactl --membind``)
``preferred``  prefer the given nodes, fall back elsewhere (``numactl --preferred``)
``interleave`` round-robin pages over the nodes (``numactl --interleave``)
``local``      allocate on the node of the CPU that touches the page (first touch,
               the kernel default; ``numactl --localalloc``)
=============  ============================================================
"""

from __future__ import annotations

from collections.abc import Iterable

from ..cpulist import check_ids, format_list, parse_list
from ..errors import ArgumentTypeError, PlanError, SpecError, UsageError
from ..machine.topology import Topology
from ..record import record
from typing import Any


__all__ = ["POLICIES", "MemorySpec", "check_nodes", "membind_spec", "policy_name"]

POLICIES = ("bind", "preferred", "interleave", "local")
_ALIASES = {"membind": "bind", "firsttouch": "local", "first-touch": "local", "first_touch": "local",
            "localalloc": "local"}


@record
class MemorySpec:
    """A memory policy and its NUMA nodes (empty for ``local``)."""

    policy: str
    nodes: frozenset[int]

    def __str__(self) -> str:
        return self.policy if not self.nodes else f"{self.policy}:{format_list(self.nodes)}"


def policy_name(policy: str, *, default_ok: bool = True) -> str:
    """The canonical name of a memory policy (``firsttouch`` -> ``local``).

    Raises
    ------
    UsageError
        An unknown name, listing the known ones (a ``ValueError``).
    """
    p = _ALIASES.get(str(policy).lower(), str(policy).lower())
    if p not in POLICIES and not (default_ok and p == "default"):
        raise UsageError(f"unknown memory policy {policy!r}; expected one of {', '.join(POLICIES)}")
    return p


def check_nodes(nodes: Iterable[int], topology: Topology, what: str, *,
                allowed: Iterable[int] | None = None, policy: str = "bind") -> frozenset[int]:
    """Check NUMA node ids against a machine.

    Parameters
    ----------
    nodes : iterable of int
        OS indexes of NUMA nodes.
    topology : Topology
        The machine.
    what : str
        Names the input in the messages (``--membind 7``, ``membind=('bind', {7})``).
    allowed : iterable of int, optional
        The nodes this process may allocate on (``Mems_allowed``); default: all.
    policy : str
        ``local``/``default`` take no node; the others need at least one.

    Returns
    -------
    frozenset of int

    Raises
    ------
    PlanError
        A node the machine does not have, one the process may not use, or none
        where the policy needs some.
    """
    chosen = frozenset(int(n) for n in nodes)
    known = frozenset(n.os_index for n in topology.numa_nodes)
    if chosen and min(chosen) < 0:
        raise PlanError(f"{what}: negative NUMA node index in {sorted(chosen)}")
    missing = chosen - known
    if missing:
        raise PlanError(f"{what}: no NUMA node {format_list(missing)} on this machine "
                        f"(nodes: {format_list(known) or 'none known'})")
    if allowed is not None:
        forbidden = chosen - frozenset(allowed)
        if forbidden:
            raise PlanError(f"{what}: node {format_list(forbidden)} is not allowed to this process "
                            f"(Mems_allowed: {format_list(frozenset(allowed) & known)})")
    if not chosen and policy not in ("local", "default"):
        raise PlanError(f"{what}: memory policy {policy!r} needs at least one NUMA node")
    return chosen


def membind_spec(membind: Any, topology: Topology, cpus: Iterable[int]) -> MemorySpec | None:
    """Read :func:`affinity.apply`'s ``membind=`` argument for a plan on ``cpus``.

    Parameters
    ----------
    membind : None, False, True, "auto", str, (policy, nodes) or iterable of int
        ``None``/``False``: leave memory alone; ``True``/``"auto"``: bind to the
        nodes of ``cpus``; ``"policy[:nodes]"`` (``"bind:0-1"``, ``"interleave:all"``,
        ``"local"``; a policy alone means the nodes of ``cpus``); ``(policy,
        nodes)``; a set or list of node ids: bind to them.
    topology : Topology
        The machine the nodes are checked against.
    cpus : iterable of int
        The CPUs of the plan (for ``"auto"`` and a policy without nodes).

    Returns
    -------
    MemorySpec or None

    Raises
    ------
    PlanError
        Nodes the machine does not have (named, with the nodes it has).
    ValueError
        An unknown policy or a malformed node list.
    """
    if membind is None or membind is False:
        return None
    what = f"membind={membind!r}"
    cpus = frozenset(cpus)
    plan_nodes = frozenset(n.os_index for n in topology.numa_nodes if n.cpuset & cpus)
    if membind is True or membind == "auto":
        policy, nodes = "bind", plan_nodes
    elif isinstance(membind, tuple) and len(membind) == 2 and isinstance(membind[0], str):
        policy, nodes = policy_name(membind[0]), check_ids(membind[1], "node", where=what)
    elif isinstance(membind, str):
        policy, nodes = _from_text(membind, topology, plan_nodes)
    elif isinstance(membind, Iterable):
        policy, nodes = "bind", check_ids(membind, "node", where=what)
    else:
        raise ArgumentTypeError(f"{what}: expected 'auto', 'policy[:nodes]', (policy, nodes) or node ids, "
                                f"not {type(membind).__name__}")
    if policy in ("local", "default"):
        nodes = frozenset()
    return MemorySpec(policy, check_nodes(nodes, topology, what, policy=policy))


def _from_text(text: str, topology: Topology, plan_nodes: frozenset[int]) -> tuple[str, frozenset[int]]:
    pol, _, nodes_s = text.partition(":")
    policy = policy_name(pol)
    if not nodes_s:
        return policy, (frozenset() if policy in ("local", "default") else plan_nodes)
    if nodes_s == "all":
        return policy, frozenset(n.os_index for n in topology.numa_nodes)
    try:
        return policy, parse_list(nodes_s, "node")
    except SpecError as e:
        raise SpecError(f"membind={text!r}: {e}") from None
