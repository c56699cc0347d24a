// File: bench/baselines/gloo_allreduce_bench.cpp — the Gloo baseline for
// pdcoll-bench: float32 sum all-reduce over Gloo's tcp transport on loopback,
// with pdcoll-bench's sizes, timing (median over -n iterations on rank 0
// after warm-up and a barrier, or with --timing mean their mean), columns
// and files.
//
//     tools/pdcoll-run -n 4 gloo_allreduce_bench --algo allreduce -b 4K -e 256M -f 2
//
// --algo allreduce          gloo::allreduce (the options API PyTorch's
//                           ProcessGroupGloo calls; ring), out-of-place and in place
// --algo ring_chunked       gloo::AllreduceRingChunked (bound-buffer class; in place only)
// --algo halving_doubling   gloo::AllreduceHalvingDoubling (bound-buffer class; in place only)
//
// Pitfall handled here: the bound-buffer classes size each connection's
// SO_SNDBUF from the first message they send on it, so a context reused
// across a size sweep keeps the small first size's buffer and starves large
// messages. Each bound-buffer measurement therefore gets a fresh context (new
// connections), and the options API gets a context of its own; the two APIs
// never share one.
//
// Rank and world size: PDCOLL_RANK/PDCOLL_WORLD_SIZE (pdcoll-run),
// OMPI_COMM_WORLD_RANK/SIZE (mpirun) or RANK/WORLD_SIZE. Rendezvous: a Gloo
// FileStore in --store DIR (default /tmp/pdcoll-gloo-<PDCOLL_TOKEN or
// parent pid>), removed by rank 0 at the end.
#include "../bench_report.hpp"

#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier.h>
#include <gloo/barrier_all_to_one.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

/// The options pdcoll-bench shares with this baseline, plus --algo and --store.
struct options {
  std::string min_bytes = "32M", max_bytes = "32M", algo = "allreduce", store, csv, json;
  double factor = 2;
  int iters = 20, warmup = 5, check = 1;
  std::string timing = "median";
  double settle = 0;  // seconds of untimed all-reduces before the first measurement
};

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
    else if (a == "--algo") o.algo = v;
    else if (a == "--store") o.store = v;
    else if (a == "--timing") o.timing = v;
    else if (a == "--settle") o.settle = std::stod(v);
    else if (a == "--csv") o.csv = v;
    else if (a == "--json") o.json = v;
    else return false;
  }
  return o.iters > 0 && o.warmup >= 0 && o.settle >= 0 && o.settle <= 3600 && pdcoll::bench::known_timing(o.timing) &&
         (o.algo == "allreduce" || o.algo == "ring_chunked" || o.algo == "halving_doubling");
}

int env_int(std::initializer_list<const char*> names, int fallback) {
  for (const char* n : names)
    if (const char* v = std::getenv(n); v && *v) return std::atoi(v);
  return fallback;
}

float input(int rank, std::size_t i) { return static_cast<float>(rank + 1 + static_cast<int>(i % 7)); }

/// Connects a fresh full mesh under `prefix` in the file store.
std::shared_ptr<gloo::rendezvous::Context> connect(gloo::rendezvous::Store& files, const std::string& prefix, int rank,
                                                   int world) {
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  attr.ai_family = AF_INET;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::PrefixStore store(prefix, files);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, world);
  context->setTimeout(std::chrono::seconds(300));
  context->connectFullMesh(store, device);
  return context;
}

/// (--settle, the launch's first measurement only) the settling run, then
/// warm-up, barrier, timed iterations, then (-c 1) one checked run.
pdcoll::bench::measurement measure(std::vector<float>& in, std::vector<float>* out, const std::function<void()>& once,
                                   const std::function<void()>& barrier, const options& o, int rank, int world,
                                   const std::function<long long(long long)>& sum_over_ranks) {
  static bool settled = false;
  if (!settled) {
    settled = true;
    pdcoll::bench::settle(o.settle, once, [&](bool still) { return sum_over_ranks(still ? 1 : 0) > 0; });
  }
  for (int i = 0; i < o.warmup; ++i) once();
  barrier();
  std::vector<double> samples;
  for (int i = 0; i < o.iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    once();
    samples.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  pdcoll::bench::measurement m;
  m.time_us = pdcoll::bench::summarize(samples, o.timing);
  pdcoll::bench::set_bandwidth(m, in.size() * sizeof(float), "all_reduce", world);
  if (o.check) {
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = input(rank, i);
    if (out) std::fill(out->begin(), out->end(), -1.0f);
    once();
    const std::vector<float>& got = out ? *out : in;
    long long wrong = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      float expected = 0;
      for (int r = 0; r < world; ++r) expected += input(r, i);  // small integers: exact in any order
      if (got[i] != expected) ++wrong;
    }
    m.wrong = sum_over_ranks(wrong);
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) try {
  options o;
  std::vector<std::size_t> sizes;
  bool ok = parse(argc, argv, o);
  if (ok)
    sizes = pdcoll::bench::size_sweep(pdcoll::bench::parse_bytes(o.min_bytes), pdcoll::bench::parse_bytes(o.max_bytes),
                                      o.factor);
  if (!ok || sizes.empty()) {
    std::fprintf(stderr, "usage: gloo_allreduce_bench [--algo allreduce|ring_chunked|halving_doubling] [-b min] "
                         "[-e max] [-f factor] [-n iters] [-w warmup] [-c 0|1] [--timing median|mean] [--settle seconds] [--store dir] [--csv f] [--json f]\n");
    return 2;
  }
  const int rank = env_int({"PDCOLL_RANK", "OMPI_COMM_WORLD_RANK", "RANK"}, 0);
  const int world = env_int({"PDCOLL_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "WORLD_SIZE"}, 1);
  if (o.store.empty()) {
    const char* token = std::getenv("PDCOLL_TOKEN");
    o.store = std::string("/tmp/pdcoll-gloo-") + (token && *token ? token : std::to_string(::getppid()));
  }
  std::filesystem::create_directories(o.store);
  gloo::rendezvous::FileStore files(o.store);

  // The options API's context: also the run's barrier and wrong-count sum
  // (it only ever carries options-API operations).
  auto control = connect(files, "control", rank, world);
  std::uint32_t tag = 0;
  auto barrier = [&] {
    gloo::BarrierOptions b(control);
    b.setTag(tag++);
    gloo::barrier(b);
  };
  auto sum_over_ranks = [&](long long value) {
    std::vector<long long> v{value};
    gloo::AllreduceOptions a(control);
    a.setOutput(v.data(), 1);
    a.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<long long>));
    a.setTag(tag++);
    gloo::allreduce(a);
    return v[0];
  };

  std::unique_ptr<pdcoll::bench::report> report;
  if (rank == 0) {
    const std::string name = o.algo == "allreduce" ? "gloo::allreduce"
                             : o.algo == "ring_chunked" ? "AllreduceRingChunked"
                                                        : "AllreduceHalvingDoubling";
    report = std::make_unique<pdcoll::bench::report>(
        pdcoll::bench::run_description{"gloo", "tcp", name, "all_reduce", "host", world, o.timing}, o.csv, o.json);
    std::printf("# gloo_allreduce_bench all_reduce  ranks %d  transport tcp (loopback)  algorithm %s\n", world,
                name.c_str());
    std::printf("# minBytes %zu maxBytes %zu step: %g(factor) warmup iters: %d iters: %d validation: %d "
                "time: %s of iters, rank 0\n",
                sizes.front(), sizes.back(), o.factor, o.warmup, o.iters, o.check, o.timing.c_str());
    report->print_header();
  }

  for (std::size_t bytes : sizes) {
    pdcoll::bench::row r;
    r.count = bytes / sizeof(float);
    r.bytes = r.count * sizeof(float);
    r.type = "float";
    r.redop = "sum";
    std::vector<float> in(r.count), out(r.count);
    for (std::size_t i = 0; i < r.count; ++i) in[i] = input(rank, i);
    if (o.algo == "allreduce") {
      auto run = [&](bool in_place) {
        return [&, in_place] {
          gloo::AllreduceOptions a(control);
          if (in_place) {
            a.setOutput(in.data(), in.size());
          } else {
            a.setInput(in.data(), in.size());
            a.setOutput(out.data(), out.size());
          }
          a.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
          a.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
          a.setTag(tag++);
          gloo::allreduce(a);
        };
      };
      r.out_of_place = measure(in, &out, run(false), barrier, o, rank, world, sum_over_ranks);
      r.in_place = measure(in, nullptr, run(true), barrier, o, rank, world, sum_over_ranks);
    } else {
      // Fresh connections for this algorithm and size (see the file comment).
      auto context = connect(files, o.algo + "-" + std::to_string(bytes), rank, world);
      std::vector<float*> ptrs{in.data()};
      std::unique_ptr<gloo::Algorithm> algorithm;
      if (o.algo == "ring_chunked")
        algorithm = std::make_unique<gloo::AllreduceRingChunked<float>>(context, ptrs, static_cast<int>(r.count));
      else
        algorithm = std::make_unique<gloo::AllreduceHalvingDoubling<float>>(context, ptrs, static_cast<int>(r.count));
      gloo::BarrierAllToOne context_barrier(context);
      r.out_of_place.available = false;
      r.in_place = measure(in, nullptr, [&] { algorithm->run(); }, [&] { context_barrier.run(); }, o, rank, world,
                           sum_over_ranks);
      // Every rank is done with these connections before any closes them:
      // closing a socket with unread bytes sends a reset that the peer
      // reports as "Connection closed by peer".
      barrier();
    }
    if (report) report->add(r);
  }
  const long long wrong = report ? report->finish() : 0;
  barrier();
  if (rank == 0) std::filesystem::remove_all(o.store);
  return wrong ? 1 : 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "gloo_allreduce_bench: %s\n", e.what());
  return 1;
}
