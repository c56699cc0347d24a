#!/usr/bin/env bash
# Installs what pdcoll needs on a fresh Debian 12 machine. Idempotent: when
# everything is present it only checks and returns.
#   scripts/install-deps.sh            core: compilers, cmake, libfabric, liburing, doctest, CLI11
#   scripts/install-deps.sh --bench    plus the baselines (Open MPI, Gloo), iperf3 (TCP ceiling) and matplotlib for bench/compare.sh
#   scripts/install-deps.sh --conan    plus Conan 2 from PyPI
set -euo pipefail

core=(g++ clang cmake make pkg-config python3 python3-pip libfabric-dev libfabric-bin liburing-dev
      doctest-dev libcli11-dev libbenchmark-dev iproute2 ethtool libclang-rt-14-dev)
bench=(libopenmpi-dev openmpi-bin libgloo-dev python3-matplotlib iperf3)
want=("${core[@]}")
want_conan=0
for arg in "$@"; do
  case "$arg" in
    --bench) want+=("${bench[@]}") ;;
    --conan) want_conan=1 ;;
    *) echo "install-deps: unknown option $arg" >&2; exit 2 ;;
  esac
done

missing=()
for pkg in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq || true
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if ((want_conan)); then
  if ! command -v conan >/dev/null 2>&1; then
    # Debian's own python3 refuses system-wide pip installs (PEP 668): fall
    # back to a user install, whose bin directory scripts/test.sh puts on PATH.
    python3 -m pip install -q "conan>=2,<3" 2>/dev/null ||
      python3 -m pip install -q --user --break-system-packages "conan>=2,<3"
    # pyenv's python3 needs its shims regenerated to put `conan` on PATH.
    if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi
  fi
fi
echo "install-deps: ok"
