"""Seeded random inputs for the planner and the command line (issue 42, point 6).

The words come from each variable's grammar (the runtimes' keywords, numbers from 0
to past 2**32, sets, ranges, strides, exclusions) cut and mixed at random, with
blanks, signs and stray characters: values a shell or a job script plausibly
holds, not random bytes, which the parsers reject at their first character.
"""

from __future__ import annotations

import random
from typing import Any

NUMBERS = ["0", "1", "2", "3", "7", "8", "15", "64", "255", "1023", "8191", "8192", "32768", "65535",
           "2147483647", "2147483648", "4294967295", "4294967296", "99999999999", "-1", "+2", "0x10", "010",
           " 3", "3 ", "", "1k", "2m", "4b"]
AFF_WORDS = ["compact", "scatter", "balanced", "explicit", "none", "disabled", "logical", "physical",
             "verbose", "noverbose", "warnings", "nowarnings", "respect", "norespect", "duplicates",
             "noduplicates", "reset", "noreset", "granularity=fine", "granularity=thread", "granularity=core",
             "granularity=socket", "granularity=numa_domain", "granularity=tile", "granularity=die",
             "granularity=l2_cache", "granularity=core_type", "granularity=core_efficiency", "gran=fine",
             "granularity=", "granularity", "proclist", "proclist=", "type=compact", "x", "0", "1", "2",
             "2147483648", "4294967295"]
PLACE_NAMES = ["threads", "cores", "sockets", "numa_domains", "ll_caches", "tiles", "dice", "l2_caches",
               "l3_caches", "core_types", "core_effs", "cores:intel_core", "cores:intel_atom", "cores:eff0",
               "unknown"]
BINDS = ["true", "false", "close", "spread", "master", "primary", "intel", "disabled", "TRUE", "Close", "x"]
SUBSET = ["1s", "2s", "1c", "4c", "2t", "1n", "2n", "1d", "1T", "1L2", "2c@1", "1s@1", "*c", "2c:intel_core",
          "1c:eff0", "0c", "99999999999c", "1s,2c,1t", "1s@4294967295", "c", "@", "1s,1s"]


def _num(rng: random.Random) -> str:
    """Mostly an id the machines have (the parsers then go on to the next word), else an odd one."""
    return str(rng.randint(0, 15)) if rng.random() < 0.7 else rng.choice(NUMBERS)


def _idlist(rng: random.Random) -> str:
    items = []
    for _ in range(rng.randint(0, 4)):
        k = rng.random()
        if k < 0.4:
            items.append(_num(rng))
        elif k < 0.7:
            items.append(f"{_num(rng)}-{_num(rng)}")
        else:
            items.append("{" + ",".join(_num(rng) for _ in range(rng.randint(0, 3))) + "}")
    return ",".join(items)


def _place(rng: random.Random) -> str:
    k = rng.random()
    if k < 0.5:
        core = "{" + ",".join(_num(rng) for _ in range(rng.randint(0, 3))) + "}"
        if rng.random() < 0.3:
            core = "{" + f"{_num(rng)}:{_num(rng)}" + (f":{_num(rng)}" if rng.random() < 0.5 else "") + "}"
    elif k < 0.7:
        core = _num(rng)
    else:
        core = "!" + "{" + _num(rng) + "}"
    if rng.random() < 0.3:
        core += f":{_num(rng)}" + (f":{_num(rng)}" if rng.random() < 0.5 else "")
    return core


def kmp_affinity(rng: random.Random) -> str:
    if rng.random() < 0.2:  # a proclist with no type: OMP_PLACES and OMP_PROC_BIND still count
        return f"proclist=[{_idlist(rng)}]" + rng.choice(["", ",verbose", ",granularity=core", ",norespect"])
    words = rng.sample(AFF_WORDS, rng.randint(0, 4))
    if rng.random() < 0.35:
        words.insert(rng.randint(0, len(words)), f"proclist=[{_idlist(rng)}]")
    if rng.random() < 0.3:
        words.append(_num(rng))
    return rng.choice([",", ", ", " "]).join(words)


def omp_places(rng: random.Random) -> str:
    if rng.random() < 0.45:
        name = rng.choice(PLACE_NAMES)
        return name + (f"({_num(rng)})" if rng.random() < 0.4 else "")
    return ",".join(_place(rng) for _ in range(rng.randint(0, 4)))


VALUES = {
    "KMP_AFFINITY": kmp_affinity,
    "OMP_PLACES": omp_places,
    "OMP_PROC_BIND": lambda rng: ",".join(rng.choice(BINDS) for _ in range(rng.randint(1, 3))),
    "OMP_NUM_THREADS": lambda rng: ",".join(_num(rng) for _ in range(rng.randint(1, 3))),
    "KMP_HW_SUBSET": lambda rng: ",".join(rng.sample(SUBSET, rng.randint(1, 3))),
    "GOMP_CPU_AFFINITY": lambda rng: rng.choice([" ", ","]).join(
        rng.choice([_num(rng), f"{_num(rng)}-{_num(rng)}", f"{_num(rng)}-{_num(rng)}:{_num(rng)}"])
        for _ in range(rng.randint(1, 3))),
    "OMP_THREAD_LIMIT": _num,
    "KMP_DEVICE_THREAD_LIMIT": _num,
    "KMP_ALL_THREADS": _num,
}

TOPOLOGIES = ["pack:1 core:4 pu:1", "pack:2 core:2 pu:2", "pack:2 numa:2 core:2 pu:2", "pack:1 core:3 pu:4",
              "pack:2 l3:1 core:4 pu:2", "pack:4 core:2 pu:1(indexes=8*2:1*4)"]
RUNTIMES = ["intel", "llvm", "gnu"]


#: variables the runtimes weigh against each other (one makes them ignore or reread another)
RIVALS = ("KMP_AFFINITY", "OMP_PLACES", "OMP_PROC_BIND", "GOMP_CPU_AFFINITY")


def environment(rng: random.Random) -> dict[str, str]:
    """One to four of the variables the runtimes read, each a plausible value; a third
    of the time ``KMP_AFFINITY`` with some of its rivals."""
    if rng.random() < 0.35:
        names = ["KMP_AFFINITY", *rng.sample(RIVALS[1:], rng.randint(1, 3))]
    else:
        names = rng.sample(sorted(VALUES), rng.randint(1, 4))
    return {n: VALUES[n](rng) for n in names}


def mask(rng: random.Random, topology: Any) -> Any:
    """None, a subset of the machine's PUs (maybe empty or with ids it lacks), or text."""
    k = rng.random()
    pus = sorted(topology.cpuset)
    if k < 0.6:
        return None
    if k < 0.85:
        return frozenset(rng.sample(pus, rng.randint(1, len(pus))))
    return rng.choice(["0", "0-1", "1,3", "", "9999", "0-8191", "x", "-1"])


def plan_call(rng: random.Random, topologies: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A call of ``plan`` or ``plan_env``: its name and keyword arguments."""
    topo = topologies[rng.choice(TOPOLOGIES)]
    runtime = rng.choice(RUNTIMES)
    if rng.random() < 0.5:
        return "plan_env", {"env": environment(rng), "topology": topo, "initial_mask": mask(rng, topo),
                            "runtime": runtime}
    spec: Any = rng.choice([kmp_affinity(rng), " ".join(f"{k}={v}" for k, v in environment(rng).items()),
                            environment(rng), None])
    threads = rng.choice([None, None, 1, 2, 3, 5, 8, 64, 40000, 0, -1])
    return "plan", {"spec": spec, "threads": threads, "topology": topo, "strict": rng.random() < 0.5,
                    "initial_mask": mask(rng, topo), "runtime": runtime}


RUN_FLAGS = [["-t", "2"], ["-t", "99999999999"], ["--instances", "2"], ["--instances", "3"],
             ["--cores-per-instance", "1"], ["-C", "0-1"], ["-C", "!0-1"], ["-C", "+0"], ["-N", "0"],
             ["-m", "0"], ["--membind", "0"], ["--interleave", "all"], ["--localalloc"], ["--pin-threads"],
             ["--runtime", "gnu"], ["--runtime", "llvm"], ["--ranks", "2"], ["--blocktime", "0"],
             ["--blocktime", "x"], ["-v"], ["--json"]]
PLAN_FLAGS = [["-t", "3"], ["-t", "0"], ["--lenient"], ["--runtime", "gnu"], ["--runtime", "llvm"],
              ["--dataloader-workers", "3"], ["--dataloader-workers", "99999999999999999999"],
              ["--env", "OMP_PROC_BIND=spread"], ["--json"], ["--mask", "0-1"], ["--mask", "x"]]


def cli_words(rng: random.Random) -> list[str]:
    """The words of an ``affinity plan`` / ``affinity run --dry-run`` / ``affinity topology``
    command line, on a described machine (never this one: nothing is applied or started)."""
    topo = ["--topology", "synthetic:" + rng.choice(TOPOLOGIES)]
    spec = [kmp_affinity(rng)] if rng.random() < 0.6 else []
    if rng.random() < 0.2:
        spec = [" ".join(f"{k}={v}" for k, v in environment(rng).items())]
    kind = rng.random()
    if kind < 0.45:
        flags = [w for f in rng.sample(PLAN_FLAGS, rng.randint(0, 3)) for w in f]
        return ["plan", *spec, *flags, *topo]
    if kind < 0.9:
        flags = [w for f in rng.sample(RUN_FLAGS, rng.randint(0, 3)) for w in f]
        if "--json" in flags:
            flags.remove("--json")
        return ["run", *spec, "--dry-run", *flags, *topo, "--", "true"]
    return ["topology", *topo, *rng.choice([[], ["--json"]])]
