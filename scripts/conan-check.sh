#!/usr/bin/env bash
# Creates pdcoll's Conan 2 package from this checkout and runs test_package
# against it (builds a consumer with CMakeDeps + CMakeToolchain and runs an
# all-reduce). Needs no Conan remote: pdcoll has no Conan requirements and
# takes libfabric, liburing and threads from the system.
#   scripts/conan-check.sh            (after scripts/install-deps.sh --conan)
# Also checks the with_pmix=True variant where pkg-config finds pmix.
# CONAN_HOME is honoured; a machine without a default profile gets a detected one.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v conan >/dev/null 2>&1; then
  echo "conan-check: conan is not installed; run scripts/install-deps.sh --conan" >&2
  exit 2
fi
if ! conan profile path default >/dev/null 2>&1; then
  conan profile detect
fi
# pdcoll requires C++20; detected profiles default to gnu17 for g++ 12.
# --no-remote: nothing to fetch, and the build machines reach no remote.
conan create . --build=missing --no-remote -s compiler.cppstd=20 -s build_type=Release
# With PMIx from the system where pkg-config finds it: the consumer must then
# compile and link pdcoll's PMIx rendezvous (include/pdcoll/bootstrap/pmix.hpp).
if pkg-config --exists pmix; then
  log=$(mktemp)
  trap 'rm -f "$log"' EXIT
  conan create . --build=missing --no-remote -s compiler.cppstd=20 -s build_type=Release \
    -o "pdcoll/*:with_pmix=True" 2>&1 | tee "$log"
  if ! grep -q "PMIx rendezvous under mpirun: yes" "$log"; then
    echo "conan-check: with_pmix=True did not give the consumer PMIx" >&2
    exit 1
  fi
else
  echo "conan-check: pkg-config finds no pmix; with_pmix=True not checked"
fi
