#!/usr/bin/env bash
# Creates pdcoll's Conan 2 package from this checkout and runs test_package
# against it (builds a consumer with CMakeDeps + CMakeToolchain and runs an
# all-reduce). Needs no Conan remote: pdcoll has no Conan requirements and
# takes libfabric, liburing and threads from the system.
#   scripts/conan-check.sh            (after scripts/install-deps.sh --conan)
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
