"""The parameter names the tuner knows, apart so that ``affinity tune``'s parser can
list them while importing nothing but the standard library
(:mod:`affinity.tools.tune_cli`); :mod:`affinity.tuning.space` checks their choices.
"""

from __future__ import annotations

__all__ = ["KNOWN"]

#: the names the tuner reads with the topology, and what each means
KNOWN = {
    "intra": "TensorFlow intra-op pool (TF_NUM_INTRAOP_THREADS)",
    "inter": "TensorFlow inter-op pool (TF_NUM_INTEROP_THREADS)",
    "omp": "OpenMP team size (OMP_NUM_THREADS)",
    "blocktime": "KMP_BLOCKTIME in ms, or 'infinite'",
    "affinity": "KMP_AFFINITY type (none, compact, scatter, balanced) or a full KMP_AFFINITY string",
    "granularity": "KMP_AFFINITY granularity (fine/thread, core, tile, die, socket, ...)",
    "instances": "copies of the program on disjoint cores",
    "threads": "threads per instance (affinity run -t)",
    "membind": "memory policy: none, local or interleave",
    "torch_threads": "PyTorch intra-op team (torch.set_num_threads; OMP_NUM_THREADS under affinity run)",
    "interop": "PyTorch inter-op pool (torch.set_num_interop_threads; AFFINITY_TORCH_INTEROP_THREADS under "
               "affinity run)",
    "dataloader_workers": "PyTorch DataLoader worker processes, 0 = load in the main process "
                          "(AFFINITY_DATALOADER_WORKERS; placed by pinned(dataloader_workers=K))",
}
