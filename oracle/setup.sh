#!/usr/bin/env bash
# setup.sh -- install the real OpenMP runtimes and build the shim and probe
# used by oracle/golden_check.py.  Adapted from the project's shared
# oracle (shared/oracle/make_golden.sh): same pinned runtimes, same shim and
# probe sources (copied in oracle/src/).  Idempotent; everything goes under
# $ORACLE_WORK (default /tmp/oracle-work).  Needs network access to PyPI and
# Debian only.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WORK="${ORACLE_WORK:-/tmp/oracle-work}"
INTEL_OMP_VERSION="${INTEL_OMP_VERSION:-2026.2.0}"
LLVM_DEBS="${LLVM_DEBS:-libomp5-19=1:19.1.7-3~deb12u1}"
HWLOC_DEBS="${HWLOC_DEBS:-hwloc-nox=2.9.0-1 libhwloc15=2.9.0-1}"
log() { echo "[oracle-setup] $*" >&2; }

need_apt=()
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc libc6-dev)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
command -v dpkg-deb >/dev/null 2>&1 || need_apt+=(dpkg)
if [ ${#need_apt[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi
echo '#include <omp.h>' | gcc -fopenmp -x c -fsyntax-only - || { log "gcc cannot find omp.h"; exit 1; }
mkdir -p "$WORK/debs" "$WORK/x" "$WORK/build"

VENV="$WORK/venv"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
have="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("intel-openmp"))' 2>/dev/null || true)"
if [ "$have" != "$INTEL_OMP_VERSION" ] || [ ! -f "$VENV/lib/libiomp5.so" ]; then
  log "pip install intel-openmp==$INTEL_OMP_VERSION"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "intel-openmp==$INTEL_OMP_VERSION"
fi
IOMP_DIR="$VENV/lib"

apt_updated=0
fetch_deb() {
  local spec="$1" pkg="${1%%=*}"
  ls "$WORK/debs/${pkg}_"*.deb >/dev/null 2>&1 && return 0
  ( cd "$WORK/debs" && apt-get download "$spec" ) 2>/dev/null && return 0
  if [ $apt_updated = 0 ]; then apt-get update -qq; apt_updated=1; fi
  ( cd "$WORK/debs" && apt-get download "$spec" ) 2>/dev/null && return 0
  ( cd "$WORK/debs" && apt-get download "$pkg" )
}
KEYS=()
for spec in $LLVM_DEBS; do
  pkg="${spec%%=*}"; fetch_deb "$spec"
  rm -rf "$WORK/x/$pkg"; dpkg-deb -x "$(ls "$WORK/debs/${pkg}_"*.deb | head -n1)" "$WORK/x/$pkg"
  KEYS+=("$pkg")
done
hw_ok=1
for spec in $HWLOC_DEBS; do fetch_deb "$spec" || { hw_ok=0; break; }; done
if [ $hw_ok = 1 ]; then
  rm -rf "$WORK/x/hwloc"
  for spec in $HWLOC_DEBS; do
    pkg="${spec%%=*}"; dpkg-deb -x "$(ls "$WORK/debs/${pkg}_"*.deb | head -n1)" "$WORK/x/hwloc"
  done
fi

B="$WORK/build"
gcc -O2 -Wall -Wextra -shared -fPIC -o "$B/libfakeaff.so" "$HERE/src/fakeaff.c" -ldl -lpthread
gcc -O2 -Wall -fopenmp -c "$HERE/src/probe.c" -o "$B/probe.o"
gcc "$B/probe.o" -o "$B/probe_libiomp5" -L"$IOMP_DIR" -liomp5 -Wl,-rpath,"$IOMP_DIR" -ldl
{
  printf '[\n  {"key": "libiomp5", "label": "libiomp5 (intel-openmp %s)", "package": "PyPI intel-openmp==%s", "library": "%s", "probe": "%s"}' \
    "$INTEL_OMP_VERSION" "$INTEL_OMP_VERSION" "$IOMP_DIR/libiomp5.so" "$B/probe_libiomp5"
  for pkg in "${KEYS[@]}"; do
    lib="$(find "$WORK/x/$pkg/usr/lib" -path '*/llvm-*/lib/libomp.so.5' | head -n1)"
    key="libomp${pkg#libomp5-}"
    gcc "$B/probe.o" -o "$B/probe_$key" "$lib" -Wl,-rpath,"$(dirname "$lib")" -ldl
    printf ',\n  {"key": "%s", "label": "LLVM libomp (Debian %s)", "package": "Debian %s", "library": "%s", "probe": "%s"}' \
      "$key" "$pkg" "$pkg" "$lib" "$B/probe_$key"
  done
  printf '\n]\n'
} > "$WORK/runtimes.json"
log "ready: $WORK/runtimes.json"
