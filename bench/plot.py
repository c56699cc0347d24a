#!/usr/bin/env python3
"""bench/plot.py — merge pdcoll-bench and baseline CSVs into the comparison.

    python3 bench/plot.py --cores 2 --csv out.csv --png out.png --table out.md run1.csv run2.csv ...

Inputs are the --csv files of pdcoll-bench, mpi_allreduce_bench and
gloo_allreduce_bench (bench/bench_report.hpp's columns). Only all_reduce
in-place rows are used (the placement every library has). Writes:

  --csv    library, transport, algorithm, ranks, oversubscribed, bytes, time_us, busbw_GBps, timing
  --png    busbw vs size (log x), one line per library/transport/algorithm
           (one colour each, the same in every panel), one panel per rank
           count, one legend under the panels; a panel whose ranks exceed
           --cores is titled "oversubscribed"
  --table  Markdown: per rank count and transport class (shared memory: pdcoll
           libfabric:shm, on ordinary and on shareable buffers ("on
           host_shareable"), vs Open MPI vader; TCP: pdcoll libfabric:tcp and
           io_uring vs Open MPI tcp and Gloo), the best pdcoll busbw over the
           best baseline's for each size, and the 8-byte latency of each
           (with the statistic the runs' timing column names).
  --floor  CSVs of bench/tcp_latency_floor (recursive doubling on plain
           sockets): the TCP sections of --table get its 8-byte time and
           pdcoll's over it, the part of pdcoll's latency that is its own.
  --rounds-csv  every in-place all_reduce row with its round, before the
           median is taken (the same columns as --csv, then round).

An input whose file name starts with "round<K>-" (compare.sh --rounds) was
measured in round K; the libraries take turns within a round, so a round
pairs one run of each. With two or more rounds --table adds, per cell, the
ratio that each round gives on its own (that round's best pdcoll series
over its best baseline) as "lowest-highest (rounds at or over --bar)": on a
shared machine a cell near the bar may pass in some rounds and miss in
others, and the median ratio alone does not say which.
"""

import argparse
import csv
import os
import re
import sys
from collections import defaultdict


def round_of(path):
    """The round an input was measured in: K for a file named "round<K>-...",
    else 0 (a run outside compare.sh's rounds)."""
    m = re.match(r"round(\d+)-", os.path.basename(path))
    return int(m.group(1)) if m else 0


def read(paths):
    """Every in-place all_reduce row of the inputs, each with its round."""
    out = []
    for path in paths:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if r["collective"] != "all_reduce" or r["placement"] != "in_place":
                    continue
                # Buffers other than ordinary host memory name their series.
                domain = r.get("domain") or "host"
                out.append({
                    "library": r["library"],
                    "transport": r["transport"],
                    "algorithm": r["algorithm"] + ("" if domain == "host" else f" on {domain}"),
                    "ranks": int(r["ranks"]),
                    "bytes": int(r["bytes"]),
                    "time_us": float(r["time_us"]),
                    "busbw_GBps": float(r["busbw_GBps"]),
                    "timing": r.get("timing", "median"),
                    "round": round_of(path),
                })
    return out


def medians(measured_rows):
    """One row per series and size: the round with the median time (the
    faster middle one for an even number of rounds)."""
    rounds = defaultdict(list)
    for row in measured_rows:
        key = (row["library"], row["transport"], row["algorithm"], row["ranks"], row["bytes"], row["timing"])
        rounds[key].append(row)
    rows = []
    for measured in rounds.values():
        measured.sort(key=lambda r: r["time_us"])
        rows.append(measured[(len(measured) - 1) // 2])
    return rows


def load(paths):
    """In-place all_reduce rows of the inputs, one per series and size (see medians)."""
    return medians(read(paths))


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


def write_csv(rows, path, cores, with_round=False):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["library", "transport", "algorithm", "ranks", "oversubscribed", "bytes", "time_us", "busbw_GBps",
                    "timing"] + (["round"] if with_round else []))
        order = lambda r: (r["ranks"], r["library"], r["transport"], r["algorithm"], r["bytes"], r["round"])
        for r in sorted(rows, key=order):
            w.writerow([r["library"], r["transport"], r["algorithm"], r["ranks"],
                        "yes" if r["ranks"] > cores else "no", r["bytes"],
                        f'{r["time_us"]:.3f}', f'{r["busbw_GBps"]:.4f}', r["timing"]]
                       + ([r["round"]] if with_round else []))


def plot(rows, path, cores):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted({r["ranks"] for r in rows})
    names = sorted({series_name(r) for r in rows if r["bytes"] > 8})
    # One colour per series across the panels (tab20: more series than the
    # default cycle's ten), and one legend under them, so no line hides.
    palette = plt.get_cmap("tab20").colors
    color = {name: palette[i % len(palette)] for i, name in enumerate(names)}
    legend_rows = (len(names) + 2) // 3
    height = 5.0 + 0.22 * legend_rows
    fig, axes = plt.subplots(1, len(ranks), figsize=(7 * len(ranks), height), squeeze=False)
    for ax, n in zip(axes[0], ranks):
        series = defaultdict(list)
        for r in rows:
            if r["ranks"] == n and r["bytes"] > 8:
                series[series_name(r)].append((r["bytes"], r["busbw_GBps"]))
        for name in sorted(series):
            pts = sorted(series[name])
            style = "-" if name.startswith("pdcoll") else "--"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", markersize=3, color=color[name],
                    label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        title = f"all_reduce fp32 sum, {n} ranks"
        if n > cores:
            title += f"\nOVERSUBSCRIBED: {n} ranks on {cores} cores"
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    # Every series has a line in some panel; the legend names each once.
    lines = {line.get_label(): line for ax in axes[0] for line in ax.get_lines()}
    fig.legend([lines[n] for n in names], names, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.22 * legend_rows / height + 0.02, 1, 1))
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


def per_round(measured, mine, base, ratio_of):
    """ratio_of(pdcoll rows, baseline rows) for each round in which both
    sides measured something, in round order."""
    rounds = sorted({r["round"] for r in measured if mine(r)} & {r["round"] for r in measured if base(r)})
    out = []
    for k in rounds:
        value = ratio_of([r for r in measured if mine(r) and r["round"] == k],
                         [r for r in measured if base(r) and r["round"] == k])
        if value is not None:
            out.append(value)
    return out


def spread(ratios, bar):
    """A cell's per-round ratios as "lowest-highest (passing/rounds)"."""
    passing = sum(1 for x in ratios if x >= bar)
    return f"{min(ratios):.2f}-{max(ratios):.2f} ({passing}/{len(ratios)})"


def table(rows, cores, floor=(), measured=(), bar=1.25):
    """The Markdown comparison. `rows` are medians over rounds (see medians),
    `measured` every round's rows: with two or more rounds each cell also gets
    its per-round ratios (see spread)."""
    several = len({r["round"] for r in measured}) > 1
    lines = ["# pdcoll vs the best baseline (all_reduce fp32 sum, in place; ratio = pdcoll busbw / baseline busbw)", ""]
    if several:
        lines += [f"Per round: the ratio each round gives alone (its best pdcoll series over its best baseline), "
                  f"lowest-highest, and how many rounds reach the bar: {bar:.2f}x for bandwidth; for the 8-byte "
                  f"latency 1.00 with no more ranks than cores and 1.25 (pdcoll at most 0.8x the baseline's "
                  f"time) with more.", ""]
    for n in sorted({r["ranks"] for r in rows}):
        note = f" — OVERSUBSCRIBED ({n} ranks on {cores} cores)" if n > cores else ""
        for cls in ("shm", "tcp"):
            mine = lambda r, n=n, cls=cls: r["ranks"] == n and r["library"] == "pdcoll" and transport_class(r) == cls
            base = lambda r, n=n, cls=cls: r["ranks"] == n and r["library"] != "pdcoll" and transport_class(r) == cls
            p, b = best(rows, mine), best(rows, base)
            lines.append(f"## {n} ranks, {'shared memory' if cls == 'shm' else 'TCP loopback'}{note}")
            lines.append("")
            extra, rule = (" per round |", " ---: |") if several else ("", "")
            lines.append("| size | pdcoll busbw GB/s | best pdcoll | baseline busbw GB/s | best baseline | ratio |"
                         + extra)
            lines.append(f"| ---: | ---: | --- | ---: | --- | ---: |{rule}")
            for size in sorted(set(p) & set(b)):
                if size <= 8:
                    continue
                ratio = p[size][0] / b[size][0] if b[size][0] > 0 else float("inf")
                cell = ""
                if several:
                    def bandwidth_ratio(ours, theirs, size=size):
                        o = [r["busbw_GBps"] for r in ours if r["bytes"] == size]
                        t = [r["busbw_GBps"] for r in theirs if r["bytes"] == size]
                        return max(o) / max(t) if o and t and max(t) > 0 else None
                    ratios = per_round(measured, mine, base, bandwidth_ratio)
                    cell = f" {spread(ratios, bar)} |" if ratios else " |"
                lines.append(f"| {size_label(size)} | {p[size][0]:.3f} | {p[size][1]} | {b[size][0]:.3f} | "
                             f"{b[size][1]} | {ratio:.2f} |{cell}")
            lp, lb = fastest(rows, mine, 8), fastest(rows, base, 8)
            if lp and lb:
                stat = lp[2] if lp[2] == lb[2] else f"{lp[2]} vs {lb[2]}"
                cell = ""
                if several:
                    def latency_ratio(ours, theirs):
                        o, t = fastest(ours, lambda r: True, 8), fastest(theirs, lambda r: True, 8)
                        return t[0] / o[0] if o and t and o[0] > 0 else None
                    ratios = per_round(measured, mine, base, latency_ratio)
                    cell = f" {spread(ratios, 1.0 if n <= cores else 1 / 0.8)} |" if ratios else " |"
                lines.append(f"| 8B latency ({stat}) | {lp[0]:.2f} us | {lp[1]} | {lb[0]:.2f} us | {lb[1]} | "
                             f"{lb[0] / lp[0]:.2f} (baseline time / pdcoll time) |{cell}")
            lf = fastest(floor, lambda r, n=n: r["ranks"] == n, 8) if cls == "tcp" else None
            if lp and lf:
                lines.append(f"| 8B floor ({lf[2]}) | {lf[0]:.2f} us | {lf[1]} (plain sockets, no library) | | | "
                             f"{lp[0] / lf[0]:.2f} (pdcoll time / floor time) |{' |' if several else ''}")
            lines.append("")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", type=int, default=1, help="CPU cores of the machine (for 'oversubscribed')")
    ap.add_argument("--csv", required=True)
    ap.add_argument("--png")
    ap.add_argument("--table")
    ap.add_argument("--floor", nargs="*", default=[], help="bench/tcp_latency_floor CSVs (for --table)")
    ap.add_argument("--rounds-csv", help="every round's rows, before the median is taken")
    ap.add_argument("--bar", type=float, default=1.25,
                    help="the bandwidth ratio a round must reach to count as passing (--table's per-round column)")
    ap.add_argument("inputs", nargs="+")
    a = ap.parse_args()
    measured = read(a.inputs)
    rows = medians(measured)
    if not rows:
        print("plot.py: no all_reduce in-place rows in the inputs", file=sys.stderr)
        return 1
    write_csv(rows, a.csv, a.cores)
    if a.rounds_csv:
        write_csv(measured, a.rounds_csv, a.cores, with_round=True)
    if a.png:
        plot(rows, a.png, a.cores)
    if a.table:
        with open(a.table, "w") as f:
            f.write(table(rows, a.cores, load(a.floor), measured, a.bar))
    return 0


if __name__ == "__main__":
    sys.exit(main())
