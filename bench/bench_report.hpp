// File: bench/bench_report.hpp — the nccl-tests table (header, one row per
// size, footer), bus-bandwidth factors, timing statistics and the CSV/JSON
// files shared by pdcoll-bench and the baseline programs (bench/baselines/),
// so every library is measured and printed the same way. Depends only on the
// standard library: the MPI and Gloo baselines include it without pdcoll.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace pdcoll::bench {

/// nccl-tests' bus-bandwidth factor: busbw = algbw · factor, where algbw is
/// the collective's "size" column divided by the time. all_reduce 2(n-1)/n;
/// all_gather, reduce_scatter (size = the total buffer), all_to_all and
/// all_to_allv (n-1)/n; broadcast, reduce and send/recv 1.
inline double bus_factor(std::string_view collective, int ranks) {
  const double n = ranks;
  if (collective == "all_reduce") return 2.0 * (n - 1) / n;
  if (collective == "all_gather" || collective == "reduce_scatter" || collective == "all_to_all" ||
      collective == "all_to_allv")
    return (n - 1) / n;
  return 1.0;
}

/// The median of `samples` (the mean of the middle two for an even count);
/// 0 when empty. Reorders `samples`.
inline double median(std::vector<double>& samples) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  return n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
}

/// The mean of `samples` (0 for none): nccl-tests' statistic, the total
/// time divided by the iterations.
inline double mean(const std::vector<double>& samples) {
  if (samples.empty()) return 0;
  double sum = 0;
  for (double x : samples) sum += x;
  return sum / static_cast<double>(samples.size());
}

/// The time column's statistic, by name: "median" (the default, steadier on
/// a shared machine) or "mean" (nccl-tests'; the one to compare where one
/// iteration's time is bimodal, as with more ranks than CPUs, where some
/// operations finish within one time slice and others wait for a handoff).
/// Throws std::invalid_argument for another name.
inline double summarize(std::vector<double>& samples, const std::string& timing) {
  if (timing == "median") return median(samples);
  if (timing == "mean") return mean(samples);
  throw std::invalid_argument("timing must be median or mean, not " + timing);
}
/// True for a statistic summarize() knows.
inline bool known_timing(std::string_view timing) noexcept { return timing == "median" || timing == "mean"; }

/// Parses a byte count with an optional K, M or G suffix (powers of 1024),
/// as nccl-tests' -b/-e do. Throws std::invalid_argument.
inline std::size_t parse_bytes(const std::string& text) {
  std::size_t pos = 0;
  const unsigned long long value = std::stoull(text, &pos);
  std::size_t scale = 1;
  if (pos < text.size()) {
    switch (text[pos]) {
      case 'k': case 'K': scale = std::size_t{1} << 10; break;
      case 'm': case 'M': scale = std::size_t{1} << 20; break;
      case 'g': case 'G': scale = std::size_t{1} << 30; break;
      default: throw std::invalid_argument("bad byte count: " + text);
    }
    if (pos + 1 != text.size() && !(pos + 2 == text.size() && (text[pos + 1] == 'B' || text[pos + 1] == 'b')))
      throw std::invalid_argument("bad byte count: " + text);
  }
  return static_cast<std::size_t>(value) * scale;
}

/// The sizes nccl-tests sweeps with -f: min, min·factor, min·factor², … up
/// to max inclusive (a factor <= 1 is taken as 2).
inline std::vector<std::size_t> size_sweep(std::size_t min_bytes, std::size_t max_bytes, double factor) {
  std::vector<std::size_t> sizes;
  if (factor <= 1.0) factor = 2.0;
  for (double b = static_cast<double>(min_bytes); b <= static_cast<double>(max_bytes) * (1 + 1e-12); b *= factor) {
    sizes.push_back(static_cast<std::size_t>(b));
    if (b == 0) break;
  }
  return sizes;
}

/// Runs `once()` (one collective) untimed for about `seconds` before a
/// launch's first measurement (--settle): for a fresh launch with more ranks
/// than CPUs the scheduler moves ranks between CPUs for some hundreds of
/// milliseconds (several ranks on one CPU, then fewer), and an all-reduce
/// measured then times that, not the steady state a long job runs in
/// (design-notes item 54). Every rank runs the same batches (1, 2, 4, … up to
/// 256 calls) and, after each, `agree(still)` combines every rank's `still`
/// (its own clock has not reached `seconds`) with one collective of the
/// library under test and returns whether any rank is still settling, so
/// all stop after the same batch. Nothing is run for `seconds` <= 0.
template <class Once, class Agree>
void settle(double seconds, Once&& once, Agree&& agree) {
  if (!(seconds > 0)) return;
  using clock = std::chrono::steady_clock;
  const auto until = clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(seconds));
  for (int batch = 1;; batch = std::min(2 * batch, 256)) {
    for (int i = 0; i < batch; ++i) once();
    if (!agree(clock::now() < until)) return;
  }
}

/// One measured placement (out-of-place or in-place) of one size.
struct measurement {
  /// False when the library cannot run this placement (printed "N/A").
  bool available = true;
  /// Time of one operation in microseconds (run_description::timing).
  double time_us = 0;
  /// Size column / time, in GB/s (10^9 bytes per second).
  double algbw = 0;
  /// algbw · bus factor.
  double busbw = 0;
  /// Wrong elements over every rank, or -1 when not checked.
  long long wrong = -1;
};

/// One row of the table: a size and its two placements.
struct row {
  std::size_t bytes = 0;     ///< nccl-tests' "size" column
  std::size_t count = 0;     ///< elements in that size
  std::string type;          ///< nccl-tests' type name (float, half, …)
  std::string redop;         ///< sum, prod, min, max, avg, or none
  int root = -1;             ///< root rank, -1 for collectives without one
  measurement out_of_place;  ///< separate input and output
  measurement in_place;      ///< input and output in one buffer
};

/// What identifies a run in the CSV and JSON files.
struct run_description {
  std::string library;    ///< pdcoll, openmpi, gloo
  std::string transport;  ///< e.g. libfabric:shm, uring, vader, tcp
  std::string algorithm;  ///< algorithm name as the library calls it
  std::string collective; ///< all_reduce, broadcast, …
  std::string domain = "host";
  int ranks = 1;
  std::string timing = "median";  ///< the time column's statistic (summarize())
};

/// Fills algbw and busbw of `m` from its time.
inline void set_bandwidth(measurement& m, std::size_t bytes, std::string_view collective, int ranks) {
  if (m.time_us > 0) {
    m.algbw = static_cast<double>(bytes) / (m.time_us * 1e-6) / 1e9;
    m.busbw = m.algbw * bus_factor(collective, ranks);
  }
}

/// Prints the nccl-tests table and writes the optional CSV/JSON files, row by
/// row (the CSV is flushed after each row, so an interrupted sweep keeps what
/// it measured). Only the printing rank should own one.
class report {
 public:
  /// Opens the files (empty name: none). Throws std::runtime_error when one cannot be opened.
  report(run_description run, const std::string& csv_path, const std::string& json_path)
      : run_(std::move(run)), json_path_(json_path) {
    if (!csv_path.empty()) {
      csv_ = std::fopen(csv_path.c_str(), "w");
      if (!csv_) throw std::runtime_error("cannot open " + csv_path + " for writing");
      std::fprintf(csv_, "library,transport,algorithm,collective,domain,ranks,type,redop,root,placement,bytes,count,"
                         "time_us,algbw_GBps,busbw_GBps,wrong,timing\n");
      std::fflush(csv_);
    }
  }
  report(const report&) = delete;
  report& operator=(const report&) = delete;
  ~report() {
    if (csv_) std::fclose(csv_);
  }

  /// The nccl-tests column header (after the caller's "# ..." preamble).
  void print_header() const {
    std::printf("#\n");
    std::printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "", "",
                "", "", "");
    std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size", "count", "type",
                "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)", "(elements)", "", "",
                "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    std::fflush(stdout);
  }

  /// Prints one row as nccl-tests does and appends it to the files.
  void add(const row& r) {
    std::printf("%12zu  %12zu  %8s  %6s  %6i", r.bytes, r.count, r.type.c_str(), r.redop.c_str(), r.root);
    print_measurement(r.out_of_place);
    print_measurement(r.in_place);
    std::printf("\n");
    std::fflush(stdout);
    for (const auto* m : {&r.out_of_place, &r.in_place}) {
      if (!m->available) continue;
      if (m->wrong > 0) wrong_ += m->wrong;
      busbw_sum_ += m->busbw;
      ++busbw_count_;
      const char* placement = m == &r.out_of_place ? "out_of_place" : "in_place";
      if (csv_) {
        std::fprintf(csv_, "%s,%s,%s,%s,%s,%d,%s,%s,%d,%s,%zu,%zu,%.3f,%.6f,%.6f,%lld,%s\n", run_.library.c_str(),
                     run_.transport.c_str(), run_.algorithm.c_str(), run_.collective.c_str(), run_.domain.c_str(),
                     run_.ranks, r.type.c_str(), r.redop.c_str(), r.root, placement, r.bytes, r.count, m->time_us,
                     m->algbw, m->busbw, m->wrong, run_.timing.c_str());
        std::fflush(csv_);
      }
      char line[512];
      std::snprintf(line, sizeof line,
                    "    {\"bytes\": %zu, \"count\": %zu, \"type\": \"%s\", \"redop\": \"%s\", \"root\": %d, "
                    "\"placement\": \"%s\", \"time_us\": %.3f, \"algbw_GBps\": %.6f, \"busbw_GBps\": %.6f, "
                    "\"wrong\": %lld}",
                    r.bytes, r.count, r.type.c_str(), r.redop.c_str(), r.root, placement, m->time_us, m->algbw,
                    m->busbw, m->wrong);
      json_rows_.emplace_back(line);
    }
  }

  /// Prints the footer and writes the JSON file. Returns the wrong-value count.
  long long finish() {
    const double avg = busbw_count_ ? busbw_sum_ / busbw_count_ : 0.0;
    std::printf("# Out of bounds values : %lld %s\n", wrong_, wrong_ ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %g \n", avg);
    std::printf("#\n");
    std::fflush(stdout);
    if (!json_path_.empty()) {
      std::FILE* f = std::fopen(json_path_.c_str(), "w");
      if (!f) throw std::runtime_error("cannot open " + json_path_ + " for writing");
      std::fprintf(f,
                   "{\n  \"library\": \"%s\", \"transport\": \"%s\", \"algorithm\": \"%s\", \"collective\": \"%s\",\n"
                   "  \"domain\": \"%s\", \"ranks\": %d, \"timing\": \"%s\",\n  \"rows\": [\n",
                   run_.library.c_str(), run_.transport.c_str(), run_.algorithm.c_str(), run_.collective.c_str(),
                   run_.domain.c_str(), run_.ranks, run_.timing.c_str());
      for (std::size_t i = 0; i < json_rows_.size(); ++i)
        std::fprintf(f, "%s%s\n", json_rows_[i].c_str(), i + 1 < json_rows_.size() ? "," : "");
      std::fprintf(f, "  ],\n  \"wrong\": %lld,\n  \"avg_busbw_GBps\": %.6f\n}\n", wrong_, avg);
      std::fclose(f);
    }
    return wrong_;
  }

 private:
  static void print_measurement(const measurement& m) {
    if (!m.available) {
      std::printf("  %7s  %6s  %6s  %5s", "N/A", "N/A", "N/A", "N/A");
      return;
    }
    char time[32];
    if (m.time_us >= 10000.0) std::snprintf(time, sizeof time, "%7.0f", m.time_us);
    else if (m.time_us >= 100.0) std::snprintf(time, sizeof time, "%7.1f", m.time_us);
    else std::snprintf(time, sizeof time, "%7.2f", m.time_us);
    char wrong[32];
    if (m.wrong < 0) std::snprintf(wrong, sizeof wrong, "%5s", "N/A");
    else std::snprintf(wrong, sizeof wrong, "%5lld", m.wrong);
    std::printf("  %7s  %6.2f  %6.2f  %5s", time, m.algbw, m.busbw, wrong);
  }

  run_description run_;
  std::string json_path_;
  std::FILE* csv_ = nullptr;
  std::vector<std::string> json_rows_;
  long long wrong_ = 0;
  double busbw_sum_ = 0;
  long long busbw_count_ = 0;
};

}  // namespace pdcoll::bench
