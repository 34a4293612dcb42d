"""Where data-loading worker processes go (PyTorch's DataLoader workers): pure.

Each worker is a process of its own that runs one intra-op thread (PyTorch sets
``torch.set_num_threads(1)`` in its workers); forked from a main thread whose
mask is one CPU, every worker would share that CPU (pytorch#82219, the most
reported pinning failure).  :func:`worker_layout` gives worker ``i`` a CPU set of
its own, in this order of preference:

1. **free cores**: cores of the allowed CPUs that the plan's compute threads do
   not use, one whole core per worker (its allowed PUs), when there are at
   least as many as workers;
2. **free PUs**: the allowed PUs the plan does not use (the SMT siblings of the
   compute threads' PUs, at ``granularity=fine``), one per worker, when there
   are at least as many as workers;
3. **shared**: the free PUs first, then the plan's compute slots from the last
   one backwards (slot 0 is the main thread's, which works hardest between
   batches), cycling when there are more workers than CPUs.  A worker then
   shares a CPU with a compute thread: by the layout, said in ``sharing``,
   never by inheriting one mask.
"""

from __future__ import annotations

from typing import Any

from ..cpulist import format_list
from ..errors import PlanError
from ..record import record

__all__ = ["MAX_WORKERS", "WorkerLayout", "worker_layout"]

#: the most DataLoader workers a layout is planned for: each is a process, and a layout
#: (one CPU set and one line each) grows with the count -- 10,000,000 took 14 s and 1.9 GB.
#: The most threads a runtime's team may have (``MAX_TEAM``) is the same number.
MAX_WORKERS = 32768


@record
class WorkerLayout:
    """The CPU set of each data-loading worker, and how it was chosen."""

    cpusets: tuple[frozenset[int], ...]
    kind: str  #: "free-cores", "free-pus" or "shared"
    sharing: tuple[int | None, ...]  #: per worker: the compute slot it shares, or None

    @property
    def workers(self) -> int:
        return len(self.cpusets)

    def describe(self) -> str:
        """One line per worker, as ``affinity plan --dataloader-workers K`` prints it."""
        head = {"free-cores": "each on a core the compute threads do not use",
                "free-pus": "each on a PU the compute threads do not use",
                "shared": "fewer free CPUs than workers: some share a compute thread's CPU"}[self.kind]
        lines = [f"{self.workers} DataLoader worker{'s' if self.workers != 1 else ''}, {head} "
                 f"(one intra-op thread each):"]
        for i, (s, shared) in enumerate(zip(self.cpusets, self.sharing)):
            also = f" (shared with compute slot {shared})" if shared is not None else ""
            lines.append(f"  worker {i} -> {{{format_list(s)}}}{also}")
        return "\n".join(lines)

    def shared_note(self) -> str | None:
        """A sentence naming the workers that share a compute thread's CPUs (None: none do)."""
        shared = [(i, j, s) for i, (s, j) in enumerate(zip(self.cpusets, self.sharing)) if j is not None]
        if not shared:
            return None
        return (f"{self.workers} DataLoader workers, fewer free CPUs than workers: "
                + ", ".join(f"worker {i} shares compute slot {j} ({{{format_list(s)}}})" for i, j, s in shared))

    def to_env_value(self) -> str:
        """The layout as one string, the sets separated by ``;`` (``AFFINITY_DATALOADER_CPUS``)."""
        return ";".join(format_list(s) for s in self.cpusets)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "cpusets": [sorted(s) for s in self.cpusets],
                "sharing": list(self.sharing)}


def _distinct_slots(plan: Any) -> list[frozenset[int]]:
    out: list[frozenset[int]] = []
    for s in plan.cpusets:
        if s not in out:
            out.append(s)
    return out


def worker_layout(plan: Any, workers: int, allowed: frozenset[int] | None = None) -> WorkerLayout:
    """The CPU set of each of ``workers`` data-loading workers beside ``plan``'s
    compute threads, within ``allowed`` (default: the plan's process mask,
    ``plan.initial_mask``: the workers are the process's children, and the CPUs of
    the cgroup around it may be another instance's) (see the module docstring for
    the order of preference).

    Raises
    ------
    PlanError
        ``workers`` is not a positive count, or more than :data:`MAX_WORKERS`.
    """
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise PlanError(f"worker_layout(workers={workers!r}): the number of DataLoader workers must be "
                        f"a positive integer")
    if workers > MAX_WORKERS:
        raise PlanError(f"{workers} DataLoader workers: at most {MAX_WORKERS} are planned (each is a process)")
    topo = plan.topology
    used = frozenset().union(*plan.cpusets)
    allowed = frozenset(allowed if allowed is not None else plan.initial_mask) or topo.allowed or topo.cpuset
    free = sorted(allowed - used)
    free_cores = [frozenset(c.cpuset & allowed) for c in topo.cores
                  if c.cpuset & allowed and not c.cpuset & used]
    if len(free_cores) >= workers:
        return WorkerLayout(tuple(free_cores[:workers]), "free-cores", (None,) * workers)
    if len(free) >= workers:
        return WorkerLayout(tuple(frozenset({c}) for c in free[:workers]), "free-pus", (None,) * workers)
    slots = _distinct_slots(plan)
    candidates: list[tuple[frozenset[int], int | None]] = [(frozenset({c}), None) for c in free]
    candidates += [(slots[j], j) for j in reversed(range(len(slots)))]
    picked = [candidates[i % len(candidates)] for i in range(workers)]
    return WorkerLayout(tuple(s for s, _ in picked), "shared", tuple(j for _, j in picked))
