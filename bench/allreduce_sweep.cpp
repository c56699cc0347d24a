// File: bench/allreduce_sweep.cpp — quick all-reduce sweep per algorithm:
// time, algorithm bandwidth and bus bandwidth (nccl-tests' busbw =
// algbw·2(P-1)/P) for float32 sums, in place, over a range of sizes. Its
// output is what model/cost_model.hpp's parameters were fitted from.
//
//     tools/pdcoll-run -n 2 build-perf-rel/bench/allreduce_sweep --algo ring --min 8 --max 256M
//
// Options: --algo automatic|ring|recursive_doubling|rabenseifner|tree|direct|two_shot
// (default automatic), --min/--max bytes (K/M/G suffixes), --factor (x4),
// --iters per size (default: fewer for larger sizes), --warmup, --out-of-place.
// Every size is checked once (rank r contributes r+1) before it is timed.
#include <pdcoll/pdcoll.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace {

struct options {
  std::string algo = "automatic";
  std::size_t min_bytes = 8;
  std::size_t max_bytes = std::size_t{64} << 20;
  std::size_t factor = 4;
  int iters = 0;  // 0: by size
  int warmup = 2;
  bool in_place = true;
};

std::size_t parse_bytes(const char* s) {
  char* end = nullptr;
  auto v = std::strtoull(s, &end, 10);
  switch (end && *end ? *end : ' ') {
    case 'K': case 'k': return v << 10;
    case 'M': case 'm': return v << 20;
    case 'G': case 'g': return v << 30;
    default: return v;
  }
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) throw std::invalid_argument("missing value after " + std::string(a));
      return argv[++i];
    };
    if (a == "--algo") o.algo = next();
    else if (a == "--min") o.min_bytes = parse_bytes(next());
    else if (a == "--max") o.max_bytes = parse_bytes(next());
    else if (a == "--factor") o.factor = std::max<std::size_t>(2, parse_bytes(next()));
    else if (a == "--iters") o.iters = std::atoi(next());
    else if (a == "--warmup") o.warmup = std::atoi(next());
    else if (a == "--out-of-place") o.in_place = false;
    else throw std::invalid_argument("unknown option " + std::string(a));
  }
  return o;
}

template <class Algo>
void run_one(pdcoll::communicator& comm, std::vector<float>& in, std::vector<float>& out, bool in_place) {
  if (in_place) pdcoll::exec::sync_wait(pdcoll::all_reduce<Algo>(comm, in, pdcoll::op::sum));
  else pdcoll::exec::sync_wait(pdcoll::all_reduce<Algo>(comm, in, out, pdcoll::op::sum));
}

using runner = void (*)(pdcoll::communicator&, std::vector<float>&, std::vector<float>&, bool);

runner runner_for(const std::string& name) {
  namespace algo = pdcoll::algo;
  if (name == "automatic") return &run_one<algo::automatic>;
  if (name == "ring") return &run_one<algo::ring>;
  if (name == "recursive_doubling") return &run_one<algo::recursive_doubling>;
  if (name == "rabenseifner") return &run_one<algo::rabenseifner>;
  if (name == "tree") return &run_one<algo::tree>;
  if (name == "direct") return &run_one<algo::direct>;
  if (name == "two_shot") return &run_one<algo::two_shot>;
  throw std::invalid_argument("unknown algorithm " + name);
}

}  // namespace

int main(int argc, char** argv) try {
  const options o = parse(argc, argv);
  const runner run = runner_for(o.algo);
  pdcoll::job job = pdcoll::job::from_environment();
  auto& comm = job.comm();
  const int rank = comm.rank(), world = comm.world_size();
  if (rank == 0) {
    std::printf("# allreduce_sweep: %d ranks, %s, algo %s, float32 sum %s\n", world, comm.transport_name().c_str(),
                o.algo.c_str(), o.in_place ? "in place" : "out of place");
    std::printf("%12s %8s %12s %12s %12s %12s\n", "bytes", "iters", "time(us)", "min(us)", "algbw(GB/s)",
                "busbw(GB/s)");
  }
  int failures = 0;
  for (std::size_t bytes = std::max<std::size_t>(o.min_bytes, 4); bytes <= o.max_bytes; bytes *= o.factor) {
    const std::size_t n = bytes / sizeof(float);
    std::vector<float> in(n, static_cast<float>(rank + 1)), out(o.in_place ? 0 : n);
    run(comm, in, out, o.in_place);
    const float expected = static_cast<float>(world * (world + 1) / 2);
    const auto& got = o.in_place ? in : out;
    if (std::any_of(got.begin(), got.end(), [&](float x) { return x != expected; })) {
      std::fprintf(stderr, "rank %d: wrong result at %zu bytes\n", rank, bytes);
      ++failures;
    }
    const int iters = o.iters > 0 ? o.iters : bytes >= (16u << 20) ? 10 : bytes >= (1u << 20) ? 30 : 200;
    std::vector<double> times;
    times.reserve(static_cast<std::size_t>(iters));
    for (int i = 0; i < o.warmup + iters; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      run(comm, in, out, o.in_place);
      if (i >= o.warmup) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    const double t = times[times.size() / 2], algbw = static_cast<double>(bytes) / t / 1e9;
    if (rank == 0)
      std::printf("%12zu %8d %12.1f %12.1f %12.3f %12.3f\n", bytes, iters, t * 1e6, times.front() * 1e6, algbw,
                  algbw * 2.0 * (world - 1) / world);
    std::fflush(stdout);
  }
  return failures ? 1 : 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "allreduce_sweep: %s\n", e.what());
  return 1;
}
