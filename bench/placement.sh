#!/usr/bin/env bash
# File: bench/placement.sh — how much of a small oversubscribed all-reduce's
# time is the CPU placement of its ranks. Runs one size (fp32 sum, in place)
# over TCP loopback, pdcoll (io_uring, automatic) against Open MPI (TCP BTL on
# lo), or over shared memory, pdcoll (libfabric shm) against Open MPI
# (vader), each rank pinned by `taskset` to the CPU a map gives it, and
# unbound, the two libraries taking turns map by map, and prints a table of
# the in-place time (median or mean of the iterations: --timing) per map and
# library (the median over rounds), with the rounds' range.
#
# With 4 ranks on 2 CPUs a launch left unbound mostly keeps one placement for
# most of its life (--watch samples it; design-notes item 42: 95-98 % of the
# samples in one placement in half the launches, two placements shared in
# the rest), and which one it is decides more of its time than the library
# does (design-notes item 36): for pdcoll and Open MPI alike the
# slow placement is the one that puts the partner of every recursive-doubling
# step on the other CPU (0101 for pdcoll's Gray-code partners, 0110 for Open
# MPI's rank ^ mask); with one step's partners sharing a CPU both run faster.
#
#   bench/placement.sh                                  # 4 ranks, 4 KiB, 4 rounds
#   bench/placement.sh --size 64K --iters 1000 --maps "0011 0101"
#   bench/placement.sh --transport shm --size 8 --iters 20000 --timing mean --maps "0011 0101 0001 0000"
#
# Over shared memory the map decides how many ranks share a CPU rather than
# which partners do (design-notes item 54): two per CPU against three or four.
#
# Options: --transport tcp|shm (tcp) --timing median|mean (median: the time
# column of the benchmarks; an 8-byte all-reduce over shared memory with more
# ranks than CPUs wants the mean, as compare.sh's latency row: its iterations
# either finish within a time slice or wait for a switch, and the median picks
# one of the two) --settle SECONDS (0: untimed all-reduces before measuring,
# passed to both benchmarks; compare.sh settles for 1) --ranks N (4) --size BYTES (4K) --iters N (3000) --rounds N (4)
# --maps "M ..." (0011 0110 0101: digit k is the CPU of rank k, an index into
# this process's allowed CPUs; "unbound" is always run too) --build DIR
# (build-bench: pdcoll-bench and mpi_allreduce_bench built there) --watch
# SECONDS (off: sample the unbound launches' placement this often with
# bench/placement_watch.py and list, per launch, the share of the samples
# each placement had).
set -euo pipefail
cd "$(dirname "$0")/.."

transport=tcp timing=median settle=0 ranks=4 size=4K iters=3000 rounds=4 maps="0011 0110 0101" build=build-bench watch=
while (($#)); do
  case "$1" in
    --transport) transport=$2; shift 2 ;;
    --timing) timing=$2; shift 2 ;;
    --settle) settle=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --maps) maps=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --watch) watch=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "placement.sh: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
bin=$build/bench
case $transport in
  tcp) pdcoll_transport=uring mpi_btl=(--mca btl self,tcp --mca btl_tcp_if_include lo) mpi_transport=tcp
       where="TCP loopback" pdcoll_name="pdcoll io_uring" mpi_name="Open MPI tcp" ;;
  shm) pdcoll_transport=shm mpi_btl=(--mca btl self,vader) mpi_transport=vader
       where="shared memory" pdcoll_name="pdcoll libfabric shm" mpi_name="Open MPI vader" ;;
  *) echo "placement.sh: --transport is tcp or shm, not $transport" >&2; exit 2 ;;
esac
[[ $timing == median || $timing == mean ]] || { echo "placement.sh: --timing is median or mean, not $timing" >&2; exit 2; }
for p in pdcoll-bench mpi_allreduce_bench; do
  [ -x "$bin/$p" ] || { echo "placement.sh: $bin/$p is missing (scripts/install-deps.sh --bench, then build)" >&2; exit 1; }
done
mapfile -t cpus < <(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)), sep="\n")')
for m in $maps; do
  [[ ${#m} -eq $ranks && $m =~ ^[0-9]+$ ]] || { echo "placement.sh: map $m needs one CPU digit per rank ($ranks)" >&2; exit 2; }
  for ((k = 0; k < ranks; k++)); do
    ((${m:k:1} < ${#cpus[@]})) || { echo "placement.sh: map $m names CPU ${m:k:1}; this process may use ${#cpus[@]}" >&2; exit 2; }
  done
done

tmp=$(mktemp -d /tmp/pdcoll-placement.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# The wrapper pins the rank it starts: PDCOLL_RANK under pdcoll-run,
# OMPI_COMM_WORLD_RANK under mpirun; the map's digit indexes the CPUs this
# script may use.
cat >"$tmp/pin" <<EOF
#!/usr/bin/env bash
cpus=(${cpus[*]})
rank=\${PDCOLL_RANK:-\${OMPI_COMM_WORLD_RANK:?}}
exec taskset -c "\${cpus[\${PLACEMENT_MAP:\$rank:1}]}" "\$@"
EOF
chmod +x "$tmp/pin"

source bench/common.sh
args=(-b "$size" -e "$size" -n "$iters" -w $((iters / 10 + 2)) -c 1 --timing "$timing" --settle "$settle")
for round in $(seq "$rounds"); do
  for m in $maps unbound; do
    wrap=("$tmp/pin") watch_pdcoll=() watch_mpi=()
    if [ "$m" = unbound ]; then
      wrap=()
      if [ -n "$watch" ]; then
        watch_pdcoll=(bench/placement_watch.py --interval "$watch" --pattern pdcoll-bench --)
        watch_mpi=(bench/placement_watch.py --interval "$watch" --pattern mpi_allreduce_bench --)
      fi
    fi
    PLACEMENT_MAP=$m "${watch_pdcoll[@]}" tools/pdcoll-run -n "$ranks" --bind-to none "${wrap[@]}" \
      "$bin/pdcoll-bench" --transport "$pdcoll_transport" "${args[@]}" >"$tmp/out" 2>&1 || true
    echo "$round $m pdcoll $(in_place_us <"$tmp/out" | grep . || echo nan)" >>"$tmp/rows"
    sed -n 's/^placement_watch: /pdcoll: /p' "$tmp/out" >>"$tmp/watch"
    PLACEMENT_MAP=$m "${watch_mpi[@]}" mpirun --oversubscribe --allow-run-as-root --bind-to none -x PLACEMENT_MAP \
      -n "$ranks" "${mpi_btl[@]}" "${wrap[@]}" "$bin/mpi_allreduce_bench" \
      --transport "$mpi_transport" "${args[@]}" >"$tmp/out" 2>&1 || true
    echo "$round $m openmpi $(in_place_us <"$tmp/out" | grep . || echo nan)" >>"$tmp/rows"
    sed -n 's/^placement_watch: /Open MPI: /p' "$tmp/out" >>"$tmp/watch"
  done
  echo "round $round of $rounds done" >&2
done

python3 - "$tmp/rows" "$ranks" "$size" "${#cpus[@]}" "$where" "$pdcoll_name" "$mpi_name" "$timing" <<'EOF'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
times = {}
for _, m, lib, t in rows:
    if t != "nan":
        times.setdefault((m, lib), []).append(float(t))
print(f"{sys.argv[2]} ranks on {sys.argv[4]} CPUs, {sys.argv[3]} all-reduce over {sys.argv[5]}: "
      f"in-place {sys.argv[8]} us, median of rounds (lowest-highest)")
print(f"| placement (CPU of rank 0, 1, ...) | {sys.argv[6]} | {sys.argv[7]} | Open MPI / pdcoll |")
print("|---|---:|---:|---:|")
for m in dict.fromkeys(r[1] for r in rows):
    cell = {}
    for lib in ("pdcoll", "openmpi"):
        v = times.get((m, lib), [])
        cell[lib] = (statistics.median(v), min(v), max(v)) if v else None
    fmt = lambda c: f"{c[0]:.1f} ({c[1]:.1f}-{c[2]:.1f})" if c else "failed"
    ratio = f"{cell['openmpi'][0] / cell['pdcoll'][0]:.2f}" if cell["pdcoll"] and cell["openmpi"] else "-"
    print(f"| {m} | {fmt(cell['pdcoll'])} | {fmt(cell['openmpi'])} | {ratio} |")
EOF
if [ -s "$tmp/watch" ]; then
  echo
  echo "Where the unbound launches' ranks were (bench/placement_watch.py, a sample every $watch s; the groups of ranks that shared a CPU, share of the samples):"
  sed 's/^/- /' "$tmp/watch"
fi
