// File: algorithm/automatic.hpp — the default all-reduce choice.
//
// `automatic` is a by_size composition whose thresholds come from the cost
// model (model/cost_model.hpp) with the parameters fitted on the reference
// machine (libfabric shm, 2 and 4 ranks, bench/allreduce_sweep):
// alpha 12 us, beta 0.11 ns/B, gamma 0.08 ns/B. The model's crossovers on 4
// ranks: recursive doubling → Rabenseifner at 256 KiB (measured: between
// 256 KiB and 2 MiB), Rabenseifner → ring at 1 MiB (the ring's extra
// alphas are paid back once its reduction hides behind the wire). Larger
// worlds move the ring's crossover up (model::crossover predicts it: ~16 MiB
// at 64 ranks); the tests in tests/unit/model_*.cpp keep these constants and
// the model in step. On 2 ranks recursive doubling is one exchange of the
// whole buffer and Rabenseifner two of half of it: over io_uring TCP
// recursive doubling measured 20-28 % ahead at 256-512 KiB (3.2-3.4 against
// 2.5-2.7 GB/s at 256 KiB, 3 runs), over libfabric tcp the runs did not
// separate from the noise, so the thresholds do not depend on the world
// size yet.
// Where the transport offers node memory (ranks on one host over libfabric
// shm) the shared-memory algorithms replace that composition (see
// automatic_scatter_threshold).
//
// PDCOLL_ALGO=<name> forces one of the algorithms compiled in (ring,
// recursive_doubling, rabenseifner, tree, direct, shared_memory,
// shared_memory_scatter) for experiments; every rank
// must set the same value. Any other value completes every automatic
// all-reduce with errc::invalid_argument (nothing is sent).
#pragma once

#include <pdcoll/algorithm/by_size.hpp>
#include <pdcoll/algorithm/direct.hpp>
#include <pdcoll/algorithm/node_direct.hpp>
#include <pdcoll/algorithm/rabenseifner.hpp>
#include <pdcoll/algorithm/recursive_doubling.hpp>
#include <pdcoll/algorithm/ring.hpp>
#include <pdcoll/algorithm/shared_memory.hpp>
#include <pdcoll/algorithm/tree.hpp>
#include <pdcoll/error.hpp>
#include <pdcoll/model/cost_model.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace pdcoll::algo {

/// Threshold (bytes) below which automatic uses recursive doubling.
inline constexpr std::size_t automatic_latency_threshold = std::size_t{256} << 10;
/// Threshold (bytes) from which automatic uses the ring.
inline constexpr std::size_t automatic_bandwidth_threshold = std::size_t{1} << 20;

/// Where the transport has node memory (ranks on one host over libfabric
/// shm), automatic uses shared_memory below this many bytes and
/// shared_memory_scatter from it up. Measured on the reference machine
/// (pdcoll-bench, float sum, in place, PDCOLL_ALGO forcing each): the two
/// tie up to 16 KiB on 2 and 4 ranks (scatter's second handshake costs what
/// its smaller reduction saves); from 64 KiB scatter is ahead, 1.7× at
/// 1–4 MiB on 2 ranks (14 against 8 GB/s bus bandwidth) and 1.2× from
/// 16 MiB; on 4 ranks (on 2 cores) 2–3× at 256 KiB–4 MiB against the
/// message algorithms and even with the ring from 16 MiB.
inline constexpr std::size_t automatic_scatter_threshold = std::size_t{32} << 10;

// The thresholds above come from the cost model: it must assume the chunks
// the algorithms use.
static_assert(model::ring_chunk_bytes == static_cast<double>(ring::chunk_bytes));
static_assert(model::pipeline_chunk_bytes == static_cast<double>(tree::chunk_bytes));

/// Small messages by recursive doubling (latency: log2 P steps), mid sizes
/// by Rabenseifner (ring bandwidth in log-many steps), large by the ring.
using automatic_by_size = by_size<recursive_doubling, automatic_latency_threshold, rabenseifner,
                                  automatic_bandwidth_threshold, ring>;

/// The default all-reduce algorithm (see the file comment).
struct automatic {
  /// Name for diagnostics.
  static constexpr const char* name = "automatic";

  /// What PDCOLL_ALGO asks for.
  struct forced_choice {
    pdcoll::detail::algorithm_fn algorithm = nullptr;  ///< nullptr: choose by size
    bool invalid = false;                              ///< PDCOLL_ALGO names no known algorithm
  };

  /// Parses a PDCOLL_ALGO value (nullptr or empty: unset).
  static forced_choice parse(const char* v) noexcept {
    if (!v || !*v) return {};
    if (!std::strcmp(v, ring::name)) return {&ring::all_reduce};
    if (!std::strcmp(v, recursive_doubling::name)) return {&recursive_doubling::all_reduce};
    if (!std::strcmp(v, rabenseifner::name)) return {&rabenseifner::all_reduce};
    if (!std::strcmp(v, tree::name)) return {&tree::all_reduce};
    if (!std::strcmp(v, direct::name)) return {&direct::all_reduce};
    if (!std::strcmp(v, shared_memory::name)) return {&shared_memory::all_reduce};
    if (!std::strcmp(v, shared_memory_scatter::name)) return {&shared_memory_scatter::all_reduce};
    return {nullptr, true};
  }

  /// PDCOLL_ALGO, read once per process.
  static forced_choice forced() noexcept {
    static const forced_choice choice = parse(std::getenv("PDCOLL_ALGO"));
    return choice;
  }

  /// Sizes that take the one-step node-memory path
  /// (collective_spec::node_small_bytes): those for which it would run
  /// shared_memory, unless PDCOLL_ALGO forces another algorithm.
  static std::size_t node_small_bytes() noexcept {
    static const std::size_t bytes = [] {
      const auto f = forced();
      if (f.invalid || (f.algorithm && f.algorithm != &shared_memory::all_reduce)) return std::size_t{0};
      return std::min(node_small_all_reduce_bytes, automatic_scatter_threshold - 1);
    }();
    return bytes;
  }

  /// Runs the forced algorithm, or the one for ctx's size; completes with
  /// errc::invalid_argument when PDCOLL_ALGO names no algorithm.
  static pdcoll::detail::collective_task all_reduce(pdcoll::detail::collective_context& ctx) {
    const auto f = forced();
    if (f.invalid) return rejected();
    if (f.algorithm) return f.algorithm(ctx);
    if (ctx.node_memory()) {
      return ctx.bytes(ctx.count) < automatic_scatter_threshold ? shared_memory::all_reduce(ctx)
                                                                 : shared_memory_scatter::all_reduce(ctx);
    }
    return automatic_by_size::all_reduce(ctx);
  }

  /// The default reduce-scatter. Ranks on one host: through node memory
  /// (shared_memory) below automatic_node_slots_bytes(P) of whole buffer,
  /// node_direct from node_direct_bytes (straight between shareable
  /// buffers, else through node memory on more than 2 ranks and by the
  /// ring on 2), the ring between; the ring otherwise.
  static pdcoll::detail::collective_task reduce_scatter(pdcoll::detail::collective_context& ctx) {
    if (ctx.node_memory() && whole_bytes(ctx) < automatic_node_slots_bytes(ctx.world_size))
      return shared_memory::reduce_scatter(ctx);
    return node_direct::reduce_scatter(ctx);
  }

  /// The default all-gather, chosen as the reduce-scatter.
  static pdcoll::detail::collective_task all_gather(pdcoll::detail::collective_context& ctx) {
    if (ctx.node_memory() && whole_bytes(ctx) < automatic_node_slots_bytes(ctx.world_size))
      return shared_memory::all_gather(ctx);
    return node_direct::all_gather(ctx);
  }

  /// Reduce-scatters and all-gathers of ranks on one host whose whole buffer
  /// is smaller than this go through node memory (shared_memory): one
  /// handshake per slot-sized step instead of the ring's P-1 message steps.
  /// On 2 ranks the ring is one exchange, one copy through the kernel (CMA)
  /// against two through the slots, so it wins from 64 KiB; on more ranks
  /// the slots win up to node_direct_bytes. Measured on the reference
  /// machine (pdcoll-bench over shm, --algo ring vs shared_memory, float,
  /// in place, two interleaved runs, busbw GB/s): 2 ranks all-gather 4 KiB
  /// 1.0 -> 1.4-1.6, 16 KiB 1.8-2.1 -> 3.6, 64 KiB 6.1-6.5 -> 5.5-5.6;
  /// reduce-scatter 16 KiB 1.7 -> 3.4-3.6, 64 KiB 5.1-5.3 -> 4.8-5.0; 4 ranks
  /// (on 2 cores) all-gather 64 KiB 1.2-1.3 -> 3.8-4.0, 256 KiB 2.8 -> 5.8-6.4,
  /// reduce-scatter 64 KiB 1.0-1.2 -> 2.2-3.8.
  static constexpr std::size_t automatic_node_slots_bytes(int world_size) noexcept {
    return world_size == 2 ? std::size_t{64} << 10 : node_direct_bytes;
  }

 private:
  static pdcoll::detail::collective_task rejected() { co_return make_error_code(errc::invalid_argument); }
  /// A reduce-scatter's input or an all-gather's output: P blocks of ctx.count.
  static std::size_t whole_bytes(const pdcoll::detail::collective_context& ctx) noexcept {
    return ctx.bytes(ctx.count) * static_cast<std::size_t>(ctx.world_size);
  }
};

}  // namespace pdcoll::algo
