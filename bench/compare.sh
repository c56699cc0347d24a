#!/usr/bin/env bash
# File: bench/compare.sh — pdcoll against Open MPI and Gloo, in one invocation:
# float32 sum all-reduce (in-place rows), 2 and 4 ranks on this machine,
#   pdcoll      libfabric shm on ordinary buffers and on node-shareable ones
#               (--domain host_shareable: memory::host::allocate_shareable),
#               libfabric tcp, io_uring tcp, io_uring tcp with one
#               connection per direction   (pdcoll-bench, algo automatic)
#   Open MPI    shared memory (btl self,vader), TCP loopback (btl self,tcp, lo)
#   Gloo        tcp loopback: gloo::allreduce, AllreduceRingChunked, AllreduceHalvingDoubling
#   tcp-ceiling the TCP loopback ceiling: n concurrent iperf3 streams for n ranks
#               (bench/tcp_ceiling.py), skipped with a note if iperf3 is missing;
#               and the ring's traffic over plain sockets at each size from
#               1 MiB, no reduction (bench/tcp_ring_exchange.cpp)
#   tcp-floor   the 8-byte all-reduce by recursive doubling on plain sockets,
#               no library (bench/tcp_latency_floor.cpp), once per round
#               before the libraries: the table's TCP sections set pdcoll's
#               latency against it
# with ranks bound to a core each where there are enough cores (pdcoll-run's
# default, and mpirun --bind-to core), over 4 KiB .. 256 MiB (×4 steps by
# default), plus an 8-byte latency row per library (the mean of 2000
# iterations over TCP, 200,000 over shared memory, nccl-tests' statistic:
# with more ranks than cores one iteration's time is bimodal, some
# all-reduces finishing within a time slice and others waiting for a
# handoff, and the median picks either mode at random; bench_report.hpp's
# summarize(). Over shared memory 2,000 iterations last 6-10 ms with 4 ranks
# on 2 cores, one draw of how many ranks the scheduler keeps on each CPU, a
# state it holds for tens to hundreds of milliseconds; 200,000 last about a
# second, as 2,000 over TCP do for Gloo's slowest; design-notes item 54).
# Writes one CSV (library,
# transport, algorithm, ranks, oversubscribed, bytes, time_us, busbw_GBps, timing;
# the ceiling as a flat series, the ring exchange as a "tcp-ceiling ring
# exchange" series), a PNG (busbw vs size, one panel per rank count, the
# ceiling a flat line), a ratio table (the best pdcoll series, shareable
# buffers included, vs the best baseline; below 256 KiB shareable buffers
# run the same code as ordinary ones, so a difference there is noise; with
# two or more rounds, each cell also gets the ratio every round gives alone,
# lowest-highest, and how many rounds reach the bar; then every TCP series'
# busbw over the ceiling, then the best pdcoll and baseline over the ring
# exchange), every round's rows before the median (compare_rounds.csv) and
# the ceiling's per-stream figures (tcp_ceiling.csv), all under --out.
#
#   bench/compare.sh                     # full sweep (tens of minutes on 2 cores)
#   bench/compare.sh --max 16M --iters 5 # quick smoke
#
# Options: --min BYTES (4K) --max BYTES (256M) --factor F (4) --iters N (10)
# --warmup N (2) --small-iters N (1000: iterations and, over 10, warm-ups
# of the sizes below 1 MiB, whose microseconds a median of 10 cannot
# resolve; with 4 ranks on 2 cores a median of 200 still moved by 20-30 %
# between runs) --ranks "2 4" --pdcoll-algos "automatic ring ..." (automatic:
# pdcoll-bench --algo values, one series each) --out DIR (bench/results) --build DIR
# (build-bench) --no-build --ceiling-lengths "16K 128K 1M" (iperf3 -l values)
# --ceiling-seconds N (3, per iperf3 run; 0 skips the ceiling)
# --latency-iters N (2000: the TCP latency rows' iterations and the floor's)
# --shm-latency-iters N (200000: the shared-memory latency rows')
# --settle SECONDS (1: every launch of the three libraries' benchmarks and of
# the floor first runs its first size untimed this long, so the table times the steady state
# rather than the scheduler still spreading a fresh launch's ranks over the
# CPUs; design-notes item 54) --rounds N (1:
# every library's runs repeated N times; within a round the libraries take
# turns part by part (small sizes, large sizes, latency), each round starting
# with the next library, and each size reported from the round with the
# median time, so a burst of load from elsewhere on a shared machine spoils
# one round, not the table). Runs with more
# ranks than cores are marked oversubscribed in the CSV, the plot and the
# table; they are kept, not hidden.
set -euo pipefail
cd "$(dirname "$0")/.."

min=4K max=256M factor=4 iters=10 warmup=2 small_iters=1000 ranks="2 4" algos=automatic out=bench/results build=build-bench do_build=1
latency_iters=2000 shm_latency_iters=200000 settle=1
ceiling_lengths="16K 128K 1M" ceiling_seconds=3 rounds=1
while (($#)); do
  case "$1" in
    --min) min=$2; shift 2 ;;
    --max) max=$2; shift 2 ;;
    --factor) factor=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --small-iters) small_iters=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --pdcoll-algos) algos=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --ceiling-lengths) ceiling_lengths=$2; shift 2 ;;
    --ceiling-seconds) ceiling_seconds=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --latency-iters) latency_iters=$2; shift 2 ;;
    --shm-latency-iters) shm_latency_iters=$2; shift 2 ;;
    --settle) settle=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "compare.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

if ((do_build)); then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DPDCOLL_BUILD_TESTS=OFF -DPDCOLL_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$build" -j 2 --target pdcoll-bench mpi_allreduce_bench gloo_allreduce_bench tcp_ring_exchange \
    tcp_latency_floor
fi
bin=$build/bench
for p in pdcoll-bench mpi_allreduce_bench gloo_allreduce_bench tcp_ring_exchange tcp_latency_floor; do
  [ -x "$bin/$p" ] || { echo "compare.sh: $bin/$p is missing (scripts/install-deps.sh --bench, then build)" >&2; exit 1; }
done

mkdir -p "$out"
raw=$(mktemp -d /tmp/pdcoll-compare.XXXXXX)
trap 'rm -rf "$raw"' EXIT
log=$out/compare.log
: >"$log"
# Open MPI as root in a container, more ranks than cores; keep it from
# probing other interfaces. Every library's ranks are bound to a core each
# when there are enough cores and left unbound otherwise: pdcoll-run's
# default (pdcoll and Gloo run under it) and the same choice for mpirun.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_base_warn_component_unused=0
mpi_for() {  # mpi_for RANKS: sets mpi to the mpirun command line
  local bind=none
  (($1 <= $(nproc))) && bind=core
  mpi=(mpirun --oversubscribe --allow-run-as-root --bind-to "$bind")
}
timeout_s=1800
n=0

run() {  # run NAME COMMAND...: output to the log, the CSV to $raw/NAME.csv
  local name=$1; shift
  echo "== $name: $*" | tee -a "$log"
  if ! timeout "$timeout_s" "$@" >>"$log" 2>&1; then
    echo "compare.sh: $name failed (see $log)" | tee -a "$log" >&2
  fi
}

bytes_of() {  # 4K -> 4096 (K, M, G suffixes, as the benchmarks read them)
  case $1 in
    *K) echo $((${1%K} << 10)) ;; *M) echo $((${1%M} << 20)) ;; *G) echo $((${1%G} << 30)) ;; *) echo "$1" ;;
  esac
}
# The sweep in two parts: sizes below 1 MiB with --small-iters, the rest with
# --iters; a part with no size of the series is left out.
small_last=0 large_first=0
for ((b = $(bytes_of "$min"); b <= $(bytes_of "$max"); b *= factor)); do
  if ((b < 1 << 20)); then small_last=$b; elif ((large_first == 0)); then large_first=$b; fi
  ((factor > 1)) || break
done
parts=""
((small_last > 0)) && parts+="small "
((large_first > 0)) && parts+="large "
parts+="latency"

sizes() {  # sizes small|large|latency [shm|tcp]: sets args to the size options
  case $1 in
    small) args=(-b "$min" -e "$small_last" -f "$factor" -n "$small_iters" -w $((small_iters / 10 > warmup ? small_iters / 10 : warmup)) -c 0) ;;
    large) args=(-b "$large_first" -e "$max" -f "$factor" -n "$iters" -w "$warmup" -c 0) ;;
    *) args=(-b 8 -e 8 -n "$([ "${2:-tcp}" = shm ] && echo "$shm_latency_iters" || echo "$latency_iters")" -w 200 -c 0 --timing mean) ;;
  esac
  args+=(--settle "$settle")
}

# The ceiling first, while nothing else of ours loads the machine. It writes
# $ceiling only when some iperf3 run gave figures, and never fails the sweep.
ceiling=$out/tcp_ceiling.csv
rm -f "$ceiling"
if ((ceiling_seconds > 0)); then
  echo "== tcp-ceiling: iperf3 on 127.0.0.1, ranks $ranks, -l $ceiling_lengths, ${ceiling_seconds}s each" | tee -a "$log"
  timeout "$timeout_s" python3 bench/tcp_ceiling.py measure --ranks "$ranks" --lengths "$ceiling_lengths" \
    --seconds "$ceiling_seconds" --out "$ceiling" 2>&1 | tee -a "$log" ||
    echo "compare.sh: the TCP ceiling measurement failed (see $log); going on without it" | tee -a "$log" >&2
fi

# The ring's traffic over plain sockets at each size of 1 MiB and up
# (bench/tcp_ring_exchange.cpp): where large buffers take the loopback below
# iperf3's cache-resident figure. Below 1 MiB its thread handoffs, not the
# loopback, set its time, so it is not run there.
mkdir -p "$raw/exchange"
if ((large_first > 0)); then
  for r in $ranks; do
    ((r > 1)) || continue
    run "tcp-ring-exchange-n$r" tools/pdcoll-run -n "$r" --timeout "$timeout_s" "$bin/tcp_ring_exchange" \
      -b "$large_first" -e "$max" -f "$factor" -n "$iters" -w "$warmup" --csv "$raw/exchange/n$r.csv"
  done
fi
exchange=("$raw"/exchange/*.csv)
[ -e "${exchange[0]}" ] || exchange=()

# The latency floor for R ranks (bench/tcp_latency_floor.cpp), the 8-byte
# options of the libraries' latency rows.
mkdir -p "$raw/floor"
run_floor() {
  (($1 > 1)) || return 0
  run "tcp-latency-floor-n$1" tools/pdcoll-run -n "$1" --timeout "$timeout_s" "$bin/tcp_latency_floor" \
    -b 8 -e 8 -n "$latency_iters" -w 200 --timing mean --settle "$settle" --csv "$raw/floor/round$round-$((n++)).csv"
}

# One library's runs of one part (small, large, latency) for R ranks:
# run_pdcoll R PART, run_openmpi R PART, run_gloo R PART.
run_pdcoll() {
  local config t domain algo
  for config in shm:host shm:host_shareable tcp:host uring:host uring-directional:host; do
    t=${config%%:*} domain=${config#*:}
    sizes "$2" "$([ "$t" = shm ] && echo shm || echo tcp)"
    for algo in $algos; do
      run "pdcoll-$t-$domain-$algo-n$1-$2" tools/pdcoll-run -n "$1" --timeout "$timeout_s" \
        "$bin/pdcoll-bench" --transport "$t" --domain "$domain" --algo "$algo" "${args[@]}" \
        --csv "$raw/round$round-$((n++)).csv"
    done
  done
}
run_openmpi() {
  local t btl
  mpi_for "$1"
  for t in vader tcp; do
    sizes "$2" "$([ "$t" = vader ] && echo shm || echo tcp)"
    btl=(--mca btl "self,$t")
    [ "$t" = tcp ] && btl+=(--mca btl_tcp_if_include lo)
    run "openmpi-$t-n$1-$2" "${mpi[@]}" -n "$1" "${btl[@]}" \
      "$bin/mpi_allreduce_bench" --transport "$t" "${args[@]}" --csv "$raw/round$round-$((n++)).csv"
  done
}
run_gloo() {
  local a
  sizes "$2"
  for a in allreduce ring_chunked halving_doubling; do
    run "gloo-$a-n$1-$2" tools/pdcoll-run -n "$1" --timeout "$timeout_s" \
      "$bin/gloo_allreduce_bench" --algo "$a" "${args[@]}" --csv "$raw/round$round-$((n++)).csv"
  done
}

# The libraries take turns part by part (small sizes, large sizes, the
# latency row), so the runs a table cell compares lie a minute or two apart
# rather than a whole library's sweep: the shared machine has stretches of
# minutes in which work runs several times slower (bench/state_probe.sh;
# in one session's two runs of --rounds 3, 2-rank shared-memory latency
# 0.22 against 0.52 us, both with Open MPI at 0.44), and a stretch that
# covered one library's whole sweep and not the next one's decided cells.
# Each round starts with another library (pdcoll, Open MPI, Gloo, in turn),
# so no library always runs first after the previous part's heaviest job.
libraries=(pdcoll openmpi gloo)
for round in $(seq "$rounds"); do
  for r in $ranks; do
    run_floor "$r"
    for what in $parts; do
      for k in 0 1 2; do
        "run_${libraries[$(((round - 1 + k) % 3))]}" "$r" "$what"
      done
    done
  done
done

floor=("$raw"/floor/*.csv)
[ -e "${floor[0]}" ] || floor=()
py=python3  # Debian's python3-matplotlib lives in /usr/bin/python3, which a pyenv shim may hide
python3 -c "import matplotlib" 2>/dev/null || py=/usr/bin/python3
if [ -f "$ceiling" ]; then
  # CSV and PNG carry the ceiling as one more (flat) series; the pdcoll-vs-baseline
  # table must not take it for a baseline, so it is drawn from the libraries alone
  # (its CSV is a by-product), and the ceiling ratios follow it.
  mkdir -p "$raw/ceiling"
  python3 bench/tcp_ceiling.py rows --measured "$ceiling" --out "$raw/ceiling/rows.csv" "$raw"/*.csv
  "$py" bench/plot.py --cores "$(nproc)" --csv "$out/compare.csv" --png "$out/compare.png" \
    "$raw"/*.csv "$raw/ceiling/rows.csv" "${exchange[@]}"
  "$py" bench/plot.py --cores "$(nproc)" --csv "$raw/ceiling/libraries.csv" --table "$out/compare.md" \
    --rounds-csv "$out/compare_rounds.csv" --floor "${floor[@]}" -- "$raw"/*.csv
  python3 bench/tcp_ceiling.py table --measured "$ceiling" --cores "$(nproc)" \
    "${exchange[@]/#/--exchange=}" "$raw"/*.csv >>"$out/compare.md"
else
  echo "compare.sh: no TCP ceiling this run (see above); compare.md has no ceiling ratios" | tee -a "$log"
  "$py" bench/plot.py --cores "$(nproc)" --csv "$out/compare.csv" --png "$out/compare.png" "$raw"/*.csv "${exchange[@]}"
  "$py" bench/plot.py --cores "$(nproc)" --csv "$raw/libraries.csv.tmp" --table "$out/compare.md" \
    --rounds-csv "$out/compare_rounds.csv" --floor "${floor[@]}" -- "$raw"/*.csv
fi
cat "$out/compare.md"
echo "compare.sh: wrote $out/compare.csv, $out/compare_rounds.csv, $out/compare.png, $out/compare.md$([ -f "$ceiling" ] && echo ", $ceiling") (full output: $log)"
