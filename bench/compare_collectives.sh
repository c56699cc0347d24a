#!/usr/bin/env bash
# File: bench/compare_collectives.sh — pdcoll's collectives other than
# all-reduce beside Open MPI's, over shared memory, in one invocation
# (bench/compare.sh is the all-reduce's comparison, with Gloo, TCP and the
# plot). For each rank count and collective it runs, in turn and --rounds
# times:
#   pdcoll-bench --transport shm --collective C --algo A   for the message
#                algorithm C runs without node memory (tree, pairwise or
#                ring) and each --algos A (automatic: the default)
#   mpi_allreduce_bench --collective C   under mpirun --mca btl self,vader
# float32 (sum where C reduces), root 0, -c 1 (every run checks its
# results), over 4 KiB .. 64 MiB (x4 steps). It writes the raw rows
# (round ranks collective series bytes busbw) and a markdown table per size
# of the busbw range over the rounds and pdcoll automatic's mean over Open
# MPI's. All-to-all is out of place (pdcoll takes no overlapping buffers);
# the others are in place (MPI_Bcast has only that form). Runs with more
# ranks than cores are marked oversubscribed.
#
#   bench/compare_collectives.sh --rounds 2
#   bench/compare_collectives.sh --collectives "broadcast" --ranks 2 --max 1M
#
# Options: --min BYTES (4K) --max BYTES (64M) --factor F (4) --iters N (40)
# --warmup N (5) --ranks "2 4" --collectives "broadcast reduce all_to_all
# all_gather reduce_scatter" (all_to_allv too on request: all-to-all's equal
# blocks through the v forms, beside MPI_Alltoallv) --algos "automatic" (pdcoll-bench --algo values
# besides the message algorithm, which always runs) --rounds N (2)
# --settle SECONDS (1: every launch runs its first size untimed that long
# before measuring, as bench/compare.sh does, while the scheduler spreads a
# fresh launch's ranks over the CPUs; design-notes item 54; 0: none, as the
# committed bench/results/collectives.md was made)
# --out FILE (bench/results/collectives.md) --build DIR (build-bench) --no-build
set -euo pipefail
cd "$(dirname "$0")/.."

min=4K max=64M factor=4 iters=40 warmup=5 ranks="2 4" rounds=2 settle=1 build=build-bench do_build=1
collectives="broadcast reduce all_to_all all_gather reduce_scatter" algos=automatic out=bench/results/collectives.md
while (($#)); do
  case "$1" in
    --min) min=$2; shift 2 ;;
    --max) max=$2; shift 2 ;;
    --factor) factor=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --collectives) collectives=$2; shift 2 ;;
    --algos) algos=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --settle) settle=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    *) echo "compare_collectives.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

[[ $settle =~ ^[0-9]+([.][0-9]+)?$ ]] && awk -v s="$settle" 'BEGIN { exit !(s <= 3600) }' ||
  { echo "compare_collectives.sh: --settle is a number of seconds from 0 to 3600" >&2; exit 2; }

if ((do_build)); then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DPDCOLL_BUILD_TESTS=OFF -DPDCOLL_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$build" -j"$(nproc)" --target pdcoll-bench mpi_allreduce_bench >/dev/null
fi
bench=$build/bench/pdcoll-bench mpi_bench=$build/bench/mpi_allreduce_bench
for b in "$bench" "$mpi_bench"; do
  [[ -x $b ]] || { echo "compare_collectives.sh: $b is missing (scripts/install-deps.sh --bench, then build)" >&2; exit 1; }
done
command -v mpirun >/dev/null || { echo "compare_collectives.sh: mpirun is missing (scripts/install-deps.sh --bench)" >&2; exit 1; }

# The message algorithm each collective runs without node memory.
message_algorithm() {
  case "$1" in
    broadcast | reduce) echo tree ;;
    all_to_all | all_to_allv) echo pairwise ;;
    *) echo ring ;;
  esac
}

# The code measured: the commit, "-dirty" when files outside bench/results differ from it.
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- . ':(exclude)bench/results' 2>/dev/null || commit+=-dirty
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_base_warn_component_unused=0
raw=${out%.md}.txt
mkdir -p "$(dirname "$out")"
: >"$raw"
sweep=(-b "$min" -e "$max" -f "$factor" -n "$iters" -w "$warmup" -c 1 --settle "$settle")
cores=$(nproc)
failed=0
for ((round = 1; round <= rounds; ++round)); do
  for n in $ranks; do
    bind=core
    ((n > cores)) && bind=none
    for c in $collectives; do
      # In place, but all-to-all's out-of-place columns: pdcoll-bench
      # prints busbw at $13 (in place) or $9; the MPI bench one column earlier.
      col=13 mcol=12
      [[ $c == all_to_all || $c == all_to_allv ]] && col=9 mcol=8
      for a in $(message_algorithm "$c") $algos; do
        log=$(tools/pdcoll-run -n "$n" "$bench" --transport shm --collective "$c" --algo "$a" "${sweep[@]}" 2>&1) || failed=1
        grep -q "Out of bounds values : 0 OK" <<<"$log" || { echo "pdcoll $c $a on $n ranks failed:" >&2; tail -5 <<<"$log" >&2; failed=1; }
        awk -v l="$round $n $c pdcoll-$a" -v col=$col '$1=="[0]" && $2 ~ /^[0-9]+$/ {print l, $2, $col}' <<<"$log" >>"$raw"
      done
      log=$(mpirun --oversubscribe --allow-run-as-root --bind-to $bind -n "$n" --mca btl self,vader "$mpi_bench" \
        --transport vader --collective "$c" "${sweep[@]}" 2>&1) || failed=1
      grep -q "Out of bounds values : 0 OK" <<<"$log" || { echo "Open MPI $c on $n ranks failed:" >&2; tail -5 <<<"$log" >&2; failed=1; }
      awk -v l="$round $n $c openmpi-vader" -v col=$mcol '$1 ~ /^[0-9]+$/ {print l, $1, $col}' <<<"$log" >>"$raw"
      echo "round $round, $n ranks, $c: done" >&2
    done
  done
done

python3 - "$raw" "$out" "$cores" "$commit" "${sweep[*]}" <<'EOF'
import collections, sys
raw, out, cores, commit, sweep = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(raw):
    f = line.split()
    if len(f) == 6:
        rows[(int(f[1]), f[2], int(f[4]))][f[3]].append(float(f[5]))
def size(b):
    for unit, shift in (("M", 20), ("K", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift}{unit}"
    return str(b)
def spread(v):
    return "-" if not v else f"{min(v):.2f}" if max(v) - min(v) < 0.005 else f"{min(v):.2f}–{max(v):.2f}"
series = sorted({s for r in rows.values() for s in r if s.startswith("pdcoll-")})
order = {c: i for i, c in enumerate(["broadcast", "reduce", "all_to_all", "all_to_allv", "all_gather", "reduce_scatter"])}
with open(out, "w") as o:
    o.write("# pdcoll's collectives beside Open MPI's over shared memory\n\n")
    o.write(f"bench/compare_collectives.sh at {commit}, sweep `{sweep}`; bus bandwidth in GB/s "
            "(nccl-tests' factors), the range over the rounds; in place except all-to-all. "
            "pdcoll over libfabric shm, Open MPI over vader. The ratio is pdcoll automatic's mean over "
            f"Open MPI's. {cores} cores: runs with more ranks are oversubscribed.\n\n")
    o.write("| ranks | collective | size | Open MPI | " + " | ".join(series) + " | automatic / MPI |\n")
    o.write("|---:|---|---:|---|" + "---|" * len(series) + "---:|\n")
    for key in sorted(rows, key=lambda k: (k[0], order.get(k[1], 9), k[1], k[2])):
        n, c, b = key
        r = rows[key]
        mpi, auto = r.get("openmpi-vader", []), r.get("pdcoll-automatic", [])
        ratio = f"{(sum(auto) / len(auto)) / (sum(mpi) / len(mpi)):.2f}" if mpi and auto and sum(mpi) > 0 else "-"
        over = " (oversubscribed)" if n > cores else ""
        o.write(f"| {n}{over} | {c} | {size(b)} | {spread(mpi)} | " + " | ".join(spread(r.get(s, [])) for s in series) +
                f" | {ratio} |\n")
print(open(out).read())
EOF
exit $failed
