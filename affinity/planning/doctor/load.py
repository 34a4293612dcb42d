"""Checks of how many threads want the CPUs: more runnable threads than the CPUs
(and the CFS quota) allow, pools sized to the host instead of what the process may
use, two OpenMP runtimes in one process.  Pure functions of a
:class:`~affinity.planning.doctor.values.Snapshot`."""

from __future__ import annotations

from ...errors import AffinityError
from ...machine.cgroup import CpuQuota
from ..gnu.runtime import plan_gomp
from ..planner import plan_env
from .masks import run_line
from .values import RUNNABLE, Finding, LoadedLibrary, ProcessState, Snapshot, ThreadState, cpus_text

__all__ = ["capacity", "host_sized_pools", "oversubscribed", "two_runtimes"]

#: runnable threads are reported when together they want this many CPUs more than there are
_SLACK = 0.5


def _cpus(n: float) -> str:
    """``0.5 CPUs``, ``1 CPU``."""
    return f"{n:g} CPU{'' if n == 1 else 's'}"


def _worth(n: int) -> str:
    """``1 CPU's worth``, ``2 CPUs' worth``."""
    return f"{n} CPU's worth" if n == 1 else f"{n} CPUs' worth"


def capacity(cpus: frozenset[int], quota: CpuQuota | None) -> int:
    """How many threads ``cpus`` run at once under ``quota``: the CPUs, or fewer when
    the quota gives less time (``cpu.max 50000 100000`` on 2 CPUs: 1), at least 1."""
    n = len(cpus)
    if quota is not None:
        n = min(n, max(1, int(-(-quota.cpus // 1))))
    return max(1, n)


def _quota_of(procs: list[ProcessState]) -> CpuQuota | None:
    """The quota the processes share (one cgroup's), else None."""
    quotas = {p.quota for p in procs}
    if len(quotas) != 1:
        return None
    return next(iter(quotas))


# ------------------------------------------------------------------ runnable > CPUs
def oversubscribed(snap: Snapshot) -> list[Finding]:
    """More runnable threads than the CPUs they may run on can run at once (counting
    the CFS quota of their cgroup): each CPU is shared, each thread waits.

    The CPU sets looked at are each runnable thread's mask and the union of them all:
    for each, the runnable threads kept inside it against its capacity.  A thread is
    runnable when it ran or waited for a CPU at least half the time sampled
    (``schedstat``, throttled periods included); under a CFS quota, a cgroup throttled
    in at least half the periods sampled is one whose threads wanted more than it gives.

    What it cannot do: threads of processes that were not asked about are not
    counted (other users' load makes ours wait, but is not ours to fix)."""
    runnable = [(p, t) for p in snap.processes for t in p.runnable]
    if len(runnable) < 2:
        return []
    sets = {t.cpus for _, t in runnable} | {frozenset().union(*(t.cpus for _, t in runnable))}
    scored = []
    for cpus in sets:
        members = [(p, t) for p, t in runnable if t.cpus <= cpus]
        quota = _quota_of([p for p, _ in members])
        cap = capacity(cpus, quota)
        demand = sum(t.wanted if t.wanted is not None else 1.0 for _, t in members)
        if len(members) > cap and (demand > cap + _SLACK or (quota is not None and _mostly_throttled(members))):
            scored.append((demand / cap, len(cpus), cpus, members, cap, quota, demand))
    scored.sort(key=lambda s: (-s[0], s[1]))
    out, covered = [], set()
    for _, _, cpus, members, cap, quota, demand in scored:
        keys = {(p.pid, t.tid) for p, t in members}
        if keys <= covered:
            continue
        covered |= keys
        out.append(_oversubscribed_finding(snap, cpus, members, cap, quota, demand))
    return out


def _oversubscribed_finding(snap: Snapshot, cpus: frozenset[int], members: list[tuple[ProcessState, ThreadState]],
                            cap: int, quota: CpuQuota | None, demand: float) -> Finding:
    procs = list({p.pid: p for p, _ in members}.values())
    sampled = (f"each ran or waited for a CPU at least {RUNNABLE:.0%} of the {snap.interval:g} s sampled"
               if snap.interval else "runnable when read")
    ev = [f"{len(members)} runnable threads ({sampled}; together {demand:.1f} CPUs' worth) kept to "
          f"{cpus_text(cpus)}: {len(cpus)} CPU{'s' if len(cpus) != 1 else ''}"]
    if quota is not None:
        ev.append(f"CFS quota of {_cpus(quota.cpus)} ({quota.quota_us}/{quota.period_us} us, {quota.path}): "
                  f"{_worth(cap)} of time{_throttled(procs)}")
    waited = [t.waited for _, t in members if t.waited is not None]
    wanted = [t.wanted for _, t in members if t.wanted is not None]
    if waited and sum(wanted):
        ev.append(f"they waited for a CPU {sum(waited) / sum(wanted):.0%} of the time they wanted one")
    for p in procs:
        mine = [t for q, t in members if q is p]
        ev.append(f"{p.label()} {p.name}: {len(mine)} runnable: "
                  + ", ".join(f"{t.label()} on {cpus_text(t.cpus)}" for t in mine[:8])
                  + (f" and {len(mine) - 8} more" if len(mine) > 8 else ""))
    return Finding(kind="oversubscribed", severity="error", pids=tuple(p.pid for p in procs),
                   summary=f"{len(members)} runnable threads on {_worth(cap)} "
                       f"({cpus_text(cpus)}{', quota ' + format(quota.cpus, 'g') if quota else ''}): "
                       f"they take turns", evidence=tuple(ev), fix=_fewer_threads(procs, cap),
                   facts=(("cpus", cpus), ("capacity", cap), ("runnable", len(members)), ("demand", round(demand, 2)),
                       ("tids", tuple(t.tid for _, t in members))))


def _fewer_threads(procs: list[ProcessState], cap: int) -> str:
    """The fix: as many threads as run at once, over the processes."""
    if len(procs) == 1:
        return (f"{run_line(procs[0], f'--threads {cap}')}, or affinity.apply(threads={cap}) in the program "
                f"(OMP_NUM_THREADS={cap}, torch.set_num_threads({cap}))")
    if len({p.cmdline for p in procs}) == 1 and procs[0].cmdline:
        return f"{run_line(procs[0], f'--instances {len(procs)}')} (the CPUs divided, each copy sized to its share)"
    each = max(1, cap // len(procs))
    return "; ".join(run_line(p, f"--threads {each}") for p in procs[:4]) + f" ({cap} threads together, {each} each)"


def _mostly_throttled(members: list[tuple[ProcessState, ThreadState]]) -> bool:
    """The quota's cgroup was throttled in at least half the periods sampled: its threads
    wanted more CPU time than the quota gives (time throttled is neither run nor waited
    in ``schedstat``, so their demand alone reads low)."""
    t = next((p.throttled for p, _ in members if p.throttled is not None), None)
    return t is not None and t[0] > 0 and t[1] / t[0] >= 0.5


def _throttled(procs: list[ProcessState]) -> str:
    t = next((p.throttled for p in procs if p.throttled is not None), None)
    if t is None or not t[0]:
        return ""
    return f"; throttled in {t[1]} of the {t[0]} periods sampled ({t[1] / t[0]:.0%})"


# ------------------------------------------------------------------ pools
def _team(rt: LoadedLibrary, env: dict[str, str], snap: Snapshot, mask: frozenset[int]) -> int | None:
    """The team size runtime ``rt`` starts for ``env`` in a process whose mask is ``mask``."""
    try:
        if rt.family == "gnu":
            return plan_gomp(env, snap.topology, mask, build="torch" if rt.bundled_by == "torch" else "gcc12"
                             ).max_threads
        return plan_env(env, topology=snap.topology, initial_mask=mask, runtime=rt.family).threads
    except (AffinityError, KeyError, ValueError):
        return None


def _pools(p: ProcessState, snap: Snapshot) -> list[tuple[str, int, str]]:
    """(pool, size, why that size) of the pools process ``p`` runs or will run."""
    env, mask = p.env, (p.cpus & p.allowed) or p.allowed
    roles = [t.role for t in p.threads]
    out = []
    for rt in p.runtimes:
        n = _team(rt, env, snap, mask)
        if n is None:
            continue
        seen = sum(1 for r in roles if r in ("openmp", "torch-intra"))
        why = (f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']}" if "OMP_NUM_THREADS" in env
               else f"OMP_NUM_THREADS unset: one thread per CPU of its mask {cpus_text(mask)}")
        out.append((f"{rt.kind}'s OpenMP team{' (PyTorch intra-op)' if rt.bundled_by == 'torch' else ''}", n,
                    why + (f"; {seen} of its threads seen" if seen else "")))
    if any(r.startswith("tf-") for r in roles):
        for var, pool in (("TF_NUM_INTRAOP_THREADS", "TensorFlow intra-op pool"),
                          ("TF_NUM_INTEROP_THREADS", "TensorFlow inter-op pool")):
            size = int(env[var]) if env.get(var, "").isdigit() else len(mask)
            out.append((pool, size, f"{var}={env[var]}" if var in env else
                        f"{var} unset: one thread per CPU of its mask {cpus_text(mask)}"))
    for var in ("MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        if env.get(var, "").isdigit():
            out.append((f"BLAS pool ({var})", int(env[var]), f"{var}={env[var]}"))
    return out


def host_sized_pools(snap: Snapshot) -> list[Finding]:
    """Thread pools sized to more threads than the process's CPUs and quota run at
    once: sized from the mask (the host's CPUs in a container whose quota is
    smaller) or by a variable set for another machine.

    What it cannot do: a pool's size is what its runtime's rules give for the
    process's environment and mask (the planner's, for OpenMP), or what
    TensorFlow's defaults give; a program that sets its sizes in code
    (``torch.set_num_threads``) is not seen, only its threads."""
    host = len(snap.topology.cpuset)
    out = []
    for p in snap.processes:
        cap = capacity(p.allowed, p.quota)
        big = [(name, n, why) for name, n, why in _pools(p, snap) if n > cap]
        if not big:
            continue
        limit = (f"{_worth(cap)}: {len(p.allowed)} CPUs allowed"
                 + (f", CFS quota {_cpus(p.quota.cpus)} ({p.quota.path})" if p.quota else ""))
        ev = tuple(f"{name}: {n} threads ({why}){' = the host' + chr(39) + 's CPUs' if n == host else ''}"
                   for name, n, why in big) + (f"the process may run {limit}",)
        out.append(Finding(
            kind="host-sized-pool", severity="warning", pids=(p.pid,),
            summary=f"pid {p.pid}: {len(big)} pool{'s' if len(big) != 1 else ''} sized to "
            f"{max(n for _, n, _ in big)} threads where it may run {cap} at once", evidence=ev,
            fix=f"{run_line(p, f'--threads {cap}')} (sizes every pool to {cap}), or OMP_NUM_THREADS={cap} "
            f"(affinity.apply(threads={cap}) in the program)",
            facts=(("capacity", cap), ("pools", tuple((name, n) for name, n, _ in big)))))
    return out


# ------------------------------------------------------------------ two runtimes
def two_runtimes(snap: Snapshot) -> list[Finding]:
    """More than one OpenMP runtime in one process: each keeps a team of its own and
    reads the OMP_/KMP_ variables by its own rules (pytorch#98836: one of the teams
    ran 1 thread; together more threads than CPUs).  Processes that map the same
    runtimes (children forked with them: DataLoader workers) are one finding.

    What it cannot do: say which library loaded which runtime (only how, when
    ``LD_PRELOAD`` names one)."""
    groups: dict[tuple[str, ...], list[ProcessState]] = {}
    for p in snap.processes:
        if len(p.runtimes) >= 2:
            groups.setdefault(tuple(sorted(rt.path for rt in p.runtimes)), []).append(p)
    return [_runtimes_finding(procs) for procs in groups.values()]


def _runtimes_finding(procs: list[ProcessState]) -> Finding:
    p = procs[0]
    preload = p.env.get("LD_PRELOAD", "")
    ev = [f"{rt.kind} ({rt.family}) {rt.path}" + (f", bundled by {rt.bundled_by}" if rt.bundled_by else "")
          + (", preloaded (LD_PRELOAD)" if rt.path.rsplit("/", 1)[-1] in preload else "") for rt in p.runtimes]
    if len(procs) > 1:
        ev.append(f"the same in {', '.join(q.label() for q in procs[1:])}")
    preloaded = [rt for rt in p.runtimes if rt.path.rsplit("/", 1)[-1] in preload]
    if preloaded:
        fix = f"remove {preloaded[0].path} from LD_PRELOAD, so that one runtime runs every team"
    elif {"gnu", "intel"} <= {rt.family for rt in p.runtimes}:
        fix = ("keep one runtime: MKL_THREADING_LAYER=GNU (MKL on libgomp, as PyTorch), or uninstall the "
               "package that ships the other (pip uninstall intel-openmp)")
    else:
        fix = "keep one runtime: install the libraries built against the same OpenMP"
    who = f"pid {p.pid}" if len(procs) == 1 else "pids " + ", ".join(str(q.pid) for q in procs)
    return Finding(kind="two-openmp-runtimes", severity="error", pids=tuple(q.pid for q in procs),
                   summary=f"{who}: {len(p.runtimes)} OpenMP runtimes loaded "
                           f"({', '.join(rt.kind for rt in p.runtimes)}); each runs a team of its own",
                   evidence=tuple(ev), fix=fix,
                   facts=(("paths", tuple(rt.path for rt in p.runtimes)),))
