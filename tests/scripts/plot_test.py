#!/usr/bin/env python3
"""tests/scripts/plot_test.py — bench/plot.py's comparison table from rounds.

Builds the CSVs compare.sh would leave for three rounds of one cell (4 KiB,
4 ranks on 2 cores, TCP) and the 8-byte row, runs plot.py on them, and
checks the median ratio, the per-round column and the rounds CSV; where
matplotlib is installed, that the picture has one legend, under its panels.

    python3 tests/scripts/plot_test.py
"""

import csv
import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLOT = os.path.join(ROOT, "bench", "plot.py")
COLUMNS = ["library", "transport", "algorithm", "collective", "domain", "ranks", "type", "redop", "root",
           "placement", "bytes", "count", "time_us", "algbw_GBps", "busbw_GBps", "wrong", "timing"]


def write(path, library, transport, rows, timing="median"):
    """One benchmark's CSV: rows of (bytes, time_us), 4 ranks, in place and
    out of place (the latter with a time that would change every ratio)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for size, time_us in rows:
            busbw = size / (time_us * 1e3) * 1.5
            for placement, t, bw in (("in_place", time_us, busbw), ("out_of_place", time_us / 10, busbw * 10)):
                w.writerow([library, transport, "automatic", "all_reduce", "host", 4, "float", "sum", -1, placement,
                            size, size // 4, f"{t:.3f}", f"{bw / 1.5:.6f}", f"{bw:.6f}", -1, timing])


class PlotTable(unittest.TestCase):
    def run_plot(self, d, inputs):
        table, rounds = os.path.join(d, "t.md"), os.path.join(d, "rounds.csv")
        subprocess.run([sys.executable, PLOT, "--cores", "2", "--csv", os.path.join(d, "out.csv"), "--table", table,
                        "--rounds-csv", rounds, "--"] + inputs, check=True)
        with open(table) as f:
            text = f.read()
        with open(rounds, newline="") as f:
            return text, list(csv.DictReader(f))

    def test_per_round_ratios_beside_the_median(self):
        with tempfile.TemporaryDirectory() as d:
            inputs = []
            # pdcoll 4 KiB: 39, 32, 48 us; Open MPI: 50, 48, 54 us. Ratios per
            # round 1.28, 1.50, 1.125; the medians (39 and 50 us) give 1.28.
            # 8 bytes: pdcoll 30, 40, 35 us against 50, 45, 40 us.
            for k, (mine, theirs, mine8, theirs8) in enumerate(((39, 50, 30, 50), (32, 48, 40, 45),
                                                                 (48, 54, 35, 40)), start=1):
                for name, lib, tr, t, t8 in (("p", "pdcoll", "uring_tcp", mine, mine8),
                                             ("m", "openmpi", "tcp", theirs, theirs8)):
                    path = os.path.join(d, f"round{k}-{name}.csv")
                    write(path, lib, tr, [(4096, t)])
                    inputs.append(path)
                    path8 = os.path.join(d, f"round{k}-{name}8.csv")
                    write(path8, lib, tr, [(8, t8)], timing="mean")
                    inputs.append(path8)
            text, rounds = self.run_plot(d, inputs)
            row = next(line for line in text.splitlines() if line.startswith("| 4K |"))
            cells = [c.strip() for c in row.strip("|").split("|")]
            self.assertEqual(cells[5], "1.28")
            self.assertEqual(cells[6], "1.12-1.50 (2/3)")
            latency = next(line for line in text.splitlines() if line.startswith("| 8B latency"))
            cells = [c.strip() for c in latency.strip("|").split("|")]
            # Medians 35 against 45 us; per round 1.67, 1.125, 1.14: one round at 1.25 or more.
            self.assertTrue(cells[5].startswith("1.29"), cells[5])
            self.assertEqual(cells[6], "1.12-1.67 (1/3)")
            self.assertIn("OVERSUBSCRIBED", text)
            self.assertEqual(len(rounds), 12)
            self.assertEqual(sorted({r["round"] for r in rounds}), ["1", "2", "3"])

    def test_one_round_has_no_per_round_column(self):
        with tempfile.TemporaryDirectory() as d:
            p, m = os.path.join(d, "p.csv"), os.path.join(d, "m.csv")
            write(p, "pdcoll", "uring_tcp", [(4096, 40)])
            write(m, "openmpi", "tcp", [(4096, 60)])
            text, _ = self.run_plot(d, [p, m])
            row = next(line for line in text.splitlines() if line.startswith("| 4K |"))
            self.assertEqual([c.strip() for c in row.strip("|").split("|")][5:], ["1.50"])
            self.assertNotIn("Per round", text)


    @unittest.skipUnless(importlib.util.find_spec("matplotlib"), "matplotlib is not installed for this interpreter")
    def test_the_picture_is_drawn_with_one_legend_for_both_panels(self):
        with tempfile.TemporaryDirectory() as d:
            inputs = []
            for ranks_name, lib, tr, t in (("p", "pdcoll", "uring_tcp", 40), ("m", "openmpi", "tcp", 60)):
                path = os.path.join(d, f"{ranks_name}.csv")
                write(path, lib, tr, [(4096, t), (65536, t * 4)])
                inputs.append(path)
            png = os.path.join(d, "out.png")
            subprocess.run([sys.executable, PLOT, "--cores", "2", "--csv", os.path.join(d, "out.csv"), "--png", png,
                            "--"] + inputs, check=True)
            with open(png, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
            sys.path.insert(0, os.path.dirname(PLOT))
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            import plot
            with open(os.path.join(d, "out.csv"), newline="") as f:
                rows = [dict(r, ranks=int(r["ranks"]), bytes=int(r["bytes"]), busbw_GBps=float(r["busbw_GBps"]))
                        for r in csv.DictReader(f)]
            plot.plot(rows, os.path.join(d, "again.png"), 2)
            fig = plt.gcf()
            # The legend is the figure's, under the panels, not drawn over an axis's lines.
            self.assertEqual(len(fig.legends), 1)
            self.assertTrue(all(ax.get_legend() is None for ax in fig.axes))
            labels = [t.get_text() for t in fig.legends[0].get_texts()]
            self.assertEqual(labels, ["openmpi tcp automatic", "pdcoll uring_tcp automatic"])


if __name__ == "__main__":
    unittest.main()
