// File: algorithm/chain.hpp — pipelined chain broadcast for large messages.
//
// Cost (P ranks, n bytes, chunk c): (P - 1 + n/c) chunk steps; every link
// carries n bytes once, so for n ≫ P·c the time approaches n / link
// bandwidth whatever P is — the binomial tree pays n·log2 P at the root.
#pragma once

#include <pdcoll/detail/collective_operation.hpp>

#include <memory>
#include <vector>

namespace pdcoll::algo {

/// Chain broadcast: root → root+1 → … in chunks of ChunkBytes.
template <std::size_t ChunkBytes = std::size_t{512} << 10>
struct chain_chunked {
  /// Name for diagnostics and PDCOLL_ALGO.
  static constexpr const char* name = "chain";

  /// Broadcast of ctx.input at the root into ctx.output everywhere.
  static pdcoll::detail::collective_task broadcast(pdcoll::detail::collective_context& ctx) {
    using pdcoll::detail::transfer_batch;
    const int P = ctx.world_size, r = ctx.rank, root = ctx.root;
    const std::size_t nbytes = ctx.bytes(ctx.count);
    if (r == root) ctx.copy(ctx.output, 0, ctx.input, 0, nbytes);
    if (P == 1) co_return std::error_code{};
    const int vr = (r - root + P) % P;
    const int prev = (r - 1 + P) % P, next = (r + 1) % P;
    const bool has_next = vr + 1 < P;
    const std::size_t chunks = nbytes == 0 ? 1 : (nbytes + ChunkBytes - 1) / ChunkBytes;
    // Every receive is posted up front; each chunk is forwarded as soon as it lands.
    std::vector<std::unique_ptr<transfer_batch>> recvs, sends;
    recvs.reserve(chunks);
    sends.reserve(chunks);
    for (std::size_t c = 0; vr > 0 && c < chunks; ++c) {
      auto& b = recvs.emplace_back(std::make_unique<transfer_batch>(ctx, 1));
      b->recv(prev, ctx.output, c * ChunkBytes, std::min(ChunkBytes, nbytes - c * ChunkBytes), static_cast<std::uint32_t>(c));
      b->post();
    }
    std::error_code first;
    for (std::size_t c = 0; c < chunks; ++c) {
      const std::size_t off = c * ChunkBytes, len = std::min(ChunkBytes, nbytes - std::min(nbytes, off));
      if (vr > 0) {
        if (first) recvs[c]->cancel();
        if (auto ec = co_await *recvs[c]; ec && !first) first = ec;
      }
      if (has_next && !first) {
        auto& b = sends.emplace_back(std::make_unique<transfer_batch>(ctx, 1));
        b->send(next, ctx.output, off, len, static_cast<std::uint32_t>(c));
        b->post();
      }
    }
    for (auto& b : sends) {
      if (first) b->cancel();
      if (auto ec = co_await *b; ec && !first) first = ec;
    }
    co_return first;
  }
};

/// Chain broadcast with 512 KiB chunks.
using chain = chain_chunked<>;

}  // namespace pdcoll::algo
