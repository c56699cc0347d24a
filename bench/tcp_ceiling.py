#!/usr/bin/env python3
"""bench/tcp_ceiling.py — the TCP loopback ceiling that bench/compare.sh holds pdcoll's TCP rows against.

    python3 bench/tcp_ceiling.py measure --ranks "2 4" --lengths "16K 128K 1M" --seconds 3 [--congestion cubic] --out tcp_ceiling.csv
    python3 bench/tcp_ceiling.py rows  --measured tcp_ceiling.csv --out ceiling_rows.csv run1.csv run2.csv ...
    python3 bench/tcp_ceiling.py table --measured tcp_ceiling.csv --cores 2 [--exchange ring-n2.csv ...] run1.csv ... >> compare.md

measure  For each rank count n and write size (-l), runs n TCP streams on
         127.0.0.1 at once, two ways, and writes one row per stream: ranks,
         method, write_bytes, seconds, stream, GBps (receiver side, 10^9
         bytes/s).
           bidir     ceil(n/2) `iperf3 --bidir` pairs: each process sends one
                     stream and receives one, as a ring rank does.
           separate  n one-way iperf3 client/server pairs, every other one
                     reversed (-R): no process both sends and receives.
         Both are kept because iperf3 3.12 runs each process on one thread, and
         one thread alternating between its send and its receive stream gets
         well below what the loopback carries (on the 2-core development VM
         about 0.8 GB/s per direction against 2 GB/s and more with separate
         processes; bench/results has pdcoll at 2 GB/s busbw for 256 MiB on
         2 ranks). The ceiling is the best of both. The streams use CUBIC
         (iperf3 -C; --congestion system keeps the kernel's choice), as
         pdcoll's io_uring connections do on one host: under BBR's pacing
         the loopback carries less, and a ceiling must be the best case.
         Without iperf3 it says so and writes nothing; it never fails the
         caller.
rows     The ceiling as bench_report CSV rows (library "tcp-ceiling", transport
         tcp) at every size the TCP runs of the inputs have, so that
         bench/plot.py draws it as a flat reference line on each rank panel.
table    Markdown: per rank count, each pdcoll TCP series' busbw (and the best
         baseline's) over the ceiling, size by size; with --exchange, also the
         best pdcoll and baseline over bench/tcp_ring_exchange's figure at the
         same size (the ring's traffic over plain sockets, no reduction, in
         buffers as large as the all-reduce's: where iperf3's cache-resident
         1 MiB writes overstate what large buffers get).

Why busbw against one stream's rate. A ring all-reduce of S bytes on n ranks
runs n-1 reduce-scatter steps and n-1 all-gather steps; in each step every rank
sends S/n bytes to its successor while it receives S/n from its predecessor.
So each rank sends 2(n-1)/n * S bytes (and receives as many) in the time t,
and busbw = algbw * 2(n-1)/n = 2(n-1)/n * S / t is exactly the rate at which
each rank sends: one direction of one link. For n = 2 that is S / t, with both
ranks sending S/2 twice while receiving S/2 twice, two streams in opposite
directions at once: two loopback streams, one per direction, each carrying
one rank's sends. busbw / (per-stream rate, n streams at once) is therefore
like against like, and 1.0 is the loopback's best. The per-stream rate is the
mean over the concurrent streams (their sum / count): a ring moves in
lockstep, so no rank can sustain more than its share of what the streams
together got. Rabenseifner sends the same 2(n-1)/n * S per rank,
so the ratio means the same for it; recursive doubling sends log2(n) * S per
rank, so for n > 2 its busbw understates its send rate (n = 2: the same S).
iperf3 only copies bytes through the socket; pdcoll also reduces them, so a
ratio near 1 is as good as it gets.
"""

import argparse
import csv
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot import best, load, series_name, size_label, transport_class  # noqa: E402

library = "tcp-ceiling"
measured_columns = ["ranks", "method", "write_bytes", "seconds", "stream", "GBps"]
report_columns = ["library", "transport", "algorithm", "collective", "domain", "ranks", "type", "redop", "root",
                  "placement", "bytes", "count", "time_us", "algbw_GBps", "busbw_GBps", "wrong", "timing"]
methods = ("bidir", "separate")
ready_timeout_s = 5
port_attempts = 3


class measurement_failed(Exception):
    """One iperf3 run that gave no figures; the others still count."""


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on right now (the caller retries if it is taken meanwhile)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent():
    """Run in the child before exec: prctl(2) PR_SET_PDEATHSIG, so an iperf3 outlives no killed measure."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def stop(procs):
    """Terminates whatever in procs still runs, then kills what ignores that."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=2)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def start_server(iperf3, workdir, procs):
    """A one-off (-s -1) iperf3 server on a free loopback port, once it listens; returns the port."""
    for _ in range(port_attempts):
        port = free_port()
        log_path = os.path.join(workdir, f"server-{port}.txt")
        with open(log_path, "w") as log:
            p = subprocess.Popen([iperf3, "-s", "-1", "-B", "127.0.0.1", "-p", str(port), "--forceflush"],
                                 stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        procs.append(p)
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline and p.poll() is None:
            with open(log_path) as f:
                if "Server listening" in f.read():
                    return port
            time.sleep(0.05)
        stop([p])
    raise measurement_failed(f"no iperf3 server came up in {port_attempts} attempts")


def stream_rates(report):
    """Receiver-side GB/s of each direction of one `iperf3 --json` client report (two with --bidir)."""
    end = report["end"]
    forward = "server->client" if report["start"]["test_start"]["reverse"] else "client->server"
    rates = {forward: end["sum_received"]["bits_per_second"] / 8e9}
    if "sum_received_bidir_reverse" in end:
        rates["server->client"] = end["sum_received_bidir_reverse"]["bits_per_second"] / 8e9
    return rates


def client_options(method, ranks):
    """The extra iperf3 options of each client that together give `ranks` streams, half each way."""
    if method == "bidir":
        return [["--bidir"]] * math.ceil(ranks / 2)
    return [["-R"] if i % 2 else [] for i in range(ranks)]


def run_streams(iperf3, options, length, seconds, congestion):
    """One iperf3 client/server pair per entry of options, all at once; returns (write bytes, {stream: GB/s})."""
    congestion_flag = [] if congestion == "system" else ["-C", congestion]
    procs = []
    with tempfile.TemporaryDirectory(prefix="tcp-ceiling.") as workdir:
        try:
            ports = [start_server(iperf3, workdir, procs) for _ in options]
            started = [subprocess.Popen([iperf3, "-c", "127.0.0.1", "-p", str(port), *extra, *congestion_flag, "-t", str(seconds),
                                         "-l", length, "--json", "--connect-timeout", "3000"],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        preexec_fn=die_with_parent)
                       for port, extra in zip(ports, options)]
            procs += started
            rates, write_bytes = {}, None
            for i, c in enumerate(started):
                out, err = c.communicate(timeout=seconds + 30)
                try:
                    report = json.loads(out)
                except json.JSONDecodeError:
                    raise measurement_failed(f"iperf3 client {i} gave no report: {err.strip() or out.strip()}")
                if "error" in report:
                    raise measurement_failed(f"iperf3 client {i}: {report['error']}")
                write_bytes = report["start"]["test_start"]["blksize"]
                rates.update({f"client{i} {k}": v for k, v in stream_rates(report).items()})
            return write_bytes, rates
        except subprocess.TimeoutExpired:
            raise measurement_failed(f"iperf3 ran more than {seconds + 30} s")
        finally:
            stop(procs)


def measure(a):
    """The measure command: every rank count, write size and method, one row per stream."""
    iperf3 = shutil.which("iperf3")
    if not iperf3:
        print("tcp_ceiling: iperf3 is not installed (scripts/install-deps.sh --bench); no TCP ceiling this run")
        return 0
    rows = []
    for n in (int(r) for r in a.ranks.split()):
        if n < 2:
            continue
        for length in a.lengths.split():
            for method in methods:
                options = client_options(method, n)
                try:
                    write_bytes, rates = run_streams(iperf3, options, length, a.seconds, a.congestion)
                except measurement_failed as e:
                    print(f"tcp_ceiling: {n} ranks, {method}, -l {length}: {e}; left out")
                    continue
                rows += [[n, method, write_bytes, a.seconds, s, f"{g:.4f}"] for s, g in sorted(rates.items())]
                each = ", ".join(f"{s} {g:.3f}" for s, g in sorted(rates.items()))
                print(f"tcp_ceiling: {n} ranks, {method} ({len(options)} iperf3 client/server pair{'s' if len(options) > 1 else ''}), "
                      f"-l {length}: {sum(rates.values()) / len(rates):.3f} GB/s per stream ({each})")
    if rows:
        with open(a.out, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(measured_columns)
            w.writerows(rows)
    else:
        print("tcp_ceiling: no iperf3 run gave figures; no TCP ceiling this run")
    return 0


def ceilings(path):
    """{ranks: ((method, write bytes) of the best, {(method, write bytes): mean GB/s per stream})}."""
    streams = defaultdict(list)
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            streams[(int(r["ranks"]), r["method"], int(r["write_bytes"]))].append(float(r["GBps"]))
    figures = defaultdict(dict)
    for (n, method, length), rates in streams.items():
        figures[n][(method, length)] = sum(rates) / len(rates)
    return {n: (max(f, key=f.get), f) for n, f in figures.items()}


def ceiling_name(ranks, method, length):
    """The ceiling's series name (its algorithm column), saying how it was measured."""
    return f"iperf3 {method} {ranks} streams -l {size_label(length)}"


def rows(a):
    """Writes the ceiling as a flat series at every TCP size the inputs have, per rank count."""
    tcp_sizes = defaultdict(set)
    for r in load(a.inputs):
        if transport_class(r) == "tcp" and r["bytes"] > 8:
            tcp_sizes[r["ranks"]].add(r["bytes"])
    with open(a.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(report_columns)
        for n, (top, figures) in sorted(ceilings(a.measured).items()):
            gbps = figures[top]
            for size in sorted(tcp_sizes[n]):
                # The time a ring all-reduce of `size` would take with every rank sending at the ceiling.
                time_us = 2 * (n - 1) / n * size / (gbps * 1e9) * 1e6
                algbw = size / (time_us * 1e-6) / 1e9
                w.writerow([library, "tcp", ceiling_name(n, *top), "all_reduce", "host", n, "float32", "sum", -1,
                            "in_place", size, size // 4, f"{time_us:.3f}", f"{algbw:.6f}", f"{gbps:.6f}", 0, "iperf3"])
    return 0


def ratio_cell(busbw, ceiling):
    """Two markdown cells: the busbw and its ratio to the ceiling."""
    return f"{busbw:.3f} | {busbw / ceiling:.2f}"


def ceiling_section(rows_, n, ceiling, cores):
    """The markdown section for n ranks: each pdcoll TCP series and the best baseline over the ceiling."""
    top, figures = ceiling
    gbps = figures[top]
    tcp = [r for r in rows_ if r["ranks"] == n and transport_class(r) == "tcp" and r["library"] != library]
    mine = sorted({series_name(r) for r in tcp if r["library"] == "pdcoll"})
    busbw = {(series_name(r), r["bytes"]): r["busbw_GBps"] for r in tcp}
    base = best(tcp, lambda r: r["library"] != "pdcoll")
    note = f" — OVERSUBSCRIBED ({n} ranks on {cores} cores; the iperf3 streams were too)" if n > cores else ""
    each = "; ".join(f"{m} -l {size_label(b)} {g:.3f}" for (m, b), g in sorted(figures.items()))
    lines = [f"## {n} ranks, TCP loopback: busbw / ceiling{note}", "",
             f"Ceiling {gbps:.3f} GB/s per stream: {ceiling_name(n, *top)}, the best of ({each}) GB/s per stream, "
             f"{n} streams at once, half each way. bidir: {math.ceil(n / 2)} `iperf3 --bidir` client/server "
             f"pair(s) (a process sends one stream and receives one, as a rank does); separate: {n} one-way "
             f"pairs (one process per stream end). Measured once, on a "
             f"machine that may be shared.",
             "",
             "| size | " + " | ".join(f"{s} GB/s | / ceiling" for s in mine) + " | best baseline GB/s | / ceiling "
             "| best baseline |",
             "| ---: | " + " | ".join("---: | ---:" for _ in mine) + " | ---: | ---: | --- |"]
    for size in sorted({r["bytes"] for r in tcp if r["bytes"] > 8}):
        cells = [ratio_cell(busbw[(s, size)], gbps) if (s, size) in busbw else "— | —" for s in mine]
        b = f"{ratio_cell(base[size][0], gbps)} | {base[size][1]}" if size in base else "— | — | —"
        lines.append(f"| {size_label(size)} | " + " | ".join(cells) + f" | {b} |")
    return lines + [""]


def exchange_section(rows_, exchange, n, cores):
    """The markdown section for n ranks against tcp_ring_exchange: the ring's traffic over plain sockets, no
    reduction, at each size (buffers as large as the all-reduce's, so above the caches they live in DRAM)."""
    ring = {r["bytes"]: r["busbw_GBps"] for r in exchange if r["ranks"] == n}
    tcp = [r for r in rows_ if r["ranks"] == n and transport_class(r) == "tcp" and r["library"] != library]
    mine = best(tcp, lambda r: r["library"] == "pdcoll")
    base = best(tcp, lambda r: r["library"] != "pdcoll")
    sizes = sorted(s for s in ring if s in mine)
    if not sizes:
        return []
    note = f" — OVERSUBSCRIBED ({n} ranks on {cores} cores)" if n > cores else ""
    lines = [f"## {n} ranks, TCP loopback: busbw / the ring's traffic over plain sockets{note}", "",
             "bench/tcp_ring_exchange: the sends and receives of a ring all-reduce of the same size (1 MiB chunks, "
             "pipelined across steps), no reduction, one blocking sender and one receiver thread per rank, in the "
             "all-reduce's own buffer. A reference, not a bound: pdcoll's io_uring and libfabric paths beat "
             "its thread handoffs where an operation takes a few hundred microseconds or less.", "",
             "| size | ring exchange GB/s | best pdcoll GB/s | / exchange | best baseline GB/s | / exchange "
             "| best pdcoll | best baseline |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for size in sizes:
        b = f"{ratio_cell(base[size][0], ring[size])}" if size in base else "— | —"
        lines.append(f"| {size_label(size)} | {ring[size]:.3f} | {ratio_cell(mine[size][0], ring[size])} | {b} | "
                     f"{mine[size][1]} | {base[size][1] if size in base else '—'} |")
    return lines + [""]


def table(a):
    """The table command: one markdown section per measured rank count, on stdout."""
    rows_ = load(a.inputs)
    lines = ["# TCP loopback ceiling (ratio = busbw / one loopback stream's rate; see bench/tcp_ceiling.py)", ""]
    for n, ceiling in sorted(ceilings(a.measured).items()):
        lines += ceiling_section(rows_, n, ceiling, a.cores)
    exchange = load(a.exchange) if a.exchange else []
    for n in sorted({r["ranks"] for r in exchange}):
        lines += exchange_section(rows_, exchange, n, a.cores)
    print("\n".join(lines))
    return 0


def stop_on_signal(signum, frame):
    """SIGTERM/SIGHUP (timeout(1), a closed terminal) unwind like ^C, so the iperf3 servers are stopped."""
    raise SystemExit(128 + signum)


def main():
    """Parses the command line and runs one command; 0 unless the arguments are wrong."""
    signal.signal(signal.SIGTERM, stop_on_signal)
    signal.signal(signal.SIGHUP, stop_on_signal)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="run concurrent iperf3 streams on 127.0.0.1")
    m.add_argument("--ranks", default="2 4", help="rank counts, space separated")
    m.add_argument("--lengths", default="16K 128K 1M", help="iperf3 -l write sizes, space separated")
    m.add_argument("--seconds", type=int, default=3, help="iperf3 -t per write size")
    m.add_argument("--congestion", default="cubic",
                   help="TCP congestion control of the streams (iperf3 -C), or 'system' for the kernel's")
    m.add_argument("--out", required=True)
    for name, helptext in (("rows", "the ceiling as bench_report CSV rows"), ("table", "the markdown ratios")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--measured", required=True, help="the CSV that measure wrote")
        p.add_argument("inputs", nargs="+", help="pdcoll-bench and baseline CSVs")
    sub.choices["rows"].add_argument("--out", required=True)
    sub.choices["table"].add_argument("--cores", type=int, default=1, help="CPU cores (for 'oversubscribed')")
    sub.choices["table"].add_argument("--exchange", action="append", default=[],
                                      help="a tcp_ring_exchange CSV (repeatable): a section per rank count")
    a = ap.parse_args()
    return {"measure": measure, "rows": rows, "table": table}[a.command](a)


if __name__ == "__main__":
    sys.exit(main())
