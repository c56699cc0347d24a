#!/usr/bin/env bash
# The headers compile cleanly in a careful user's build: every public header
# alone and every example (which instantiates the templates a program uses)
# with -Wall -Wextra -Werror. pdcoll.pc and add_subdirectory hand out plain
# -I paths, not -isystem, so a warning the headers raise fails such builds.
#   warnings.sh <c++ compiler> <source dir>
set -euo pipefail
cxx=$1
source=$2
flags=(-Wall -Wextra -Werror)
# The PMIx rendezvous too, where pkg-config finds PMIx (as find_package(pdcoll) then enables it).
if pmix_flags=$(pkg-config --cflags pmix 2>/dev/null); then
  read -r -a pmix <<< "$pmix_flags"
  flags+=(-DPDCOLL_WITH_PMIX "${pmix[@]}")
fi
"$source/tests/scripts/headers_alone.sh" "$cxx" "$source/include" "${flags[@]}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
for example in "$source"/examples/*.cpp; do
  if ! "$cxx" -std=c++20 -fsyntax-only "${flags[@]}" -I"$source/include" "$example" 2> "$work/err"; then
    echo "FAIL: $(basename "$example") warns:"
    head -n 8 "$work/err"
    failed=1
  fi
done
[ "$failed" = 0 ] && echo "the examples compile without warnings"
exit "$failed"
