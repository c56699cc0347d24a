#!/usr/bin/env bash
# File: tests/slurm/run.sh — pdcoll started by a real srun. It brings up a
# private one-node Slurm cluster (slurmctld and slurmd from Debian's
# slurm-wlm; auth/none, its own ports, configuration and state in a temporary
# directory, nothing in /etc touched), then checks, with no PDCOLL_ROOT,
# MASTER_* or PDCOLL_TOKEN set (bootstrap/launch_info.hpp derives the root):
#   srun        pdcoll-bench's checked all_reduce sweep on 1-4 tasks over
#               libfabric tcp and shm and io_uring, and a reduce_scatter;
#   pmi2        srun --mpi=pmi2, whose PMI_RANK/PMI_SIZE make pdcoll read the
#               task as a PMI launch: the root still comes from the step;
#   two steps   two srun steps of one batch job that provably overlap;
#   -E          srun --preserve-env inside a 4-task job, whose tasks keep the
#               job's SLURM_NTASKS=4 although the step has 2;
#   batch       a batch script that runs the program itself, not through
#               srun, sees SLURM_PROCID=0 and SLURM_NTASKS=2: it must fail
#               within seconds naming the mistake, not wait for ranks that
#               never start.
#
#     tests/slurm/run.sh <pdcoll-bench binary>
#
# Needs root, slurmctld, slurmd, srun and Slurm's auth/none plugin
# (scripts/install-deps.sh --slurm) and a host name that resolves; otherwise
# prints why it was skipped and exits 77 (ctest's SKIP_RETURN_CODE). Every
# command is bounded (at most about 8 minutes in all); on exit the jobs are
# cancelled and the daemons stopped (trap).
set -uo pipefail

# shellcheck source=tests/support/launcher_checks.sh
source "$(dirname "$0")/../support/launcher_checks.sh" slurm "$@"
[[ $(id -u) -eq 0 ]] || skip "not root (uid $(id -u)); slurmd runs job steps as their owner"
for tool in slurmctld slurmd srun sbatch sinfo squeue scancel python3; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (scripts/install-deps.sh --slurm installs it)"
done
compgen -G "/usr/lib/*/slurm-wlm/auth_none.so" >/dev/null || compgen -G "/usr/lib*/slurm/auth_none.so" >/dev/null ||
  skip "this Slurm build has no auth/none plugin, which the private cluster uses instead of munge"
node=$(hostname -s)
getent hosts "$node" >/dev/null || skip "host name '$node' does not resolve; rank 0's clients connect to the step's first node"

# Nothing of an enclosing job or launcher may leak into the private cluster.
clean_launcher_environment
export PDCOLL_TIMEOUT_MS=20000

dir=$(mktemp -d /tmp/pdcoll-slurm.XXXXXX)
export SLURM_CONF=$dir/slurm.conf
pids=()
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  if ((${#pids[@]})); then
    timeout 10 scancel --quiet --full --partition=pdcoll 2>/dev/null
    for _ in $(seq 1 20); do
      [[ -z $(timeout 5 squeue -h 2>/dev/null) ]] && break
      sleep 0.5
    done
    kill "${pids[@]}" 2>/dev/null
    sleep 0.5
    kill -9 "${pids[@]}" 2>/dev/null
  fi
  rm -rf "$dir"
}
trap cleanup EXIT

read -r ctld_port slurmd_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')
cpus=$(nproc)
((cpus < 4)) && cpus=4  # four tasks on a 2-core machine: config_overrides accepts the count
mkdir -p "$dir/state" "$dir/spool"
cat >"$SLURM_CONF" <<EOF
ClusterName=pdcolltest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
MessageTimeout=5
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=pdcoll Nodes=$node Default=YES MaxTime=5 State=UP OverSubscribe=YES
EOF

slurmctld -D -f "$SLURM_CONF" >"$dir/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" -N "$node" >"$dir/slurmd.out" 2>&1 &
pids+=($!)
state=""
deadline=$((SECONDS + 40))
while ((SECONDS < deadline)); do
  kill -0 "${pids[@]}" 2>/dev/null || break
  state=$(timeout 5 sinfo -h -o %T 2>/dev/null)
  [[ $state == idle* ]] && break
  sleep 0.5
done
if [[ $state != idle* ]]; then
  echo "FAIL: the private Slurm cluster did not come up (node state '$state')"
  tail -n 20 "$dir"/*.log "$dir"/*.out 2>/dev/null
  exit 1
fi
echo "slurm: $(sinfo -V), node $node, $cpus CPUs, controller port $ctld_port"

q_bench=$(printf %q "$bench")
q_dir=$(printf %q "$dir")

check_sweeps srun srun -t 1
check_job "srun --mpi=pmi2 -n 3 (PMI_RANK/PMI_SIZE set)" srun -t 1 --mpi=pmi2 -n 3 "$bench" --transport tcp "${sweep[@]}"

# check_batch <name> <tasks> <script>: a batch job, at most 90 s; the
# script's last line of output must be "pass".
check_batch() {
  local name=$1 tasks=$2 script=$3 out=$dir/batch.$RANDOM.out
  timeout -k 5 90 sbatch --wait -n "$tasks" -t 1 -o "$out" --wrap "$script" >"$out.sbatch" 2>&1
  local rc=$?
  if [[ $rc -eq 0 ]] && [[ $(tail -n 1 "$out") == pass ]]; then echo "ok    $name"; else fail "$name (sbatch exit $rc)" "$out.sbatch" "$out"; fi
}

# Two steps of one job that overlap in time (each long enough that both are
# in flight together; the script checks that their intervals intersect).
long=(-b 8 -e 64K -f 8 -n 400 -w 10 -c 1 --transport tcp)
check_batch "two overlapping steps of one job" 4 "
  run() { s=\$(date +%s.%N); srun -n 2 --exact $q_bench ${long[*]} >$q_dir/step\$1.out 2>&1; r=\$?; echo \"\$r \$s \$(date +%s.%N)\" >$q_dir/step\$1.t; }
  run 0 & run 1 & wait
  cat $q_dir/step0.out $q_dir/step0.t $q_dir/step1.out $q_dir/step1.t
  read r0 s0 e0 <$q_dir/step0.t; read r1 s1 e1 <$q_dir/step1.t
  [ \$r0 -eq 0 ] && [ \$r1 -eq 0 ] && grep -q '$ok' $q_dir/step0.out && grep -q '$ok' $q_dir/step1.out &&
    python3 -c \"import sys; s0,e0,s1,e1=map(float,sys.argv[1:]); sys.exit(not (s0<e1 and s1<e0))\" \$s0 \$e0 \$s1 \$e1 &&
    echo pass"

# srun -E keeps the job's SLURM_NTASKS=4 in a 2-task step's environment.
check_batch "srun --preserve-env: 2 tasks of a 4-task job" 4 "
  srun -n 2 --preserve-env $q_bench --transport tcp ${sweep[*]} >$q_dir/e.out 2>&1; r=\$?
  cat $q_dir/e.out
  [ \$r -eq 0 ] && grep -q '$ok' $q_dir/e.out && echo pass"

# A batch script's own process is no srun task: refused well within the
# 20 s rendezvous timeout; srun from the same script works.
check_batch "a batch script's own process is refused at once; srun in it works" 2 "
  s=\$(date +%s)
  $q_bench --transport tcp -b 8 -e 8 -n 1 -w 0 >$q_dir/direct.out 2>&1; r=\$?
  t=\$((\$(date +%s) - s))
  cat $q_dir/direct.out; echo \"direct run: exit \$r after \$t s\"
  srun -n 2 $q_bench --transport tcp ${sweep[*]} >$q_dir/srun.out 2>&1; rs=\$?
  cat $q_dir/srun.out
  [ \$r -ne 0 ] && [ \$t -lt 10 ] && grep -q 'but this process is no srun task' $q_dir/direct.out &&
    [ \$rs -eq 0 ] && grep -q '$ok' $q_dir/srun.out && echo pass"

finish
