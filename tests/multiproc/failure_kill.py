#!/usr/bin/env python3
"""Fault injection: a rank SIGKILLed at a seeded moment of a loop of all-reduces.

    failure_kill.py --program build/tests/failure_rank --launcher tools/pdcoll-run \
        --transport libfabric --provider shm --runs 17 [--first-seed 0] [--op-timeout-ms 2000]

Run i uses seed first_seed + i and world size 2 + i % 4. failure_rank picks the
victim and the moment from the seed (before posting, mid-transfer from a thread
after a random delay, after the loop). Each run passes when:
  * pdcoll-run exits non-zero, and not 124 (its own timeout: something hung);
  * the victim printed its VICTIM line and no RESULT;
  * every survivor printed "RESULT ok=1": its failing operation completed within
    its deadline plus one second and every later operation failed at once with
    errc::aborted (failure_rank checks and reports both);
  * no survivor crashed (sanitizer reports make a rank exit non-zero, and a
    crashed rank prints no RESULT).
Prints one line per run and a summary with the slowest survivor.

libfabric's shm provider has one hazard no deadline of pdcoll reaches: a rank
killed while holding a spinlock in a peer's shared-memory region leaves that
lock held for good, and survivors that send to that peer spin inside
fi_tinjectdata / fi_cq_read (seen with gdb: __pthread_spin_lock). pdcoll's
provider watchdog (transport/libfabric/provider_watchdog.hpp) ends such a
process after PDCOLL_PROVIDER_STUCK_MS with a line saying so.
--provider-watchdog-ms N sets that limit for the ranks and accepts a survivor
that ended that way in place of its RESULT (reported as "watchdog"); without
it such a survivor fails the run.

--max-hung-runs K tolerates up to K runs in which survivors printed nothing
(and were ended by pdcoll-run) while every other check held. Such runs are
reported as HUNG.
"""

import argparse
import os
import re
import subprocess
import sys
import time

LINE = re.compile(r"^\[(\d+)\] (RESULT|VICTIM) (.*)$")
WATCHDOG = re.compile(r"^\[(\d+)\] pdcoll: rank \d+ has been inside libfabric's (\S+)")


def fields(text):
    out = {}
    for m in re.finditer(r"(\w+)=('([^']*)'|\S+)", text):
        out[m.group(1)] = m.group(3) if m.group(3) is not None else m.group(2)
    return out


def one_run(args, seed, world):
    env = dict(os.environ)
    env["PDCOLL_TRANSPORT"] = args.transport
    if args.provider:
        env["PDCOLL_PROVIDER"] = args.provider
    else:
        env.pop("PDCOLL_PROVIDER", None)
    env["PDCOLL_TEST_OP_TIMEOUT_MS"] = str(args.op_timeout_ms)
    if args.provider_watchdog_ms:
        env["PDCOLL_PROVIDER_STUCK_MS"] = str(args.provider_watchdog_ms)
    env.setdefault("PDCOLL_TIMEOUT_MS", "30000")  # rendezvous; the operations use the short deadline
    # ASan's leak check runs at exit; survivors exit normally, the victim never does.
    cmd = [args.launcher, "-n", str(world), "--timeout", str(args.job_timeout), "--grace", "10",
           args.program, "kill", str(seed)]
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=args.job_timeout + 30)
    took = time.monotonic() - start
    text = proc.stdout.decode(errors="replace")
    results, victim, watchdog = {}, None, {}
    for line in text.splitlines():
        w = WATCHDOG.match(line)
        if w:
            watchdog[int(w.group(1))] = w.group(2)
            continue
        m = LINE.match(line)
        if not m:
            continue
        rank, kind, rest = int(m.group(1)), m.group(2), m.group(3)
        if kind == "VICTIM":
            victim = (rank, fields(rest))
        else:
            results[rank] = fields(rest)
    problems = []
    if proc.returncode == 0:
        problems.append("pdcoll-run exited 0")
    if proc.returncode == 124:
        problems.append("pdcoll-run timed out (a rank hung)")
    if victim is None:
        problems.append("no VICTIM line")
    else:
        if victim[0] in results:
            problems.append(f"victim rank {victim[0]} printed a RESULT")
    survivors = [r for r in range(world) if victim is None or r != victim[0]]
    late = []
    for r in survivors:
        res = results.get(r)
        if res is None and r in watchdog and args.provider_watchdog_ms:
            continue  # stuck inside the provider and ended by pdcoll's watchdog, as it should be
        if res is None:
            what = f" (the provider watchdog ended it inside {watchdog[r]})" if r in watchdog else ""
            problems.append(f"survivor {r} printed no RESULT (crashed, hung or was killed){what}")
            continue
        # A victim killed during setup takes the rendezvous (or a peer's
        # address exchange) with it: a clear setup error, returned promptly, is
        # the outcome wanted then.
        setup_error = res.get("status") == "setup-error" and victim is not None
        if res.get("ok") != "1" and not setup_error:
            problems.append(f"survivor {r}: {res.get('problem', res)}")
        late.append(float(res.get("late_ms", "0")))
    desc = "?" if victim is None else f"victim {victim[0]} {victim[1].get('mode')}@{victim[1].get('iteration')}"
    return problems, took, max(late) if late else 0.0, desc, text, proc.returncode, len(watchdog)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--program", required=True)
    p.add_argument("--launcher", required=True)
    p.add_argument("--transport", default="libfabric")
    p.add_argument("--provider", default="")
    p.add_argument("--runs", type=int, default=17)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--op-timeout-ms", type=int, default=2000)
    p.add_argument("--job-timeout", type=int, default=60)
    p.add_argument("--max-hung-runs", type=int, default=0)
    p.add_argument("--provider-watchdog-ms", type=int, default=0)
    args = p.parse_args()
    name = args.transport + (":" + args.provider if args.provider else "")
    failures, hung, ended_by_watchdog, worst_late, total = 0, 0, 0, -1e9, 0.0
    for i in range(args.runs):
        seed = args.first_seed + i
        world = 2 + i % 4
        problems, took, late, desc, text, rc, stuck = one_run(args, seed, world)
        ended_by_watchdog += stuck
        total += took
        worst_late = max(worst_late, late)
        only_silent = problems and all("printed no RESULT" in pr for pr in problems)
        if only_silent and hung < args.max_hung_runs:
            hung += 1
            print(f"{name} seed={seed} ranks={world} {desc}: HUNG (tolerated {hung}/{args.max_hung_runs}): "
                  + "; ".join(problems), flush=True)
            continue
        status = "ok" if not problems else "FAIL"
        watched = f", {stuck} ended by the provider watchdog" if stuck else ""
        print(f"{name} seed={seed} ranks={world} {desc}: {status} rc={rc} {took:.1f}s "
              f"slowest survivor {late:+.0f} ms vs deadline{watched}", flush=True)
        if problems:
            failures += 1
            for pr in problems:
                print("   - " + pr)
            print("   output:\n" + "\n".join("     " + l for l in text.splitlines()[-60:]), flush=True)
    print(f"{name}: {args.runs - failures - hung}/{args.runs} runs passed, {hung} hung (tolerated), "
          f"{ended_by_watchdog} survivors ended by the provider watchdog, in {total:.0f} s; "
          f"slowest survivor completed {worst_late:+.0f} ms relative to its deadline (limit +1000 ms)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
