#!/usr/bin/env bash
# File: bench/segments.sh — what an all-reduce costs the kernel's TCP
# loopback in segments, beside its time. For each --sizes value, alternated
# --rounds times, it launches pdcoll-bench (io_uring, recursive doubling by
# default, float sum, no check, no warm-up, no settling: the time is an
# unsettled launch's, design-notes item 54), reads the kernel's counters with
# nstat around the launch (in its own history file) and divides them by the
# all-reduces the launch ran (--iters out of place, then --iters in place).
# Prints per round and size the in-place median time, the segments sent per
# all-reduce, and of those the ones carrying data (TcpExtTCPOrigDataSent)
# and the rest (TcpOutSegs less data and retransmissions: ACKs and window
# updates alone), then the medians over the rounds.
#
# It shows design-notes item 55: over a loopback whose MTU is 64 KiB a
# segment carries at most 65,483 bytes, so a 64 KiB message with pdcoll's
# 24-byte header takes two data segments, where 96 bytes less takes one, and
# the time follows the segments. The counters are the whole machine's: run
# it on a quiet one. The launch's setup adds a few hundred segments, under
# 1 % of the default run's.
#
#   bench/segments.sh                                  # 4 ranks, 65440 and 65536 bytes
#   bench/segments.sh --sizes "32K 64K 128K" --algo automatic --ranks 2
#
# Options: --ranks N (4) --sizes "BYTES ..." (65440 65536; K and M suffixes)
# --iters N (5000) --rounds N (3) --algo A (recursive_doubling: any
# pdcoll-bench --algo) --transport uring|uring-directional|tcp (uring)
# --timeout SECONDS (600: per launch) --build DIR (build-bench: pdcoll-bench
# built there)
set -euo pipefail
cd "$(dirname "$0")/.."

ranks=4 sizes="65440 65536" iters=5000 rounds=3 algo=recursive_doubling transport=uring timeout=600 build=build-bench
while (($#)); do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --algo) algo=$2; shift 2 ;;
    --transport) transport=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "segments.sh: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
case $transport in
  uring | uring-directional | tcp) ;;
  *) echo "segments.sh: --transport is uring, uring-directional or tcp (TCP loopback)" >&2; exit 2 ;;
esac
[[ $iters =~ ^[1-9][0-9]*$ && $rounds =~ ^[1-9][0-9]*$ && $ranks =~ ^[1-9][0-9]*$ && $timeout =~ ^[1-9][0-9]*$ ]] ||
  { echo "segments.sh: --iters, --rounds, --ranks and --timeout are positive integers" >&2; exit 2; }
bench=$build/bench/pdcoll-bench
[[ -x $bench ]] || { echo "segments.sh: $bench is missing (cmake --preset default -DPDCOLL_BUILD_BENCH=ON, then build)" >&2; exit 1; }
command -v nstat >/dev/null || { echo "segments.sh: nstat is missing (Debian iproute2: scripts/install-deps.sh)" >&2; exit 1; }

counter() {  # counter NAME: the value of NAME in the last nstat output, 0 when absent
  awk -v n="$1" '$1 == n { v = $2 } END { print v + 0 }' <<<"$counters"
}

raw=$(mktemp)
# nstat keeps what it last read in a history file, by default one per user:
# another nstat of this user during a launch would move the baseline.
NSTAT_HISTORY=$(mktemp)
export NSTAT_HISTORY
trap 'rm -f "$raw" "$NSTAT_HISTORY"' EXIT
printf '%-6s %10s %12s %12s %12s %12s\n' round bytes "in-place us" "segs/op" "data segs/op" "other/op"
for ((round = 1; round <= rounds; ++round)); do
  for s in $sizes; do
    nstat -n >/dev/null || { echo "segments.sh: nstat failed" >&2; exit 1; }  # history only: the next nstat reports the change since
    out=$(tools/pdcoll-run -n "$ranks" --timeout "$timeout" "$bench" --transport "$transport" --algo "$algo" \
      -b "$s" -e "$s" -n "$iters" -w 0 -c 0 2>&1) || { echo "segments.sh: pdcoll-bench failed:" >&2; tail -5 <<<"$out" >&2; exit 1; }
    counters=$(nstat) || { echo "segments.sh: nstat failed" >&2; exit 1; }  # what changed since the -n above
    row=$(awk '$1 == "[0]" && $2 ~ /^[0-9]+$/ { print $2, $11 }' <<<"$out")
    [[ -n $row ]] || { echo "segments.sh: no result row from pdcoll-bench:" >&2; tail -5 <<<"$out" >&2; exit 1; }
    read -r bytes time_us <<<"$row"
    ops=$((2 * iters))
    per_op=$(awk -v out="$(counter TcpOutSegs)" -v data="$(counter TcpExtTCPOrigDataSent)" \
      -v again="$(counter TcpRetransSegs)" -v n=$ops 'BEGIN { printf "%.2f %.2f %.2f", out / n, data / n, (out - data - again) / n }')
    read -r segments data other <<<"$per_op"
    printf '%-6s %10s %12s %12s %12s %12s\n' "$round" "$bytes" "$time_us" "$segments" "$data" "$other"
    echo "$bytes $time_us $segments $data $other" >>"$raw"
  done
done
echo
echo "medians over $rounds round(s), $ranks ranks, $transport, $algo:"
python3 - "$raw" <<'EOF'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    b, *values = line.split()
    rows[int(b)].append(tuple(float(v) for v in values))
print(f"{'bytes':>10} {'in-place us':>12} {'segs/op':>12} {'data segs/op':>12} {'other/op':>12}")
for b in sorted(rows):
    t, s, d, o = (statistics.median(x) for x in zip(*rows[b]))
    print(f"{b:>10} {t:>12.1f} {s:>12.2f} {d:>12.2f} {o:>12.2f}")
EOF
