#!/usr/bin/env bash
# File: bench/crossover.sh — where one all-reduce algorithm overtakes
# another: pdcoll-bench --algo A for each A, taking turns size by size,
# --rounds times, then a table of the median in-place bus bandwidth (GB/s)
# per size and algorithm, the leader in bold. What algo::automatic's
# thresholds and model::reference_tcp were checked against (design-notes
# item 29).
#
#   bench/crossover.sh --ranks 4 --transport uring --sizes "256K 1M 2M 4M 8M"
#   bench/crossover.sh --ranks 2 --transport tcp --algos "recursive_doubling rabenseifner"
#
# Options: --ranks N (4) --transport shm|tcp|uring|uring-directional (uring)
# --algos "..." (recursive_doubling rabenseifner ring) --sizes "..." (128K
# 256K 512K 1M 2M 4M 8M) --rounds N (5) --iters N (20) --warmup N (3)
# --out FILE (raw rows "round bytes algo busbw"; default: a temporary file)
# --build DIR (build-bench; pdcoll-bench must be built there).
set -euo pipefail
cd "$(dirname "$0")/.."

ranks=4 transport=uring rounds=5 iters=20 warmup=3 build=build-bench out=""
algos="recursive_doubling rabenseifner ring" sizes="128K 256K 512K 1M 2M 4M 8M"
while (($#)); do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --transport) transport=$2; shift 2 ;;
    --algos) algos=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "crossover.sh: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
bench="$build/bench/pdcoll-bench"
[[ -x $bench ]] || { echo "crossover.sh: $bench is not built (cmake --build $build --target pdcoll-bench)" >&2; exit 1; }
[[ -n $out ]] || { out=$(mktemp); trap 'rm -f "$out"' EXIT; }
: >"$out"

for ((round = 1; round <= rounds; ++round)); do
  for size in $sizes; do
    for algo in $algos; do
      # Rank 0's row: "[0] bytes count type redop root | time algbw busbw #wrong (out of place) | ... (in place)".
      busbw=$(tools/pdcoll-run -n "$ranks" "$bench" --transport "$transport" --algo "$algo" -b "$size" -e "$size" \
                -n "$iters" -w "$warmup" -c 0 | awk '$1 == "[0]" && $2 + 0 > 0 { print $13 }')
      [[ -n $busbw ]] || { echo "crossover.sh: no result for $algo at $size" >&2; exit 1; }
      echo "$round $size $algo $busbw" >>"$out"
    done
  done
  echo "round $round of $rounds done" >&2
done

python3 - "$out" "$ranks" "$transport" "$rounds" <<'PY'
import collections, statistics, sys
rows, ranks, transport, rounds = sys.argv[1:]
busbw = collections.defaultdict(list)
sizes, algos = [], []
for line in open(rows):
    _, size, algo, value = line.split()
    busbw[size, algo].append(float(value))
    if size not in sizes: sizes.append(size)
    if algo not in algos: algos.append(algo)
print(f"{ranks} ranks over {transport}: in-place busbw GB/s, median of {rounds} rounds")
print("| size | " + " | ".join(algos) + " |")
print("|---|" + "---:|" * len(algos))
for size in sizes:
    medians = [statistics.median(busbw[size, a]) for a in algos]
    best = max(medians)
    print(f"| {size} | " + " | ".join(f"**{m:.2f}**" if m == best else f"{m:.2f}" for m in medians) + " |")
PY
