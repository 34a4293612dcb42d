"""A PyTorch workload: a small CNN on synthetic images, no download, no torchvision.

``python -m affinity.tools.workload_torch --json`` runs inference (``--train``: a
training loop fed by a DataLoader, ``--loader-workers K`` processes) and prints
``images/sec``.  ``--pin SPEC`` applies a plan the way the README's card says a
PyTorch user does -- ``affinity.apply(SPEC)`` *before* ``import torch`` (with
``dataloader_workers=K`` when training) -- so that the import order is the
user's.  :func:`demo_rows` is ``make demo``'s PyTorch row: defaults against
pinned, each in a fresh process (PyTorch sizes its pools once per process).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from .rows import DEMO_ROUNDS, hold_running, measure_row, row_text

__all__ = ["demo_rows", "main", "run_workload"]

IMAGE = 64  #: images are IMAGE x IMAGE x 3
CLEAN_PREFIXES = ("OMP_", "KMP_", "GOMP_", "TF_NUM_", "MKL_", "AFFINITY_")


def _model(torch: Any) -> Any:
    """Four 3x3 convolutions (32-64-128-128 channels, two strided), pooling, a linear layer."""
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(128, 128, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))


class _Images:
    """A map-style dataset of synthetic images with per-sample CPU work (what a
    decoder and augmentations cost a DataLoader worker): a random crop, a flip,
    normalisation."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import torch  # noqa: PLC0415  (in the worker process)

        g = torch.Generator().manual_seed(i)
        big = torch.rand(3, IMAGE + 16, IMAGE + 16, generator=g)
        y, x = (int(v) for v in torch.randint(0, 16, (2,), generator=g))
        img = big[:, y:y + IMAGE, x:x + IMAGE]
        if i % 2:
            img = img.flip(2)
        img = (img - img.mean()) / (img.std() + 1e-6)
        return img, i % 10


def _infer(torch: Any, batch: int, batches: int, hold: bool = False) -> float:
    net = _model(torch).eval()
    x = torch.randn(batch, 3, IMAGE, IMAGE)
    with torch.no_grad():
        for _ in range(3):
            net(x)
        t0 = time.perf_counter()
        for _ in range(batches):
            net(x)
        ips = batch * batches / (time.perf_counter() - t0)
        if hold:
            hold_running(lambda: net(x))
        return ips


def _train(torch: Any, batch: int, batches: int, workers: int) -> float:
    net = _model(torch)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    loader = torch.utils.data.DataLoader(_Images(batch * (batches + 3)), batch_size=batch,
                                         num_workers=workers)
    t0 = 0.0
    for step, (x, y) in enumerate(loader):
        if step == 3:  # the workers started and the first batches are in: time from here
            t0 = time.perf_counter()
        opt.zero_grad()
        loss_fn(net(x), y).backward()
        opt.step()
    return batch * batches / (time.perf_counter() - t0)


def run_workload(*, train: bool = False, batch: int = 32, batches: int = 20, workers: int = 2,
                 pin: str | None = None, threads: int | None = None, hold: bool = False) -> dict[str, Any]:
    """Run the workload in this process (``pin``: ``apply()`` before ``import torch``;
    ``hold``: inference only, keep running it after the timed batches until standard
    input ends -- :func:`affinity.tools.workload.hold_running`)."""
    binding = None
    if pin is not None:
        from ..binding.apply import apply  # lazy: the card's line, affinity first, then torch

        binding = apply(pin, threads=threads, dataloader_workers=workers if train else None)
    import torch  # noqa: PLC0415  (after apply(), on purpose)

    ips = _train(torch, batch, batches, workers) if train else _infer(torch, batch, batches, hold)
    out = {"images_per_sec": ips, "train": train, "batch": batch, "batches": batches,
           "loader_workers": workers if train else 0, "intra_op_threads": torch.get_num_threads(),
           "inter_op_threads": torch.get_num_interop_threads(), "pinned": pin,
           "bind_map": binding.report().text() if binding is not None else ""}
    if binding is not None:
        binding.restore()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m affinity.tools.workload_torch", description=__doc__.split("\n")[0])
    ap.add_argument("--train", action="store_true", help="a training loop fed by a DataLoader")
    ap.add_argument("--loader-workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--num-batches", type=int, default=20)
    ap.add_argument("--pin", metavar="SPEC", default=None, help="affinity.apply(SPEC) before import torch")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--hold", action="store_true",
                    help="inference: after the timed batches, print {\"holding\": PID} and keep running until "
                         "standard input ends (a live job for 'affinity doctor PID')")
    a = ap.parse_args(argv)
    out = run_workload(train=a.train, batch=a.batch_size, batches=a.num_batches, workers=a.loader_workers,
                       pin=a.pin, threads=a.threads, hold=a.hold)
    print(json.dumps(out) if a.json else f"total images/sec: {out['images_per_sec']:.2f}")
    return 0


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without any thread or placement variable (the defaults), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEAN_PREFIXES)}
    env.update(extra or {})
    return env


def workload_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "affinity.tools.workload_torch", "--json", *args]


def run_fresh(cmd: Sequence[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """One run in a fresh process; its JSON result."""
    r = subprocess.run(list(cmd), capture_output=True, text=True, env=env or clean_env(), timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"PyTorch workload failed ({' '.join(cmd)}):\n{r.stderr[-3000:]}")
    return json.loads([line for line in r.stdout.splitlines() if line.startswith("{")][-1])


def demo_rows(say: Callable[[str], None], spec: str, threads: int, *, batches: int = 20,
              rounds: int = DEMO_ROUNDS) -> dict[str, Any] | None:
    """``make demo``'s PyTorch row: inference with PyTorch's defaults against
    ``affinity.apply(spec)`` before ``import torch``, interleaved over at most ``rounds``
    (:func:`affinity.tools.rows.measure_row`, the TensorFlow row's function); returns
    the last pinned run.  Says so and returns ``None`` when PyTorch is not installed."""
    if importlib.util.find_spec("torch") is None:
        say("PyTorch: not installed (pip install 'kmp-affinity[torch]')")
        return None
    common = ["--num-batches", str(batches)]
    pin = ["--pin", spec, "--threads", str(threads)]
    row = measure_row("PyTorch small CNN", lambda pinned: run_fresh(workload_cmd(*common, *(pin if pinned else []))),
                      rounds)
    for line in row_text(row):
        say(line)
    base, pinned = row.last_defaults, row.last
    say(f"  threads: defaults intra_op={base['intra_op_threads']} inter_op={base['inter_op_threads']} "
        f"(not pinned); pinned intra_op={pinned['intra_op_threads']} inter_op={pinned['inter_op_threads']} "
        f"({spec})")
    return pinned

if __name__ == "__main__":
    sys.exit(main())
