"""Fixtures of the engine tests: a one-node Slurm for the whole session
(:mod:`helpers.slurm`), started on first use and ended at the end, and the
OpenMP library the ranks' probe reports its team with."""

from __future__ import annotations

import os

import pytest

from helpers import slurm as slurm_mod
from helpers.ranks_probe import build_omp_lib


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A running one-node Slurm: ``.client(*argv)`` runs srun/sbatch/sinfo against it."""
    missing = slurm_mod.missing_tools()
    if missing:
        pytest.skip(f"Slurm not installed ({', '.join(missing)} missing): make sysdeps installs "
                    f"slurmctld, slurmd, slurm-client and munge when run as root")
    if os.geteuid() != 0:
        pytest.skip("the one-node Slurm of the tests runs its daemons as root (SlurmUser=root)")
    try:
        s = slurm_mod.start(tmp_path_factory.mktemp("slurm"))
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="session")
def omp_lib(tmp_path_factory):
    """libgomp's ``report()`` (:mod:`helpers.ompprog`), built once for the engine tests."""
    return build_omp_lib(tmp_path_factory.mktemp("omp"))
