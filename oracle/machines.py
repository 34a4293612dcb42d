"""Invented machines for differential tests of the planner.

Each machine is a list of hardware threads ``(os_proc, physical id, core id,
rank in core)`` plus its NUMA nodes (sysfs ``nodeN/cpulist``), chosen to
exercise the rules the shared golden data does not: more sockets, odd OS
numberings, SMT-4, sparse physical/core ids, offline CPUs, unequal cores per
package, sub-NUMA clustering, NUMA nodes spanning packages, sparse and
reversed NUMA ids, a KNL-like 68x4 part.

:func:`hwloc_xml` writes the same machine as an hwloc 2.x XML file (checked
with ``lstopo`` by ``golden_check.py`` when it is available).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .runtime import Machine

Hw = tuple[int, int, int, int]


def linux_style(S: int, C: int, T: int, core_ids: Sequence[int] | None = None,
                socket_ids: Sequence[int] | None = None) -> list[Hw]:
    """Linux/Xeon numbering: all first hw threads (socket-major), then all
    second ones, ... (siblings p, p+S*C, ...)."""
    cids = list(core_ids or range(C))
    sids = list(socket_ids or range(S))
    return [(t * S * C + s * C + c, sids[s], cids[c], t)
            for t in range(T) for s in range(S) for c in range(C)]


def adjacent(S: int, C: int, T: int, core_ids: Sequence[int] | None = None) -> list[Hw]:
    """Siblings numbered next to each other: core k = procs kT..kT+T-1."""
    cids = list(core_ids or range(C))
    return [((s * C + c) * T + t, s, cids[c], t) for s in range(S) for c in range(C) for t in range(T)]


def numa_by(hw: Sequence[Hw], f: Callable[[Hw], int | None]) -> dict[int, tuple[int, ...]]:
    d: dict[int, list[int]] = {}
    for h in hw:
        n = f(h)
        if n is not None:
            d.setdefault(n, []).append(h[0])
    return {k: tuple(sorted(v)) for k, v in sorted(d.items())}


def per_socket(hw: Sequence[Hw]) -> dict[int, tuple[int, ...]]:
    socks = sorted({h[1] for h in hw})
    return numa_by(hw, lambda h: socks.index(h[1]))


def _mk(name: str, desc: str, hw: Sequence[Hw], numa: dict[int, tuple[int, ...]] | None = None,
        masks: Sequence[str] = (), dies: dict[int, int] | None = None) -> Machine:
    hw = sorted(hw)
    assert len({h[0] for h in hw}) == len(hw), name
    return Machine(name, desc, tuple(hw), per_socket(hw) if numa is None else numa, tuple(masks),
                   dict(dies or {}))


def die_restarting(S: int, D: int, C: int, T: int, *, linux: bool) -> tuple[list[Hw], dict[int, int]]:
    """``S`` packages x ``D`` dies x ``C`` cores x ``T`` hw threads whose core ids
    restart at 0 in every die, as the kernel reports them on multi-die parts
    (``core id`` / ``topology/core_id`` relative to the die).  OS numbering:
    Linux style (``linux``: all first hw threads, die-major, then the second
    ones) or siblings adjacent.  Returns the hardware threads and each proc's die."""
    hw: list[Hw] = []
    die_of: dict[int, int] = {}
    n = S * D * C
    for s in range(S):
        for d in range(D):
            for c in range(C):
                for t in range(T):
                    core = (s * D + d) * C + c
                    p = t * n + core if linux else core * T + t
                    hw.append((p, s, c, t))
                    die_of[p] = d
    return hw, die_of


def all_machines() -> list[Machine]:
    ms: list[Machine] = []
    ms.append(_mk("x_8s4c1t", "8 sockets x 4 cores x 1 thread, Linux numbering", linux_style(8, 4, 1),
                  masks=["0-7,16-23", "3-20"]))
    ms.append(_mk("x_2s6c4t_smt4", "2 sockets x 6 cores x 4 hw threads (SMT-4), siblings adjacent",
                  adjacent(2, 6, 4), masks=["0-5,24-29", "1,2,5,6,9,10,13,14,17,18,21,22"]))
    hw = linux_style(2, 4, 2, core_ids=[0, 2, 5, 9], socket_ids=[0, 3])
    ms.append(_mk("x_2s4c2t_sparseids", "2 sockets (physical ids 0,3) x 4 cores (core ids 0,2,5,9) x 2 HT",
                  hw, masks=["0-5"]))
    hw = [h for h in linux_style(2, 4, 2) if h[0] not in (5, 14)]
    ms.append(_mk("x_2s4c2t_offline", "2 x 4 x 2 Linux numbering with CPUs 5 and 14 offline",
                  hw, masks=["0-3,8-13,15"]))
    hw = [(p, s, c, t) for (p, s, c, t) in linux_style(2, 6, 2) if not (s == 1 and c >= 4)]
    # renumber so that the OS ids are dense
    ids = sorted(h[0] for h in hw)
    hw = [(ids.index(p), s, c, t) for (p, s, c, t) in hw]
    ms.append(_mk("x_unequal_6c4c2t", "2 sockets with 6 and 4 cores x 2 HT", hw, masks=["0-7,10-17"]))
    hw = linux_style(2, 8, 2)
    ms.append(_mk("x_snc2_2s8c2t", "2 x 8 x 2 with sub-NUMA clustering: 2 NUMA nodes per socket",
                  hw, numa_by(hw, lambda h: 2 * h[1] + h[2] // 4), masks=["0-5,16-21", "4-11"]))
    ms.append(_mk("x_snc2rev_2s8c2t", "2 x 8 x 2, SNC-2 with NUMA ids in reverse order",
                  hw, numa_by(hw, lambda h: 3 - (2 * h[1] + h[2] // 4))))
    hw = linux_style(4, 4, 1)
    ms.append(_mk("x_4s4c_numa2", "4 sockets x 4 cores, 2 NUMA nodes each spanning 2 packages",
                  hw, numa_by(hw, lambda h: h[1] // 2), masks=["0-5"]))
    hw = linux_style(2, 4, 2)
    ms.append(_mk("x_2s4c2t_numa1", "2 x 4 x 2 with one NUMA node over both packages",
                  hw, numa_by(hw, lambda h: 0)))
    ms.append(_mk("x_2s4c2t_numa02", "2 x 4 x 2, NUMA node ids 0 and 2 (sparse)",
                  hw, numa_by(hw, lambda h: 2 * h[1])))
    ms.append(_mk("x_2s4c2t_numarev", "2 x 4 x 2, socket 0 on NUMA node 1, socket 1 on node 0",
                  hw, numa_by(hw, lambda h: 1 - h[1])))
    # round-robin numbering over sockets, siblings adjacent inside a socket
    hw = []
    for s in range(2):
        for c in range(4):
            for t in range(2):
                hw.append(((c * 2 + t) * 2 + s, s, c, t))
    ms.append(_mk("x_2s4c2t_roundrobin", "2 x 4 x 2, OS procs alternate between sockets", hw,
                  masks=["0-7"]))
    # AMD-like: core ids with gaps between CCXs, 4 NUMA nodes per socket (NPS4)
    hw = linux_style(2, 16, 2, core_ids=[0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23])
    ms.append(_mk("x_amd_2s16c2t_nps4", "2 sockets x 16 cores (core ids 0-7,16-23) x 2 HT, NPS4",
                  hw, numa_by(hw, lambda h: 4 * h[1] + [0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22,
                                                        23].index(h[2]) // 4), masks=["0-11,32-43"]))
    # socket 0 with SMT-2, socket 1 without SMT
    hw = [h for h in linux_style(2, 4, 2) if not (h[1] == 1 and h[3] == 1)]
    ms.append(_mk("x_mixed_smt", "2 sockets x 4 cores, socket 0 with 2 HT per core, socket 1 with 1",
                  hw, masks=["0-5,8-9"]))
    # KNL-like: 68 cores x 4 threads, one socket, flat mode MCDRAM node without CPUs
    hw = linux_style(1, 68, 4)
    numa = {0: tuple(sorted(h[0] for h in hw)), 1: ()}
    ms.append(_mk("x_knl_1s68c4t", "KNL-like 1 socket x 68 cores x 4 threads, flat mode (node 1 = MCDRAM)",
                  hw, numa, masks=["0-33,68-101"]))
    # core ids restarting in every die (the kernel's numbering on multi-die packages):
    # the runtime's cpuinfo method keys cores by (physical id, core id), so the
    # same-numbered cores of a package's dies are one core to it
    hw, dies = die_restarting(4, 2, 4, 2, linux=False)
    ms.append(_mk("x_die_4s2d2n2c2t", "4 packages x 2 dies x 2 NUMA nodes x 2 cores x 2 HT, core ids "
                  "restarting in every die (0-3), siblings adjacent", hw,
                  numa_by(hw, lambda h: h[0] // 4), masks=["0-15,32-39"], dies=dies))
    hw, dies = die_restarting(2, 2, 4, 2, linux=True)
    ms.append(_mk("x_die_2s2d4c2t", "2 packages x 2 dies x 4 cores x 2 HT, core ids restarting in every die, "
                  "Linux numbering, one NUMA node per package", hw, masks=["0-3,16-19", "0,4,8,12"], dies=dies))
    return ms


def machine(name: str) -> Machine:
    for m in all_machines():
        if m.name == name:
            return m
    raise KeyError(name)


def random_machine(seed: int) -> Machine:
    """A random machine for live differential tests: 1-3 packages with sparse
    physical ids, unequal core counts with sparse core ids, 1-4 hw threads per
    core (possibly different per package), one of several OS numberings, and
    NUMA nodes per package, inside packages (SNC), over all packages, or
    with sparse ids; some have offline CPUs (gaps in the OS ids).  Same
    seed, same machine."""
    import random
    r = random.Random(seed)
    n_sock = r.randint(1, 3)
    sock_ids = sorted(r.sample(range(0, 6), n_sock))
    rows: list[tuple[int, int, int]] = []  # (socket, core, rank)
    for s in sock_ids:
        ncores = r.randint(1, 5)
        core_ids = sorted(r.sample(range(0, 12), ncores))
        smt = r.choice([1, 2, 2, 4])
        rows.extend((s, c, t) for c in core_ids for t in range(smt))
    style = r.choice(["linux", "adjacent", "shuffled"])
    if style == "linux":
        order = sorted(rows, key=lambda x: (x[2], x[0], x[1]))
    elif style == "adjacent":
        order = sorted(rows)
    else:
        order = list(rows)
        r.shuffle(order)
    hw = [(i, s, c, t) for i, (s, c, t) in enumerate(order)]
    numa_style = r.choice(["socket", "snc", "one", "sparse"])
    if numa_style == "socket":
        numa = per_socket(hw)
    elif numa_style == "one":
        numa = numa_by(hw, lambda h: 0)
    elif numa_style == "sparse":
        numa = numa_by(hw, lambda h: 2 * sock_ids.index(h[1]))
    else:
        def snc(h: Hw) -> int:
            cores = sorted({x[2] for x in hw if x[1] == h[1]})
            half = 1 if cores.index(h[2]) >= (len(cores) + 1) // 2 else 0
            return 2 * sock_ids.index(h[1]) + half
        numa = numa_by(hw, snc)
    procs = [h[0] for h in hw]
    k = r.randint(1, len(procs))
    mask = sorted(r.sample(procs, k))
    # a quarter of the machines have offline CPUs: OS ids with gaps
    r2 = random.Random(seed * 7919 + 1)
    offline = r2.random() < 0.25
    if offline:
        ids = sorted(r2.sample(range(2 * len(procs)), len(procs)))
        hw = [(ids[p], s, c, t) for p, s, c, t in hw]
        numa = {n: tuple(ids[p] for p in cpus) for n, cpus in numa.items()}
        mask = [ids[p] for p in mask]
    return _mk("random_%d" % seed, "random machine %d: %s numbering, NUMA %s%s"
               % (seed, style, numa_style, ", offline CPUs" if offline else ""),
               hw, numa, masks=[",".join(map(str, mask))])


# ---------------------------------------------------------------------------
# hwloc XML
# ---------------------------------------------------------------------------

def _bitmap(cpus: Sequence[int] | set[int] | frozenset[int]) -> str:
    s = set(cpus)
    if not s:
        return "0x0"
    top = max(s) // 32
    words = []
    for w in range(top, -1, -1):
        v = 0
        for b in range(32):
            if w * 32 + b in s:
                v |= 1 << b
        words.append("0x%08x" % v)
    return ",".join(words)


def hwloc_xml(m: Machine) -> str | None:
    """The machine as an hwloc 2.x XML topology (``None`` when its NUMA nodes
    cannot be expressed as a tree: nodes cutting through cores)."""
    hw = m.hw_threads
    sockets = sorted({h[1] for h in hw})
    # a core is (package, die, core id): with dies, core ids repeat in every die
    cores: dict[tuple[int, int, int], list[int]] = {}
    for p, s, c, _t in hw:
        cores.setdefault((s, m.dies.get(p, 0), c), []).append(p)
    sock_cpus = {s: {p for p, s2, _c, _t in hw if s2 == s} for s in sockets}
    machine_cpus = {h[0] for h in hw}
    nodes = {n: set(c) for n, c in m.numa_nodes.items()}
    gp = [1]

    def attrs(typ: str, os_index: int | None, cpus: set[int], nodeset: set[int]) -> str:
        gp[0] += 1
        osx = f' os_index="{os_index}"' if os_index is not None else ""
        return (f'type="{typ}"{osx} cpuset="{_bitmap(cpus)}" complete_cpuset="{_bitmap(cpus)}" '
                f'nodeset="{_bitmap(nodeset)}" complete_nodeset="{_bitmap(nodeset)}" gp_index="{gp[0]}"')

    def local_nodes(cpus: set[int]) -> set[int]:
        return {n for n, c in nodes.items() if c & cpus}

    # where each NUMA node hangs: machine, package, or a group of cores / packages
    machine_nodes = [n for n, c in nodes.items() if not c or c == machine_cpus]
    pkg_nodes: dict[int, list[int]] = {}
    core_groups: dict[int, list[tuple[int, set[int]]]] = {}
    pkg_groups: list[tuple[int, set[int]]] = []
    for n, c in nodes.items():
        if not c or c == machine_cpus:
            continue
        in_pkg = [s for s in sockets if c <= sock_cpus[s]]
        if in_pkg:
            s = in_pkg[0]
            if c == sock_cpus[s]:
                pkg_nodes.setdefault(s, []).append(n)
            else:
                for (s2, _d, _c), pcs in cores.items():
                    if s2 == s and bool(set(pcs) & c) and not set(pcs) <= c:
                        return None
                die_ids = {m.dies[p] for p in c if p in m.dies}
                if len(die_ids) > 1:
                    return None  # a node over several dies of a package (not drawn)
                core_groups.setdefault(s, []).append((n, c))
        else:
            covered = [s for s in sockets if sock_cpus[s] & c]
            if any(not sock_cpus[s] <= c for s in covered):
                return None
            pkg_groups.append((n, c))
    out = ['<?xml version="1.0" encoding="UTF-8"?>', '<!DOCTYPE topology SYSTEM "hwloc2.dtd">',
           '<topology version="2.0">']
    out.append(f'  <object {attrs("Machine", 0, machine_cpus, set(nodes))}>')
    for n in sorted(machine_nodes):
        out.append(f'    <object {attrs("NUMANode", n, nodes[n], {n})} local_memory="1073741824"/>')

    def emit_core(key: tuple[int, int, int], ind: str) -> None:
        pcs = sorted(cores[key])
        out.append(f'{ind}<object {attrs("Core", key[2], set(pcs), local_nodes(set(pcs)))}>')
        for p in pcs:
            out.append(f'{ind}  <object {attrs("PU", p, {p}, local_nodes({p}))}/>')
        out.append(f"{ind}</object>")

    def emit_inside(cpus: set[int], groups: list[tuple[int, set[int]]], ind: str) -> None:
        """The NUMA groups and cores within ``cpus`` (a package or a die)."""
        done: set[tuple[int, int, int]] = set()
        for n, c in sorted(groups, key=lambda x: min(x[1])):
            if not c <= cpus:
                continue
            out.append(f'{ind}<object {attrs("Group", None, c, {n})} kind="1000" subkind="0">')
            out.append(f'{ind}  <object {attrs("NUMANode", n, nodes[n], {n})} local_memory="1073741824"/>')
            for key in sorted(cores, key=lambda k: min(cores[k])):
                if set(cores[key]) <= c:
                    emit_core(key, ind + "  ")
                    done.add(key)
            out.append(f"{ind}</object>")
        for key in sorted(cores, key=lambda k: min(cores[k])):
            if set(cores[key]) <= cpus and key not in done:
                emit_core(key, ind)

    def emit_package(s: int, ind: str) -> None:
        out.append(f'{ind}<object {attrs("Package", s, sock_cpus[s], local_nodes(sock_cpus[s]))}>')
        for n in pkg_nodes.get(s, []):
            out.append(f'{ind}  <object {attrs("NUMANode", n, nodes[n], {n})} local_memory="1073741824"/>')
        groups = core_groups.get(s, [])
        die_cpus: dict[int, set[int]] = {}
        for p in sock_cpus[s]:
            if p in m.dies:
                die_cpus.setdefault(m.dies[p], set()).add(p)
        for d, dc in sorted(die_cpus.items(), key=lambda x: min(x[1])):
            out.append(f'{ind}  <object {attrs("Die", d, dc, local_nodes(dc))}>')
            for n, c in groups:
                if c == dc:
                    out.append(f'{ind}    <object {attrs("NUMANode", n, nodes[n], {n})} local_memory="1073741824"/>')
            emit_inside(dc, [(n, c) for n, c in groups if c < dc], ind + "    ")
            out.append(f"{ind}  </object>")
        emit_inside(sock_cpus[s] - set().union(*die_cpus.values()), groups, ind + "  ")
        out.append(f"{ind}</object>")

    placed: set[int] = set()
    for n, c in sorted(pkg_groups, key=lambda x: min(x[1])):
        out.append(f'    <object {attrs("Group", None, c, {n})} kind="1000" subkind="0">')
        out.append(f'      <object {attrs("NUMANode", n, nodes[n], {n})} local_memory="1073741824"/>')
        for s in sorted(sockets, key=lambda s: min(sock_cpus[s])):
            if sock_cpus[s] <= c:
                emit_package(s, "      ")
                placed.add(s)
        out.append("    </object>")
    for s in sorted(sockets, key=lambda s: min(sock_cpus[s])):
        if s not in placed:
            emit_package(s, "    ")
    out.append("  </object>")
    out.append('  <support name="discovery.pu"/>')
    out.append('  <support name="discovery.numa"/>')
    out.append("</topology>")
    return "\n".join(out) + "\n"
