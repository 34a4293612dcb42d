"""Write the GPU test data of this folder (run from the checkout: ``.venv/bin/python
tests/data/gpu/make_gpu_data.py``; needs ``lstopo-no-graphics``, hwloc's own tool,
for the dumps).

* ``server-2s8g/``: the example 8-GPU two-socket server as a Linux ``/sys`` tree
  (``--topology fsroot:tests/data/gpu/server-2s8g``): 2 sockets x 6 cores x 2
  threads (CPUs 0-5,12-17 on socket 0, 6-11,18-23 on socket 1), one NUMA node and
  one L3 per socket, 8 NVIDIA H100 (class 0x0302) at a DGX H100's bus ids, four on
  each node, beside a BMC's VGA, an InfiniBand NIC, an NVSwitch and a GPU's audio
  function, which are no GPUs.
* ``dumps/NAME.xml`` with ``dumps/NAME.json``: hwloc XML exports made with I/O
  discovery (``lstopo --whole-io``, ``HWLOC_COMPONENTS=linux,stop
  HWLOC_FSROOT=<tree>``, as hwloc's own tests read a described machine) of the
  machine the JSON describes (``tests/helpers/sysfs_tree.Server``): the test
  writes that machine's tree again and compares PyTorch's binding over the tree
  with ours over the XML.
* an Aurora-shaped node, written where asked (``make_gpu_data.py --aurora-like DIR``;
  the tests write it in a temporary folder, docs/gpu.md shows it): 2 sockets x 12
  cores x 2 threads (Aurora: 52 cores a socket, CPU ``i`` and ``i + 104`` one core),
  a NUMA node a socket plus the HBM of each socket as a memory-only node (nodes 2
  and 3, as ``numactl -H`` shows Aurora's), 3 Intel Data Center GPU Max a socket,
  2 tiles each (listed as ``xe`` lists them), at the bus numbers ALCF's
  ``hello_affinity`` prints (18, 42, 6c on each socket; the domains assumed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # tests/, for helpers

from helpers.sysfs_tree import GpuSpec, Server, server_to_dict, write_tree  # noqa: E402

H100 = (0x10DE, 0x2330, 0x030200)
MI300X = (0x1002, 0x74A1, 0x038000)
PVC = (0x8086, 0x0BD5, 0x038000)


def gpus(model: tuple[int, int, int], placed: list[tuple[str, int]]) -> tuple[GpuSpec, ...]:
    return tuple(GpuSpec(bus, model[0], model[1], model[2], node) for bus, node in placed)


SERVER_2S8G = Server(2, 1, 6, 2, "split", "package", 6, frozenset(), 0, 0, gpus(H100, [
    ("0000:1b:00.0", 0), ("0000:43:00.0", 0), ("0000:52:00.0", 0), ("0000:61:00.0", 0),
    ("0000:9d:00.0", 1), ("0000:c3:00.0", 1), ("0000:d1:00.0", 1), ("0000:df:00.0", 1)]))

AURORA_LIKE = Server(2, 1, 12, 2, "split", "package", 12, frozenset(), 2, 0, tuple(
    GpuSpec(f"{domain:04x}:{bus:02x}:00.0", PVC[0], PVC[1], PVC[2], node, 2)
    for node, domain in ((0, 0), (1, 1)) for bus in (0x18, 0x42, 0x6C)))

DUMPS = {
    # sub-NUMA clustering: two nodes a socket, an L3 a node, GPUs on every node
    "snc-2s4n": Server(2, 2, 3, 2, "split", "ccx", 3, frozenset(), 0, 0, gpus(H100, [
        ("0000:18:00.0", 0), ("0000:2a:00.0", 1), ("0000:3a:00.0", 1), ("0000:9a:00.0", 2), ("0000:ab:00.0", 3),
        ("0000:ba:00.0", 3)])),
    # firmware that names no node: numa_node -1, local CPUs every CPU
    "nonuma-1s": Server(1, 1, 4, 2, "split", "package", 4, frozenset(), 0, 0, gpus(H100, [
        ("0000:17:00.0", -1), ("0000:65:00.0", -1)])),
    # four sockets of AMD Instinct (class 0x0380), siblings numbered next to each other, CPU 5 offline
    "amd-4s": Server(4, 1, 2, 2, "adjacent", "package", 2, frozenset({5}), 0, 0, gpus(MI300X, [
        ("0000:05:00.0", 0), ("0000:15:00.0", 0), ("0000:45:00.0", 1), ("0000:55:00.0", 1), ("0000:85:00.0", 2),
        ("0000:95:00.0", 2), ("0000:c5:00.0", 3), ("0000:d5:00.0", 3)])),
    # Intel Data Center GPU Max (class 0x0380), no L3 (L2 is the last level), no SMT
    "intel-2s": Server(2, 1, 4, 1, "split", "none", 4, frozenset(), 0, 0, gpus(PVC, [
        ("0000:18:00.0", 0), ("0000:42:00.0", 0), ("0000:6c:00.0", 0), ("0001:18:00.0", 1), ("0001:42:00.0", 1),
        ("0001:6c:00.0", 1)])),
}


def main() -> int:
    if sys.argv[1:2] == ["--aurora-like"]:
        write_tree(AURORA_LIKE, sys.argv[2])
        return 0
    target = HERE / "server-2s8g"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir()
    write_tree(SERVER_2S8G, str(target))
    dumps = HERE / "dumps"
    dumps.mkdir(exist_ok=True)
    version = subprocess.run(["lstopo-no-graphics", "--version"], capture_output=True, text=True,
                             check=True).stdout.strip()
    for name, server in DUMPS.items():
        tree = tempfile.mkdtemp(prefix="gpu-dump-")
        try:
            write_tree(server, tree)
            env = {**os.environ, "HWLOC_COMPONENTS": "linux,stop", "HWLOC_FSROOT": tree}
            subprocess.run(["lstopo-no-graphics", "--whole-io", "-f", "--of", "xml", str(dumps / f"{name}.xml")],
                           env=env, check=True)
        finally:
            shutil.rmtree(tree)
        (dumps / f"{name}.json").write_text(json.dumps({"made_by": version, "server": server_to_dict(server)},
                                                       indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
