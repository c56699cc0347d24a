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
#   shaped       the same over links shaped with netem (delay 2ms, rate 1gbit);
#                reported as skipped where the kernel has no sch_netem;
#   cut          a loop that runs until it fails; 4 s in, the last rank's link
#                is set down: every rank must report a failure within its
#                deadline + 1 s, later operations must fail at once with
#                aborted, and every rank must exit (no hang).
# Needs root and `ip netns`; otherwise prints why it was skipped and exits 77
# (ctest's SKIP_RETURN_CODE). Namespaces are removed on exit (trap).
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

tag="pdc$$"
hub="${tag}-hub"
ns() { echo "${tag}-r$1"; }
workdir=$(mktemp -d)
cleanup() {
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

for transport in libfabric uring; do
  echo "== $transport over $ranks namespaces"
  launch "$transport.correctness" "$transport" 20000 0 run 40
  expect "$transport.correctness" ok

  if ! command -v tc >/dev/null; then
    echo "SKIPPED: $transport.shaped: tc (iproute2) is not installed"
  elif ! ip netns exec "$(ns 0)" tc qdisc add dev eth0 root netem delay 2ms rate 1gbit 2>"$workdir/tc.err"; then
    echo "SKIPPED: $transport.shaped: netem is not available here ($(cat "$workdir/tc.err"); kernel module sch_netem)"
  else
    for ((r = 1; r < ranks; ++r)); do
      ip netns exec "$(ns $r)" tc qdisc add dev eth0 root netem delay 2ms rate 1gbit || failures=$((failures + 1))
    done
    launch "$transport.shaped" "$transport" 30000 0 run 20
    expect "$transport.shaped" ok
    for ((r = 0; r < ranks; ++r)); do ip netns exec "$(ns $r)" tc qdisc del dev eth0 root 2>/dev/null; done
  fi

  launch "$transport.cut" "$transport" 2000 4 run 0 60
  expect "$transport.cut" error
done

if [[ $failures -ne 0 ]]; then
  echo "netns: $failures scenario(s) failed"
  exit 1
fi
echo "netns: every scenario passed"
