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
from typing import Any

from ..machine import _native
from ..cpulist import check_ids, format_list
from ..errors import AccessDenied, BindError, UnsupportedError
from ..planning.memory import POLICIES, check_nodes, policy_name
from ..record import record
from .threads import require_system, task_ids
from ..machine.topology import Topology

__all__ = ["POLICIES", "REFUSED_WHY", "MemPolicy", "is_refused", "refused", "area_location", "area_policy", "array_nodes", "array_policy",
           "bind_area", "bind_array", "empty", "get_membind", "set_membind"]


@record
class MemPolicy:
    """A memory policy read back from the kernel: ``policy`` and its ``nodes``
    (empty for ``default``/``local``)."""

    policy: str
    nodes: frozenset[int]

    def __str__(self) -> str:
        return self.policy if not self.nodes else f"{self.policy}:{format_list(self.nodes)}"


def _checked(call: str, nodes: Iterable[int], policy: str) -> tuple[str, frozenset[int]]:
    """The policy's canonical name and its nodes: node ids as every id is read
    (:func:`affinity.cpulist.check_ids`: ints, not bools or floats, not a string),
    then checked against this machine (:func:`affinity.planning.memory.check_nodes`:
    the same messages as ``affinity run``)."""
    pol = policy_name(policy)
    ns = check_ids(nodes, "node", where=call)
    what = f"{call}(nodes={{{format_list(ns)}}}, policy={pol})"
    return pol, check_nodes(ns, Topology.from_system(), what, policy=pol)


#: Why a memory-policy call fails with EPERM where the kernel itself would allow it.
REFUSED_WHY = ("this container forbids NUMA memory policies (Docker's default seccomp profile allows "
               "set_mempolicy, get_mempolicy, mbind and set_mempolicy_home_node only with CAP_SYS_NICE)")
#: ... and with ENOSYS.
MISSING_WHY = "this kernel has no NUMA memory policies"


def refused(e: BindError, hint: str) -> BindError:
    """The error for a memory-policy call the system refused (``e``: AccessDenied or
    ENOSYS), saying why and what to do (``hint``); any other error unchanged."""
    if isinstance(e, AccessDenied):
        return AccessDenied(e.errno, e.call, e.argument, f"{REFUSED_WHY}; {hint}")
    if isinstance(e, UnsupportedError) and e.errno == errno.ENOSYS:
        return UnsupportedError(f"{e} ({MISSING_WHY}; {hint})", e.call, e.errno, e.argument)
    return e


def is_refused(e: BaseException) -> bool:
    """Whether ``e`` says the system refuses memory policies (EPERM in a container,
    ENOSYS on a kernel without NUMA), as opposed to a bad argument."""
    return isinstance(e, AccessDenied) or (isinstance(e, UnsupportedError) and e.errno == errno.ENOSYS)


_API_HINT = "start the container with --cap-add SYS_NICE, or leave memory alone (membind=None)"


def get_membind() -> MemPolicy:
    """The calling thread's memory policy, as the kernel reports it.

    Raises
    ------
    AccessDenied
        The container forbids reading it (Docker's default profile), saying so.
    """
    try:
        pol, nodes = _native.get_mempolicy()
    except BindError as e:
        raise refused(e, _API_HINT) from e
    return MemPolicy(pol, nodes if pol not in ("default", "local") else frozenset())


def set_membind(nodes: Iterable[int] = (), policy: str = "bind", *, scope: str = "thread",
                strict: bool = False, topology: Topology | None = None) -> MemPolicy:
    """Set the memory policy and return it read back.

    Parameters
    ----------
    nodes : iterable of int
        NUMA node OS indexes (none for ``local``): ints, not a string (``"0-1"`` is
        refused, as :func:`affinity.threads.set_affinity` refuses one for CPUs;
        :func:`affinity.cpulist.parse_list` reads a list's text).
    policy : {"bind", "preferred", "interleave", "local"}
        As numactl's ``--membind``, ``--preferred``, ``--interleave``, ``--localalloc``.
    scope : {"thread", "process"}
        ``"thread"`` sets the calling thread's policy (threads it creates later
        inherit it).  ``"process"`` is the same call, accepted only while the
        process has a single thread: Linux cannot change the policy of other
        running threads.
    strict : bool
        Fail (``EXDEV``) where the policy could only be approximated.
    topology : Topology, optional
        Must be this system's.

    Returns
    -------
    MemPolicy
        The calling thread's policy read back.

    Raises
    ------
    SpecError
        (a ``ValueError``) a node id that is not an int (a float, a bool), a negative
        or too large one, or a string for ``nodes``.
    PlanError
        (a ``ValueError``) a node this machine does not have, or no node for a
        policy that needs one.
    ValueError
        An unknown ``policy`` or ``scope``.
    UnsupportedError
        ``scope="process"`` in a multi-threaded process (set the policy before
        starting threads, or launch with ``affinity run --membind``).
    AccessDenied
        The kernel refused (EPERM in containers without CAP_SYS_NICE), saying so.
    BindError
        Another failure of the system call, named with its argument.
    """
    require_system(topology, "memory binding")
    pol, ns = _checked("set_membind", nodes, policy)
    if scope not in ("thread", "process"):
        raise ValueError(f"scope must be 'thread' or 'process', not {scope!r}")
    if scope == "process":
        tids = task_ids()
        if len(tids) > 1:
            raise UnsupportedError(
                f"set_membind(scope='process'): this process already runs {len(tids)} threads and "
                f"Linux memory policies are per thread; set the policy before starting threads, or "
                f"launch with 'affinity run --membind'", call="set_mempolicy", err=errno.ENOSYS)
    try:
        _native.set_membind(ns, pol, _native.MEMF_STRICT if strict else 0)
    except BindError as e:
        raise refused(e, _API_HINT) from e
    return get_membind()


def bind_area(addr: int, length: int, nodes: Iterable[int], policy: str = "bind", *,
              migrate: bool = False, strict: bool = False) -> None:
    """Bind the memory area ``[addr, addr+length)`` to ``nodes`` (``mbind``).

    ``migrate=True`` also moves pages already allocated there.  ``nodes`` is read
    as :func:`set_membind` reads it (:class:`SpecError`, :class:`PlanError`); a failed
    ``mbind`` is a :class:`BindError`."""
    pol, ns = _checked("bind_area", nodes, policy)
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


# ------------------------------------------------------------------ NumPy arrays
#
# An array's pages land where its memory policy says when they are first
# touched.  ``empty`` maps fresh anonymous memory, binds it before anything is
# written, then touches every page, so the placement is decided here and not by
# whichever thread happens to write first.  ``bind_array`` moves an existing
# array.  Both can be checked page by page with ``array_nodes`` (``move_pages``)
# and ``array_policy`` (``get_mempolicy`` with ``MPOL_F_ADDR``).

def _page_size() -> int:
    import mmap

    return mmap.PAGESIZE


def empty(shape: Any, dtype: Any = float, *, node: int | Iterable[int] | None = None,
          policy: str = "bind", order: str = "C", touch: bool = True) -> Any:
    """A new, uninitialised NumPy array whose pages are on NUMA ``node``.

    ``node`` is one node or several (``policy="interleave"`` spreads the pages over
    them; ``"preferred"`` falls back elsewhere when the node is full); ``None``
    leaves the memory to the calling thread's policy.  The memory is a private
    anonymous mapping owned by the array (freed with it), bound with ``mbind``
    before it is written; ``touch=True`` (default) faults every page in at once
    so the placement is fixed now.  Raises :class:`BindError` (``mbind`` named,
    e.g. EPERM in a container that forbids it) and ``ValueError`` for a bad node
    (:class:`SpecError`: not an int, or a string; :class:`PlanError`: not on this
    machine, as :func:`set_membind`).
    """
    import mmap

    import numpy as np

    dt = np.dtype(dtype)
    shape_t = (int(shape),) if np.ndim(shape) == 0 else tuple(int(s) for s in shape)
    count = 1
    for s in shape_t:
        if s < 0:
            raise ValueError(f"empty: negative dimension in shape {shape_t}")
        count *= s
    nbytes = count * dt.itemsize
    page = _page_size()
    length = max(page, -(-nbytes // page) * page)
    buf = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = np.frombuffer(buf, dtype=np.uint8)  # keeps ``buf`` alive as its base
    if node is not None:
        bind_area(raw.ctypes.data, length, _one_or_many(node), policy, strict=True)
    if touch:
        raw[::page] = 0  # one write per page: fault them in under the policy
    arr = raw[:nbytes].view(dt)
    return arr.reshape(shape_t, order=order)  # type: ignore[call-overload]


def _one_or_many(nodes: Any) -> Any:
    """``node=`` of :func:`empty` and :func:`bind_array`: one id (an ``int``, a NumPy
    integer: anything with ``__index__``) as a list of it, anything else as given
    (a string or a bool is refused by :func:`_checked`)."""
    return [nodes] if hasattr(type(nodes), "__index__") else nodes


def _span(arr: Any) -> tuple[int, int]:
    """The page-aligned ``(addr, length)`` covering an array's memory."""
    import numpy as np

    a = np.asarray(arr)
    if a.nbytes == 0:
        raise ValueError("array has no memory (size 0)")
    try:
        lo, hi = np.lib.array_utils.byte_bounds(a)  # numpy >= 2
    except AttributeError:
        lo, hi = np.byte_bounds(a)
    page = _page_size()
    start = lo - lo % page
    end = -(-hi // page) * page
    return start, end - start


def bind_array(arr: Any, nodes: int | Iterable[int], policy: str = "bind", *,
               migrate: bool = True, strict: bool = True) -> MemPolicy:
    """Bind the pages of ``arr`` to ``nodes`` and move the ones already elsewhere
    (``mbind`` with ``MPOL_MF_MOVE``; ``migrate=False`` only sets the policy for
    pages not yet touched).  Pages are whole: the first and last page may hold
    other data, which moves with them.  Returns the area's policy read back with
    ``get_mempolicy(MPOL_F_ADDR)``."""
    addr, length = _span(arr)
    bind_area(addr, length, _one_or_many(nodes), policy, migrate=migrate, strict=strict)
    return array_policy(arr)


def array_policy(arr: Any) -> MemPolicy:
    """The memory policy governing the first page of ``arr`` (its own area policy,
    else the calling thread's), read with ``get_mempolicy(MPOL_F_ADDR)``; unlike
    :func:`area_policy` it tells ``preferred`` from ``bind``."""
    addr, _ = _span(arr)
    pol, ns = _native.get_mempolicy_addr(addr)
    return MemPolicy(pol, ns if pol not in ("default", "local") else frozenset())


def array_nodes(arr: Any) -> dict[int, int]:
    """``{node: pages}`` for the pages of ``arr``, asked page by page with
    ``move_pages`` (no move).  Pages never touched are counted under
    ``-errno.ENOENT``; other negative keys are other per-page errors."""
    addr, length = _span(arr)
    page = _page_size()
    status = _native.move_pages([addr + i for i in range(0, length, page)])
    out: dict[int, int] = {}
    for s in status:
        out[s] = out.get(s, 0) + 1
    return out
