#!/usr/bin/env bash
# File: tests/netns/run.sh — ranks on separate "hosts": one network namespace
# per rank, joined by veth pairs to a bridge that lives in a hub namespace of
# its own, addresses 10.77.0.x inside the namespaces only (nothing is added to
# the caller's namespace, so no traffic leaves the namespaces made here).
#
#     tests/netns/run.sh <path to failure_rank> [ranks]
#
# Scenarios, over libfabric tcp (PDCOLL_PROVIDER=tcp) and the uring transport:
#   correctness  a seeded loop of all-reduces of random sizes and algorithms;
#                every rank checks every result;
#   cut          a loop that runs until it fails; 4 s in, the last rank's link
#                is set down: every rank must report a failure within its
#                deadline + 1 s, later operations must fail at once with
#                aborted, and every rank must exit (no hang);
#   shaped       (last, for both transports) the correctness loop over shaped
#                links: a tbf rate limit on every rank's eth0 and a delay that
#                adds 2 x $shape_delay_ms to every round trip between two
#                ranks. The delay comes from netem where the kernel has
#                sch_netem, otherwise from delay_line.py, a user-space
#                forwarder spliced into each rank's port on the bridge. Before
#                the runs, link_probe.py measures RTT and throughput between
#                two ranks unshaped and shaped; the scenario fails unless the
#                RTT grew by the delay and the throughput stayed under the rate.
# Needs root and `ip netns`; otherwise prints why it was skipped and exits 77
# (ctest's SKIP_RETURN_CODE). Namespaces and forwarders are removed on exit (trap).
set -uo pipefail

program=${1:-}
ranks=${2:-3}
if [[ -z "$program" || ! -x "$program" ]]; then
  echo "usage: $0 <failure_rank binary> [ranks]" >&2
  exit 2
fi
skip() { echo "SKIPPED: netns tests: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "not root (uid $(id -u)); they create network namespaces"
command -v ip >/dev/null || skip "the ip command (iproute2) is not installed"
probe="pdcoll-probe-$$"
ip netns add "$probe" 2>/dev/null || skip "'ip netns add' failed (no CAP_SYS_ADMIN, or no netns support in this kernel/container)"
ip netns del "$probe"

here=$(cd "$(dirname "$0")" && pwd)
tag="pdc$$"
hub="${tag}-hub"
ns() { echo "${tag}-r$1"; }
workdir=$(mktemp -d)
helper_pids=()
cleanup() {
  for pid in "${helper_pids[@]}"; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; done
  for ((r = 0; r < ranks; ++r)); do ip netns del "$(ns $r)" 2>/dev/null; done
  ip netns del "$hub" 2>/dev/null
  rm -rf "$workdir"
}
trap cleanup EXIT INT TERM

ip netns add "$hub"
ip -n "$hub" link add br0 type bridge
ip -n "$hub" link set br0 up
ip -n "$hub" link set lo up
for ((r = 0; r < ranks; ++r)); do
  n=$(ns $r)
  ip netns add "$n"
  ip -n "$n" link set lo up
  # Both ends are created inside the namespaces: the pair is born in $n, one end moves to the hub.
  ip -n "$n" link add eth0 type veth peer name "p$r"
  ip -n "$n" link set "p$r" netns "$hub"
  ip -n "$n" addr add "10.77.0.$((r + 1))/24" dev eth0
  ip -n "$n" link set eth0 up
  ip -n "$hub" link set "p$r" master br0
  ip -n "$hub" link set "p$r" up
done
# With STP off (the default) the bridge forwards as soon as its ports are up.

failures=0
port=29500
# launch <name> <transport> <op timeout ms> <cut after s or 0> <failure_rank args...>
launch() {
  local name=$1 transport=$2 op_ms=$3 cut_after=$4
  shift 4
  port=$((port + 1))
  local token
  token=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
  local pids=()
  local start=$SECONDS
  for ((r = 0; r < ranks; ++r)); do
    ip netns exec "$(ns $r)" env PDCOLL_RANK=$r PDCOLL_WORLD_SIZE=$ranks PDCOLL_ROOT=10.77.0.1:$port \
      PDCOLL_TOKEN="$token" PDCOLL_TRANSPORT="$transport" PDCOLL_PROVIDER=tcp FI_PROVIDER=tcp FI_TCP_IFACE=eth0 \
      PDCOLL_URING_BIND="10.77.0.$((r + 1))" PDCOLL_TIMEOUT_MS=30000 PDCOLL_TEST_OP_TIMEOUT_MS="$op_ms" \
      timeout -s KILL 120 "$program" "$@" >"$workdir/$name.$r" 2>&1 &
    pids+=($!)
  done
  if [[ $cut_after != 0 ]]; then
    sleep "$cut_after"
    echo "   cutting rank $((ranks - 1))'s link (ip link set eth0 down in $(ns $((ranks - 1))))"
    ip -n "$(ns $((ranks - 1)))" link set eth0 down
  fi
  local rc=0
  for ((r = 0; r < ranks; ++r)); do
    wait "${pids[$r]}" || rc=1
  done
  echo "   $name: all ranks exited after $((SECONDS - start)) s"
  [[ $cut_after != 0 ]] && ip -n "$(ns $((ranks - 1)))" link set eth0 up
  return $rc
}

# expect <name> <ok|error>: every rank printed RESULT ok=1 with that status.
expect() {
  local name=$1 status=$2 bad=0
  for ((r = 0; r < ranks; ++r)); do
    local line
    line=$(grep '^RESULT' "$workdir/$name.$r" | tail -1)
    echo "   rank $r: ${line:-<no RESULT line>}"
    if [[ "$line" != *"ok=1"* || "$line" != *"status=$status"* ]]; then
      bad=1
      tail -20 "$workdir/$name.$r" | sed 's/^/      | /'
    fi
  done
  if [[ $bad -ne 0 ]]; then
    echo "FAIL: $name"
    failures=$((failures + 1))
  else
    echo "ok: $name"
  fi
}

# The shaping: every rank's eth0 sends at most $shape_rate_mbit Mbit/s (tbf); a frame
# between two ranks is delayed by $shape_delay_ms in all, so a round trip
# grows by twice that. The rate is low enough for the Python delay line to
# keep up on a busy 2-core machine (100 Mbit/s of full frames is ~8,300 a
# second per direction).
shape_delay_ms=2
shape_rate_mbit=100
shape_tbf=(tbf rate "${shape_rate_mbit}mbit" burst 64kb latency 100ms)
delay_line_pid=""

# start_helper <namespace> <log> <command...>: runs a helper that prints
# "ready" when set up, waits (5 s at most) for that line, and records its pid
# for cleanup.
start_helper() {
  local n=$1 log=$2
  shift 2
  ip netns exec "$n" "$@" >"$log" 2>&1 &
  helper_pids+=($!)
  local i
  for ((i = 0; i < 50; ++i)); do
    grep -qs '^ready' "$log" && return 0
    sleep 0.1
  done
  echo "   helper did not start: $*"
  sed 's/^/      | /' "$log"
  return 1
}

# stop_helper <pid>: ends a helper started above (its output stays in its log).
stop_helper() {
  kill "$1" 2>/dev/null
  wait "$1" 2>/dev/null
}

# probe_link <label>: RTT and throughput from rank 0 to rank 1; prints the
# link_probe line and leaves it in $workdir/probe.<label>.
probe_link() {
  local label=$1 out="$workdir/probe.$1"
  start_helper "$(ns 1)" "$workdir/probe-server.$label" python3 "$here/link_probe.py" serve 10.77.0.2 29400 || return 1
  local server=${helper_pids[-1]}
  ip netns exec "$(ns 0)" python3 "$here/link_probe.py" measure 10.77.0.2 29400 >"$out" 2>&1
  local rc=$?
  stop_helper "$server"
  echo "   rank 0 -> rank 1, $label: $(cat "$out")"
  return $rc
}

# field <file> <name>: the number after "<name>=" in a link_probe line.
field() { sed -n "s/.*$2=\([0-9.]*\).*/\1/p" "$1"; }

# offloads_off <namespace> <device>: whole, checksummed frames no larger than
# the MTU, which is what an AF_PACKET forwarder can pass on unchanged.
offloads_off() {
  ip netns exec "$1" ethtool -K "$2" tx off gso off tso off gro off >/dev/null
}

# netem_delay: $shape_delay_ms of netem on every rank's eth0 with the tbf
# under it (tc-netem(8)'s way of combining the two). Fails where the kernel
# has no sch_netem, before touching any other rank.
netem_delay() {
  local r
  for ((r = 0; r < ranks; ++r)); do
    ip netns exec "$(ns $r)" tc qdisc add dev eth0 root handle 1: netem delay "${shape_delay_ms}ms" 2>"$workdir/tc.err" ||
      return 1
    ip netns exec "$(ns $r)" tc qdisc add dev eth0 parent 1:1 handle 10: "${shape_tbf[@]}" || return 1
  done
}

# delay_line_delay: tbf on every rank's eth0 and, in the hub, each rank port
# p<r> taken off the bridge and joined to it again through delay_line.py and
# a second veth pair d<r>/q<r> (q<r> on the bridge). Each line delays both
# directions by half of $shape_delay_ms, so rank to rank is $shape_delay_ms.
delay_line_delay() {
  local r pairs=()
  for ((r = 0; r < ranks; ++r)); do
    ip netns exec "$(ns $r)" tc qdisc add dev eth0 root "${shape_tbf[@]}" || return 1
    offloads_off "$(ns $r)" eth0 || return 1
    ip -n "$hub" link set "p$r" nomaster
    ip -n "$hub" link add "d$r" type veth peer name "q$r"
    local dev
    for dev in "p$r" "d$r" "q$r"; do offloads_off "$hub" "$dev" || return 1; done
    ip -n "$hub" link set "q$r" master br0
    ip -n "$hub" link set "d$r" up
    ip -n "$hub" link set "q$r" up
    pairs+=("p$r:d$r")
  done
  local half
  half=$(awk "BEGIN { print $shape_delay_ms / 2 }")
  start_helper "$hub" "$workdir/delay_line.log" python3 "$here/delay_line.py" --delay-ms "$half" "${pairs[@]}" || return 1
  delay_line_pid=${helper_pids[-1]}
}

# check_shaping: the probe after shaping shows the added delay (at least 3/4
# of it) and a throughput under the rate (+10%). The fastest round trips are
# compared: scheduling noise on a busy machine only ever adds to a sample.
check_shaping() {
  local before after rate
  before=$(field "$workdir/probe.unshaped" min)
  after=$(field "$workdir/probe.shaped" min)
  rate=$(field "$workdir/probe.shaped" throughput_mbit)
  if [[ -z "$before" || -z "$after" || -z "$rate" ]]; then
    echo "   no measurement to check"
    return 1
  fi
  awk -v b="$before" -v a="$after" -v d="$shape_delay_ms" -v r="$rate" -v lim="$shape_rate_mbit" 'BEGIN {
    added = a - b
    printf "   fastest RTT grew by %.3f ms (expected about %.1f); throughput %.1f Mbit/s under a %d Mbit/s shaper\n", added, 2 * d, r, lim
    if (added < 1.5 * d) { print "   the link was not delayed"; exit 1 }
    if (r > 1.1 * lim) { print "   the link was not rate-limited"; exit 1 }
  }'
}

# show_qdiscs: the shaper on every rank's eth0 with its counters (tc -s).
show_qdiscs() {
  local r
  for ((r = 0; r < ranks; ++r)); do
    echo "   $(ns $r) eth0:"
    ip netns exec "$(ns $r)" tc -s qdisc show dev eth0 | sed 's/^/      | /'
  done
}

# shape_links: sets up the rate limit and the delay; says which way, or why
# it cannot, on stdout.
shape_links() {
  local r
  command -v tc >/dev/null || { echo "SKIPPED: shaped: tc (iproute2) is not installed"; return 1; }
  if netem_delay; then
    echo "   delay: netem ${shape_delay_ms}ms on each eth0; rate: tbf ${shape_rate_mbit}mbit"
    return 0
  fi
  echo "   netem is not available ($(cat "$workdir/tc.err")); delay from delay_line.py instead"
  for ((r = 0; r < ranks; ++r)); do ip netns exec "$(ns $r)" tc qdisc del dev eth0 root 2>/dev/null; done
  command -v ethtool >/dev/null || { echo "SKIPPED: shaped: ethtool is not installed (the delay line needs offloads off)"; return 1; }
  command -v python3 >/dev/null || { echo "SKIPPED: shaped: python3 is not installed (runs the delay line)"; return 1; }
  delay_line_delay || { echo "FAIL: shaped: the delay line could not be set up"; failures=$((failures + 1)); return 1; }
  echo "   delay: delay_line.py $(awk "BEGIN { print $shape_delay_ms / 2 }")ms each way on each rank's port; rate: tbf ${shape_rate_mbit}mbit on each eth0"
}

for transport in libfabric uring; do
  echo "== $transport over $ranks namespaces"
  launch "$transport.correctness" "$transport" 20000 0 run 40
  expect "$transport.correctness" ok

  launch "$transport.cut" "$transport" 2000 4 run 0 60
  expect "$transport.cut" error
done

# Shaped last: the links stay shaped until the namespaces are deleted.
echo "== shaped links over $ranks namespaces"
if ! probe_link unshaped; then
  echo "FAIL: shaped: the unshaped link could not be measured"
  failures=$((failures + 1))
elif shape_links; then
  if probe_link shaped && check_shaping; then
    echo "ok: shaping in place"
  else
    echo "FAIL: shaping in place"
    failures=$((failures + 1))
  fi
  for transport in libfabric uring; do
    launch "$transport.shaped" "$transport" 30000 0 run 20
    expect "$transport.shaped" ok
  done
  show_qdiscs
  if [[ -n "$delay_line_pid" ]]; then
    stop_helper "$delay_line_pid"
    grep -v '^ready' "$workdir/delay_line.log" | sed 's/^/   /'
  fi
fi

if [[ $failures -ne 0 ]]; then
  echo "netns: $failures scenario(s) failed"
  exit 1
fi
echo "netns: every scenario passed"
