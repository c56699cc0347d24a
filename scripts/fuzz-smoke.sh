#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for a bounded time
# over its committed corpus (fuzz/corpus/<target>/), which CI calls.
#   scripts/fuzz-smoke.sh [seconds per target, default 30]
# Exits non-zero when a build fails or a target finds a crash, leak or
# sanitizer report; the reproducer lands in $BUILD/artifacts/.
set -euo pipefail

seconds=${1:-30}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PDCOLL_FUZZ_BUILD:-$root/build-fuzz}

cmake -S "$root" -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug \
  -DPDCOLL_BUILD_FUZZ=ON -DPDCOLL_BUILD_TESTS=OFF -DPDCOLL_BUILD_EXAMPLES=OFF -DPDCOLL_BUILD_BENCH=OFF >/dev/null
mkdir -p "$build/artifacts"
status=0
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for source in "$root"/fuzz/*_fuzz.cpp; do
  target=$(basename "$source" .cpp)
  cmake --build "$build" --target "$target" -j2
  # New inputs go to a scratch directory so that the committed corpus stays as reviewed.
  inputs=("$scratch/$target")
  mkdir -p "${inputs[0]}"
  [ -d "$root/fuzz/corpus/$target" ] && inputs+=("$root/fuzz/corpus/$target")
  echo "fuzz-smoke: $target for ${seconds}s"
  if ! "$build/fuzz/$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$build/artifacts/$target-" "${inputs[@]}"; then
    echo "fuzz-smoke: $target FAILED (see $build/artifacts/)" >&2
    status=1
  fi
done
exit $status
