#!/usr/bin/env bash
# The main job on a fresh machine: install dependencies, build (Release), and
# run the 4-rank all-reduce demo with verification and a bandwidth table.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset default -DPDCOLL_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build --preset default --target hello_allreduce
tools/pdcoll-run -n "${PDCOLL_DEMO_RANKS:-4}" --timeout 300 build/default/examples/hello_allreduce
