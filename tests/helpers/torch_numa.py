"""Run PyTorch's own ``torch/numa/binding.py`` over described ``/sys`` trees (a
program: tests start it in a subprocess, torch staying out of the test process).

Reads JSON cases from standard input, one list of
``{"root": DIR, "allowed": [cpus], "visible": [bus ids], "modes": [...]}``, and
prints, for each case, each mode's CPU set for every visible device as torch's
``_get_logical_cpus_to_bind_to`` computes it, or ``{"error": "Type: message"}``
where it raises (an empty set counts as an error: torch refuses to bind to one).

What is redirected, and nothing else: the module's ``open`` and ``os.listdir`` of
``/sys/...`` paths go into ``root``; ``os.sched_getaffinity`` returns ``allowed``;
``torch.cuda.device_count`` and ``get_device_properties`` describe the visible
devices (PCI domain, bus, device of each bus id) -- the CPU build has no CUDA.
"""

from __future__ import annotations

import builtins
import json
import os
import sys
import types


def _props(bus_id: str) -> types.SimpleNamespace:
    domain, bus, rest = bus_id.split(":")
    return types.SimpleNamespace(pci_domain_id=int(domain, 16), pci_bus_id=int(bus, 16),
                                 pci_device_id=int(rest.split(".")[0], 16))


def main() -> int:
    import torch
    import torch.numa.binding as binding

    cases = json.load(sys.stdin)
    state: dict[str, object] = {}

    def into(path: str) -> str:
        path = os.fspath(path)
        return os.path.join(state["root"], path.lstrip("/")) if path.startswith("/sys/") else path  # type: ignore[arg-type]

    fake_os = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
    fake_os.listdir = lambda path=".": os.listdir(into(path))
    fake_os.sched_getaffinity = lambda pid: set(state["allowed"])  # type: ignore[call-overload]
    fake_os.path = os.path
    binding.open = lambda path, *a, **k: builtins.open(into(path), *a, **k)  # type: ignore[attr-defined]
    binding.os = fake_os  # type: ignore[attr-defined]
    torch.cuda.device_count = lambda: len(state["visible"])  # type: ignore[assignment,arg-type]
    torch.cuda.get_device_properties = lambda i: _props(state["visible"][i])  # type: ignore[assignment,index]

    out = []
    for case in cases:
        state.update(case)
        result: dict[str, list[object]] = {}
        for mode in case["modes"]:
            options = binding.NumaOptions(affinity_mode=binding.AffinityMode(mode))
            per_device: list[object] = []
            for i in range(len(case["visible"])):
                try:
                    cpus = binding._get_logical_cpus_to_bind_to(gpu_index=i, numa_options=options)
                    per_device.append(sorted(cpus) if cpus else {"error": "empty: torch refuses an empty set"})
                except Exception as e:  # noqa: BLE001 - every failure of torch's is an answer here
                    per_device.append({"error": f"{type(e).__name__}: {e}"})
            result[mode] = per_device
        out.append(result)
    json.dump({"torch": torch.__version__, "results": out}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
