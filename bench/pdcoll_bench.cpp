// File: bench/pdcoll_bench.cpp — pdcoll-bench: the nccl-tests of pdcoll. Same
// command line (-b -e -f -n -w -c -o -d -r), same columns (size count type
// redop root | time algbw busbw #wrong, out-of-place then in-place), same
// bus-bandwidth factors and footer, for every collective, transport,
// all-reduce algorithm and memory domain.
//
//     tools/pdcoll-run -n 4 build-bench/bench/pdcoll-bench -b 8 -e 128M -f 2 -c 1
//     tools/pdcoll-run -n 2 build-bench/bench/pdcoll-bench --collective all_gather --transport tcp
//     mpirun -n 4 build-bench/bench/pdcoll-bench --algo ring --csv ring.csv
//
// Time: the MEDIAN over -n iterations of one operation as rank 0 sees it,
// after warm-up and a barrier (nccl-tests reports the mean; the median is
// steadier on a shared machine); --timing mean gives the mean (see
// bench_report.hpp's summarize() for when to prefer it). Check mode (-c 1):
// after timing, each placement runs once more on deterministic inputs and
// every rank compares its result with a reference
// (tests/support/reference.hpp: exact for integers, min, max and data
// movement; the order-independent rounding bound for floating-point sums,
// products and averages); #wrong is the total over all ranks. Exit status 1 when anything was wrong or an operation failed.
#include "bench_report.hpp"

#include <support/reference.hpp>

#include <pdcoll/memory/emulated_device.hpp>
#include <pdcoll/memory/track.hpp>
#include <pdcoll/pdcoll.hpp>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

namespace memory = pdcoll::memory;
namespace exec = pdcoll::exec;
using pdcoll::bench::measurement;

/// The command line.
struct options {
  std::string min_bytes = "32M";
  std::string max_bytes = "32M";
  double factor = 2;
  int iters = 20;
  int warmup = 5;
  int check = 1;
  std::string op = "sum";
  std::string type = "float";
  int root = 0;
  std::string collective = "all_reduce";
  std::string algo = "automatic";
  std::string transport;  // empty: the environment's choice
  std::string domain = "host";
  std::string json;
  std::string csv;
  std::string timing = "median";
  double settle = 0;  // seconds of untimed collectives before the first measurement
};

/// Where pdcoll-bench's collectives read and write: a host vector or an
/// emulated-device allocation, behind the same small interface.
template <class T, class D>
class bench_buffer;

/// The host domain's handle: whether buffers are node-shareable
/// (--domain host_shareable: memory::host::allocate_shareable) or ordinary
/// process memory (a vector, as a user's own buffers).
struct host_choice {
  bool shareable = false;
};

template <class T>
class bench_buffer<T, memory::host> {
 public:
  using domain_handle = const host_choice*;
  bench_buffer(domain_handle choice, std::size_t count) {
    if (choice && choice->shareable) {
      shareable_ = memory::host::allocate_shareable<T>(count);
      data_ = shareable_.span();
    } else {
      vector_.resize(count);
      data_ = vector_;
    }
  }
  pdcoll::view<T, memory::host> view(std::size_t offset, std::size_t count) { return {data_.data() + offset, count}; }
  void write(std::size_t offset, const std::vector<T>& values) {
    std::copy(values.begin(), values.end(), data_.begin() + static_cast<std::ptrdiff_t>(offset));
  }
  std::vector<T> read() const { return {data_.begin(), data_.end()}; }

 private:
  std::vector<T> vector_;
  memory::host_buffer<T> shareable_;
  std::span<T> data_;
};

template <class T>
class bench_buffer<T, memory::emulated_device> {
 public:
  using domain_handle = memory::emulated_device*;
  bench_buffer(domain_handle device, std::size_t count) : device_(device), buffer_(device->template allocate<T>(count)) {}
  pdcoll::view<T, memory::emulated_device> view(std::size_t offset, std::size_t count) {
    return buffer_.view().subview(offset, count);
  }
  void write(std::size_t offset, const std::vector<T>& values) {
    device_->copy_from_host(std::span<const T>(values.data(), values.size()), view(offset, values.size()));
  }
  std::vector<T> read() const {
    std::vector<T> host(buffer_.size());
    device_->copy_to_host(buffer_.view(), std::span<T>(host));
    return host;
  }

 private:
  domain_handle device_;
  memory::device_buffer<T, memory::emulated_device> buffer_;
};

/// Calls f(op) with the op object `name` stands for.
template <class F>
decltype(auto) with_op(const std::string& name, F&& f) {
  if (name == "prod") return f(pdcoll::op::prod);
  if (name == "min") return f(pdcoll::op::min);
  if (name == "max") return f(pdcoll::op::max);
  if (name == "avg") return f(pdcoll::op::avg);
  return f(pdcoll::op::sum);
}

/// Element counts of one size for one collective.
struct layout {
  std::size_t count = 0;      // elements in `bytes`
  std::size_t bytes = 0;      // nccl-tests' size column
  std::size_t shown_count = 0;  // nccl-tests' count column (its paramcount): the per-rank block where there is one
  std::size_t in_count = 0;   // this rank's input elements
  std::size_t out_count = 0;  // this rank's output elements
  std::size_t block = 0;      // per-rank block (all_gather, reduce_scatter, all_to_all, all_to_allv)
  bool in_place = true;       // whether the collective has an in-place form
  // In place, input and output share one buffer of max(in_count, out_count)
  // elements, at these offsets (nccl-tests' layout: all_gather's input is
  // this rank's block of the output, reduce_scatter's output this rank's
  // block of the input).
  std::size_t in_at = 0, out_at = 0;
};

bool reduces(const std::string& collective) {
  return collective == "all_reduce" || collective == "reduce" || collective == "reduce_scatter";
}
bool rooted(const std::string& collective) { return collective == "broadcast" || collective == "reduce"; }

/// The benchmark of one element type in one memory domain.
template <class T, class D>
class runner {
 public:
  runner(pdcoll::communicator& comm, const options& opt, typename bench_buffer<T, D>::domain_handle domain)
      : comm_(comm), opt_(opt), domain_(domain), rank_(comm.rank()), world_(comm.world_size()) {}

  layout plan(std::size_t bytes) const {
    layout l;
    const auto P = static_cast<std::size_t>(world_);
    l.count = bytes / sizeof(T);
    const std::string& c = opt_.collective;
    const bool to_all = c == "all_to_all" || c == "all_to_allv";
    if (c == "all_gather" || c == "reduce_scatter" || to_all) {
      l.count = l.count / P * P;  // nccl-tests rounds the total down to a multiple of the ranks
      l.block = l.count / P;
      l.shown_count = l.block;
      l.in_count = c == "all_gather" ? l.block : l.count;
      l.out_count = c == "reduce_scatter" ? l.block : l.count;
      l.in_place = !to_all;  // pdcoll rejects overlapping input and output for all_to_all(v)
      const std::size_t mine = static_cast<std::size_t>(rank_) * l.block;
      l.in_at = c == "all_gather" ? mine : 0;
      l.out_at = c == "reduce_scatter" ? mine : 0;
    } else {
      l.shown_count = l.count;
      l.in_count = l.out_count = l.count;
      l.in_place = c != "sendrecv";
    }
    l.bytes = l.count * sizeof(T);
    return l;
  }

  /// Measures both placements of one size.
  pdcoll::bench::row run(std::size_t bytes, std::uint64_t salt) {
    const layout l = plan(bytes);
    pdcoll::bench::row r;
    r.bytes = l.bytes;
    r.count = l.shown_count;
    r.redop = reduces(opt_.collective) ? opt_.op : "none";
    r.root = rooted(opt_.collective) ? opt_.root : -1;
    r.out_of_place = measure(l, false, salt);
    r.in_place = l.in_place ? measure(l, true, salt + 1) : measurement{false};
    return r;
  }

 private:
  /// One placement: warm-up, barrier, timed iterations, then (-c 1) a checked run.
  measurement measure(const layout& l, bool in_place, std::uint64_t salt) {
    return with_collective([&](auto run_once) { return measure(l, in_place, salt, run_once); });
  }

  /// measure() with the collective resolved: `run_once(in_view, out_view)`
  /// runs it once, to completion (throws std::system_error on failure).
  template <class Run>
  measurement measure(const layout& l, bool in_place, std::uint64_t salt, Run run_once) {
    const std::size_t in_at = in_place ? l.in_at : 0, out_at = in_place ? l.out_at : 0;
    bench_buffer<T, D> in(domain_, in_place ? std::max(l.in_count, l.out_count) : l.in_count);
    std::unique_ptr<bench_buffer<T, D>> separate_out;
    if (!in_place) separate_out = std::make_unique<bench_buffer<T, D>>(domain_, l.out_count);
    bench_buffer<T, D>& out = in_place ? in : *separate_out;
    in.write(in_at, input_of(rank_, salt, l.in_count));  // touches the pages before timing

    const auto vin = in.view(in_at, l.in_count);
    const auto vout = out.view(out_at, l.out_count);
    if (!settled_) {
      settled_ = true;
      pdcoll::bench::settle(opt_.settle, [&] { run_once(vin, vout); }, [&](bool still) {
        std::vector<std::uint32_t> flag{still ? 1u : 0u};
        exec::sync_wait(pdcoll::all_reduce(comm_, flag, pdcoll::op::max));
        return flag[0] != 0;
      });
    }
    for (int i = 0; i < opt_.warmup; ++i) run_once(vin, vout);
    exec::sync_wait(pdcoll::barrier(comm_));
    std::vector<double> samples;
    samples.reserve(static_cast<std::size_t>(opt_.iters));
    for (int i = 0; i < opt_.iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      run_once(vin, vout);
      samples.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    measurement m;
    m.time_us = pdcoll::bench::summarize(samples, opt_.timing);
    pdcoll::bench::set_bandwidth(m, l.bytes, opt_.collective, world_);

    if (opt_.check) {
      // Stale values everywhere the result goes (in place too: the timed runs
      // left right answers in the other blocks), then the input.
      out.write(0, input_of(rank_, salt ^ 0x5eed, in_place ? std::max(l.in_count, l.out_count) : l.out_count));
      in.write(in_at, input_of(rank_, salt, l.in_count));
      run_once(vin, vout);
      auto result = out.read();
      result.erase(result.begin(), result.begin() + static_cast<std::ptrdiff_t>(out_at));
      std::vector<std::uint64_t> wrong{count_wrong(l, result, salt)};
      exec::sync_wait(pdcoll::all_reduce(comm_, wrong, pdcoll::op::sum));
      m.wrong = static_cast<long long>(wrong[0]);
    }
    return m;
  }

  bool for_product() const { return reduces(opt_.collective) && opt_.op == "prod"; }

  std::vector<T> input_of(int rank, std::uint64_t salt, std::size_t count) const {
    return pdcoll::testing::make_input<T>(salt, rank, count, for_product());
  }

  /// Calls `body(run_once)` with a callable that runs the command line's
  /// collective once on (in, out) views. The strings are compared here,
  /// once per placement, so that the timed loop holds only the collective
  /// (as the baselines' loops hold only MPI_Allreduce or Gloo's call).
  template <class Body>
  measurement with_collective(Body&& body) {
    const std::string& c = opt_.collective;
    if (c == "all_reduce") {
      return with_op(opt_.op, [&](auto op) {
        return body([this, op](auto vin, auto vout) {
          if constexpr (pdcoll::is_supported_v<T, decltype(op)>) exec::sync_wait(pdcoll::all_reduce(comm_, vin, vout, op));
        });
      });
    }
    if (c == "broadcast") {
      auto with = [&](auto algo) {
        return body([this](auto vin, auto vout) {
          exec::sync_wait(pdcoll::broadcast<decltype(algo)>(comm_, vin, vout, opt_.root));
        });
      };
      if (opt_.algo == "chain") return with(pdcoll::algo::chain{});
      if (opt_.algo == "tree") return with(pdcoll::algo::tree{});
      if (opt_.algo == "shared_memory") return with(pdcoll::algo::shared_memory{});
      return with(pdcoll::algo::automatic{});
    }
    if (c == "reduce") {
      return with_op(opt_.op, [&](auto op) {
        auto with = [&](auto algo) {
          return body([this, op](auto vin, auto vout) {
            if constexpr (pdcoll::is_supported_v<T, decltype(op)>)
              exec::sync_wait(pdcoll::reduce<decltype(algo)>(comm_, vin, vout, op, opt_.root));
          });
        };
        if (opt_.algo == "tree") return with(pdcoll::algo::tree{});
        if (opt_.algo == "shared_memory") return with(pdcoll::algo::shared_memory{});
        return with(pdcoll::algo::automatic{});
      });
    }
    if (c == "all_gather") {
      if (opt_.algo == "recursive_doubling")
        return body([this](auto vin, auto vout) {
          exec::sync_wait(pdcoll::all_gather<pdcoll::algo::recursive_doubling>(comm_, vin, vout));
        });
      if (opt_.algo == "ring")
        return body([this](auto vin, auto vout) { exec::sync_wait(pdcoll::all_gather<pdcoll::algo::ring>(comm_, vin, vout)); });
      if (opt_.algo == "shared_memory")
        return body([this](auto vin, auto vout) {
          exec::sync_wait(pdcoll::all_gather<pdcoll::algo::shared_memory>(comm_, vin, vout));
        });
      return body([this](auto vin, auto vout) { exec::sync_wait(pdcoll::all_gather(comm_, vin, vout)); });
    }
    if (c == "reduce_scatter") {
      return with_op(opt_.op, [&](auto op) {
        if (opt_.algo == "recursive_halving" || opt_.algo == "rabenseifner")
          return body([this, op](auto vin, auto vout) {
            if constexpr (pdcoll::is_supported_v<T, decltype(op)>)
              exec::sync_wait(pdcoll::reduce_scatter<pdcoll::algo::recursive_halving>(comm_, vin, vout, op));
          });
        if (opt_.algo == "ring")
          return body([this, op](auto vin, auto vout) {
            if constexpr (pdcoll::is_supported_v<T, decltype(op)>)
              exec::sync_wait(pdcoll::reduce_scatter<pdcoll::algo::ring>(comm_, vin, vout, op));
          });
        if (opt_.algo == "shared_memory")
          return body([this, op](auto vin, auto vout) {
            if constexpr (pdcoll::is_supported_v<T, decltype(op)>)
              exec::sync_wait(pdcoll::reduce_scatter<pdcoll::algo::shared_memory>(comm_, vin, vout, op));
          });
        return body([this, op](auto vin, auto vout) {
          if constexpr (pdcoll::is_supported_v<T, decltype(op)>)
            exec::sync_wait(pdcoll::reduce_scatter(comm_, vin, vout, op));
        });
      });
    }
    if (c == "all_to_all") {
      auto with = [&](auto algo) {
        return body([this](auto vin, auto vout) {
          exec::sync_wait(pdcoll::all_to_all<decltype(algo)>(comm_, vin, vout));
        });
      };
      if (opt_.algo == "pairwise") return with(pdcoll::algo::pairwise{});
      if (opt_.algo == "direct") return with(pdcoll::algo::direct{});
      if (opt_.algo == "shared_memory") return with(pdcoll::algo::shared_memory{});
      return with(pdcoll::algo::automatic{});
    }
    if (c == "all_to_allv") {
      // all_to_all's equal blocks through the v form's packed counts, as
      // all_to_all_single with split sizes: the counts are made per call.
      auto with = [&](auto algo) {
        return body([this](auto vin, auto vout) {
          const std::vector<std::size_t> counts(static_cast<std::size_t>(world_), vin.size() / static_cast<std::size_t>(world_));
          exec::sync_wait(pdcoll::all_to_allv<decltype(algo)>(comm_, vin, counts, vout, counts));
        });
      };
      if (opt_.algo == "pairwise") return with(pdcoll::algo::pairwise{});
      if (opt_.algo == "direct") return with(pdcoll::algo::direct{});
      if (opt_.algo == "shared_memory") return with(pdcoll::algo::shared_memory{});
      return with(pdcoll::algo::automatic{});
    }
    // sendrecv: a ring shift, as nccl-tests' sendrecv_perf
    return body([this](auto vin, auto vout) {
      const int next = (rank_ + 1) % world_, prev = (rank_ + world_ - 1) % world_;
      exec::sync_wait(exec::when_all(pdcoll::send(comm_, next, vin), pdcoll::recv(comm_, prev, vout)));
    });
  }

  static bool same_bits(const T& a, const T& b) { return std::memcmp(&a, &b, sizeof(T)) == 0; }

  /// Elements of this rank's result that differ from the reference.
  std::uint64_t count_wrong(const layout& l, const std::vector<T>& got, std::uint64_t salt) const {
    const std::string& c = opt_.collective;
    const bool prod = for_product();
    std::uint64_t wrong = 0;
    auto reduced_wrong = [&](std::size_t n, std::size_t offset) {
      with_op(opt_.op, [&](auto op) {
        using Op = decltype(op);
        if constexpr (pdcoll::is_supported_v<T, Op>) {
          for (std::size_t k = 0; k < n; ++k)
            if (!pdcoll::testing::check_reduced<T, Op>(&got[k], 1, salt, world_, offset + k).empty()) ++wrong;
        }
      });
    };
    auto moved_wrong = [&](std::size_t n, std::size_t out_offset, int src, std::size_t src_offset) {
      for (std::size_t k = 0; k < n; ++k)
        if (!same_bits(got[out_offset + k], pdcoll::testing::input_value<T>(salt, src, src_offset + k, prod))) ++wrong;
    };
    if (c == "all_reduce") {
      reduced_wrong(l.count, 0);
    } else if (c == "reduce") {
      if (rank_ == opt_.root) reduced_wrong(l.count, 0);
    } else if (c == "reduce_scatter") {
      reduced_wrong(l.block, static_cast<std::size_t>(rank_) * l.block);
    } else if (c == "broadcast") {
      moved_wrong(l.count, 0, opt_.root, 0);
    } else if (c == "all_gather") {
      for (int p = 0; p < world_; ++p) moved_wrong(l.block, static_cast<std::size_t>(p) * l.block, p, 0);
    } else if (c == "all_to_all" || c == "all_to_allv") {
      for (int p = 0; p < world_; ++p)
        moved_wrong(l.block, static_cast<std::size_t>(p) * l.block, p, static_cast<std::size_t>(rank_) * l.block);
    } else {  // sendrecv
      moved_wrong(l.count, 0, (rank_ + world_ - 1) % world_, 0);
    }
    return wrong;
  }

  pdcoll::communicator& comm_;
  const options& opt_;
  typename bench_buffer<T, D>::domain_handle domain_;
  int rank_, world_;
  bool settled_ = false;  // --settle ran (before the sweep's first measurement)
};

/// The sweep for element type T in domain D; returns the wrong-value count.
template <class T, class D>
long long sweep(pdcoll::communicator& comm, const options& opt, typename bench_buffer<T, D>::domain_handle domain,
                const std::vector<std::size_t>& sizes, pdcoll::bench::report* report) {
  runner<T, D> bench(comm, opt, domain);
  std::uint64_t salt = 1;
  for (std::size_t bytes : sizes) {
    auto r = bench.run(bytes, salt);
    salt += 2;
    r.type = opt.type;
    if (report) report->add(r);
  }
  return report ? report->finish() : 0;
}

/// Calls f(T{}) for the nccl-tests type name.
template <class F>
void with_type(const std::string& name, F&& f) {
  if (name == "float") f(float{});
  else if (name == "double") f(double{});
  else if (name == "half") f(pdcoll::float16{});
  else if (name == "bfloat16") f(pdcoll::bfloat16{});
  else if (name == "int8") f(std::int8_t{});
  else if (name == "uint8") f(std::uint8_t{});
  else if (name == "int32") f(std::int32_t{});
  else if (name == "uint32") f(std::uint32_t{});
  else if (name == "int64") f(std::int64_t{});
  else f(std::uint64_t{});
}

/// The algorithms --algo accepts for each collective (the first is the default).
const std::map<std::string, std::vector<std::string>>& algorithms() {
  static const std::map<std::string, std::vector<std::string>> table{
      {"all_reduce", {"automatic", "ring", "recursive_doubling", "rabenseifner", "tree", "direct", "two_shot"}},
      {"broadcast", {"automatic", "tree", "chain", "shared_memory"}},
      {"reduce", {"automatic", "tree", "shared_memory"}},
      {"all_gather", {"automatic", "ring", "recursive_doubling", "shared_memory"}},
      {"reduce_scatter", {"automatic", "ring", "recursive_halving", "rabenseifner", "shared_memory"}},
      {"all_to_all", {"automatic", "pairwise", "direct", "shared_memory"}},
      {"all_to_allv", {"automatic", "pairwise", "direct", "shared_memory"}},
      {"sendrecv", {"direct"}},
  };
  return table;
}

}  // namespace

int main(int argc, char** argv) {
  options opt;
  CLI::App app{
      "pdcoll-bench: nccl-tests-style benchmark of pdcoll's collectives.\n"
      "Launch under tools/pdcoll-run, mpirun or srun. Time is the MEDIAN over -n iterations of one\n"
      "operation measured by rank 0 after warm-up and a barrier (nccl-tests reports the mean: --timing).\n"
      "busbw = algbw x factor: all_reduce 2(n-1)/n; all_gather, reduce_scatter (size = whole buffer)\n"
      "and all_to_all(v) (n-1)/n; broadcast, reduce, sendrecv 1. In place as nccl-tests: all_gather's\n"
      "input is this rank's block of the output, reduce_scatter's output this rank's block of the\n"
      "input. In-place all_to_all(v) and sendrecv print N/A: pdcoll rejects overlapping input and output.\n"
      "all_to_allv moves all_to_all's equal blocks through the v form's packed counts.",
      "pdcoll-bench"};
  app.add_option("-b,--minbytes", opt.min_bytes, "smallest size in bytes (K/M/G suffixes)")->capture_default_str();
  app.add_option("-e,--maxbytes", opt.max_bytes, "largest size in bytes (K/M/G suffixes)")->capture_default_str();
  // A factor of 1 or less would sweep one size for ever; nccl-tests' -f means growth.
  const CLI::Validator above_one(
      [](const std::string& v) {
        char* end = nullptr;
        const double f = std::strtod(v.c_str(), &end);
        return end != v.c_str() && *end == '\0' && f > 1.0 ? std::string() : "must be a number above 1, got " + v;
      },
      "FACTOR>1");
  app.add_option("-f,--stepfactor", opt.factor, "multiplication factor between sizes")
      ->capture_default_str()
      ->check(above_one);
  app.add_option("-n,--iters", opt.iters, "timed iterations per size")->capture_default_str()->check(CLI::Range(1, 1 << 30));
  app.add_option("-w,--warmup_iters", opt.warmup, "warm-up iterations per size")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--timing", opt.timing, "time column: median or mean (nccl-tests') of the iterations")
      ->capture_default_str()->check(CLI::IsMember({"median", "mean"}));
  app.add_option("--settle", opt.settle,
                 "seconds of untimed collectives at the first size before the first measurement, while the "
                 "scheduler settles a fresh launch's ranks on the CPUs (0: none, as nccl-tests)")
      ->capture_default_str()->check(CLI::Range(0.0, 3600.0));
  app.add_option("-c,--check", opt.check, "check results: 0 or 1")->capture_default_str()->check(CLI::Range(0, 1));
  app.add_option("-o,--op", opt.op, "reduction: sum|prod|min|max|avg")
      ->capture_default_str()->check(CLI::IsMember({"sum", "prod", "min", "max", "avg"}));
  app.add_option("-d,--datatype", opt.type, "element type")
      ->capture_default_str()
      ->check(CLI::IsMember({"float", "double", "half", "bfloat16", "int8", "uint8", "int32", "uint32", "int64", "uint64"}));
  app.add_option("-r,--root", opt.root, "root rank of broadcast and reduce")->capture_default_str();
  app.add_option("--collective", opt.collective, "collective to measure")
      ->capture_default_str()
      ->check(CLI::IsMember({"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all",
                             "all_to_allv", "sendrecv"}));
  app.add_option("--algo", opt.algo,
                 "algorithm: all_reduce automatic|ring|recursive_doubling|rabenseifner|tree|direct|two_shot (sets PDCOLL_ALGO); "
                 "broadcast automatic|tree|chain|shared_memory; reduce automatic|tree|shared_memory; all_gather "
                 "automatic|ring|recursive_doubling|shared_memory; reduce_scatter automatic|ring|recursive_halving|shared_memory; "
                 "all_to_all automatic|pairwise|direct|shared_memory; all_to_allv automatic|pairwise|direct|shared_memory")
      ->capture_default_str();
  app.add_option("--transport", opt.transport,
                 "shm|tcp (libfabric), uring, or uring-directional (uring with one connection per direction); "
                 "sets PDCOLL_TRANSPORT/PDCOLL_PROVIDER/PDCOLL_URING_DIRECTIONAL")
      ->check(CLI::IsMember({"shm", "tcp", "uring", "uring-directional"}));
  app.add_option("--domain", opt.domain,
                 "buffer memory: host (ordinary process memory), host_shareable (memory::host::allocate_shareable: "
                 "other ranks on the host map it, so shm all-reduces, reduce-scatters and all-gathers read it in place) or emulated_device")
      ->capture_default_str()->check(CLI::IsMember({"host", "host_shareable", "emulated_device"}));
  app.add_option("--json", opt.json, "also write the rows to this JSON file (rank 0)");
  app.add_option("--csv", opt.csv, "also write the rows to this CSV file (rank 0)");
  CLI11_PARSE(app, argc, argv);

  std::vector<std::size_t> sizes;
  try {
    sizes = pdcoll::bench::size_sweep(pdcoll::bench::parse_bytes(opt.min_bytes),
                                      pdcoll::bench::parse_bytes(opt.max_bytes), opt.factor);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pdcoll-bench: %s\n", e.what());
    return 2;
  }
  if (sizes.empty()) {
    std::fprintf(stderr, "pdcoll-bench: -b %s is larger than -e %s\n", opt.min_bytes.c_str(), opt.max_bytes.c_str());
    return 2;
  }
  const auto& valid = algorithms().at(opt.collective);
  if (std::find(valid.begin(), valid.end(), opt.algo) == valid.end()) {
    if (opt.algo != "automatic") {
      std::fprintf(stderr, "pdcoll-bench: --algo %s does not apply to %s\n", opt.algo.c_str(), opt.collective.c_str());
      return 2;
    }
    opt.algo = valid.front();
  }
  bool op_ok = true;
  with_type(opt.type, [&](auto t) {
    with_op(opt.op, [&](auto op) { op_ok = pdcoll::is_supported_v<decltype(t), decltype(op)>; });
  });
  if (reduces(opt.collective) && !op_ok) {
    std::fprintf(stderr, "pdcoll-bench: -o %s is not defined for -d %s\n", opt.op.c_str(), opt.type.c_str());
    return 2;
  }

  // Before joining: the transport and the all-reduce algorithm come from the environment.
  if (opt.transport == "shm" || opt.transport == "tcp") {
    ::setenv("PDCOLL_TRANSPORT", "libfabric", 1);
    ::setenv("PDCOLL_PROVIDER", opt.transport.c_str(), 1);
  } else if (opt.transport == "uring" || opt.transport == "uring-directional") {
    ::setenv("PDCOLL_TRANSPORT", "uring", 1);
    ::setenv("PDCOLL_URING_DIRECTIONAL", opt.transport == "uring" ? "0" : "1", 1);
  }
  if (opt.collective == "all_reduce") {
    if (opt.algo == "automatic") {
      if (const char* forced = std::getenv("PDCOLL_ALGO"); forced && *forced) opt.algo = forced;
    } else {
      ::setenv("PDCOLL_ALGO", opt.algo.c_str(), 1);
    }
  }

  try {
    pdcoll::job job = pdcoll::job::from_environment();
    auto& comm = job.comm();
    if (rooted(opt.collective) && (opt.root < 0 || opt.root >= comm.world_size())) {
      if (comm.rank() == 0) std::fprintf(stderr, "pdcoll-bench: -r %d is not a rank of %d\n", opt.root, comm.world_size());
      return 2;
    }
    std::unique_ptr<pdcoll::bench::report> report;
    if (comm.rank() == 0) {
      pdcoll::bench::run_description run{"pdcoll", comm.transport_name(), opt.algo, opt.collective, opt.domain,
                                         comm.world_size(), opt.timing};
      report = std::make_unique<pdcoll::bench::report>(run, opt.csv, opt.json);
      char host[256] = {};
      ::gethostname(host, sizeof host - 1);
      std::printf("# pdcoll-bench %s  ranks %d  transport %s  algorithm %s  domain %s  host %s\n",
                  opt.collective.c_str(), comm.world_size(), comm.transport_name().c_str(), opt.algo.c_str(),
                  opt.domain.c_str(), host);
      std::printf("# minBytes %zu maxBytes %zu step: %g(factor) warmup iters: %d iters: %d validation: %d "
                  "time: %s of iters, rank 0\n",
                  sizes.front(), sizes.back(), opt.factor, opt.warmup, opt.iters, opt.check, opt.timing.c_str());
      report->print_header();
    }
    long long wrong = 0;
    with_type(opt.type, [&](auto t) {
      using T = decltype(t);
      if (opt.domain == "emulated_device") {
        // One arena for the run: the largest size's input and output and
        // the collectives' device scratch (a direct all-reduce takes a
        // block per rank), twice over for the sweep's fragmentation. The
        // memfd's pages come only when touched and go back when freed.
        const std::size_t arena =
            2 * (2 + static_cast<std::size_t>(comm.world_size())) * sizes.back() + (std::size_t{4} << 20);
        memory::emulated_device device(arena);
        auto tracking = pdcoll::track_frees(device, comm);  // its registrations cached, as a runtime would
        wrong = sweep<T, memory::emulated_device>(comm, opt, &device, sizes, report.get());
      } else {
        const host_choice choice{opt.domain == "host_shareable"};
        wrong = sweep<T, memory::host>(comm, opt, &choice, sizes, report.get());
      }
    });
    return wrong ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pdcoll-bench: %s\n", e.what());
    return 1;
  }
}
