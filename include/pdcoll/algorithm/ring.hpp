// File: algorithm/ring.hpp — ring algorithms: bandwidth-optimal all-reduce
// (reduce-scatter then all-gather around the ring), all-gather and
// reduce-scatter.
//
// Cost (P ranks, n bytes): all-reduce 2(P-1) steps, 2(P-1)/P·n bytes sent per
// rank — the best for large messages; latency grows with P. Each step's
// segment moves in chunks of at most ChunkBytes, posted together, and each
// chunk is reduced as soon as it has arrived while the rest still stream in.
#pragma once

#include <pdcoll/algorithm/detail/partition.hpp>
#include <pdcoll/detail/collective_operation.hpp>

#include <memory>
#include <vector>

namespace pdcoll::algo {

/// Ring algorithms with segments moved in chunks of `ChunkBytes`.
template <std::size_t ChunkBytes = std::size_t{1} << 20>
struct ring_chunked {
  static_assert(ChunkBytes > 0);
  /// Name for diagnostics and PDCOLL_ALGO.
  static constexpr const char* name = "ring";

  /// All-reduce: ctx.input (count elements) reduced into ctx.output on every rank.
  static pdcoll::detail::collective_task all_reduce(pdcoll::detail::collective_context& ctx) {
    const int P = ctx.world_size, r = ctx.rank;
    const std::size_t n = ctx.count, es = ctx.element_size;
    ctx.copy(ctx.output, 0, ctx.input, 0, ctx.bytes(n));
    if (P == 1 || n == 0) co_return std::error_code{};
    const auto& data = ctx.output;
    const int right = (r + 1) % P, left = (r - 1 + P) % P;
    const std::size_t max_segment = detail::segment_size(n, P, 0) * es;
    const std::size_t chunks_per_segment = max_segment == 0 ? 1 : (max_segment + ChunkBytes - 1) / ChunkBytes;
    auto incoming = ctx.scratch(max_segment);

    // Reduce-scatter: after step s, segment (r - s - 1) holds s + 2 ranks' contributions.
    for (int s = 0; s < P - 1; ++s) {
      const int send_seg = (r - s + P) % P, recv_seg = (r - s - 1 + P) % P;
      const std::size_t send_off = detail::segment_begin(n, P, send_seg) * es;
      const std::size_t send_bytes = detail::segment_size(n, P, send_seg) * es;
      const std::size_t recv_off = detail::segment_begin(n, P, recv_seg) * es;
      const std::size_t recv_bytes = detail::segment_size(n, P, recv_seg) * es;
      const auto base = static_cast<std::uint32_t>(s * chunks_per_segment);
      if (auto ec = co_await exchange_chunked(ctx, right, data, send_off, send_bytes, left, incoming, 0, recv_bytes,
                                              base, [&](std::size_t off, std::size_t bytes) {
                                                ctx.reduce(data, recv_off + off, incoming, off, bytes / es);
                                              }))
        co_return ec;
    }
    // All-gather: circulate the finished segments straight into place.
    for (int s = 0; s < P - 1; ++s) {
      const int send_seg = (r - s + 1 + P) % P, recv_seg = (r - s + P) % P;
      const auto base = static_cast<std::uint32_t>((P - 1 + s) * chunks_per_segment);
      if (auto ec = co_await exchange_chunked(
              ctx, right, data, detail::segment_begin(n, P, send_seg) * es, detail::segment_size(n, P, send_seg) * es,
              left, data, detail::segment_begin(n, P, recv_seg) * es, detail::segment_size(n, P, recv_seg) * es, base,
              [](std::size_t, std::size_t) {}))
        co_return ec;
    }
    co_return std::error_code{};
  }

  /// All-gather: ctx.input (count elements) from every rank, concatenated in
  /// rank order into ctx.output (P·count elements).
  static pdcoll::detail::collective_task all_gather(pdcoll::detail::collective_context& ctx) {
    const int P = ctx.world_size, r = ctx.rank;
    const std::size_t block = ctx.bytes(ctx.count);
    ctx.copy(ctx.output, static_cast<std::size_t>(r) * block, ctx.input, 0, block);
    if (P == 1 || block == 0) co_return std::error_code{};
    const int right = (r + 1) % P, left = (r - 1 + P) % P;
    const std::size_t chunks = (block + ChunkBytes - 1) / ChunkBytes;
    for (int s = 0; s < P - 1; ++s) {
      const auto send_blk = static_cast<std::size_t>((r - s + P) % P);
      const auto recv_blk = static_cast<std::size_t>((r - s - 1 + P) % P);
      if (auto ec = co_await exchange_chunked(ctx, right, ctx.output, send_blk * block, block, left, ctx.output,
                                              recv_blk * block, block, static_cast<std::uint32_t>(s * chunks),
                                              [](std::size_t, std::size_t) {}))
        co_return ec;
    }
    co_return std::error_code{};
  }

  /// Reduce-scatter: ctx.input holds P blocks of count elements; rank r ends
  /// with the reduction of every rank's block r in ctx.output.
  static pdcoll::detail::collective_task reduce_scatter(pdcoll::detail::collective_context& ctx) {
    const int P = ctx.world_size, r = ctx.rank;
    const std::size_t block = ctx.bytes(ctx.count), es = ctx.element_size;
    if (P == 1 || block == 0) {
      ctx.copy(ctx.output, 0, ctx.input, static_cast<std::size_t>(r) * block, block);
      co_return std::error_code{};
    }
    auto acc = ctx.scratch(block * static_cast<std::size_t>(P));
    ctx.copy(acc, 0, ctx.input, 0, block * static_cast<std::size_t>(P));
    auto incoming = ctx.scratch(block);
    const int right = (r + 1) % P, left = (r - 1 + P) % P;
    const std::size_t chunks = (block + ChunkBytes - 1) / ChunkBytes;
    for (int s = 0; s < P - 1; ++s) {
      const auto send_blk = static_cast<std::size_t>((r - s - 1 + 2 * P) % P);
      const auto recv_blk = static_cast<std::size_t>((r - s - 2 + 2 * P) % P);
      if (auto ec = co_await exchange_chunked(ctx, right, acc, send_blk * block, block, left, incoming, 0, block,
                                              static_cast<std::uint32_t>(s * chunks),
                                              [&](std::size_t off, std::size_t bytes) {
                                                ctx.reduce(acc, recv_blk * block + off, incoming, off, bytes / es);
                                              }))
        co_return ec;
    }
    ctx.copy(ctx.output, 0, acc, static_cast<std::size_t>(r) * block, block);
    co_return std::error_code{};
  }

  /// Sends `send_bytes` at send_buf+send_off to `to` and receives
  /// `recv_bytes` into recv_buf+recv_off from `from`, both in chunks; calls
  /// on_chunk(offset, bytes) for each received chunk as soon as it is in.
  template <class OnChunk>
  static pdcoll::detail::collective_task exchange_chunked(pdcoll::detail::collective_context& ctx, int to,
                                                          pdcoll::detail::buffer_desc send_buf, std::size_t send_off,
                                                          std::size_t send_bytes, int from,
                                                          pdcoll::detail::buffer_desc recv_buf, std::size_t recv_off,
                                                          std::size_t recv_bytes, std::uint32_t index_base,
                                                          OnChunk on_chunk) {
    using pdcoll::detail::transfer_batch;
    const std::size_t send_chunks = send_bytes == 0 ? 1 : (send_bytes + ChunkBytes - 1) / ChunkBytes;
    const std::size_t recv_chunks = recv_bytes == 0 ? 1 : (recv_bytes + ChunkBytes - 1) / ChunkBytes;
    transfer_batch sends(ctx, send_chunks);
    for (std::size_t c = 0; c < send_chunks; ++c) {
      std::size_t off = c * ChunkBytes, len = std::min(ChunkBytes, send_bytes - std::min(send_bytes, off));
      sends.send(to, send_buf, send_off + off, len, index_base + static_cast<std::uint32_t>(c));
    }
    if (recv_chunks == 1) {
      transfer_batch recv(ctx, 1);
      recv.recv(from, recv_buf, recv_off, recv_bytes, index_base);
      recv.post();
      sends.post();
      auto ec = co_await recv;
      if (!ec) on_chunk(0, recv_bytes);
      auto send_ec = co_await sends;
      co_return ec ? ec : send_ec;
    }
    std::vector<std::unique_ptr<transfer_batch>> recvs;
    recvs.reserve(recv_chunks);
    for (std::size_t c = 0; c < recv_chunks; ++c) {
      std::size_t off = c * ChunkBytes, len = std::min(ChunkBytes, recv_bytes - off);
      auto& b = recvs.emplace_back(std::make_unique<transfer_batch>(ctx, 1));
      b->recv(from, recv_buf, recv_off + off, len, index_base + static_cast<std::uint32_t>(c));
      b->post();
    }
    sends.post();
    std::error_code first;
    for (std::size_t c = 0; c < recv_chunks; ++c) {
      if (first) recvs[c]->cancel();
      auto ec = co_await *recvs[c];
      if (ec && !first) {
        first = ec;
        sends.cancel();
      }
      if (!first) on_chunk(c * ChunkBytes, std::min(ChunkBytes, recv_bytes - c * ChunkBytes));
    }
    auto send_ec = co_await sends;
    co_return first ? first : send_ec;
  }
};

/// Ring algorithms with the default 1 MiB chunks.
using ring = ring_chunked<>;

}  // namespace pdcoll::algo
