#!/usr/bin/env bash
# File: tests/mpirun/run.sh — pdcoll started by a real Open MPI mpirun, with
# no PDCOLL_ROOT, MASTER_* or PDCOLL_TOKEN set: rank 0 hands its rendezvous
# address to the others through mpirun's PMIx server
# (include/pdcoll/bootstrap/pmix.hpp). It checks
#   sweeps      pdcoll-bench's checked all_reduce sweep on 1-4 ranks over
#               libfabric tcp and shm and io_uring, and a reduce_scatter;
#   two jobs    two mpiruns on this host at once, both passing (each root
#               serves on its own ephemeral port; the token is the job's);
#   missing     a job whose third rank never joins (MPMD: two pdcoll-bench
#               ranks and a `sleep`) fails within seconds of
#               PDCOLL_TIMEOUT_MS, naming the PMIx fence, instead of waiting;
#   stale       a rank whose PMIx server accepts but never answers fails
#               after PDCOLL_TIMEOUT_MS too;
#   nowhere     where rank 0's host name does not resolve (a UTS namespace
#               renames the host; root only) the others stop at once.
#
#     tests/mpirun/run.sh <pdcoll-bench binary>
#
# Needs mpirun (scripts/install-deps.sh --mpi) and a pdcoll-bench built with
# PDCOLL_WITH_PMIX (the ctest entry exists only then); otherwise prints why it
# was skipped and exits 77. Every command is bounded (at most about 5 minutes).
set -uo pipefail

# shellcheck source=tests/support/launcher_checks.sh
source "$(dirname "$0")/../support/launcher_checks.sh" mpirun "$@"
command -v mpirun >/dev/null || skip "mpirun is not installed (scripts/install-deps.sh --mpi installs Open MPI)"
mpirun --version 2>/dev/null | grep -q "Open MPI" || skip "mpirun is not Open MPI's"

# Nothing of an enclosing job or launcher may leak in.
clean_launcher_environment
export PDCOLL_TIMEOUT_MS=20000
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_base_warn_component_unused=0

dir=$(mktemp -d /tmp/pdcoll-mpirun.XXXXXX)
trap 'rm -rf "$dir"' EXIT
# libpmix keeps a few bytes until exit that LeakSanitizer would report in a
# sanitizer build; they are the library's, not pdcoll's.
echo "leak:libpmix.so" >"$dir/lsan.supp"
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$dir/lsan.supp"
mpi=(mpirun --oversubscribe --bind-to none -x LSAN_OPTIONS -x PDCOLL_TIMEOUT_MS)
for name in ASAN_OPTIONS UBSAN_OPTIONS; do [[ -n ${!name:-} ]] && mpi+=(-x "$name"); done
echo "mpirun: $(mpirun --version | head -n 1)"

check_sweeps mpirun "${mpi[@]}"

# Two jobs at once, each long enough that both are in flight together.
long=(-b 8 -e 64K -f 8 -n 400 -w 10 -c 1 --transport tcp)
run_job() {  # run_job K: job K's output in $dir/job.K.out, "exit start end" in $dir/job.K.t
  local s
  s=$(date +%s.%N)
  timeout -k 5 90 "${mpi[@]}" -n 2 "$bench" "${long[@]}" >"$dir/job.$1.out" 2>&1
  echo "$? $s $(date +%s.%N)" >"$dir/job.$1.t"
}
run_job 0 &
run_job 1 &
wait
read -r r0 s0 e0 <"$dir/job.0.t"
read -r r1 s1 e1 <"$dir/job.1.t"
if [[ $r0 -eq 0 && $r1 -eq 0 ]] && grep -q "$ok" "$dir/job.0.out" && grep -q "$ok" "$dir/job.1.out" &&
  python3 -c "import sys; s0,e0,s1,e1=map(float,sys.argv[1:]); sys.exit(not (s0<e1 and s1<e0))" "$s0" "$e0" "$s1" "$e1"; then
  echo "ok    two mpiruns at once"
else
  fail "two mpiruns at once (exits $r0 $r1; intervals $s0-$e0, $s1-$e1)" "$dir/job.0.out" "$dir/job.1.out"
fi

# A rank that never joins: the others give up after PDCOLL_TIMEOUT_MS (3 s), not never.
out=$dir/missing.out
start=$SECONDS
PDCOLL_TIMEOUT_MS=3000 timeout -k 5 60 "${mpi[@]}" -n 2 "$bench" --transport tcp -b 8 -e 8 -n 1 -w 0 : -n 1 sleep 40 >"$out" 2>&1
rc=$?
took=$((SECONDS - start))
if [[ $rc -ne 0 && $rc -ne 124 && $took -lt 30 ]] && grep -q "PMIx fence" "$out"; then
  echo "ok    a rank that never joins: failed after $took s naming the PMIx fence"
else
  fail "a rank that never joins (exit $rc after $took s)" "$out"
fi

# Rank 0's host name resolves nowhere (a UTS namespace renames the host):
# rank 1 stops at once asking for PDCOLL_ROOT, not after PDCOLL_TIMEOUT_MS.
nowhere=pdcoll-nowhere-$$
if unshare -u true 2>/dev/null && ! getent hosts "$nowhere" >/dev/null; then
  out=$dir/nowhere.out
  start=$SECONDS
  q_mpi=$(printf '%q ' "${mpi[@]}")
  q_bench=$(printf %q "$bench")
  timeout -k 5 60 unshare -u sh -c "hostname $nowhere && $q_mpi -n 2 $q_bench --transport tcp -b 8 -e 8 -n 1 -w 0" >"$out" 2>&1
  rc=$?
  took=$((SECONDS - start))
  if [[ $rc -ne 0 && $took -lt 10 ]] && grep -q "does not resolve here.*set PDCOLL_ROOT" "$out"; then
    echo "ok    rank 0's host name resolves nowhere: refused after $took s"
  else
    fail "rank 0's host name resolves nowhere (exit $rc after $took s)" "$out"
  fi
else
  echo "skip  rank 0's host name resolves nowhere (needs unshare -u, i.e. root)"
fi

# A stale PMIx server address (say, left over from an enclosing job) whose
# server accepts but never answers: PMIx_Init itself must not hold the rank
# past PDCOLL_TIMEOUT_MS.
out=$dir/stale.out
start=$SECONDS
python3 - "$bench" >"$out" 2>&1 <<'PY'
import os, socket, subprocess, sys
mute = socket.socket()
mute.bind(("127.0.0.1", 0))
mute.listen(8)  # accepts (the kernel does) and never says a word
uri = "4242.0;tcp4://127.0.0.1:%d" % mute.getsockname()[1]
env = dict(os.environ, OMPI_COMM_WORLD_RANK="1", OMPI_COMM_WORLD_SIZE="2", PMIX_NAMESPACE="4242",
           PMIX_RANK="1", PMIX_SERVER_URI4=uri, PMIX_SERVER_URI41=uri, PMIX_SERVER_URI3=uri,
           PMIX_SERVER_URI2=uri, PMIX_SERVER_URI21=uri, PMIX_SECURITY_MODE="native",
           PMIX_VERSION="4.2.2", PDCOLL_TIMEOUT_MS="2000")
try:
    r = subprocess.run([sys.argv[1], "--transport", "tcp", "-b", "8", "-e", "8", "-n", "1", "-w", "0"],
                       env=env, timeout=30, capture_output=True, text=True)
    print(r.stdout, r.stderr, "exit", r.returncode)
except subprocess.TimeoutExpired:
    print("still waiting after 30 s")
PY
took=$((SECONDS - start))
if [[ $took -lt 20 ]] && grep -q "exit [1-9]" "$out" && grep -q "PMIx" "$out"; then
  echo "ok    a PMIx server that never answers: failed after $took s"
else
  fail "a PMIx server that never answers (after $took s)" "$out"
fi

finish
