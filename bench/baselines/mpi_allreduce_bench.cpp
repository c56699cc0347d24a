// File: bench/baselines/mpi_allreduce_bench.cpp — the MPI baseline for
// pdcoll-bench: MPI_Allreduce of float32 sums (or, with --collective,
// MPI_Reduce_scatter_block / MPI_Allgather / MPI_Bcast / MPI_Reduce /
// MPI_Alltoall / MPI_Alltoallv with equal blocks), out-of-place and in place (MPI_IN_PLACE; MPI_Bcast has
// only the one form, timed for both), with pdcoll-bench's sizes, -r root and
// timing (median over -n
// iterations on rank 0 after warm-up and a barrier, or with --timing mean
// their mean), columns and files. As in nccl-tests, the size of a
// reduce-scatter or all-gather is the whole buffer (P blocks).
//
//     mpirun -n 4 --oversubscribe --mca btl self,vader mpi_allreduce_bench -b 4K -e 256M -f 2
//     mpirun -n 2 --mca btl self,tcp --mca btl_tcp_if_include lo mpi_allreduce_bench --transport tcp
//     mpirun -n 2 --mca btl self,vader mpi_allreduce_bench --collective reduce_scatter
//
// --transport only labels the CSV/JSON rows (the btl is chosen on mpirun's
// command line). -c 1 checks every element (rank r contributes r + 1 + i % 7).
#include "../bench_report.hpp"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

/// The options pdcoll-bench shares with this baseline.
struct options {
  std::string min_bytes = "32M", max_bytes = "32M", transport = "mpi", csv, json;
  /// all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all or all_to_allv
  std::string collective = "all_reduce";
  double factor = 2;
  int iters = 20, warmup = 5, check = 1, root = 0;
  std::string timing = "median";
  double settle = 0;  // seconds of untimed collectives before the first measurement
};

/// Parses nccl-tests' short options; false on a usage error.
bool parse(int argc, char** argv, options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return false;
    const std::string v = argv[++i];
    if (a == "-b") o.min_bytes = v;
    else if (a == "-e") o.max_bytes = v;
    else if (a == "-f") o.factor = std::stod(v);
    else if (a == "-n") o.iters = std::stoi(v);
    else if (a == "-w") o.warmup = std::stoi(v);
    else if (a == "-c") o.check = std::stoi(v);
    else if (a == "-r") o.root = std::stoi(v);
    else if (a == "--transport") o.transport = v;
    else if (a == "--timing") o.timing = v;
    else if (a == "--settle") o.settle = std::stod(v);
    else if (a == "--collective") o.collective = v;
    else if (a == "--csv") o.csv = v;
    else if (a == "--json") o.json = v;
    else return false;
  }
  const bool known = o.collective == "all_reduce" || o.collective == "reduce_scatter" || o.collective == "all_gather" ||
                     o.collective == "broadcast" || o.collective == "reduce" || o.collective == "all_to_all" ||
                     o.collective == "all_to_allv";
  return known && o.root >= 0 && o.iters > 0 && o.warmup >= 0 && o.settle >= 0 && o.settle <= 3600 && pdcoll::bench::known_timing(o.timing);
}

float input(int rank, std::size_t i) { return static_cast<float>(rank + 1 + static_cast<int>(i % 7)); }

/// Times one placement of o.collective over `count` elements (the whole
/// buffer; a block is count / world) and (-c 1) checks it.
pdcoll::bench::measurement measure(std::size_t count, bool in_place, const options& o, int rank, int world) {
  const std::size_t block = count / static_cast<std::size_t>(world);
  const std::string& c = o.collective;
  const bool reduce_scatter = c == "reduce_scatter", all_gather = c == "all_gather", broadcast = c == "broadcast",
             reduce = c == "reduce", all_to_allv = c == "all_to_allv", all_to_all = c == "all_to_all" || all_to_allv;
  const bool root = rank == o.root;
  // all_gather's input is one block, reduce-scatter's output one block; the
  // others' buffers are whole. MPI_Bcast has one buffer: `in`.
  std::vector<float> in(all_gather ? block : count), out(reduce_scatter ? block : broadcast ? 0 : count);
  auto fill = [&] {
    if (all_gather && in_place) {
      for (std::size_t i = 0; i < block; ++i) out[static_cast<std::size_t>(rank) * block + i] = input(rank, i);
    } else if (broadcast && !root) {
      std::fill(in.begin(), in.end(), -1.0f);
    } else {
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = input(rank, i);
    }
  };
  fill();
  const int n = static_cast<int>(count), b = static_cast<int>(block);
  // MPI_Alltoallv's counts and displacements: all_to_all's equal blocks.
  std::vector<int> counts(static_cast<std::size_t>(world), b), displs(static_cast<std::size_t>(world));
  for (int p = 0; p < world; ++p) displs[static_cast<std::size_t>(p)] = p * b;
  auto once = [&] {
    if (reduce_scatter) {
      // In place, MPI leaves this rank's block at the start of the buffer.
      if (in_place) MPI_Reduce_scatter_block(MPI_IN_PLACE, in.data(), b, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      else MPI_Reduce_scatter_block(in.data(), out.data(), b, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (all_gather) {
      if (in_place) MPI_Allgather(MPI_IN_PLACE, 0, MPI_FLOAT, out.data(), b, MPI_FLOAT, MPI_COMM_WORLD);
      else MPI_Allgather(in.data(), b, MPI_FLOAT, out.data(), b, MPI_FLOAT, MPI_COMM_WORLD);
    } else if (broadcast) {
      MPI_Bcast(in.data(), n, MPI_FLOAT, o.root, MPI_COMM_WORLD);
    } else if (reduce) {
      // Only the root's receive buffer may be MPI_IN_PLACE's.
      if (in_place && root) MPI_Reduce(MPI_IN_PLACE, in.data(), n, MPI_FLOAT, MPI_SUM, o.root, MPI_COMM_WORLD);
      else MPI_Reduce(in.data(), out.data(), n, MPI_FLOAT, MPI_SUM, o.root, MPI_COMM_WORLD);
    } else if (all_to_allv) {
      MPI_Alltoallv(in.data(), counts.data(), displs.data(), MPI_FLOAT, out.data(), counts.data(), displs.data(),
                    MPI_FLOAT, MPI_COMM_WORLD);
    } else if (all_to_all) {
      // Out of place only (main skips the in-place form, as pdcoll-bench).
      MPI_Alltoall(in.data(), b, MPI_FLOAT, out.data(), b, MPI_FLOAT, MPI_COMM_WORLD);
    } else {
      if (in_place) MPI_Allreduce(MPI_IN_PLACE, in.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      else MPI_Allreduce(in.data(), out.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
  };
  static bool settled = false;  // --settle: before the launch's first measurement only
  if (!settled) {
    settled = true;
    pdcoll::bench::settle(o.settle, once, [](bool still) {
      int any = still ? 1 : 0;
      MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      return any != 0;
    });
  }
  for (int i = 0; i < o.warmup; ++i) once();
  MPI_Barrier(MPI_COMM_WORLD);
  std::vector<double> samples;
  for (int i = 0; i < o.iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    once();
    samples.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  pdcoll::bench::measurement m;
  m.time_us = pdcoll::bench::summarize(samples, o.timing);
  pdcoll::bench::set_bandwidth(m, count * sizeof(float), o.collective, world);
  if (o.check) {
    std::fill(out.begin(), out.end(), -1.0f);
    fill();
    once();
    long long wrong = 0;
    auto sum = [&](std::size_t i) {  // small integers: exact in any order
      float expected = 0;
      for (int r = 0; r < world; ++r) expected += input(r, i);
      return expected;
    };
    if (reduce_scatter) {
      const float* got = in_place ? in.data() : out.data();
      for (std::size_t i = 0; i < block; ++i)
        if (got[i] != sum(static_cast<std::size_t>(rank) * block + i)) ++wrong;
    } else if (all_gather) {
      for (std::size_t i = 0; i < block * static_cast<std::size_t>(world); ++i)
        if (out[i] != input(static_cast<int>(i / block), i % block)) ++wrong;
    } else if (broadcast) {
      for (std::size_t i = 0; i < count; ++i)
        if (in[i] != input(o.root, i)) ++wrong;
    } else if (reduce) {
      const std::vector<float>& got = in_place ? in : out;
      for (std::size_t i = 0; root && i < count; ++i)
        if (got[i] != sum(i)) ++wrong;
    } else if (all_to_all) {
      // Block q of this rank's output is block `rank` of rank q's input.
      for (std::size_t i = 0; i < block * static_cast<std::size_t>(world); ++i)
        if (out[i] != input(static_cast<int>(i / block), static_cast<std::size_t>(rank) * block + i % block)) ++wrong;
    } else {
      const std::vector<float>& got = in_place ? in : out;
      for (std::size_t i = 0; i < count; ++i)
        if (got[i] != sum(i)) ++wrong;
    }
    MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    m.wrong = wrong;
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  options o;
  std::vector<std::size_t> sizes;
  bool ok = false;
  try {
    ok = parse(argc, argv, o) && o.root < world;
    if (ok)
      sizes = pdcoll::bench::size_sweep(pdcoll::bench::parse_bytes(o.min_bytes), pdcoll::bench::parse_bytes(o.max_bytes),
                                        o.factor);
  } catch (const std::exception&) {
    ok = false;
  }
  if (!ok || sizes.empty()) {
    if (rank == 0)
      std::fprintf(stderr, "usage: mpi_allreduce_bench [-b min] [-e max] [-f factor] [-n iters] [-w warmup] [-c 0|1] [--timing median|mean] [--settle seconds] "
                           "[-r root] [--transport label] [--collective all_reduce|reduce_scatter|all_gather|broadcast|reduce|all_to_all|all_to_allv] "
                           "[--csv file] [--json file]\n");
    MPI_Finalize();
    return 2;
  }
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int version_length = 0;
  MPI_Get_library_version(version, &version_length);
  std::unique_ptr<pdcoll::bench::report> report;
  if (rank == 0) {
    report = std::make_unique<pdcoll::bench::report>(
        pdcoll::bench::run_description{"openmpi", o.transport,
                                       o.collective == "reduce_scatter" ? "MPI_Reduce_scatter_block"
                                       : o.collective == "all_gather"   ? "MPI_Allgather"
                                       : o.collective == "broadcast"    ? "MPI_Bcast"
                                       : o.collective == "reduce"       ? "MPI_Reduce"
                                       : o.collective == "all_to_all"   ? "MPI_Alltoall"
                                       : o.collective == "all_to_allv"  ? "MPI_Alltoallv"
                                                                        : "MPI_Allreduce",
                                       o.collective, "host", world, o.timing},
        o.csv, o.json);
    std::string first_line(version, std::strcspn(version, "\n,"));
    std::printf("# mpi_allreduce_bench %s  ranks %d  transport %s  library %s\n", o.collective.c_str(), world, o.transport.c_str(),
                first_line.c_str());
    std::printf("# minBytes %zu maxBytes %zu step: %g(factor) warmup iters: %d iters: %d validation: %d "
                "time: %s of iters, rank 0\n",
                sizes.front(), sizes.back(), o.factor, o.warmup, o.iters, o.check, o.timing.c_str());
    report->print_header();
  }
  for (std::size_t bytes : sizes) {
    pdcoll::bench::row r;
    // A reduce-scatter or all-gather size holds a whole number of blocks.
    const bool to_all = o.collective == "all_to_all" || o.collective == "all_to_allv";
    const bool blocks = o.collective == "reduce_scatter" || o.collective == "all_gather" || to_all;
    const std::size_t unit = blocks ? static_cast<std::size_t>(world) : 1;
    r.count = bytes / sizeof(float) / unit * unit;
    r.bytes = r.count * sizeof(float);
    r.type = "float";
    r.redop = o.collective == "broadcast" || o.collective == "all_gather" || to_all ? "none" : "sum";
    if (o.collective == "broadcast" || o.collective == "reduce") r.root = o.root;
    r.out_of_place = measure(r.count, false, o, rank, world);
    // As pdcoll-bench: no in-place all-to-all (N/A).
    r.in_place = to_all ? pdcoll::bench::measurement{false} : measure(r.count, true, o, rank, world);
    if (report) report->add(r);
  }
  const long long wrong = report ? report->finish() : 0;
  MPI_Finalize();
  return wrong ? 1 : 0;
}
