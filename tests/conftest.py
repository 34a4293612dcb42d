"""Fixtures shared by the tests; plain helpers live in ``tests/helpers``."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from helpers import golden_dir
from helpers.cgroups import v1_dir
from helpers.unprivileged import identity, python_runs_as


@pytest.fixture(scope="session")
def golden() -> Path:
    return golden_dir()


@pytest.fixture
def ram_path(tmp_path):
    """A fresh folder in memory (``/dev/shm``) when there is one, else ``tmp_path``:
    described ``/sys`` trees are hundreds of small files, and on this project's
    machines a disk-backed ``/tmp`` writes them 30 times slower."""
    import shutil
    import tempfile

    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    d = Path(tempfile.mkdtemp(prefix="affinity-test-", dir=shm))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def scratch_cgroup(request):
    """A fresh v1 cgroup of ``controller`` under our own group, removed afterwards."""
    controller = request.param
    top = v1_dir(controller)
    if top is None or os.geteuid() != 0 or not os.access(top, os.W_OK):
        pytest.skip(f"needs root and a writable cgroup v1 '{controller}' hierarchy")
    own = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
               if controller in line.split(":")[1].split(","))
    d = top / own.lstrip("/") / f"affinity-test-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    try:
        yield d
    finally:
        d.rmdir()


@pytest.fixture(params=["root-without-CAP_SYS_NICE", "nobody"])
def who(request, shared):
    """An unprivileged identity to run a test's processes as (``shared``: the test
    module's fixture holding a directory both identities can reach)."""
    ident, why = identity(request.param)
    if ident is None:
        pytest.skip(why)
    why = python_runs_as(ident, shared["dir"])
    if why:
        pytest.skip(why)
    return ident


#: test modules whose every test starts PyTorch in a fresh process (seconds each, like the
#: tf-marked ones): marked ``torch``, which ``make check`` leaves out (``make test`` runs them)
TORCH_MODULES = ("test_torch.py", "test_torch_workload.py", "test_torchrun.py", "test_runtimes.py",
                 "test_auto_runtime.py", "test_torch_run.py", "test_gpu_torch_binding.py", "test_overlap_torch.py")
#: the tuner's end-to-end runs of `affinity tune -- CMD` (several real trials each, 2-15 s):
#: marked ``slow``, which ``make check`` leaves out (``make test`` runs them)
SLOW_TUNER_RUNS = ("test_pruned_trials_are_never_finalists", "test_two_tuners_on_one_study",
                   "test_copies_of_sleep_are_no_speed_up", "test_pruning_reads_every_instances_log",
                   "test_a_warm_start_uses_only_this_machines", "test_a_study_is_keyed_by",
                   "test_instances_are_copies_measured_per_copy", "test_ctrl_c_keeps_the_finished_trials",
                   "test_a_resume_reports_the_speed_up", "test_killing_the_tuner_leaves_no_process",
                   "test_with_time_a_trial_running_twice_the_best_stops", "test_a_tuner_killed_mid_trial")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in TORCH_MODULES:
            item.add_marker(pytest.mark.torch)
        if item.path.parent.name == "engines":  # real Slurm, MPI and torchrun jobs
            item.add_marker(pytest.mark.engines)
        if item.path.name == "test_tune_cli.py" and item.name.startswith(SLOW_TUNER_RUNS):
            item.add_marker(pytest.mark.slow)


def pytest_collection_finish(session):
    """No test module may import PyTorch into the test process: its libgomp would load
    here and every later in-process ``apply()`` would attach to PyTorch (tests that need
    torch run it in a subprocess; ``helpers.torch_package_dir`` finds its files)."""
    import sys

    if "torch" in sys.modules:
        raise pytest.UsageError("a test module imported torch at collection; run torch in a subprocess "
                                "(helpers.torch_package_dir() finds its files without importing it)")


@pytest.fixture(autouse=True)
def _torch_stays_out_of_the_test_process():
    """Fails the test that imported PyTorch into the test process (see above)."""
    import sys

    yield
    assert "torch" not in sys.modules, "this test imported torch in the test process; run it in a subprocess"


def pytest_configure(config):
    """Signals as a terminal gives them, whatever started the suite.  ``nohup`` ignores
    SIGHUP and a shell's background job SIGINT and SIGQUIT; an ignored signal stays
    ignored across ``exec``, so every process a test starts would inherit it: the
    Ctrl-C tests would wait forever for a KeyboardInterrupt, and the launcher's and
    the tuner's forwarding tests would signal processes that cannot hear."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGHUP, signal.SIGQUIT):
        if signal.getsignal(sig) is signal.SIG_IGN:
            signal.signal(sig, signal.SIG_DFL)
