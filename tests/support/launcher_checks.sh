# File: tests/support/launcher_checks.sh — what the real-launcher tests
# (tests/slurm/run.sh, tests/mpirun/run.sh) share; sourced, not run, as
#   source tests/support/launcher_checks.sh SUITE "$@"
# which takes the script's one argument, the pdcoll-bench binary, into
# $bench (absolute path), or exits 2 with a usage line. Then:
#   skip WHY                    says why the suite is skipped, exits 77;
# The script sets $dir (a scratch directory) before running checks.
#   clean_launcher_environment  unsets every launcher's variables, so nothing
#                               of an enclosing job leaks into the test's jobs;
#   fail NAME [FILE...]         reports a failed check with the files' tails;
#   check_job NAME COMMAND...   runs one job (at most 60 s), whose
#                               pdcoll-bench checks must all pass;
#   check_sweeps WORD LAUNCH... the checked sweeps every launcher runs:
#                               LAUNCH -n N pdcoll-bench ... on 1-4 ranks
#                               over libfabric tcp, on 3 over shm, on 2 over
#                               io_uring, and a reduce_scatter on 3;
#   finish                      exits 1 when a check failed, else 0;
#   ok, sweep                   pdcoll-bench's all-passed footer and the
#                               checked sweep every launcher runs.
# shellcheck shell=bash

suite=$1
bench=${2:-}
if [[ -z "$bench" || ! -x "$bench" ]]; then
  echo "usage: $0 <pdcoll-bench binary>" >&2
  exit 2
fi
bench=$(realpath "$bench")

skip() { echo "SKIPPED: $suite tests: $*"; exit 77; }

clean_launcher_environment() {
  local name
  while read -r name; do unset "$name"; done < <(env | sed -n 's/^\(\(SLURM\|OMPI\|PMI\|PMIX\)_[A-Za-z0-9_]*\)=.*/\1/p')
  unset PDCOLL_ROOT PDCOLL_TOKEN PDCOLL_RANK PDCOLL_WORLD_SIZE PDCOLL_LOCAL_RANK PDCOLL_LOCAL_SIZE \
    MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
}

failures=0
fail() {
  echo "FAIL  $1"
  shift
  (($#)) && cat "$@" 2>/dev/null | sed 's/^/      /' | tail -n 40
  failures=$((failures + 1))
}

finish() {
  if ((failures)); then
    echo "$suite tests: $failures failed"
    exit 1
  fi
  echo "$suite tests: all passed"
  exit 0
}

# shellcheck disable=SC2034  # used by the scripts that source this file
ok="Out of bounds values : 0 OK"  # pdcoll-bench's footer when every check passed
# shellcheck disable=SC2034
sweep=(-b 8 -e 256K -f 32 -n 3 -w 1 -c 1)

jobs_run=0
check_job() {
  local name=$1 out=${dir:?set by the sourcing script}/check.$((jobs_run++)).out rc
  shift
  timeout -k 5 60 "$@" >"$out" 2>&1
  rc=$?
  if [[ $rc -eq 0 ]] && grep -q "$ok" "$out"; then echo "ok    $name"; else fail "$name (exit $rc)" "$out"; fi
}

check_sweeps() {
  local word=$1 n
  shift
  for n in 1 2 3 4; do
    check_job "$word -n $n, libfabric tcp" "$@" -n "$n" "$bench" --transport tcp "${sweep[@]}"
  done
  check_job "$word -n 3, libfabric shm" "$@" -n 3 "$bench" --transport shm "${sweep[@]}"
  check_job "$word -n 2, io_uring" "$@" -n 2 "$bench" --transport uring "${sweep[@]}"
  check_job "$word -n 3, reduce_scatter" "$@" -n 3 "$bench" --transport tcp --collective reduce_scatter "${sweep[@]}"
}
