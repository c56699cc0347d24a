#!/usr/bin/env bash
# Every public header compiles on its own, as its file comment invites
# (`#include <pdcoll/job.hpp>` and nothing else), and leaves a later system
# header (<unistd.h>) compiling: a missing include that pdcoll.hpp's order
# hides, or a declaration that conflicts with the system's, fails here.
#   headers_alone.sh <c++ compiler> <include dir> [extra compiler flags...]
set -euo pipefail
cxx=$1
include=$2
shift 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$include"
find pdcoll -name '*.hpp' | sort > "$work/headers"
count=$(wc -l < "$work/headers")
check_one() {
  local header=$1 cxx=$2 include=$3 work=$4
  shift 4
  local tu="$work/$(echo "$header" | tr '/.' '__').cpp"
  printf '#include <%s>\n#include <unistd.h>\nint main() {}\n' "$header" > "$tu"
  if ! "$cxx" -std=c++20 -fsyntax-only -I"$include" "$@" "$tu" 2> "$tu.err"; then
    echo "FAIL: $header does not compile on its own:"
    head -n 5 "$tu.err"
    return 1
  fi
}
export -f check_one
if xargs -P "$(nproc)" -I{} bash -c 'check_one "$@"' _ {} "$cxx" "$include" "$work" "$@" < "$work/headers"; then
  echo "all $count headers compile on their own"
else
  exit 1
fi
