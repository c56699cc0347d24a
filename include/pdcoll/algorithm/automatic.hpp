// File: algorithm/automatic.hpp — the default algorithm of every collective
// but the barrier: for the all-reduce the choice below; for the others, each
// member's comment says what it runs.
//
// For the all-reduce without node memory (TCP, io_uring, efa, verbs),
// `automatic` is a by_size composition per world size whose thresholds are
// the crossovers of the cost model (model/cost_model.hpp) with the
// parameters of the reference machine over TCP loopback (reference_tcp:
// alpha 40 us, beta 0.45 ns/B, gamma 0.07 ns/B), checked at compile time
// below. On 2 ranks: recursive doubling (one exchange of the whole buffer)
// below 2 MiB, Rabenseifner (two of half of it) below 4 MiB, the ring
// (pipelined in 1 MiB chunks) from there. On more ranks: recursive doubling
// below 256 KiB, Rabenseifner below 4 MiB, the ring. Measured on the
// reference machine (pdcoll-bench --algo, float sum, in place, busbw GB/s,
// medians of 5-8 interleaved rounds; design-notes item 29): 4 ranks over
// io_uring 128 KiB recursive doubling 0.93 / Rabenseifner 0.97, 1 MiB
// Rabenseifner 2.21 / ring 1.77, 2 MiB 2.03 / 2.02, 4 MiB 1.54 / 1.69,
// 8 MiB 1.27 / 1.48; over libfabric tcp 2 MiB 1.21 / 0.72, 4 MiB 1.03 /
// 1.11; 2 ranks over io_uring 1 MiB recursive doubling 5.80 / Rabenseifner
// 5.08, 2 MiB 5.41 / 6.94. Larger worlds keep the 4-rank thresholds; the
// model predicts the ring's crossover moving up with the world size
// (model::crossover: 8 MiB at 8 ranks, 128 MiB at 64), which no machine
// here can check.
// Where the transport offers node memory (ranks on one host over libfabric
// shm) the shared-memory algorithms replace that composition (see
// automatic_scatter_threshold).
//
// For the other collectives on node memory, whether large blocks go through
// the slots (two copies in user space) or as messages (one kernel copy) is
// the machine's: the shm transport times both at setup and every rank
// reads the same verdict (node_memory::bulk_through_slots,
// transport/libfabric/copy_probe.hpp). Where it favours the slots, every
// size goes through them; else the thresholds below, measured where the
// kernel copy led. Session 45's AMD EPYC VM (the probe: 17 µs per 256 KiB by
// the kernel, 4 by two memcpy) against the thresholds' message paths,
// bench/compare_collectives.sh --algos "automatic shared_memory" --rounds 5
// -n 200, medians of busbw GB/s: 2 ranks broadcast 256 KiB 14.4 -> 59.5,
// all-gather 1 MiB 13.8 -> 28.5, reduce-scatter 64 MiB 3.8 -> 9.9,
// all-to-all 1 MiB 11.2 -> 17.3; 4 ranks all-to-all 1 MiB 4.0 -> 8.5
// (design-notes item 48).
//
// PDCOLL_ALGO=<name> forces one of the all-reduce algorithms compiled in
// (ring, recursive_doubling, rabenseifner, tree, direct, two_shot,
// shared_memory, shared_memory_scatter) for experiments;
// PDCOLL_ALGO=automatic is the same as leaving it unset. The other
// collectives do not read it (name their algorithm as the template
// argument instead). Every rank
// must set the same value. Any other value completes every automatic
// all-reduce with errc::invalid_argument before it starts (nothing is sent,
// and the communicator stays usable for other collectives).
#pragma once

#include <pdcoll/algorithm/by_size.hpp>
#include <pdcoll/algorithm/chain.hpp>
#include <pdcoll/algorithm/direct.hpp>
#include <pdcoll/algorithm/node_direct.hpp>
#include <pdcoll/algorithm/rabenseifner.hpp>
#include <pdcoll/algorithm/recursive_doubling.hpp>
#include <pdcoll/algorithm/ring.hpp>
#include <pdcoll/algorithm/shared_memory.hpp>
#include <pdcoll/algorithm/tree.hpp>
#include <pdcoll/algorithm/two_shot.hpp>
#include <pdcoll/error.hpp>
#include <pdcoll/model/cost_model.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace pdcoll::algo {

/// Threshold (bytes) below which automatic uses recursive doubling on more
/// than 2 ranks without node memory.
inline constexpr std::size_t automatic_latency_threshold = std::size_t{256} << 10;
/// Threshold (bytes) from which automatic uses the ring on more than 2 ranks
/// without node memory.
inline constexpr std::size_t automatic_bandwidth_threshold = std::size_t{4} << 20;
/// automatic_latency_threshold on 2 ranks.
inline constexpr std::size_t automatic_pair_latency_threshold = std::size_t{2} << 20;
/// automatic_bandwidth_threshold on 2 ranks.
inline constexpr std::size_t automatic_pair_bandwidth_threshold = std::size_t{4} << 20;

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

// The thresholds above are the cost model's crossovers over TCP loopback:
// the model must assume the chunks the algorithms use.
static_assert(model::ring_chunk_bytes == static_cast<double>(ring::chunk_bytes));
static_assert(model::pipeline_chunk_bytes == static_cast<double>(tree::chunk_bytes));
static_assert(model::crossover(model::algorithm::recursive_doubling, model::algorithm::rabenseifner, 4,
                               model::reference_tcp) == automatic_latency_threshold);
static_assert(model::crossover(model::algorithm::rabenseifner, model::algorithm::ring, 4, model::reference_tcp) ==
              automatic_bandwidth_threshold);
static_assert(model::crossover(model::algorithm::recursive_doubling, model::algorithm::rabenseifner, 2,
                               model::reference_tcp) == automatic_pair_latency_threshold);
static_assert(model::crossover(model::algorithm::rabenseifner, model::algorithm::ring, 2, model::reference_tcp) ==
              automatic_pair_bandwidth_threshold);

/// Small messages by recursive doubling (latency: log2 P steps), mid sizes
/// by Rabenseifner (ring bandwidth in log-many steps), large by the ring:
/// automatic's choice on more than 2 ranks without node memory.
using automatic_by_size = by_size<recursive_doubling, automatic_latency_threshold, rabenseifner,
                                  automatic_bandwidth_threshold, ring>;

/// automatic's choice on 2 ranks without node memory: recursive doubling is
/// one exchange of the whole buffer, Rabenseifner two of half of it, so the
/// first stays ahead to larger sizes than on more ranks.
using automatic_pair_by_size = by_size<recursive_doubling, automatic_pair_latency_threshold, rabenseifner,
                                       automatic_pair_bandwidth_threshold, ring>;

/// The default all-reduce algorithm (see the file comment).
struct automatic {
  /// Name for diagnostics.
  static constexpr const char* name = "automatic";

  /// What PDCOLL_ALGO asks for.
  struct forced_choice {
    pdcoll::detail::algorithm_fn algorithm = nullptr;  ///< nullptr: choose by size
    bool invalid = false;                              ///< PDCOLL_ALGO names no known algorithm
  };

  /// Parses a PDCOLL_ALGO value (nullptr, empty or "automatic": unset).
  static forced_choice parse(const char* v) noexcept {
    if (!v || !*v || !std::strcmp(v, name)) return {};
    if (!std::strcmp(v, ring::name)) return {&ring::all_reduce};
    if (!std::strcmp(v, recursive_doubling::name)) return {&recursive_doubling::all_reduce};
    if (!std::strcmp(v, rabenseifner::name)) return {&rabenseifner::all_reduce};
    if (!std::strcmp(v, tree::name)) return {&tree::all_reduce};
    if (!std::strcmp(v, direct::name)) return {&direct::all_reduce};
    if (!std::strcmp(v, two_shot::name)) return {&two_shot::all_reduce};
    if (!std::strcmp(v, shared_memory::name)) return {&shared_memory::all_reduce};
    if (!std::strcmp(v, shared_memory_scatter::name)) return {&shared_memory_scatter::all_reduce};
    return {nullptr, true};
  }

  /// PDCOLL_ALGO, read once per process.
  static forced_choice forced() noexcept {
    static const forced_choice choice = parse(std::getenv("PDCOLL_ALGO"));
    return choice;
  }

  /// True when PDCOLL_ALGO names no algorithm: all_reduce refuses the call
  /// before it starts, on every rank alike.
  static bool refuses() noexcept { return forced().invalid; }

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
    return ctx.world_size == 2 ? automatic_pair_by_size::all_reduce(ctx) : automatic_by_size::all_reduce(ctx);
  }

  /// The default reduce-scatter. Ranks on one host: through node memory
  /// (shared_memory) below node_slots_bytes (node_direct_bytes where the
  /// node's copies favour the slots, else automatic_node_slots_bytes(P)),
  /// node_direct from node_direct_bytes (straight between shareable
  /// buffers, else through node memory, or by the ring on 2 ranks where
  /// the kernel copy leads), the ring between; the ring otherwise.
  static pdcoll::detail::collective_task reduce_scatter(pdcoll::detail::collective_context& ctx) {
    if (auto* node = ctx.node_memory(); node && whole_bytes(ctx) < node_slots_bytes(*node, ctx.world_size))
      return shared_memory::reduce_scatter(ctx);
    return node_direct::reduce_scatter(ctx);
  }

  /// The default all-gather, chosen as the reduce-scatter.
  static pdcoll::detail::collective_task all_gather(pdcoll::detail::collective_context& ctx) {
    if (auto* node = ctx.node_memory(); node && whole_bytes(ctx) < node_slots_bytes(*node, ctx.world_size))
      return shared_memory::all_gather(ctx);
    return node_direct::all_gather(ctx);
  }

  /// The default broadcast. Ranks on one host: through node memory
  /// (shared_memory; the root's copy into its slot and the others' out of
  /// it overlap from the second slot-sized step), except on 2 ranks from
  /// 64 KiB to below 512 KiB where the node's copy probe favours messages:
  /// there one message (one copy through the kernel, CMA) beat the slot's
  /// two copies in sequence. Measured on the
  /// reference machine (pdcoll-bench over shm, float, in place, busbw GB/s,
  /// tree against shared_memory): 2 ranks 4 KiB 1.9 -> 3.4-3.6, 16 KiB 4.1
  /// -> 7.3, 1 MiB 7.6-8.2 -> 14.2-14.9, 64 MiB 3.2-3.9 -> 5.9-7.4; 4 ranks
  /// (on 2 cores) 16 KiB 0.9-1.0 -> 2.3-2.6, 256 KiB 2.2-4.2 -> 6.1-6.5,
  /// 64 MiB 1.7 -> 2.6-2.9; 2 ranks, three runs, median µs: 64 KiB 5.6-5.8
  /// against 6.0-6.7, 128 KiB level, 256 KiB 13.4-14.7 against 16.1-25.4,
  /// 512 KiB 44.9-46.9 against 35.2-36.4. Smaller steps, for more
  /// overlap, measured slower up to 1 MiB. Without node memory the binomial
  /// tree below automatic_chain_bytes, the pipelined chain from it.
  static pdcoll::detail::collective_task broadcast(pdcoll::detail::collective_context& ctx) {
    const std::size_t bytes = ctx.bytes(ctx.count);
    if (auto* node = ctx.node_memory()) {
      const bool one_message = !node->bulk_through_slots() && ctx.world_size == 2 &&
                               bytes >= automatic_message_broadcast_from && bytes < automatic_message_broadcast_below;
      return one_message ? tree::broadcast(ctx) : shared_memory::broadcast(ctx);
    }
    if (ctx.world_size > 2 && bytes >= automatic_chain_bytes) return chain::broadcast(ctx);
    return tree::broadcast(ctx);
  }

  /// On 2 ranks with node memory, broadcasts of at least
  /// automatic_message_broadcast_from and fewer than
  /// automatic_message_broadcast_below bytes take one message (see broadcast).
  static constexpr std::size_t automatic_message_broadcast_from = std::size_t{64} << 10;
  /// See automatic_message_broadcast_from.
  static constexpr std::size_t automatic_message_broadcast_below = std::size_t{512} << 10;

  /// The default reduce: through node memory (shared_memory: the root
  /// combines every rank's chunk in rank order) where ranks share a host,
  /// the binomial tree otherwise. Measured as the broadcast: 2 ranks 16 KiB
  /// 2.1 -> 7.9, 1 MiB 4.5 -> 13.0, 64 MiB 1.1 -> 7.6; 4 ranks 16 KiB 0.6 ->
  /// 1.5, 1 MiB 1.6 -> 2.6, 64 MiB 0.6 -> 2.0.
  static pdcoll::detail::collective_task reduce(pdcoll::detail::collective_context& ctx) {
    if (ctx.node_memory()) return shared_memory::reduce(ctx);
    return tree::reduce(ctx);
  }

  /// The default all-to-all: where ranks share a host, through node memory
  /// (shared_memory); where the node's copy probe favours messages, only
  /// below automatic_node_slots_bytes(P) of whole buffer, as the
  /// reduce-scatter, and above it every block posted at once (direct): each
  /// message is then one copy through the kernel (CMA) against the slots'
  /// two, and no rank waits for a step. Pairwise exchange otherwise.
  /// Measured on the reference machine (pdcoll-bench over shm, float, -c 1,
  /// busbw GB/s, pairwise / direct / shared_memory): 2 ranks 16 KiB 1.7 /
  /// 1.8 / 3.1, 64 KiB 5.2 / 5.2 / 4.8, 256 KiB 10.8 / 9.6 / 6.5, 1 MiB 6.5
  /// / 6.7 / 4.5; 4 ranks (on 2 cores) 64 KiB 0.8 / 1.1 / 2.1, 256 KiB 2.9 /
  /// 3.0 / 2.3, 1 MiB 2.3 / 2.7 / 1.8, 4 MiB 2.4 / 2.8 / 2.1. Over TCP
  /// (4 ranks, io_uring and libfabric tcp) neither of pairwise and direct
  /// led at every size.
  static pdcoll::detail::collective_task all_to_all(pdcoll::detail::collective_context& ctx) {
    auto* node = ctx.node_memory();
    if (!node) return pairwise::all_to_all(ctx);
    if (node->bulk_through_slots() || whole_bytes(ctx) < automatic_node_slots_bytes(ctx.world_size))
      return shared_memory::all_to_all(ctx);
    return direct::all_to_all(ctx);
  }
  /// The default all_to_allv and all_gatherv. Where ranks share a host,
  /// shared_memory's one node step carries every block's length and every
  /// block that fits a slot's section, or, where the node's copy probe
  /// favours messages, every block smaller than the all-to-all's per-block
  /// node-memory threshold (automatic_node_slots_bytes(P) / P); larger
  /// blocks go as one message each, all posted at once (direct), as the
  /// all-to-all's do above it. Both ends of a pair see the block's size, so
  /// no rank needs another's counts to choose. Pairwise exchange otherwise.
  static pdcoll::detail::collective_task all_to_allv(pdcoll::detail::collective_context& ctx) {
    return v_form(ctx, false);
  }
  /// See all_to_allv.
  static pdcoll::detail::collective_task all_gatherv(pdcoll::detail::collective_context& ctx) {
    return v_form(ctx, true);
  }

  /// Broadcasts of at least this many bytes over more than 2 ranks without
  /// node memory take the pipelined chain: the tree's root sends the whole
  /// buffer log2 P times, the chain's every rank once (on 2 ranks both are
  /// one message). Measured on the reference machine (pdcoll-bench, 4 ranks
  /// on 2 cores, busbw GB/s, tree against chain): io_uring TCP 256 KiB 1.8
  /// -> 1.2, 1 MiB 1.6 -> 1.8, 4 MiB 1.4 -> 2.1, 64 MiB 0.7 -> 1.2;
  /// libfabric tcp 1 MiB 1.6 -> 1.4, 4 MiB 1.3 -> 1.2, 16 MiB 0.9 -> 1.1,
  /// 64 MiB 0.8 -> 1.0.
  static constexpr std::size_t automatic_chain_bytes = std::size_t{4} << 20;

  /// Where the node's copy probe favours messages, reduce-scatters and
  /// all-gathers of ranks on one host whose whole buffer is smaller than
  /// this go through node memory (shared_memory): one
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
  // all_to_allv, or all_gatherv (one_block).
  static pdcoll::detail::collective_task v_form(pdcoll::detail::collective_context& ctx, bool one_block) {
    auto* node = ctx.node_memory();
    if (!node) return one_block ? pairwise::all_gatherv(ctx) : pairwise::all_to_allv(ctx);
    if (ctx.world_size == 1 || !shared_memory::v_header_fits(ctx, *node))
      return one_block ? direct::all_gatherv(ctx) : direct::all_to_allv(ctx);
    const std::size_t section = shared_memory::v_section_bytes(ctx, *node, one_block);
    const std::size_t below = automatic_node_slots_bytes(ctx.world_size) / static_cast<std::size_t>(ctx.world_size);
    const std::size_t cap = node->bulk_through_slots() ? section : std::min(section, below ? below - 1 : 0);
    return shared_memory::v_through(ctx, *node, ctx.reserve_node_steps(1), cap, one_block);
  }
  static pdcoll::detail::collective_task rejected() { co_return make_error_code(errc::invalid_argument); }
  /// Below this many bytes of whole buffer a reduce-scatter or all-gather
  /// goes through the slots: automatic_node_slots_bytes(P), or
  /// node_direct_bytes on 2 ranks too where the node's copies favour the
  /// slots (from there node_direct asks about shareable buffers and falls
  /// back to the slots as well).
  static std::size_t node_slots_bytes(const transport::node_memory& node, int world_size) noexcept {
    return node.bulk_through_slots() ? node_direct_bytes : automatic_node_slots_bytes(world_size);
  }
  /// A reduce-scatter's input, an all-gather's output or an all-to-all's
  /// buffer: P blocks of ctx.count.
  static std::size_t whole_bytes(const pdcoll::detail::collective_context& ctx) noexcept {
    return ctx.bytes(ctx.count) * static_cast<std::size_t>(ctx.world_size);
  }
};

}  // namespace pdcoll::algo
