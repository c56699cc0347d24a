#!/usr/bin/env python3
"""bench/placement_watch.py — where the scheduler keeps the ranks of a launch.

Runs a launch command (pdcoll-run or mpirun and its benchmark), passes its
output through, and every INTERVAL seconds reads the CPU each rank last ran
on (field 39 of /proc/PID/stat; a rank is a process whose environment has
PDCOLL_RANK or OMPI_COMM_WORLD_RANK and whose program name contains PATTERN).
At the end it prints to stderr, for each placement seen, the share of the
samples it was in, written as the groups of ranks that shared a CPU
("01|23": ranks 0 and 1 on one CPU, 2 and 3 on the other).

    bench/placement_watch.py --pattern pdcoll-bench -- tools/pdcoll-run -n 4 ...

Sampling reads /proc only (no process is forked per sample), so it takes
little from the ranks; at the default 0.1 s it is a few hundred microseconds
of CPU per second.
"""
import argparse
import collections
import os
import subprocess
import sys
import time

RANK_VARIABLES = (b"PDCOLL_RANK=", b"OMPI_COMM_WORLD_RANK=")


def rank_processes(pattern):
    """{rank: pid} of the processes whose program matches and that carry a rank variable."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                program = f.read().split(b"\0")[0]
            if pattern.encode() not in os.path.basename(program):
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                environment = f.read().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        for variable in environment:
            if variable.startswith(RANK_VARIABLES):
                found[int(variable.split(b"=", 1)[1])] = int(entry)
                break
    return found


def last_cpu(pid):
    """The CPU the process last ran on, or None once it has exited."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # Field 39; the fields after the command name (which may hold spaces) start at 3.
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return None


def placement(cpus):
    """The ranks grouped by CPU, groups ordered by their lowest rank: {0: 1, 1: 0, 2: 1, 3: 0} -> "02|13"."""
    groups = collections.defaultdict(list)
    for rank in sorted(cpus):
        groups[cpus[rank]].append(rank)
    return "|".join("".join(map(str, g)) for g in sorted(groups.values()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pattern", required=True, help="part of the ranks' program name")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between samples (0.1)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the launch command")
    options = parser.parse_args()
    command = options.command[1:] if options.command[:1] == ["--"] else options.command
    if not command:
        parser.error("no launch command after --")

    launch = subprocess.Popen(command)
    ranks, settled, samples = {}, False, collections.Counter()
    while launch.poll() is None:
        time.sleep(options.interval)
        if not settled:  # until two scans find the same ranks, all of them started
            found = rank_processes(options.pattern)
            settled, ranks = bool(found) and found == ranks, found
            continue
        cpus = {rank: last_cpu(pid) for rank, pid in ranks.items()}
        if None not in cpus.values():
            samples[placement(cpus)] += 1
    total = sum(samples.values())
    if total:
        shares = ", ".join(f"{p} {100 * n / total:.0f} %" for p, n in samples.most_common())
        print(f"placement_watch: {len(ranks)} ranks, {total} samples: {shares}", file=sys.stderr)
    else:
        print("placement_watch: no sample (the launch ended before its ranks were found)", file=sys.stderr)
    return launch.returncode


if __name__ == "__main__":
    sys.exit(main())
