#!/usr/bin/env bash
# Installs what pdcoll needs on a fresh Debian 12 machine. Idempotent: when
# everything is present it only checks and returns.
#   scripts/install-deps.sh            core: compilers, cmake, libfabric, liburing, doctest, CLI11
#   scripts/install-deps.sh --bench    plus the baselines (Open MPI, Gloo), iperf3 (TCP ceiling), matplotlib for bench/compare.sh and valgrind for bench/instructions.sh
#   scripts/install-deps.sh --conan    plus Conan 2 from PyPI
#   scripts/install-deps.sh --mpi      plus Open MPI's mpirun and PMIx's headers (rendezvous under mpirun
#                                      without PDCOLL_ROOT, include/pdcoll/bootstrap/pmix.hpp; tests/mpirun/run.sh)
#   scripts/install-deps.sh --slurm    plus Slurm's daemons and srun (tests/slurm/run.sh); if they
#                                      cannot be installed it says so and goes on: that test then skips
set -euo pipefail

core=(g++ clang cmake make pkg-config python3 python3-pip libfabric-dev libfabric-bin liburing-dev
      doctest-dev libcli11-dev libbenchmark-dev iproute2 ethtool libclang-rt-14-dev)
bench=(libopenmpi-dev openmpi-bin libgloo-dev python3-matplotlib iperf3 valgrind)
mpi=(openmpi-bin libpmix-dev openssh-client)  # mpirun looks for ssh (plm_rsh_agent) even for local ranks
slurm=(slurmctld slurmd slurm-client)
want=("${core[@]}")
want_conan=0
want_slurm=0
for arg in "$@"; do
  case "$arg" in
    --bench) want+=("${mpi[@]}" "${bench[@]}") ;;
    --mpi) want+=("${mpi[@]}") ;;
    --conan) want_conan=1 ;;
    --slurm) want_slurm=1 ;;
    *) echo "install-deps: unknown option $arg" >&2; exit 2 ;;
  esac
done

sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
export DEBIAN_FRONTEND=noninteractive
updated=0
# install_missing PACKAGE...: apt-get installs those not installed yet.
install_missing() {
  local missing=() pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  ((${#missing[@]})) || return 0
  echo "install-deps: installing ${missing[*]}"
  if ((!updated)); then
    $sudo_cmd apt-get update -qq || true
    updated=1
  fi
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
}
install_missing "${want[@]}"
if ((want_slurm)); then
  # The packages' scripts try to start munge and slurmd as services; where
  # that breaks the install, only the Slurm test is lost (it skips).
  install_missing "${slurm[@]}" || echo "install-deps: warning: Slurm could not be installed; tests/slurm/run.sh will skip"
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
