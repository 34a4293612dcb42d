"""A small real PyTorch workload for recording surfaces on this machine
(``record.py``): inference of a small convolutional network on a random batch,
timed after a warm-up; prints ``images/sec: X`` (the tuner's default metric).

    python bench/surfaces/torch_workload.py --batch 16 --iters 8
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--size", type=int, default=64, help="image side")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=8)
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
    x = torch.randn(a.batch, 3, a.size, a.size)
    with torch.inference_mode():
        for _ in range(a.warmup):
            model(x)
        t0 = time.perf_counter()
        for _ in range(a.iters):
            model(x)
        dt = time.perf_counter() - t0
    print(f"threads: {torch.get_num_threads()}  images/sec: {a.batch * a.iters / dt:.2f}", flush=True)


if __name__ == "__main__":
    main()
