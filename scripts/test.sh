#!/usr/bin/env bash
# The test suite on a fresh machine: install dependencies, then build and run
# every test under AddressSanitizer + UndefinedBehaviorSanitizer, the
# in-process unit tests in the optimised build, then the progress,
# cancellation and cache tests under ThreadSanitizer, then a short
# bounded fuzz run of the rendezvous parser. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --conan --mpi --slurm
export PATH="$HOME/.local/bin:$PATH"
jobs=$(nproc)

echo "== ASan + UBSan build, every test"
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$jobs"
# A test that fails is run again, up to 3 times in all: libfabric 1.17's shm
# provider occasionally stalls on large unexpected messages
# (ofiwg/libfabric#9143, #9853; see README "Known limitations"). A real
# regression fails every attempt; ctest prints each failed attempt.
ctest --preset asan -j "$jobs" --timeout 900 --repeat until-pass:3

echo "== Optimised build (the default preset, -O2): the in-process unit tests"
# The sanitizer builds compile at -O1, and -O2 code differs: g++ orders the
# operands of a float + differently, and faster loops meet other timings.
# Users build optimised.
cmake --preset default >/dev/null
cmake --build --preset default -j "$jobs" --target test_badinput test_bootstrap test_collectives test_exec \
  test_fabric test_failure test_fastmath test_matrix test_memory test_model test_p2p test_peerdirect test_reduce \
  test_registration test_senders test_shmspace test_steady test_uring
ctest --preset default -L unit -j "$jobs" --timeout 900 --repeat until-pass:3

echo "== ThreadSanitizer build: progress engine, cancellation, stop tokens, registration cache, aborts, send/recv"
cmake --preset tsan >/dev/null
cmake --build --preset tsan -j "$jobs" --target test_exec test_registration test_collectives test_bootstrap test_failure test_p2p multiproc_bootstrap
ctest --preset tsan -j "$jobs" --timeout 900

echo "== Conan 2 package: conan create (offline) and its test_package"
scripts/conan-check.sh

echo "== Fuzz smoke (rendezvous store parser and state machine)"
scripts/fuzz-smoke.sh 30
