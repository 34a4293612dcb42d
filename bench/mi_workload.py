"""One instance of the multi-instance benchmark (``bench/multi_instance.py``).

PyTorch inference on a torchvision model with random weights and a random
batch (no download), timed after a warm-up; prints one line::

    MI_RESULT {"ips": images/sec, "t0": start, "t1": end, "pid": ..., "threads": ...}

``t0``/``t1`` are wall-clock times of the timed part, so the driver can tell how
far the instances overlapped.  ``--apply`` calls :func:`affinity.apply` (this
process's threads pinned in process) before the timed part; ``--probe`` also
reports every thread's CPU mask, the memory policy and the variables the
OpenMP runtimes read (what a placement variant changes in the process).
"""

from __future__ import annotations

import argparse
import json
import os
import time


def thread_masks() -> dict[str, str]:
    """``{tid: Cpus_allowed_list}`` of every thread of this process."""
    out = {}
    for tid in sorted(os.listdir("/proc/self/task"), key=int):
        try:
            with open(f"/proc/self/task/{tid}/status") as fh:
                for line in fh:
                    if line.startswith("Cpus_allowed_list:"):
                        out[tid] = line.split(":", 1)[1].strip()
        except OSError:
            pass
    return out


def mempolicy() -> str:
    """The policy of this process's heap as ``/proc/self/numa_maps`` says it
    (``default``, ``bind:0``, ``local``, ...)."""
    try:
        with open("/proc/self/numa_maps") as fh:
            for line in fh:
                if "heap" in line:
                    return line.split()[1]
    except OSError:
        pass
    return "unknown"


def probe() -> dict:
    keys = ("OMP_", "KMP_", "GOMP_", "TF_", "AFFINITY_", "LD_PRELOAD", "MKL_")
    return {"masks": thread_masks(), "mempolicy": mempolicy(),
            "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(keys)}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--size", type=int, default=224, help="image side")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--apply", action="store_true", help="affinity.apply() before the timed part")
    ap.add_argument("--probe", action="store_true")
    a = ap.parse_args()
    import torch
    import torchvision

    model = getattr(torchvision.models, a.model)(weights=None).eval()
    x = torch.randn(a.batch, 3, a.size, a.size)
    binding = None
    with torch.inference_mode():
        model(x)  # the OpenMP team exists from here on
        if a.apply:
            import affinity

            binding = affinity.apply(tensorflow=False)
        for _ in range(a.warmup):
            model(x)
        t0 = time.time()
        for _ in range(a.iters):
            model(x)
        t1 = time.time()
    out = {"ips": a.batch * a.iters / (t1 - t0), "t0": t0, "t1": t1, "pid": os.getpid(),
           "threads": torch.get_num_threads()}
    if a.probe:
        out["probe"] = probe()
    if binding is not None:
        binding.restore()
    print("MI_RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
