// File: bench/progress_bench.cpp — micro-benchmarks of one trip through the
// progress engine, without a network: an 8-byte send/recv ping-pong and a
// 1-element all_reduce between two threads over the inproc transport, and
// the cost of exec::sync_wait itself on senders that complete inline.
// Build optimised (cmake -DCMAKE_BUILD_TYPE=Release) and run directly:
//
//     build-bench/bench/progress_bench --benchmark_min_time=0.2
//
// A round trip is what a latency-bound collective pays per step; compare it
// with pdcoll-bench's 8-byte row to see what the transport adds.
#include <pdcoll/pdcoll.hpp>

#include <benchmark/benchmark.h>

#include <array>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace {

namespace exec = pdcoll::exec;

/// Two communicators joined by one inproc fabric; rank 1 runs `partner` on a
/// thread of its own for as long as the pair lives.
class two_ranks {
 public:
  template <class Partner>
  explicit two_ranks(Partner partner) {
    auto fabric = pdcoll::transport::inproc::fabric::create(2);
    rank0_ = std::make_unique<pdcoll::communicator>(fabric->endpoint_for(0));
    rank1_ = std::make_unique<pdcoll::communicator>(fabric->endpoint_for(1));
    thread_ = std::thread([this, partner] { partner(*rank1_); });
  }
  two_ranks(const two_ranks&) = delete;
  two_ranks& operator=(const two_ranks&) = delete;
  ~two_ranks() {
    if (thread_.joinable()) thread_.join();
  }

  /// The communicator the benchmark thread drives.
  pdcoll::communicator& rank0() { return *rank0_; }
  /// Waits for the partner to finish (it must have been told to stop).
  void join() { thread_.join(); }

 private:
  std::unique_ptr<pdcoll::communicator> rank0_, rank1_;
  std::thread thread_;
};

constexpr std::uint64_t stop_word = ~std::uint64_t{0};

/// Rank 0 sends 8 bytes to rank 1, which sends them back: one iteration.
void ping_pong_8_bytes(benchmark::State& state) {
  two_ranks pair([](pdcoll::communicator& comm) {
    std::array<std::uint64_t, 1> word{};
    for (;;) {
      exec::sync_wait(pdcoll::recv(comm, 0, word));
      if (word[0] == stop_word) return;
      exec::sync_wait(pdcoll::send(comm, 0, word));
    }
  });
  auto& comm = pair.rank0();
  std::array<std::uint64_t, 1> word{1};
  for (auto _ : state) {
    exec::sync_wait(pdcoll::send(comm, 1, word));
    exec::sync_wait(pdcoll::recv(comm, 1, word));
    benchmark::DoNotOptimize(word);
  }
  word[0] = stop_word;
  exec::sync_wait(pdcoll::send(comm, 1, word));
  pair.join();
  state.SetLabel("round trip over inproc");
}
BENCHMARK(ping_pong_8_bytes)->UseRealTime();

/// A 1-element float all_reduce on two ranks; rank 0 contributes -1 to stop
/// the partner after the last iteration (both see the same sum).
template <class Algo>
void all_reduce_1_element(benchmark::State& state) {
  two_ranks pair([](pdcoll::communicator& comm) {
    std::array<float, 1> x{};
    do {
      x[0] = 0;
      exec::sync_wait(pdcoll::all_reduce<Algo>(comm, x, pdcoll::op::sum));
    } while (x[0] >= 0);
  });
  auto& comm = pair.rank0();
  std::array<float, 1> x{};
  for (auto _ : state) {
    x[0] = 1;
    exec::sync_wait(pdcoll::all_reduce<Algo>(comm, x, pdcoll::op::sum));
    benchmark::DoNotOptimize(x);
  }
  x[0] = -1;
  exec::sync_wait(pdcoll::all_reduce<Algo>(comm, x, pdcoll::op::sum));
  pair.join();
  state.SetLabel(Algo::name);
}
BENCHMARK(all_reduce_1_element<pdcoll::algo::automatic>)->UseRealTime();
BENCHMARK(all_reduce_1_element<pdcoll::algo::recursive_doubling>)->UseRealTime();
BENCHMARK(all_reduce_1_element<pdcoll::algo::ring>)->UseRealTime();

/// sync_wait on a sender that completes inline: the fixed cost of waiting.
void sync_wait_just(benchmark::State& state) {
  for (auto _ : state) {
    auto result = exec::sync_wait(exec::just(42));
    benchmark::DoNotOptimize(result);
  }
}
BENCHMARK(sync_wait_just);

/// sync_wait on just | then: one adaptor more.
void sync_wait_just_then(benchmark::State& state) {
  for (auto _ : state) {
    auto result = exec::sync_wait(exec::just(41) | exec::then([](int v) { return v + 1; }));
    benchmark::DoNotOptimize(result);
  }
}
BENCHMARK(sync_wait_just_then);

/// A 1-element all_reduce on a 1-rank communicator: the collective
/// machinery (validation, op state, progress loop) with no peer to wait for.
void all_reduce_1_element_1_rank(benchmark::State& state) {
  auto fabric = pdcoll::transport::inproc::fabric::create(1);
  pdcoll::communicator comm(fabric->endpoint_for(0));
  std::array<float, 1> x{1};
  for (auto _ : state) {
    exec::sync_wait(pdcoll::all_reduce(comm, x, pdcoll::op::sum));
    benchmark::DoNotOptimize(x);
  }
}
BENCHMARK(all_reduce_1_element_1_rank);

}  // namespace

BENCHMARK_MAIN();
