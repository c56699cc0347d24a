// File: algorithm/node_direct.hpp — reduce-scatter and all-gather straight
// between the callers' buffers, for ranks on one host whose buffers are
// node-shareable (memory::host::allocate_shareable); the ring otherwise.
//
// From node_direct_bytes of the whole buffer up, where the transport offers
// node memory, each collective first asks in one node-memory step whether
// every rank's input is shareable and mapped by every rank
// (detail/node_direct.hpp). If so:
//   - reduce-scatter: rank r combines block r of every rank's input in rank
//     order straight into its output;
//   - all-gather: rank r copies every peer's input into its block of the
//     output;
// and completes once every rank has finished reading its input. Outputs
// may be ordinary memory: peers read only inputs.
//
// Cost (P ranks, block of b bytes): a reduce-scatter reads P·b and writes
// b per rank, where the ring sends and receives (P-1)·b through the
// transport (over libfabric shm a copy through the kernel per byte, at
// best) and reads its input once more to combine; an all-gather copies
// (P-1)·b with memcpy where the ring moves the same bytes through the
// transport. Asking costs two handshakes with shareable buffers and a few
// stores with ordinary ones (that rank knows the answer and does not wait
// for the others). Large all-gather outputs are written with non-temporal
// stores.
// Otherwise (ordinary buffers, a staged device buffer) the collective goes
// through node memory (algorithm/shared_memory.hpp), in steps reserved with
// the question, except on 2 ranks where the node's copy probe found one
// kernel copy faster than two through the slots
// (node_memory::bulk_through_slots): there the ring runs. Without node
// memory, or below node_direct_bytes, the ring runs.
#pragma once

#include <pdcoll/algorithm/detail/node_direct.hpp>
#include <pdcoll/algorithm/ring.hpp>
#include <pdcoll/algorithm/shared_memory.hpp>
#include <pdcoll/detail/collective_operation.hpp>
#include <pdcoll/detail/node_layout.hpp>
#include <pdcoll/detail/stream_copy.hpp>

#include <cstring>

namespace pdcoll::algo {

/// Direct all-gathers whose output has at least this many bytes copy the
/// peers' blocks with non-temporal stores (detail/stream_copy.hpp): the
/// output is not in cache, and ordinary stores would first read each line.
/// Measured on the reference machine (pdcoll-bench --domain host_shareable
/// over shm, 2 ranks, two interleaved runs each): 64 MiB in place 9.9-10.1
/// -> 12.3-12.5 GB/s bus bandwidth, out of place 3.3-3.6 -> 4.1-4.2; 16 MiB
/// in place 13.6-13.8 -> 12.5-13.1, which is why the threshold is above it;
/// 4 MiB unchanged.
inline constexpr std::size_t node_direct_gather_stream_bytes = std::size_t{32} << 20;

/// Reduce-scatter and all-gather directly on node-shareable buffers (see the
/// file comment); the ring otherwise.
struct node_direct {
  /// Name for diagnostics.
  static constexpr const char* name = "node_direct";

  /// Reduce-scatter: ctx.input holds P blocks of ctx.count elements; rank r
  /// ends with every rank's block r combined in rank order in ctx.output.
  static pdcoll::detail::collective_task reduce_scatter(pdcoll::detail::collective_context& ctx) {
    auto* node = ctx.node_memory();
    if (!worth_asking(ctx, node)) return ring::reduce_scatter(ctx);
    const std::size_t block = ctx.bytes(ctx.count);
    const std::uint64_t slot_steps = slots_instead_of_ring(ctx, *node) ? shared_memory::blockwise_steps(ctx, *node) : 0;
    return direct(ctx, *node, block * static_cast<std::size_t>(ctx.world_size), block, slot_steps,
                  &shared_memory::reduce_scatter_in, &ring::reduce_scatter,
                  [](pdcoll::detail::collective_context& c, const detail::node_direct_buffers& buffers) {
                    // In place the output is block r of this rank's input, which no peer reads.
                    const std::size_t bytes = c.bytes(c.count);
                    detail::node_direct_reduce_block(c, c.output.address, static_cast<std::size_t>(c.rank) * bytes,
                                                     bytes, [&](int q) { return buffers.input(q); });
                  });
  }

  /// All-gather: ctx.input (ctx.count elements) of every rank concatenated
  /// in rank order into ctx.output.
  static pdcoll::detail::collective_task all_gather(pdcoll::detail::collective_context& ctx) {
    auto* node = ctx.node_memory();
    if (!worth_asking(ctx, node)) return ring::all_gather(ctx);
    const std::size_t block = ctx.bytes(ctx.count);
    const std::uint64_t slot_steps = slots_instead_of_ring(ctx, *node) ? shared_memory::all_gather_steps(ctx, *node) : 0;
    return direct(ctx, *node, block, block * static_cast<std::size_t>(ctx.world_size), slot_steps,
                  &shared_memory::all_gather_in, &ring::all_gather,
                  [](pdcoll::detail::collective_context& c, const detail::node_direct_buffers& buffers) {
                    const int r = c.rank, P = c.world_size;
                    const std::size_t bytes = c.bytes(c.count);
                    // In place the input is block r of the output: the copy is skipped.
                    c.copy(c.output, static_cast<std::size_t>(r) * bytes, c.input, 0, bytes);
                    const bool stream = bytes * static_cast<std::size_t>(P) >= node_direct_gather_stream_bytes;
                    for (int q = 0; q < P; ++q) {
                      if (q == r) continue;
                      std::byte* const to = c.output.address + static_cast<std::size_t>(q) * bytes;
                      if (stream) pdcoll::detail::stream_copy(to, buffers.input(q), bytes);
                      else std::memcpy(to, buffers.input(q), bytes);
                    }
                  });
  }

 private:
  /// Node memory, more than one rank, and a whole buffer of node_direct_bytes.
  static bool worth_asking(const pdcoll::detail::collective_context& ctx, const transport::node_memory* node) noexcept {
    const auto P = static_cast<std::size_t>(ctx.world_size);
    const std::size_t block = ctx.bytes(ctx.count);
    return node && P > 1 && block != 0 && block >= (node_direct_bytes + P - 1) / P;
  }

  /// Where some rank's input is not shareable: through node memory
  /// (shared_memory) on more than 2 ranks, and on 2 where the node's copies
  /// favour the slots; else the ring. The ring's P-1 message steps cost more
  /// than the slots' extra copy once there are several; on 2 it is one
  /// exchange, one copy through the kernel (CMA), which led on the reference
  /// machine and trails on others (node_memory::bulk_through_slots).
  /// Measured on the reference machine (pdcoll-bench over shm, 4 ranks on 2
  /// cores, --algo ring vs shared_memory, in place, busbw GB/s): all-gather
  /// 256 KiB 2.8 -> 5.8-6.4, 1 MiB 3.1-3.2 -> 3.9-4.5, 16 MiB 3.1-3.8 ->
  /// 4.0-4.5, 64 MiB 1.9-2.0 -> 2.7-2.8; reduce-scatter 4 MiB 2.4-2.6 ->
  /// 3.3-3.4, 16 MiB 1.9 -> 2.6-3.1, 64 MiB 1.3 -> 2.2-2.3. On 2 ranks the
  /// ring led from 64 KiB (all-gather 1 MiB 20-21 against 8.1-8.3).
  static bool slots_instead_of_ring(const pdcoll::detail::collective_context& ctx,
                                    const transport::node_memory& node) noexcept {
    return ctx.world_size > 2 || node.bulk_through_slots();
  }

  /// One node-memory step (plus `slot_steps` reserved for a fallback
  /// through the slots): asks (detail/node_direct.hpp), then runs
  /// `body(ctx, buffers)` on the mapped inputs and releases them; when some
  /// rank's input is not shareable or not mapped, runs `slots` in the
  /// reserved steps, or `ring` when none were reserved. Not inlined, for
  /// the reason detail::node_direct_handshake gives.
  template <class Body>
  [[gnu::noinline]] static pdcoll::detail::collective_task direct(
      pdcoll::detail::collective_context& ctx, transport::node_memory& node, std::size_t input_bytes,
      std::size_t output_bytes, std::uint64_t slot_steps,
      pdcoll::detail::collective_task (*slots)(pdcoll::detail::collective_context&, transport::node_memory&,
                                               std::uint64_t),
      pdcoll::detail::collective_task (*ring_fallback)(pdcoll::detail::collective_context&), Body body) {
    // Before the first suspension (see algorithm/shared_memory.hpp).
    const pdcoll::detail::node_step s{&node, ctx.world_size, ctx.reserve_node_steps(1 + slot_steps)};
    detail::node_direct_buffers buffers(ctx.world_size, ctx.input.address, input_bytes, ctx.output.address,
                                        output_bytes, /*peers_read_output=*/false);
    bool agreed = false;
    if (auto ec = co_await detail::node_direct_handshake::ask(ctx, s, buffers, agreed)) co_return ec;
    if (!agreed) {
      // No peer reads this rank's buffers.
      buffers.finish();
      s.raise(ctx.rank, &pdcoll::detail::node_flags::consumed);
      if (slot_steps != 0) co_return co_await slots(ctx, node, s.step + 1);
      co_return co_await ring_fallback(ctx);
    }
    body(ctx, buffers);
    if (auto ec = co_await detail::node_direct_handshake::release(ctx, s, buffers)) co_return ec;
    co_return co_await detail::node_direct_handshake::skip(ctx, s, slot_steps);
  }
};

}  // namespace pdcoll::algo
