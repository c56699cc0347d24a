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
// transport. Asking costs one handshake, two with shareable buffers. Large
// all-gather outputs are written with non-temporal stores.
// Otherwise (ordinary buffers, no node memory, a staged device buffer, a
// smaller buffer) the ring runs.
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
    return reduce_scatter_direct(ctx, *node);
  }

  /// All-gather: ctx.input (ctx.count elements) of every rank concatenated
  /// in rank order into ctx.output.
  static pdcoll::detail::collective_task all_gather(pdcoll::detail::collective_context& ctx) {
    auto* node = ctx.node_memory();
    if (!worth_asking(ctx, node)) return ring::all_gather(ctx);
    return all_gather_direct(ctx, *node);
  }

 private:
  /// Node memory, more than one rank, and a whole buffer of node_direct_bytes.
  static bool worth_asking(const pdcoll::detail::collective_context& ctx, const transport::node_memory* node) noexcept {
    const auto P = static_cast<std::size_t>(ctx.world_size);
    const std::size_t block = ctx.bytes(ctx.count);
    return node && P > 1 && block != 0 && block >= (node_direct_bytes + P - 1) / P;
  }

  static pdcoll::detail::collective_task reduce_scatter_direct(pdcoll::detail::collective_context& ctx,
                                                               transport::node_memory& node) {
    const int r = ctx.rank, P = ctx.world_size;
    const std::size_t block = ctx.bytes(ctx.count), at = static_cast<std::size_t>(r) * block;
    // Before the first suspension (see algorithm/shared_memory.hpp).
    const pdcoll::detail::node_step s{&node, P, ctx.reserve_node_steps(1)};
    detail::node_direct_buffers buffers(P, ctx.input.address, block * static_cast<std::size_t>(P),
                                        ctx.output.address, block, /*peers_read_output=*/false);
    bool agreed = false;
    if (auto ec = co_await detail::node_direct_handshake::ask(ctx, s, buffers, agreed)) co_return ec;
    if (!agreed) {
      buffers.finish();
      s.raise(r, &pdcoll::detail::node_flags::consumed);
      co_return co_await ring::reduce_scatter(ctx);
    }
    // In place the output is block r of this rank's input, which no peer reads.
    detail::node_direct_reduce_block(ctx, ctx.output.address, at, block, [&](int q) { return buffers.input(q); });
    co_return co_await detail::node_direct_handshake::release(ctx, s, buffers);
  }

  static pdcoll::detail::collective_task all_gather_direct(pdcoll::detail::collective_context& ctx,
                                                           transport::node_memory& node) {
    const int r = ctx.rank, P = ctx.world_size;
    const std::size_t block = ctx.bytes(ctx.count);
    const pdcoll::detail::node_step s{&node, P, ctx.reserve_node_steps(1)};
    detail::node_direct_buffers buffers(P, ctx.input.address, block, ctx.output.address,
                                        block * static_cast<std::size_t>(P), /*peers_read_output=*/false);
    bool agreed = false;
    if (auto ec = co_await detail::node_direct_handshake::ask(ctx, s, buffers, agreed)) co_return ec;
    if (!agreed) {
      buffers.finish();
      s.raise(r, &pdcoll::detail::node_flags::consumed);
      co_return co_await ring::all_gather(ctx);
    }
    // In place the input is block r of the output: the copy is skipped.
    ctx.copy(ctx.output, static_cast<std::size_t>(r) * block, ctx.input, 0, block);
    const bool stream = block * static_cast<std::size_t>(P) >= node_direct_gather_stream_bytes;
    for (int q = 0; q < P; ++q) {
      if (q == r) continue;
      std::byte* const to = ctx.output.address + static_cast<std::size_t>(q) * block;
      if (stream) pdcoll::detail::stream_copy(to, buffers.input(q), block);
      else std::memcpy(to, buffers.input(q), block);
    }
    co_return co_await detail::node_direct_handshake::release(ctx, s, buffers);
  }
};

}  // namespace pdcoll::algo
