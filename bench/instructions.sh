#!/usr/bin/env bash
# File: bench/instructions.sh — what one small collective costs a rank in
# instructions, counted by valgrind's callgrind: a figure that does not move
# with the machine's state, where the timings of the table's latency rows
# move by 2x from one launch to the next on a shared 2-vCPU VM
# (docs/design-notes.md, item 30).
#
# Rank 0 runs pdcoll-bench under callgrind, the other ranks natively and
# polling (PDCOLL_POLL_US, default 1 s), so they are always there first:
# rank 0 never waits, and what it counts is the work of the operation
# itself (launching, posting or publishing, reducing, completing), not
# spinning. Three launches with N, 2N and 3N iterations; the differences
# cancel setup and teardown; the smaller of the two differences is the figure (a wait only
# adds polling), and where they disagree by more than 5 % rank 0 did wait in
# one and the script warns. Counted: everything inside sync_wait() of the
# collective's sender (connect, start, the transport's work, completion,
# the operation state's end), not the call that builds the sender; user
# space only: the kernel's side of a system call (a TCP send, a futex wake)
# is not counted, so for the socket transports this is the library's own
# share of the time, not the whole of it.
#
#   bench/instructions.sh                                  # 8 B all-reduce, 2 ranks, libfabric shm
#   bench/instructions.sh --ranks 4 --transport uring --bytes 8
#   bench/instructions.sh --top 15                         # and where they go (exclusive, per operation)
#
# Options: --ranks N (2) --transport shm|tcp|uring|uring-directional (shm)
# --domain host|host_shareable (host) --bytes B (8) --collective
# all_reduce|broadcast|reduce|all_gather|reduce_scatter|all_to_all (all_reduce)
# --algo A (automatic) --iters N (2000) --top K (0: the total only; K: the
# K costliest functions per operation, by the difference of the first and
# last launch) --build DIR (build-bench: pdcoll-bench built there, e.g. by
# bench/compare.sh; a build with -g names inlined code's source lines).
set -euo pipefail
cd "$(dirname "$0")/.."

ranks=2 transport=shm domain=host bytes=8 collective=all_reduce algo=automatic iters=2000 top=0 build=build-bench
while (($#)); do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --transport) transport=$2; shift 2 ;;
    --domain) domain=$2; shift 2 ;;
    --bytes) bytes=$2; shift 2 ;;
    --collective) collective=$2; shift 2 ;;
    --algo) algo=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --top) top=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "instructions.sh: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
bench="$build/bench/pdcoll-bench"
[[ -x $bench ]] || { echo "instructions.sh: $bench is not built (cmake --build $build --target pdcoll-bench)" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "instructions.sh: valgrind is missing (scripts/install-deps.sh --bench)" >&2; exit 1; }
((ranks >= 2)) || { echo "instructions.sh: --ranks must be at least 2" >&2; exit 2; }
case $collective in
  all_reduce | broadcast | reduce | all_gather | reduce_scatter | all_to_all) ;;
  *) echo "instructions.sh: --collective $collective is not one it counts (pdcoll-bench's collective_sender ones)" >&2; exit 2 ;;
esac

work=$(mktemp -d /tmp/pdcoll-instructions.XXXXXX)
trap 'rm -rf "$work"' EXIT
# pdcoll-run starts every rank with the same command: this wrapper puts
# rank 0 under callgrind. --separate-threads keeps the main thread's count
# apart from helper threads a provider may start (their polling scales with
# rank 0's slowed-down wall time, not with the operations).
cat >"$work/rank0.sh" <<'EOF'
#!/usr/bin/env bash
if [ "$PDCOLL_RANK" = 0 ]; then
  exec valgrind --tool=callgrind --separate-threads=yes --collect-atstart=no --toggle-collect='*exec::sync_wait<pdcoll::collective_sender>*' \
    --callgrind-out-file="$CALLGRIND_OUT" "$@" 2>"$CALLGRIND_OUT.log"
fi
exec "$@"
EOF
chmod +x "$work/rank0.sh"

export PDCOLL_POLL_US=${PDCOLL_POLL_US:-1000000} PDCOLL_TIMEOUT_MS=${PDCOLL_TIMEOUT_MS:-600000}
totals=() mains=()
for k in 1 2 3; do
  out="$work/cg.$k"
  CALLGRIND_OUT=$out tools/pdcoll-run -n "$ranks" --timeout 1800 "$work/rank0.sh" "$bench" --transport "$transport" \
    --domain "$domain" --collective "$collective" --algo "$algo" -b "$bytes" -e "$bytes" -n $((k * iters)) -w 10 -c 0 --timing mean \
    >"$work/run.$k.log" 2>&1 || { cat "$work/run.$k.log" >&2; echo "instructions.sh: launch $k failed" >&2; exit 1; }
  # The main thread's file (cg.k-01), or the only one where the run had no other thread.
  main=$out-01
  [[ -f $main ]] || main=$out
  [[ -f $main ]] || { echo "instructions.sh: no callgrind output" >&2; exit 1; }
  mains+=("$main")
  totals+=("$(awk '/^summary:/ { print $2 }' "$main")")
done

# pdcoll-bench times each size out of place and, where the collective has
# one, in place: 2 operations per iteration for these collectives.
per_iter=2
[[ $collective == all_to_all ]] && per_iter=1
python3 - "${totals[@]}" "$iters" "$per_iter" "$ranks" "$transport" "$domain" "$bytes" "$collective" "$algo" <<'PY'
import sys
t1, t2, t3 = map(int, sys.argv[1:4])
iters, per_iter = int(sys.argv[4]), int(sys.argv[5])
ranks, transport, domain, nbytes, collective, algo = sys.argv[6:]
ops = iters * per_iter
a, b = (t2 - t1) / ops, (t3 - t2) / ops
# A wait only adds instructions (the polling), so the smaller difference is
# the better figure.
print(f"{collective} {nbytes} B, {ranks} ranks, {transport}, {domain} memory, algo {algo}: "
      f"{min(a, b):,.0f} instructions per operation on rank 0 "
      f"(launches of {iters}, {2 * iters}, {3 * iters} iterations: {a:,.0f} and {b:,.0f})")
if abs(a - b) > 0.05 * max(a, b):
    print("instructions.sh: warning: the two differences disagree by more than 5 %: rank 0 waited in one "
          "(run again, raise PDCOLL_POLL_US, or leave a CPU free)", file=sys.stderr)
PY

if ((top > 0)); then
  # Exclusive cost per function in the first and last launch, differenced.
  for k in 1 3; do
    callgrind_annotate --threshold=100 --show-percs=no "${mains[k - 1]}" 2>/dev/null |
      awk '$1 ~ /^[0-9][0-9,]*$/ && NF >= 2 { c = $1; gsub(",", "", c); $1 = ""; sub(/^ +/, ""); print c "\t" $0 }' \
      >"$work/functions.$k"
  done
  python3 - "$work/functions.1" "$work/functions.3" "$((2 * iters * per_iter))" "$top" <<'PY'
import sys
def load(path):
    cost = {}
    for line in open(path):
        c, name = line.rstrip("\n").split("\t", 1)
        if name.startswith("PROGRAM TOTALS") or name.startswith("=>"):
            continue
        cost[name] = cost.get(name, 0) + int(c)
    return cost
first, last = load(sys.argv[1]), load(sys.argv[2])
ops, top = int(sys.argv[3]), int(sys.argv[4])
rows = sorted(((last.get(k, 0) - first.get(k, 0)) / ops, k) for k in set(first) | set(last))
print(f"the {top} costliest functions, instructions per operation (exclusive):")
for v, k in reversed(rows[-top:]):
    print(f"{v:8.1f}  {k[:150]}")
PY
fi
