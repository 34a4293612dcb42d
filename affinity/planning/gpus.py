"""Each rank next to its GPU, as pure functions of the machine and the environment.

Three questions, three steps, each a function of plain values (no system call,
nothing read from the machine: the faces pass ``Topology.from_system()`` and
``os.environ``):

1. **Which GPUs does this process see, in which order?**
   :func:`visible_devices` reads the vendor's visibility variables with their
   documented meaning -- ``CUDA_VISIBLE_DEVICES`` (indices, ``GPU-`` UUIDs and
   their unique prefixes, ``MIG-GPU-<uuid>/..``), ``ROCR_VISIBLE_DEVICES`` then
   ``HIP_VISIBLE_DEVICES``, ``ZE_AFFINITY_MASK`` (``device`` or
   ``device.tile``, under ``ZE_FLAT_DEVICE_HIERARCHY``) -- and Slurm's GPU
   allocation (``SLURM_STEP_GPUS``, ``SLURM_JOB_GPUS``).
2. **Which one is this rank's?** :func:`rank_gpu`: an explicit ``gpu=``, else
   the rank's own when each rank sees one (``srun --gpus-per-task``, a wrapper
   that sets the variable per rank), else device ``local_rank`` as torchrun
   assigns it (``cuda:LOCAL_RANK``).
3. **Which CPUs and memory go with it?** :func:`mode_cpus` gives exactly the CPU
   set of ``torchrun --numa-binding=MODE`` (``node``, ``socket``, ``exclusive``,
   ``core-complex``; PyTorch 2.13's ``torch/numa/binding.py``) wherever torch
   gives one, and says (``differs_from_torch``) where torch would fail and what is
   done instead; :func:`gpu_binding` adds what torchrun lacks: the memory node(s),
   cores set aside for data loading, and the size of the rank's pools.

What cannot be known without the driver, and is assumed (each result says so in
its ``notes``): the order in which the driver numbers the GPUs.  CUDA's default
``CUDA_DEVICE_ORDER=FASTEST_FIRST`` orders by a speed heuristic only the driver
applies; with ``PCI_BUS_ID`` (what nvidia-smi, NVML and Slurm use) it is PCI bus
order.  PCI bus order is assumed for CUDA (exact with ``PCI_BUS_ID``, and for
GPUs that are all the same model), for ROCr and for Level Zero.  A MIG instance
named by its own ``MIG-<uuid>`` belongs to a GPU only the driver knows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ..cpulist import format_list
from ..errors import PlanError
from ..machine.gpus import GPU_VENDORS, Gpu, parse_bus_id
from ..machine.topology import Topology
from ..record import record

__all__ = ["GPU_BIND_MODES", "GPU_ENVIRONMENT", "GpuBinding", "GpuChoice", "GpuDevice", "ModeCpus", "Visibility",
           "far_from_gpu", "gpu_binding", "gpu_bindings", "mode_cpus", "rank_device", "rank_gpu", "visible_devices"]

#: torchrun's ``--numa-binding`` modes, in its words
GPU_BIND_MODES = ("node", "socket", "exclusive", "core-complex")
#: what :func:`gpu_binding` does with memory: bind to the nodes, prefer them, or leave it
MEMORY_POLICIES = ("bind", "preferred", "none")
#: vendor name -> the variables that choose its devices (what a result names as its inputs)
VISIBILITY_VARIABLES = {
    "NVIDIA": ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"),
    "AMD": ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"),
    "Intel": ("ZE_AFFINITY_MASK", "ZE_FLAT_DEVICE_HIERARCHY"),
}
SLURM_GPU_VARIABLES = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
#: every environment variable the GPU decision reads (what a cache of its answers must key on)
GPU_ENVIRONMENT = tuple(dict.fromkeys(
    [v for vs in VISIBILITY_VARIABLES.values() for v in vs] + list(SLURM_GPU_VARIABLES)
    + ["SLURM_GPUS_PER_TASK", "SLURM_GPUS_ON_NODE", "SLURMD_TRES_BIND", "TORCHELASTIC_RUN_ID", "LOCAL_WORLD_SIZE"]))


@record
class GpuDevice:
    """One device a GPU runtime enumerates: a GPU, or one tile of an Intel GPU that
    Level Zero shows as a device of its own (``ZE_FLAT_DEVICE_HIERARCHY=FLAT``)."""

    gpu: Gpu
    tile: int | None = None

    @property
    def name(self) -> str:
        """``0000:17:00.0`` or ``0000:17:00.0 tile 1``."""
        return self.gpu.bus_id + ("" if self.tile is None else f" tile {self.tile}")


@record
class Visibility:
    """The devices a process sees, device ordinal ``i`` being ``devices[i]``."""

    vendor: str  #: ``NVIDIA``, ``AMD`` or ``Intel``
    devices: tuple[GpuDevice, ...]
    #: the variables that decided, as ``NAME=VALUE`` (empty: none set, every GPU seen)
    variables: tuple[str, ...] = ()
    #: the devices of the whole step on this node when Slurm says them (the rank's
    #: peers when each rank sees only its own); ``()`` when not known
    step: tuple[GpuDevice, ...] = ()
    notes: tuple[str, ...] = ()  #: assumptions, said (the driver's device order, ...)


@record
class GpuChoice:
    """This rank's device, and the devices that share the node with it."""

    device: GpuDevice
    ordinal: int  #: its device ordinal in this process (``cuda:N``)
    peers: tuple[GpuDevice, ...]  #: the devices the node's CPUs are divided between (torch's ``range(device_count)``)
    peer_index: int  #: ``device``'s position in ``peers``
    per_rank: bool  #: each rank sees only its own device(s)
    notes: tuple[str, ...] = ()


@record
class ModeCpus:
    """The CPUs of one mode for one device (:func:`mode_cpus`)."""

    cpus: frozenset[int]
    #: the NUMA node whose CPUs (or, for a node without CPUs, whose neighbours') were taken
    node: int
    #: why ``torchrun --numa-binding`` would give no CPU set here (it raises), and so what
    #: this differs by; ``None``: torch gives exactly ``cpus``
    differs_from_torch: str | None = None
    notes: tuple[str, ...] = ()


@record
class GpuBinding:
    """Where one rank goes with its GPU: what :func:`gpu_binding` decides."""

    rank: int
    device: GpuDevice
    ordinal: int  #: the device ordinal in the rank's process (``cuda:N``)
    mode: str
    cpus: frozenset[int]  #: the rank's CPUs (its process mask): torchrun's set for the mode
    compute_cpus: frozenset[int]  #: where its OpenMP/PyTorch/TensorFlow pools go
    loader_cpus: frozenset[int]  #: the cores set aside for data loading (``reserve_cores``)
    threads: int  #: the pools' size: one thread per core of ``compute_cpus``
    node: int  #: the NUMA node the CPUs were taken from
    mem_nodes: frozenset[int]  #: where its memory goes (the nodes of ``cpus``, within the allowed mems)
    mempolicy: str | None  #: ``bind``, ``preferred``, or ``None`` (memory left as it is)
    differs_from_torch: str | None = None
    variables: tuple[str, ...] = ()  #: the inputs that chose the GPU (``CUDA_VISIBLE_DEVICES=0,1``, ``gpu=3``)
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        """``rank 0: GPU 0000:17:00.0 (cuda:0), node 0, cpus 0-13, memory bind 0``."""
        mem = f"memory {self.mempolicy} {format_list(self.mem_nodes)}" if self.mempolicy else "memory as it is"
        loader = f", loader cpus {format_list(self.loader_cpus)}" if self.loader_cpus else ""
        return (f"rank {self.rank}: GPU {self.device.name} (device {self.ordinal}), NUMA node {self.node}, "
                f"cpus {format_list(self.cpus)}{loader}, {self.threads} thread{'s' if self.threads != 1 else ''}, {mem}")

    def to_dict(self) -> dict[str, object]:
        g = self.device.gpu
        return {"rank": self.rank, "gpu": g.bus_id, "tile": self.device.tile, "vendor": g.vendor_name,
                "ordinal": self.ordinal, "gpu_numa_node": g.numa_node, "mode": self.mode,
                "cpus": format_list(self.cpus), "compute_cpus": format_list(self.compute_cpus),
                "loader_cpus": format_list(self.loader_cpus), "threads": self.threads, "node": self.node,
                "mem_nodes": format_list(self.mem_nodes), "mempolicy": self.mempolicy,
                "differs_from_torch": self.differs_from_torch, "variables": list(self.variables),
                "notes": list(self.notes)}


# ------------------------------------------------------------------ 1. visibility

def visible_devices(topology: Topology, environ: Mapping[str, str], *, vendor: str | None = None,
                    devices_constrained: bool | None = None) -> Visibility:
    """The devices this process sees, in its device order.

    Parameters
    ----------
    topology : Topology
        The machine, with its GPUs (:attr:`Topology.gpus`).
    environ : mapping
        The process's environment.
    vendor : str, optional
        ``"NVIDIA"``, ``"AMD"`` or ``"Intel"``; by default the only vendor of the
        machine's GPUs, else the one whose visibility variable is set, else the one
        with the most GPUs (said in ``notes``).
    devices_constrained : bool, optional
        Under Slurm: whether the step's device files are confined by cgroup
        (``ConstrainDevices=yes``), which makes ``CUDA_VISIBLE_DEVICES`` count from
        the step's first GPU instead of the node's.  ``None``: not known; the value
        is read both ways and refused only where the two readings name different GPUs.

    Returns
    -------
    Visibility

    Raises
    ------
    PlanError
        One line naming the input: no GPU on the machine, an index, UUID or bus id
        that names no GPU, a device listed twice, variables that contradict each
        other (``HIP_VISIBLE_DEVICES`` beyond what ``ROCR_VISIBLE_DEVICES`` leaves,
        ``CUDA_VISIBLE_DEVICES`` outside ``SLURM_STEP_GPUS``), a reading that
        depends on what cannot be known (UUIDs without the driver, a ``MIG-<uuid>``).
    """
    name, notes = _pick_vendor(topology, environ, vendor)
    base = tuple(g for g in topology.gpus if GPU_VENDORS.get(g.vendor) == name)
    if name == "Intel":
        vis = _intel_visible(base, environ)
    else:
        alloc = _slurm_alloc(environ, base)
        vis = (_nvidia_visible if name == "NVIDIA" else _amd_visible)(base, environ, alloc, devices_constrained)
        peers, said = _slurm_peers(environ, base, alloc)
        vis = Visibility(vis.vendor, vis.devices, vis.variables, tuple(GpuDevice(g) for g in peers),
                         vis.notes + tuple(said))
    return Visibility(vis.vendor, vis.devices, vis.variables, vis.step, tuple(notes) + vis.notes)


def _pick_vendor(topology: Topology, environ: Mapping[str, str], vendor: str | None) -> tuple[str, list[str]]:
    counts: dict[str, int] = {}
    for g in topology.gpus:
        name = GPU_VENDORS.get(g.vendor)
        if name:
            counts[name] = counts.get(name, 0) + 1
    if not counts:
        raise PlanError(f"no GPU on this machine ({topology.source or 'the topology'} lists no NVIDIA, AMD or "
                        f"Intel display controller)")
    if vendor is not None:
        chosen = next((v for v in GPU_VENDORS.values() if v.lower() == str(vendor).lower()), None)
        if chosen is None or chosen not in counts:
            have = ", ".join(f"{n} {v}" for v, n in counts.items())
            raise PlanError(f"vendor={vendor!r}: this machine's GPUs are {have}")
        return chosen, []
    if len(counts) == 1:
        return next(iter(counts)), []
    set_for = [v for v in counts if any(var in environ for var in VISIBILITY_VARIABLES[v][:1])]
    if len(set_for) == 1:
        return set_for[0], [f"GPUs of {len(counts)} vendors: {set_for[0]}'s, whose "
                            f"{VISIBILITY_VARIABLES[set_for[0]][0]} is set"]
    order = list(GPU_VENDORS.values())
    chosen = max(counts, key=lambda v: (counts[v], -order.index(v)))
    return chosen, [f"GPUs of {len(counts)} vendors ({', '.join(f'{n} {v}' for v, n in counts.items())}): "
                    f"{chosen}'s, the most (pass vendor= to choose)"]


def _names(names: Sequence[str]) -> str:
    """``a, b, c`` or, past four, ``a, b, c, ... z``."""
    return ", ".join(names) if len(names) <= 4 else f"{', '.join(names[:3])}, ... {names[-1]}"


def _devices_text(devices: Sequence[GpuDevice | Gpu]) -> str:
    return _names([d.name if isinstance(d, GpuDevice) else d.bus_id for d in devices])


def _slurm_gpus(var: str, environ: Mapping[str, str], base: Sequence[Gpu]) -> tuple[Gpu, ...] | None:
    """The GPUs of one of Slurm's lists (global ids on this node), ``None`` unset or empty."""
    value = environ.get(var)
    if value is None or not value.strip():
        return None
    picked = []
    for item in value.split(","):
        item = item.strip()
        if not item.isdigit():
            raise PlanError(f"{var}={value}: {item!r} is not a GPU index (Slurm writes the global ids "
                            f"of the GPUs it allocated, e.g. 0,1)")
        if int(item) >= len(base):
            raise PlanError(f"{var}={value}: no GPU {item} on this machine ({len(base)} GPUs: "
                            f"{_devices_text(base)})")
        picked.append(base[int(item)])
    return tuple(picked)


def _slurm_alloc(environ: Mapping[str, str], base: Sequence[Gpu]) -> tuple[str, tuple[Gpu, ...]] | None:
    """(``NAME=VALUE``, the GPUs) of Slurm's allocation on this node: the step's
    (``SLURM_STEP_GPUS``) else the job's (``SLURM_JOB_GPUS``), global GPU ids in
    Slurm's order -- NVML's, PCI bus order, when gres.conf auto-detects them."""
    for var in SLURM_GPU_VARIABLES:
        picked = _slurm_gpus(var, environ, base)
        if picked is not None:
            return f"{var}={environ[var]}", picked
    return None


def _slurm_peers(environ: Mapping[str, str], base: Sequence[Gpu],
                 alloc: tuple[str, tuple[Gpu, ...]] | None) -> tuple[tuple[Gpu, ...], list[str]]:
    """The GPUs of the whole step on this node, between which a node's CPUs are
    divided, and how that was read.  Where Slurm binds each task to GPUs of its own
    (``--gpus-per-task``: ``SLURMD_TRES_BIND=gpu:per_task:N``), ``SLURM_STEP_GPUS``
    names the task's GPUs only (Slurm 22.05, measured); the step's are then the job's
    (``SLURM_JOB_GPUS``, which a batch script passes on to its steps) when
    ``SLURM_GPUS_ON_NODE`` -- the step's count on this node -- says the step holds
    all of them.  Otherwise (srun outside a batch script, or a step of some of the
    job's GPUs) the other tasks' GPUs are not known, and the step's list is taken as
    it is."""
    if alloc is None:
        return (), []
    if not alloc[0].startswith("SLURM_STEP_GPUS="):
        return alloc[1], []
    job = _slurm_gpus("SLURM_JOB_GPUS", environ, base)
    count = environ.get("SLURM_GPUS_ON_NODE", "").strip()
    step = alloc[1]
    if job is None or not count.isdigit() or int(count) != len(job) or not set(step) < set(job):
        return step, []
    bind = environ.get("SLURMD_TRES_BIND", "")
    how = f" ({bind})" if bind else ""
    return job, [f"{alloc[0]} names this task's own GPU{'s' if len(step) > 1 else ''} (Slurm binds each task "
                 f"to its GPUs{how}); the step's {count} on this node are SLURM_JOB_GPUS="
                 f"{environ['SLURM_JOB_GPUS']}, as SLURM_GPUS_ON_NODE={count} says"]


def _order_note(base: Sequence[Gpu], environ: Mapping[str, str]) -> list[str]:
    """What CUDA_DEVICE_ORDER leaves unknown, said."""
    order = environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    if len(base) < 2 or order == "PCI_BUS_ID":
        return []
    models = {g.device for g in base}
    why = ("the GPUs are of one model, where its ties fall in PCI bus order" if len(models) == 1 else
           f"the GPUs are of {len(models)} models: the driver may number them otherwise; set "
           f"CUDA_DEVICE_ORDER=PCI_BUS_ID to be sure")
    shown = "unset" if "CUDA_DEVICE_ORDER" not in environ else f"={order}"
    return [f"CUDA_DEVICE_ORDER {shown}: CUDA numbers the GPUs fastest first, which only the driver can "
            f"tell; PCI bus order assumed ({why})"]


def _resolve_uuid(item: str, var: str, value: str, base: Sequence[Gpu], pool: Sequence[Gpu]) -> Gpu:
    """The GPU of ``pool`` whose UUID starts with ``item`` (a unique prefix, as CUDA
    and ROCr accept)."""
    if not base or any(g.uuid is None for g in base):
        raise PlanError(f"{var}={value}: {item} names a GPU by UUID, which this topology does not know (the "
                        f"NVIDIA kernel driver's /proc/driver/nvidia/gpus/*/information, amdgpu's unique_id or "
                        f"an hwloc XML with NVML/RSMI objects says them); use indices or gpu=BUS_ID")
    matches = [g for g in base if g.uuid is not None and g.uuid.lower().startswith(item.lower())]
    if len(matches) != 1:
        raise PlanError(f"{var}={value}: {item} {'matches no GPU' if not matches else 'is ambiguous'} "
                        f"({len(matches)} of {len(base)} GPUs' UUIDs start with it); CUDA would see only the "
                        f"GPUs listed before it")
    if matches[0] not in pool:
        raise PlanError(f"{var}={value}: {item} is GPU {matches[0].bus_id}, which is not among the GPUs this "
                        f"variable chooses from ({_devices_text(pool)})")
    return matches[0]


_MIG = re.compile(r"MIG-(GPU-[0-9a-fA-F-]+)/\d+/\d+")


def _entry(item: str, var: str, value: str, base: Sequence[Gpu], pool: Sequence[Gpu]) -> tuple[Gpu | None, str]:
    """One entry of an index-or-UUID list: (its GPU, a note), ``(None, note)`` for a
    negative index (CUDA and HIP read no further: ``-1`` alone hides every GPU)."""
    if re.fullmatch(r"\+?\d+", item):
        i = int(item)
        if i >= len(pool):
            raise PlanError(f"{var}={value}: no GPU {i} here ({len(pool)} to choose from: "
                            f"{_devices_text(pool) or 'none'}); the runtime would see only the GPUs listed "
                            f"before it")
        return pool[i], ""
    if re.fullmatch(r"-\d+", item):
        return None, f"{var}={value}: {item} ends the list (the runtime reads no further)"
    if item.upper().startswith("GPU-"):
        return _resolve_uuid(item, var, value, base, pool), ""
    m = _MIG.fullmatch(item)
    if m:
        gpu = _resolve_uuid(m.group(1), var, value, base, pool)
        return gpu, f"{var}: {item} is a MIG instance of GPU {gpu.bus_id}"
    if item.upper().startswith("MIG-"):
        raise PlanError(f"{var}={value}: {item} is a MIG instance named by its own UUID: which GPU holds it "
                        f"is known to the NVIDIA driver only; pass gpu=BUS_ID")
    raise PlanError(f"{var}={value}: {item!r} is not a device index, a GPU-<uuid> or a MIG-GPU-<uuid>/GI/CI "
                    f"(the forms the vendor documents; a PCI bus id is not one of them)")


def _id_list(var: str, value: str, base: Sequence[Gpu], pool: Sequence[Gpu]) -> tuple[tuple[Gpu, ...], list[str]]:
    """An index-or-UUID list read as CUDA and ROCm read it, each entry choosing from
    ``pool`` (``base``: every GPU of the vendor, for UUIDs); an empty value hides
    every GPU.  A list that the runtime would cut short (an entry naming no GPU, one
    listed twice, indices mixed with UUIDs) is refused: the job would silently see
    fewer GPUs than it names."""
    if not value.strip():
        return (), [f"{var} is empty: no GPU is visible"]
    out: list[Gpu] = []
    notes: list[str] = []
    kinds = set()
    for raw in value.split(","):
        item = raw.strip()
        gpu, note = _entry(item, var, value, base, pool)
        if note:
            notes.append(note)
        if gpu is None:
            break
        kinds.add("uuid" if item.upper().startswith(("GPU-", "MIG-")) else "index")
        if len(kinds) > 1:
            raise PlanError(f"{var}={value}: mixes indices and UUIDs; the runtime reads such a list only up to "
                            f"the first entry of the other kind")
        if gpu in out:
            raise PlanError(f"{var}={value}: GPU {gpu.bus_id} is listed twice ({item}); CUDA then sees no GPU "
                            f"at all")
        out.append(gpu)
    if sum(1 for n in notes if " MIG instance " in n) > 1:
        notes.append(f"{var}: CUDA enumerates a single MIG instance; only the first is seen")
        out = out[:1]
    return tuple(out), notes


def _first_level(var: str, value: str, base: tuple[Gpu, ...], alloc: tuple[str, tuple[Gpu, ...]] | None,
                 constrained: bool | None) -> tuple[tuple[Gpu, ...], list[str]]:
    """The first visibility variable read under Slurm's allocation: counting from the
    node's first GPU (devices not confined), from the step's (confined by cgroup), or
    both when that is not known and they agree."""
    if alloc is None:
        return _id_list(var, value, base, base)
    slurm_text, step = alloc
    readings: dict[bool, tuple[tuple[Gpu, ...], list[str]] | PlanError] = {}
    contradiction = None  # a reading that names a GPU outside Slurm's: said first when none is whole
    for confined in (True, False):
        if constrained is not None and constrained != confined:
            continue
        try:
            got = _id_list(var, value, base, step if confined else base)
        except PlanError as e:
            readings[confined] = e
            continue
        outside = [g for g in got[0] if g not in step]
        if outside:
            contradiction = readings[confined] = PlanError(
                f"{var}={value} and {slurm_text} contradict each other: {var} names GPU {outside[0].bus_id}, "
                f"outside the GPUs Slurm gave this step ({_devices_text(step)})")
        else:
            readings[confined] = got
    ok = {k: v for k, v in readings.items() if not isinstance(v, PlanError)}
    if not ok:
        raise contradiction or next(iter(readings.values()))  # type: ignore[misc]
    if len(ok) == 2 and ok[True][0] != ok[False][0]:
        raise PlanError(f"{var}={value} under {slurm_text}: GPU {_devices_text(ok[True][0])} if Slurm confines "
                        f"the step's devices (ConstrainDevices=yes: indices count from the step's first GPU), "
                        f"GPU {_devices_text(ok[False][0])} if not; pass devices_constrained= or gpu=BUS_ID")
    confined, (devs, notes) = next(iter(ok.items()))
    if len(ok) == 1 and constrained is None:
        notes = notes + [f"{var}={value} read {'from the step' if confined else 'from the node'}'s first GPU: "
                         f"the only reading that names GPUs of {slurm_text}"]
    return devs, notes


def _nvidia_visible(base: tuple[Gpu, ...], environ: Mapping[str, str],
                    alloc: tuple[str, tuple[Gpu, ...]] | None, constrained: bool | None) -> Visibility:
    notes = _order_note(base, environ)
    value = environ.get("CUDA_VISIBLE_DEVICES")
    variables = [f"CUDA_VISIBLE_DEVICES={value}"] if value is not None else []
    if "CUDA_DEVICE_ORDER" in environ:
        variables.append(f"CUDA_DEVICE_ORDER={environ['CUDA_DEVICE_ORDER']}")
    if alloc is not None:
        variables.append(alloc[0])
    if value is not None:
        devs, more = _first_level("CUDA_VISIBLE_DEVICES", value, base, alloc, constrained)
        notes += more
    elif alloc is not None and constrained is not False:
        devs = alloc[1]
        notes.append(f"CUDA_VISIBLE_DEVICES unset under {alloc[0]}: the step's GPUs (Slurm's device cgroup "
                     f"assumed to hide the others)")
    else:
        devs = base
    step = alloc[1] if alloc is not None else ()
    return Visibility("NVIDIA", tuple(GpuDevice(g) for g in devs), tuple(variables),
                      tuple(GpuDevice(g) for g in step), tuple(notes))


def _amd_visible(base: tuple[Gpu, ...], environ: Mapping[str, str],
                 alloc: tuple[str, tuple[Gpu, ...]] | None, constrained: bool | None) -> Visibility:
    """ROCr's list first (``ROCR_VISIBLE_DEVICES``), then HIP's indices into what it
    leaves (``HIP_VISIBLE_DEVICES``, or ``CUDA_VISIBLE_DEVICES`` when neither of the
    two is set), as torch composes them; PCI bus order assumed for ROCr's own."""
    notes = ["ROCr's device order is the driver's: PCI bus order assumed"] if len(base) > 1 else []
    rocr, hip = environ.get("ROCR_VISIBLE_DEVICES"), environ.get("HIP_VISIBLE_DEVICES")
    hip_var = "HIP_VISIBLE_DEVICES"
    if hip is None and rocr is None and "CUDA_VISIBLE_DEVICES" in environ:
        hip, hip_var = environ["CUDA_VISIBLE_DEVICES"], "CUDA_VISIBLE_DEVICES"
    elif hip is None and rocr is not None and "CUDA_VISIBLE_DEVICES" in environ:
        notes.append("CUDA_VISIBLE_DEVICES is not read: ROCR_VISIBLE_DEVICES is set and HIP_VISIBLE_DEVICES "
                     "is not (as torch reads them)")
    variables = [f"ROCR_VISIBLE_DEVICES={rocr}"] if rocr is not None else []
    variables += [f"{hip_var}={hip}"] if hip is not None else []
    variables += [alloc[0]] if alloc is not None else []
    level = base
    if rocr is not None:
        level, more = _first_level("ROCR_VISIBLE_DEVICES", rocr, base, alloc, constrained)
        notes += more
    if hip is not None:
        if rocr is not None:
            reach = [i for i in re.findall(r"\d+", hip) if int(i) >= len(level)]
            if reach and re.fullmatch(r"[\s\d,+]*", hip):
                raise PlanError(f"{hip_var}={hip} and ROCR_VISIBLE_DEVICES={rocr} contradict each other: HIP "
                                f"counts within the {len(level)} GPU(s) ROCr leaves, so {reach[0]} is none")
            level, more = _id_list(hip_var, hip, base, level)
        else:
            level, more = _first_level(hip_var, hip, base, alloc, constrained)
        notes += more
    step = alloc[1] if alloc is not None else ()
    return Visibility("AMD", tuple(GpuDevice(g) for g in level), tuple(variables),
                      tuple(GpuDevice(g) for g in step), tuple(notes))


def _intel_visible(base: tuple[Gpu, ...], environ: Mapping[str, str]) -> Visibility:
    """Level Zero's devices: each tile a device (``ZE_FLAT_DEVICE_HIERARCHY=FLAT``,
    the default, or ``COMBINED``) or each GPU one (``COMPOSITE``), chosen by
    ``ZE_AFFINITY_MASK`` (``N``: device N; ``N.M``: tile M of GPU N, COMPOSITE only).
    The mask selects, it does not reorder: the devices keep the driver's order (PCI
    bus order assumed), and in COMPOSITE a GPU chosen by two or more tiles is one device."""
    hier = environ.get("ZE_FLAT_DEVICE_HIERARCHY", "FLAT").strip().upper()
    notes = ["Level Zero's device order is the driver's: PCI bus order assumed"] if len(base) > 1 else []
    if hier not in ("FLAT", "COMPOSITE", "COMBINED"):
        notes.append(f"ZE_FLAT_DEVICE_HIERARCHY={environ['ZE_FLAT_DEVICE_HIERARCHY']} is not FLAT, COMPOSITE or "
                     f"COMBINED: read as FLAT, the default")
        hier = "FLAT"
    devices, more = _ze_devices(base, hier != "COMPOSITE")
    notes += more
    mask = environ.get("ZE_AFFINITY_MASK")
    variables = tuple(f"{k}={environ[k]}" for k in VISIBILITY_VARIABLES["Intel"] if k in environ)
    if mask is None:
        return Visibility("Intel", tuple(devices), variables, (), tuple(notes))
    chosen = _ze_mask(mask, hier, base, devices)
    order = _ze_order(chosen, hier != "COMPOSITE", base)
    if order != chosen:
        notes.append(f"ZE_AFFINITY_MASK={mask} selects devices; Level Zero keeps its own order")
    return Visibility("Intel", tuple(order), variables, (), tuple(notes))


def _ze_devices(base: tuple[Gpu, ...], flat: bool) -> tuple[list[GpuDevice], list[str]]:
    """Level Zero's devices before the mask: a GPU's tiles (FLAT), or the GPU."""
    devices: list[GpuDevice] = []
    for g in base:
        devices += [GpuDevice(g, t) for t in range(g.tiles)] if flat and g.tiles and g.tiles > 1 else [GpuDevice(g)]
    unknown = [g.bus_id for g in base if g.tiles is None]
    notes = []
    if flat and unknown:
        notes.append(f"the tiles of {_names(unknown)} are not known (the kernel driver lists none): each counted "
                     f"as one device")
    return devices, notes


def _ze_order(chosen: list[GpuDevice], flat: bool, base: tuple[Gpu, ...]) -> list[GpuDevice]:
    """The masked devices in the driver's order; in COMPOSITE a GPU chosen whole or by
    two of its tiles is the GPU."""
    key = lambda d: (d.gpu.logical_index, -1 if d.tile is None else d.tile)  # noqa: E731
    order = sorted(set(chosen), key=key)
    if flat:
        return order
    whole = {d.gpu for d in order if d.tile is None} | {g for g in base if sum(1 for d in order if d.gpu == g) > 1}
    return sorted([d for d in order if d.gpu not in whole] + [GpuDevice(g) for g in whole], key=key)


def _ze_mask(mask: str, hier: str, base: tuple[Gpu, ...], devices: list[GpuDevice]) -> list[GpuDevice]:
    chosen: list[GpuDevice] = []
    if not mask.strip():
        return chosen
    for raw in mask.split(","):
        item = raw.strip()
        m = re.fullmatch(r"(\d+)(?:\.(\d+))?", item)
        if m is None:
            raise PlanError(f"ZE_AFFINITY_MASK={mask}: {item!r} is not a device (N) or a device's tile (N.M)")
        d, t = int(m.group(1)), m.group(2)
        if hier != "COMPOSITE":
            if t is not None:
                raise PlanError(f"ZE_AFFINITY_MASK={mask}: {item} names a tile of a device, but with "
                                f"ZE_FLAT_DEVICE_HIERARCHY={hier} each tile is a device of its own (0 to "
                                f"{len(devices) - 1}); device.tile is COMPOSITE's form")
            if d >= len(devices):
                raise PlanError(f"ZE_AFFINITY_MASK={mask}: no device {d} ({len(devices)} devices in "
                                f"{hier} mode: {_devices_text(devices)})")
            chosen.append(devices[d])
            continue
        if d >= len(base):
            raise PlanError(f"ZE_AFFINITY_MASK={mask}: no GPU {d} ({len(base)} GPUs: {_devices_text(base)})")
        g = base[d]
        if t is not None and g.tiles is not None and int(t) >= g.tiles:
            raise PlanError(f"ZE_AFFINITY_MASK={mask}: GPU {d} ({g.bus_id}) has {g.tiles} tiles, no tile {t}")
        chosen.append(GpuDevice(g, None if t is None else int(t)))
    return chosen


# ------------------------------------------------------------------ 2. the rank's device

def _where(vis: Visibility) -> str:
    return ", ".join(vis.variables) if vis.variables else f"every {vis.vendor} GPU of the machine"


def _under_torchrun(environ: Mapping[str, str]) -> bool:
    """torchrun sets the visibility variables for the node, never per rank."""
    return "TORCHELASTIC_RUN_ID" in environ or "LOCAL_WORLD_SIZE" in environ


def rank_gpu(vis: Visibility, local_rank: int, *, local_size: int | None = None, gpu: int | str | None = None,
             environ: Mapping[str, str] | None = None) -> GpuChoice:
    """This rank's device among those it sees.

    * ``gpu`` given: that device -- an ordinal of this process (``3``), a PCI bus
      id (``0000:17:00.0``, or ``17:00.0`` in domain 0) or a ``GPU-`` UUID prefix;
    * the process sees one device, outside torchrun: it is the rank's own (``srun
      --gpus-per-task=1``, ``--gpu-bind=single:1``, a wrapper that sets
      ``CUDA_VISIBLE_DEVICES``/``ZE_AFFINITY_MASK`` per rank); so is the first of
      several when Slurm's step holds more GPUs than the rank sees and Slurm bound
      the tasks to GPUs (srun ``--gpus-per-task=N`` sets ``SLURMD_TRES_BIND=gpu:per_task:N``
      in each task; a batch script's ``SLURM_GPUS_PER_TASK`` passes on to its steps) or
      the rank sees fewer devices than the node has ranks;
    * else device ``local_rank``, as torchrun binds ``cuda:LOCAL_RANK``.

    The peers, between which ``exclusive`` and ``core-complex`` divide a node, are
    the devices the process sees (torch's ``range(device_count())``), or the
    step's when each rank sees its own and Slurm says the step's.

    Raises
    ------
    PlanError
        No device visible; ``gpu`` naming no device or one this process does not
        see; more ranks on the node (``local_size``) than devices visible, or a
        ``local_rank`` beyond them.
    """
    devices = vis.devices
    if not devices:
        raise PlanError(f"{_where(vis)}: no {vis.vendor} GPU is visible to this process")
    if gpu is not None:
        ordinal = _explicit(vis, gpu)
        return GpuChoice(device=devices[ordinal], ordinal=ordinal, peers=devices, peer_index=ordinal, per_rank=False,
                         notes=(f"gpu={gpu!r}: device {ordinal} of this process ({devices[ordinal].name})",))
    env = environ or {}
    # the step holds more GPUs than this task sees: Slurm bound tasks to GPUs (srun
    # --gpus-per-task), unless the task sees enough for every rank of the node, which
    # is a visibility narrowed for the whole node
    bound = "SLURM_GPUS_PER_TASK" in env or "per_task" in env.get("SLURMD_TRES_BIND", "")
    own_step = (bool(vis.step) and len(vis.step) > len(devices)
                and (bound or local_size is None or len(devices) < local_size))
    if (len(devices) == 1 and not _under_torchrun(env)) or own_step:
        device = devices[0]
        peers = vis.step if own_step and device in vis.step else devices
        notes = [f"{_where(vis)}: this process sees {len(devices)} device{'s' if len(devices) > 1 else ''} of "
                 f"its own; {device.name} is its GPU"]
        if peers == devices and (local_size or 1) > 1:
            notes.append("the other ranks' GPUs are not known here: exclusive and core-complex divide the node as "
                         "if this GPU were alone on it (as torchrun, seeing one device, does)")
        return GpuChoice(device=device, ordinal=0, peers=peers, peer_index=peers.index(device), per_rank=True,
                         notes=tuple(notes))
    if local_size is not None and local_size > len(devices):
        raise PlanError(f"{local_size} ranks on this node but {len(devices)} {vis.vendor} GPU"
                        f"{'s' if len(devices) > 1 else ''} visible ({_where(vis)}): more ranks than GPUs")
    if not 0 <= local_rank < len(devices):
        raise PlanError(f"local rank {local_rank}: {len(devices)} {vis.vendor} GPU"
                        f"{'s' if len(devices) > 1 else ''} visible ({_where(vis)}): more ranks than GPUs")
    return GpuChoice(devices[local_rank], local_rank, devices, local_rank, False)


def rank_device(topology: Topology, environ: Mapping[str, str], local_rank: int,
                local_size: int | None = None) -> tuple[GpuChoice, Visibility]:
    """The device a rank uses, from its environment alone: :func:`visible_devices`
    then :func:`rank_gpu` (what ``affinity show --ranks`` says of a rank of any job:
    the device its runtime numbers ``cuda:LOCAL_RANK``, or its own where it sees one).
    What it cannot know: a device the program chose otherwise (``torch.cuda.set_device(3)``).
    Raises :class:`PlanError` as those two do."""
    vis = visible_devices(topology, environ)
    return rank_gpu(vis, local_rank, local_size=local_size, environ=environ), vis


def far_from_gpu(topology: Topology, gpu: Gpu, cpus: frozenset[int]) -> str | None:
    """A sentence when some of ``cpus`` are not next to ``gpu`` -- outside the CPUs
    of its NUMA node (for a node without CPUs, those hwloc places next to it), or of
    its ``local_cpulist`` when the firmware names no node -- ``None`` when all are,
    or when where the GPU is cannot be known."""
    node = next((n for n in topology.numa_nodes if n.os_index == gpu.numa_node), None)
    near = node.cpuset if node is not None and node.cpuset else gpu.local_cpus
    if not near or not cpus:
        return None
    far = cpus - near
    if not far:
        return None
    where = f"NUMA node {gpu.numa_node}" if node is not None else "its local CPUs"
    return (f"cpu{'s' if len(far) > 1 else ''} {format_list(far)} {'are' if len(far) > 1 else 'is'} not next to "
            f"GPU {gpu.bus_id} ({where}: cpus {format_list(near)})")


def _explicit(vis: Visibility, gpu: int | str) -> int:
    """The ordinal of the device ``gpu`` names (see :func:`rank_gpu`)."""
    devices = vis.devices
    if isinstance(gpu, bool) or not isinstance(gpu, (int, str)):
        raise PlanError(f"gpu={gpu!r}: expected a device ordinal, a PCI bus id or a GPU- UUID")
    text = str(gpu).strip()
    if isinstance(gpu, int) or text.isdigit():
        i = int(text)
        if not 0 <= i < len(devices):
            raise PlanError(f"gpu={gpu!r}: this process sees {len(devices)} device{'s' if len(devices) > 1 else ''} "
                            f"({_where(vis)}): 0 to {len(devices) - 1}")
        return i
    key = parse_bus_id(text) or parse_bus_id(f"0000:{text}")
    if key is not None:
        matches = [i for i, d in enumerate(devices) if d.gpu.order_key == key]
    elif text.upper().startswith("GPU-"):
        matches = [i for i, d in enumerate(devices) if (d.gpu.uuid or "").lower().startswith(text.lower())]
    else:
        raise PlanError(f"gpu={gpu!r}: expected a device ordinal, a PCI bus id (0000:17:00.0) or a GPU- UUID")
    if len({devices[i].gpu for i in matches}) > 1:
        raise PlanError(f"gpu={gpu!r} is ambiguous: it matches {_devices_text([devices[i] for i in matches])}")
    if not matches:
        raise PlanError(f"gpu={gpu!r} is none of the GPUs this process sees ({_where(vis)}: "
                        f"{_devices_text(devices)})")
    return matches[0]


# ------------------------------------------------------------------ 3. torchrun's modes

class _Nodes:
    """The machine as torch's binding reads sysfs: each NUMA node's own CPUs (its
    ``cpulist``: the PUs the topology places on it), within ``allowed``."""

    def __init__(self, topology: Topology, allowed: frozenset[int]):
        self.topology = topology
        self.allowed = allowed
        own: dict[int, set[int]] = {n.os_index: set() for n in topology.numa_nodes}
        for pu in topology.pus:
            if pu.numa is not None:
                own[topology.numa_nodes[pu.numa].os_index].add(pu.os_index)
        self.own = {n: frozenset(c) for n, c in own.items()}
        self.usable = {n: c & allowed for n, c in self.own.items()}
        self.by_os = {n.os_index: n for n in topology.numa_nodes}

    def effective(self, gpu: Gpu) -> int:
        """The node torch takes for ``gpu``: its ``numa_node``, node 0 for ``-1``."""
        return max(gpu.numa_node, 0)

    def node_of_cpu(self, cpu: int) -> int | None:
        n = self.topology.pu(cpu).numa
        return None if n is None else self.topology.numa_nodes[n].os_index

    def domain(self, gpu: Gpu) -> tuple[int, frozenset[int], str | None, list[str]]:
        """(the node, the CPUs the modes divide, why torch fails, notes) for ``gpu``."""
        notes: list[str] = []
        node = self.effective(gpu)
        if not self.own:  # a source without NUMA nodes: the machine is node 0
            return 0, self.allowed, "no NUMA node is known (torch reads node0/cpulist)", [
                "the topology knows no NUMA node: the machine taken as node 0"]
        if gpu.numa_node < 0:
            notes.append(f"GPU {gpu.bus_id}: numa_node -1 (the firmware gave none): NUMA node 0 assumed, as "
                         f"torchrun does (its local CPUs: {format_list(gpu.local_cpus) or 'not known'})")
        if node not in self.own:
            raise PlanError(f"GPU {gpu.bus_id}: NUMA node {node} is no node of this machine (nodes "
                            f"{format_list(self.own)}); torchrun fails here too")
        if self.usable[node]:
            return node, self.usable[node], None, notes
        if self.own[node]:
            raise PlanError(f"GPU {gpu.bus_id} is on NUMA node {node}, whose CPUs {format_list(self.own[node])} are "
                            f"all outside the allowed CPUs {format_list(self.allowed)} (the cgroup's or the "
                            f"process mask); run this rank where node {node} is allowed, or choose its GPU with gpu=")
        near = self.by_os[node].cpuset & self.allowed  # hwloc's locality of a node without CPUs
        if not near:
            raise PlanError(f"GPU {gpu.bus_id} is on NUMA node {node}, which has no CPUs, and no allowed CPU is "
                            f"known to be near it; choose the rank's CPUs otherwise")
        notes.append(f"GPU {gpu.bus_id}: NUMA node {node} has no CPUs: the allowed CPUs next to it "
                     f"({format_list(near)}, nodes {format_list({self.node_of_cpu(c) for c in near} - {None})})")
        return node, near, f"NUMA node {node} of GPU {gpu.bus_id} has no CPUs (torch finds none to bind to)", notes

    def socket(self, cpus: frozenset[int]) -> tuple[frozenset[int], str | None]:
        """torch's ``socket``: every node whose first allowed CPU is in the package of
        the domain's first CPU; a node without allowed CPUs is left out, where
        torch fails reading one (it reads every node the kernel lists)."""
        package = self.topology.package_of(min(cpus)).os_index
        out = set(cpus)
        empty = []
        for node, usable in sorted(self.usable.items()):
            if not usable:
                empty.append(node)
            elif self.topology.package_of(min(usable)).os_index == package:
                out |= usable
        why = None
        if empty:
            why = (f"NUMA node{'s' if len(empty) > 1 else ''} {format_list(empty)} "
                   f"{'have' if len(empty) > 1 else 'has'} no allowed CPU (torch's socket mode reads one from "
                   f"every node and fails)")
        return frozenset(out), why

    def exclusive(self, cpus: frozenset[int], node: int, peers: list[str], rel: int) -> frozenset[int]:
        """torch's ``exclusive``: the node's allowed physical cores (each keyed by its
        first CPU, siblings outside ``allowed`` included) cut in ``len(peers)``
        consecutive runs, the first ``cores % len(peers)`` one core longer."""
        cores: dict[int, set[int]] = {}
        for c in cpus:
            cores.setdefault(min(self.topology.core_of(c).cpuset), set()).add(c)
        keys = sorted(cores)
        per, extra = divmod(len(keys), len(peers))
        if per < 1:
            raise PlanError(f"gpu_bind='exclusive': NUMA node {node} has {len(keys)} allowed core"
                            f"{'s' if len(keys) != 1 else ''} for its {len(peers)} GPUs ({_names(peers)}): "
                            f"fewer than one each (torchrun fails here too); use 'node' or 'socket'")
        start = rel * per + min(rel, extra)
        end = start + per + (1 if rel < extra else 0)
        return frozenset(c for k in keys[start:end] for c in cores[k])

    def core_complex(self, cpus: frozenset[int], node: int, rel: int) -> frozenset[int]:
        """torch's ``core-complex``: the node's allowed CPUs grouped by the
        highest-level cache each CPU has (keyed by its first CPU), the groups ordered
        by size (largest first) then key; device ``rel`` of the node takes group
        ``rel % groups``."""
        top: dict[int, tuple[int, int]] = {}
        for cache in self.topology.caches:
            key = min(cache.cpuset)
            for c in cache.cpuset & cpus:
                if top.get(c, (-1, 0))[0] < cache.level:
                    top[c] = (cache.level, key)
        missing = cpus - top.keys()
        if missing:
            raise PlanError(f"gpu_bind='core-complex': CPU{'s' if len(missing) > 1 else ''} "
                            f"{format_list(missing)} of NUMA node {node} report no cache, so no core complex "
                            f"is known (torchrun fails here too); use 'node' or 'exclusive'")
        groups: dict[int, set[int]] = {}
        for c in cpus:
            groups.setdefault(top[c][1], set()).add(c)
        ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        return frozenset(ordered[rel % len(ordered)][1])


def mode_cpus(topology: Topology, devices: Sequence[GpuDevice | Gpu], index: int, mode: str, *,
              allowed: frozenset[int] | None = None) -> ModeCpus:
    """The CPUs ``torchrun --numa-binding=MODE`` gives device ``index`` of
    ``devices`` (the devices the process sees, in order: torch's
    ``range(torch.cuda.device_count())``), from PyTorch 2.13's rules:

    * ``node``: the allowed CPUs of the GPU's NUMA node (node 0 when the kernel
      gives ``-1``, as torch takes it);
    * ``socket``: the allowed CPUs of every node whose first allowed CPU is in the
      package of the GPU node's first allowed CPU;
    * ``exclusive``: the node's allowed physical cores divided between the devices
      on that node, in device order, the lowest getting one more where it does not
      divide evenly;
    * ``core-complex``: one group of CPUs sharing their highest-level cache,
      largest groups first, device ``k`` of the node taking group ``k % groups``.

    Where torch raises instead, this says why in ``differs_from_torch`` and gives
    what it can: a GPU on a node without CPUs gets the allowed CPUs hwloc places
    next to that node; ``socket`` leaves out nodes without allowed CPUs.

    Raises
    ------
    PlanError
        An unknown mode; a GPU whose node has CPUs but none allowed; ``exclusive``
        with fewer allowed cores than GPUs on the node; ``core-complex`` on CPUs
        that report no cache.  torchrun fails in each of these too.
    """
    if mode not in GPU_BIND_MODES:
        raise PlanError(f"gpu_bind={mode!r}: expected one of {', '.join(GPU_BIND_MODES)} (torchrun's "
                        f"--numa-binding modes)")
    devs = [d if isinstance(d, GpuDevice) else GpuDevice(d) for d in devices]
    if not 0 <= index < len(devs):
        raise PlanError(f"device {index}: {len(devs)} devices given")
    nodes = _Nodes(topology, topology.allowed if allowed is None else frozenset(allowed) & topology.cpuset)
    node, cpus, why, notes = nodes.domain(devs[index].gpu)
    if mode == "socket":
        cpus, socket_why = nodes.socket(cpus)
        why = why or socket_why
    elif mode != "node":
        peers = [i for i, d in enumerate(devs) if nodes.effective(d.gpu) == node]
        rel = peers.index(index)
        if mode == "exclusive":
            cpus = nodes.exclusive(cpus, node, [devs[i].name for i in peers], rel)
        else:
            cpus = nodes.core_complex(cpus, node, rel)
    return ModeCpus(cpus, node, why, tuple(notes))


# ------------------------------------------------------------------ what torchrun lacks

def gpu_binding(topology: Topology, mode: str, *, environ: Mapping[str, str] | None = None, local_rank: int = 0,
                local_size: int | None = None, gpu: int | str | None = None, vendor: str | None = None,
                allowed: frozenset[int] | None = None, memory: str = "bind",
                mems_allowed: frozenset[int] | None = None, reserve_cores: int = 0,
                devices_constrained: bool | None = None) -> GpuBinding:
    """Where local rank ``local_rank`` goes with its GPU: the decision, whole.

    :func:`visible_devices` then :func:`rank_gpu` choose the device;
    :func:`mode_cpus` gives torchrun's CPUs for ``mode``; then what torchrun does
    not do: ``memory`` (``"bind"``, ``"preferred"`` or ``"none"``) on the NUMA
    node(s) of those CPUs, within ``mems_allowed`` (the cgroup's ``cpuset.mems``;
    ``None``: any); ``reserve_cores`` physical cores (the last of the set) set
    aside for data loading (DataLoader workers) and the pools sized to the rest,
    one thread per core.

    Parameters
    ----------
    topology : Topology
        The machine with its GPUs; ``allowed`` (default ``topology.allowed``) are
        the CPUs the rank may use (cgroup cpuset and inherited mask).
    mode : str
        ``node``, ``socket``, ``exclusive`` or ``core-complex``.
    environ, local_rank, local_size, gpu, vendor, devices_constrained
        As :func:`visible_devices` and :func:`rank_gpu` take them (``environ``
        default: empty, every GPU visible).

    Returns
    -------
    GpuBinding

    Raises
    ------
    PlanError
        One line naming the input (see the three steps), an unknown ``memory``, or
        ``reserve_cores`` that leaves no core for compute.
    """
    environ = {} if environ is None else environ
    if memory not in MEMORY_POLICIES:
        raise PlanError(f"memory={memory!r}: expected one of {', '.join(MEMORY_POLICIES)}")
    if isinstance(reserve_cores, bool) or not isinstance(reserve_cores, int) or reserve_cores < 0:
        raise PlanError(f"reserve_cores={reserve_cores!r}: expected a count of cores (0 or more)")
    vis = visible_devices(topology, environ, vendor=vendor, devices_constrained=devices_constrained)
    choice = rank_gpu(vis, local_rank, local_size=local_size, gpu=gpu, environ=environ)
    cpus = mode_cpus(topology, choice.peers, choice.peer_index, mode, allowed=allowed)
    differs = cpus.differs_from_torch
    if choice.per_rank and choice.peers != vis.devices and mode in ("exclusive", "core-complex"):
        differs = differs or (f"each rank sees only its own GPU: torchrun, seeing one device, would not divide "
                              f"the node between the {len(choice.peers)} GPUs of the step")
    compute, loader = _reserve(topology, cpus.cpus, reserve_cores, choice.device)
    nodes = _Nodes(topology, cpus.cpus)
    mem_nodes = frozenset(n for n in (nodes.node_of_cpu(c) for c in cpus.cpus) if n is not None)
    notes = list(vis.notes) + list(choice.notes) + list(cpus.notes)
    if mems_allowed is not None and mem_nodes - frozenset(mems_allowed):
        kept = mem_nodes & frozenset(mems_allowed)
        notes.append(f"NUMA node{'s' if len(mem_nodes - kept) > 1 else ''} "
                     f"{format_list(mem_nodes - kept)} outside the allowed memory nodes "
                     f"{format_list(mems_allowed)}" + ("" if kept else ": memory is not bound"))
        mem_nodes = kept
    policy = None if memory == "none" or not mem_nodes else memory
    variables = vis.variables + ((f"gpu={gpu}",) if gpu is not None else ())
    threads = len({min(topology.core_of(c).cpuset) for c in compute})
    return GpuBinding(rank=local_rank, device=choice.device, ordinal=choice.ordinal, mode=mode, cpus=cpus.cpus,
                      compute_cpus=compute, loader_cpus=loader, threads=threads, node=cpus.node,
                      mem_nodes=mem_nodes if policy else frozenset(), mempolicy=policy, differs_from_torch=differs,
                      variables=variables, notes=tuple(notes))


def _reserve(topology: Topology, cpus: frozenset[int], count: int, device: GpuDevice) -> tuple[frozenset[int],
                                                                                                   frozenset[int]]:
    """(compute CPUs, loader CPUs): the last ``count`` physical cores of ``cpus`` set
    aside for data loading."""
    if not count:
        return cpus, frozenset()
    cores: dict[int, set[int]] = {}
    for c in cpus:
        cores.setdefault(min(topology.core_of(c).cpuset), set()).add(c)
    if count >= len(cores):
        raise PlanError(f"reserve_cores={count}: GPU {device.name}'s CPUs {format_list(cpus)} are {len(cores)} "
                        f"core{'s' if len(cores) != 1 else ''}: none would be left for compute")
    keys = sorted(cores)
    loader = frozenset(c for k in keys[-count:] for c in cores[k])
    return cpus - loader, loader


def gpu_bindings(topology: Topology, mode: str, ranks: int, **options: object) -> tuple[GpuBinding, ...]:
    """:func:`gpu_binding` for each local rank ``0 .. ranks-1`` of a job of ``ranks``
    ranks on this node, all seeing the same environment (what ``affinity plan
    --ranks N --gpu-bind MODE`` shows).  Raises :class:`PlanError` for the first
    rank that cannot be placed, so a plan is whole or refused."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise PlanError(f"ranks={ranks!r}: expected a positive count of ranks")
    return tuple(gpu_binding(topology, mode, local_rank=i, local_size=ranks, **options)  # type: ignore[arg-type]
                 for i in range(ranks))
