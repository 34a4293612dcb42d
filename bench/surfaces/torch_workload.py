"""A small real PyTorch workload for recording surfaces on this machine
(``record.py``): inference of a small convolutional network on random batches,
timed after a warm-up; prints ``images/sec: X`` (the tuner's default metric).

    python bench/surfaces/torch_workload.py --batch 16 --images 1024

One job of ``--images`` images is split between the instances ``affinity run``
starts: instance ``AFFINITY_INSTANCE`` of ``AFFINITY_NUM_INSTANCES`` (0 of 1 when
run alone) infers its share (the remainder goes to the first ones), so more
instances do the same work, not more of it.  What a job costs is the wall time of
all of them (``affinity tune --time``, ``record.py --time``); the rate printed is
this instance's own, over its share.  ``--iters N`` instead runs N batches in
every instance (copies: each does the whole job).
"""

from __future__ import annotations

import argparse
import os
import time


def share(images: int) -> int:
    """This instance's part of ``images`` (from ``AFFINITY_INSTANCE`` / ``AFFINITY_NUM_INSTANCES``)."""
    n = max(1, int(os.environ.get("AFFINITY_NUM_INSTANCES", "1")))
    i = int(os.environ.get("AFFINITY_INSTANCE", "0"))
    return images // n + (1 if i < images % n else 0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--size", type=int, default=64, help="image side")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--images", type=int, default=None, help="the whole job, split between the instances")
    ap.add_argument("--iters", type=int, default=8, help="batches per instance (without --images)")
    a = ap.parse_args()
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    ch = 3
    for out in (32, 64, 128, 128):
        layers += [nn.Conv2d(ch, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU(), nn.MaxPool2d(2)]
        ch = out
    model = nn.Sequential(*layers, nn.Flatten(), nn.LazyLinear(10)).eval()
    mine = share(a.images) if a.images is not None else a.batch * a.iters
    sizes = [a.batch] * (mine // a.batch) + ([mine % a.batch] if mine % a.batch else [])
    x = torch.randn(a.batch, 3, a.size, a.size)
    with torch.inference_mode():
        for _ in range(a.warmup):
            model(x)
        t0 = time.perf_counter()
        for b in sizes:
            model(x[:b])
        dt = max(time.perf_counter() - t0, 1e-9)
    print(f"threads: {torch.get_num_threads()}  images: {mine}  images/sec: {mine / dt:.2f}", flush=True)


if __name__ == "__main__":
    main()
