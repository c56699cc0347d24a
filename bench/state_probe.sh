#!/usr/bin/env bash
# File: bench/state_probe.sh — is a slow benchmark cell the library's or the
# machine's? Runs one all-reduce size (fp32 sum, shared memory) as many
# short launches, pdcoll (libfabric shm) and Open MPI (vader) alternately,
# and prints every launch's in-place median time, then per library the
# median, the fastest and slowest launch, and how many launches took more
# than 3x that library's fastest.
#
# On the shared 2-vCPU VM the project is measured on, whole stretches of
# hundreds of milliseconds run memory-bound work several times slower
# (a 1 MiB all-reduce on 2 ranks: 75-110 us, then 450-800 us), for both
# libraries alike. A cell of bench/compare.sh that one library lost by 4x
# in one round is that, when this probe shows both libraries slow in a
# similar share of launches.
#
#   bench/state_probe.sh                         # 1 MiB, 2 ranks, 10 launches each
#   bench/state_probe.sh --size 4M --launches 20
#
# Options: --size BYTES (1M) --ranks N (2) --launches N (10) --iters N (50)
# --build DIR (build-bench: pdcoll-bench and mpi_allreduce_bench built by
# bench/compare.sh or cmake --build DIR --target pdcoll-bench mpi_allreduce_bench).
set -euo pipefail
cd "$(dirname "$0")/.."

size=1M ranks=2 launches=10 iters=50 build=build-bench
while (($#)); do
  case "$1" in
    --size) size=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --launches) launches=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "state_probe.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
bin=$build/bench
for p in pdcoll-bench mpi_allreduce_bench; do
  [ -x "$bin/$p" ] || { echo "state_probe.sh: $bin/$p is missing (see --help)" >&2; exit 1; }
done
source bench/common.sh
bind=none
((ranks <= $(nproc))) && bind=core
args=(-b "$size" -e "$size" -n "$iters" -w $((iters / 10 + 1)) -c 0)


times=$(mktemp)
trap 'rm -f "$times"' EXIT
printf '%-7s %12s %12s\n' launch "pdcoll us" "openmpi us"
for i in $(seq "$launches"); do
  p=$(tools/pdcoll-run -n "$ranks" "$bin/pdcoll-bench" --transport shm "${args[@]}" 2>&1 | in_place_us)
  m=$(mpirun --oversubscribe --allow-run-as-root --bind-to "$bind" -n "$ranks" --mca btl self,vader \
        "$bin/mpi_allreduce_bench" --transport vader "${args[@]}" 2>&1 | in_place_us)
  printf '%-7s %12s %12s\n' "$i" "${p:-failed}" "${m:-failed}"
  echo "pdcoll ${p:-nan}" >>"$times"
  echo "openmpi ${m:-nan}" >>"$times"
done
python3 - "$times" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    name, value = line.split()
    if value != "nan":
        runs.setdefault(name, []).append(float(value))
for name, t in runs.items():
    slow = sum(1 for x in t if x > 3 * min(t))
    print(f"{name:8s} median {statistics.median(t):9.1f} us  fastest {min(t):9.1f}  slowest {max(t):9.1f}  "
          f"launches over 3x the fastest: {slow} of {len(t)}")
EOF
