#!/usr/bin/env python3
"""bench/plot.py — merge pdcoll-bench and baseline CSVs into the comparison.

    python3 bench/plot.py --cores 2 --csv out.csv --png out.png --table out.md run1.csv run2.csv ...

Inputs are the --csv files of pdcoll-bench, mpi_allreduce_bench and
gloo_allreduce_bench (bench/bench_report.hpp's columns). Only all_reduce
in-place rows are used (the placement every library has). Writes:

  --csv    library, transport, algorithm, ranks, oversubscribed, bytes, time_us, busbw_GBps, timing
  --png    busbw vs size (log x), one line per library/transport/algorithm,
           one panel per rank count; a panel whose ranks exceed --cores is
           titled "oversubscribed"
  --table  Markdown: per rank count and transport class (shared memory: pdcoll
           libfabric:shm, on ordinary and on shareable buffers ("on
           host_shareable"), vs Open MPI vader; TCP: pdcoll libfabric:tcp and
           io_uring vs Open MPI tcp and Gloo), the best pdcoll busbw over the
           best baseline's for each size, and the 8-byte latency of each
           (with the statistic the runs' timing column names).
  --floor  CSVs of bench/tcp_latency_floor (recursive doubling on plain
           sockets): the TCP sections of --table get its 8-byte time and
           pdcoll's over it, the part of pdcoll's latency that is its own.
"""

import argparse
import csv
import sys
from collections import defaultdict


def load(paths):
    """In-place all_reduce rows of the inputs. A series measured in several
    rounds (compare.sh --rounds) gives one row per size: the round with the
    median time (the faster middle one for an even number of rounds)."""
    rounds = defaultdict(list)
    for path in paths:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if r["collective"] != "all_reduce" or r["placement"] != "in_place":
                    continue
                # Buffers other than ordinary host memory name their series.
                domain = r.get("domain") or "host"
                row = {
                    "library": r["library"],
                    "transport": r["transport"],
                    "algorithm": r["algorithm"] + ("" if domain == "host" else f" on {domain}"),
                    "ranks": int(r["ranks"]),
                    "bytes": int(r["bytes"]),
                    "time_us": float(r["time_us"]),
                    "busbw_GBps": float(r["busbw_GBps"]),
                    "timing": r.get("timing", "median"),
                }
                key = (row["library"], row["transport"], row["algorithm"], row["ranks"], row["bytes"], row["timing"])
                rounds[key].append(row)
    rows = []
    for measured in rounds.values():
        measured.sort(key=lambda r: r["time_us"])
        rows.append(measured[(len(measured) - 1) // 2])
    return rows


def transport_class(row):
    t = row["transport"].lower()
    return "shm" if ("shm" in t or "vader" in t or "sm" == t) else "tcp"


def series_name(row):
    return f'{row["library"]} {row["transport"]} {row["algorithm"]}'


def size_label(b):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= scale and b % scale == 0:
            return f"{b // scale}{unit}"
    return f"{b}B"


def write_csv(rows, path, cores):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["library", "transport", "algorithm", "ranks", "oversubscribed", "bytes", "time_us", "busbw_GBps",
                    "timing"])
        for r in sorted(rows, key=lambda r: (r["ranks"], r["library"], r["transport"], r["algorithm"], r["bytes"])):
            w.writerow([r["library"], r["transport"], r["algorithm"], r["ranks"],
                        "yes" if r["ranks"] > cores else "no", r["bytes"],
                        f'{r["time_us"]:.3f}', f'{r["busbw_GBps"]:.4f}', r["timing"]])


def plot(rows, path, cores):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted({r["ranks"] for r in rows})
    fig, axes = plt.subplots(1, len(ranks), figsize=(7 * len(ranks), 5.5), squeeze=False)
    for ax, n in zip(axes[0], ranks):
        series = defaultdict(list)
        for r in rows:
            if r["ranks"] == n and r["bytes"] > 8:
                series[series_name(r)].append((r["bytes"], r["busbw_GBps"]))
        for name in sorted(series):
            pts = sorted(series[name])
            style = "-" if name.startswith("pdcoll") else "--"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", markersize=3, label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        title = f"all_reduce fp32 sum, {n} ranks"
        if n > cores:
            title += f"\nOVERSUBSCRIBED: {n} ranks on {cores} cores"
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def best(rows, pred):
    """Best busbw per size over rows matching pred, with the series that achieved it."""
    out = {}
    for r in rows:
        if pred(r) and (r["bytes"] not in out or r["busbw_GBps"] > out[r["bytes"]][0]):
            out[r["bytes"]] = (r["busbw_GBps"], series_name(r))
    return out


def fastest(rows, pred, size):
    """Lowest time at `size` over rows matching pred, with its series and
    the time's statistic (median or mean)."""
    cands = [(r["time_us"], series_name(r), r["timing"]) for r in rows if pred(r) and r["bytes"] == size]
    return min(cands) if cands else None


def table(rows, cores, floor=()):
    lines = ["# pdcoll vs the best baseline (all_reduce fp32 sum, in place; ratio = pdcoll busbw / baseline busbw)", ""]
    for n in sorted({r["ranks"] for r in rows}):
        note = f" — OVERSUBSCRIBED ({n} ranks on {cores} cores)" if n > cores else ""
        for cls in ("shm", "tcp"):
            mine = lambda r, n=n, cls=cls: r["ranks"] == n and r["library"] == "pdcoll" and transport_class(r) == cls
            base = lambda r, n=n, cls=cls: r["ranks"] == n and r["library"] != "pdcoll" and transport_class(r) == cls
            p, b = best(rows, mine), best(rows, base)
            lines.append(f"## {n} ranks, {'shared memory' if cls == 'shm' else 'TCP loopback'}{note}")
            lines.append("")
            lines.append("| size | pdcoll busbw GB/s | best pdcoll | baseline busbw GB/s | best baseline | ratio |")
            lines.append("| ---: | ---: | --- | ---: | --- | ---: |")
            for size in sorted(set(p) & set(b)):
                if size <= 8:
                    continue
                ratio = p[size][0] / b[size][0] if b[size][0] > 0 else float("inf")
                lines.append(f"| {size_label(size)} | {p[size][0]:.3f} | {p[size][1]} | {b[size][0]:.3f} | "
                             f"{b[size][1]} | {ratio:.2f} |")
            lp, lb = fastest(rows, mine, 8), fastest(rows, base, 8)
            if lp and lb:
                stat = lp[2] if lp[2] == lb[2] else f"{lp[2]} vs {lb[2]}"
                lines.append(f"| 8B latency ({stat}) | {lp[0]:.2f} us | {lp[1]} | {lb[0]:.2f} us | {lb[1]} | "
                             f"{lb[0] / lp[0]:.2f} (baseline time / pdcoll time) |")
            lf = fastest(floor, lambda r, n=n: r["ranks"] == n, 8) if cls == "tcp" else None
            if lp and lf:
                lines.append(f"| 8B floor ({lf[2]}) | {lf[0]:.2f} us | {lf[1]} (plain sockets, no library) | | | "
                             f"{lp[0] / lf[0]:.2f} (pdcoll time / floor time) |")
            lines.append("")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", type=int, default=1, help="CPU cores of the machine (for 'oversubscribed')")
    ap.add_argument("--csv", required=True)
    ap.add_argument("--png")
    ap.add_argument("--table")
    ap.add_argument("--floor", nargs="*", default=[], help="bench/tcp_latency_floor CSVs (for --table)")
    ap.add_argument("inputs", nargs="+")
    a = ap.parse_args()
    rows = load(a.inputs)
    if not rows:
        print("plot.py: no all_reduce in-place rows in the inputs", file=sys.stderr)
        return 1
    write_csv(rows, a.csv, a.cores)
    if a.png:
        plot(rows, a.png, a.cores)
    if a.table:
        with open(a.table, "w") as f:
            f.write(table(rows, a.cores, load(a.floor)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
