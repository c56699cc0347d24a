// File: algorithm/tree.hpp — tree algorithms: binary-tree all-reduce
// (reduce to rank 0, broadcast back), binomial broadcast and binomial reduce.
//
// Cost (P ranks, n bytes): all-reduce 2·ceil(log2(P+1)) steps of n bytes,
// pipelined in chunks so the bytes stream through the tree rather than
// waiting at each level; broadcast and reduce ceil(log2 P) steps of n bytes.
// Trees win at small and mid sizes on large worlds, where the ring's 2(P-1)
// latencies dominate.
#pragma once

#include <pdcoll/algorithm/detail/partition.hpp>
#include <pdcoll/detail/collective_operation.hpp>

#include <memory>
#include <vector>

namespace pdcoll::algo {

/// Binary-tree all-reduce; binomial-tree broadcast and reduce.
template <std::size_t ChunkBytes = std::size_t{256} << 10>
struct tree_chunked {
  /// Name for diagnostics and PDCOLL_ALGO.
  static constexpr const char* name = "tree";
  /// Bytes per pipeline chunk (model::pipeline_chunk_bytes assumes the default's).
  static constexpr std::size_t chunk_bytes = ChunkBytes;

  /// All-reduce of ctx.input into ctx.output: each chunk is reduced up a
  /// binary tree rooted at rank 0 (children 2i+1, 2i+2), then sent back down.
  static pdcoll::detail::collective_task all_reduce(pdcoll::detail::collective_context& ctx) {
    using pdcoll::detail::transfer_batch;
    const int P = ctx.world_size, r = ctx.rank;
    const std::size_t n = ctx.count, es = ctx.element_size, nbytes = ctx.bytes(n);
    ctx.copy(ctx.output, 0, ctx.input, 0, nbytes);
    if (P == 1 || n == 0) co_return std::error_code{};
    const auto& data = ctx.output;
    const std::size_t chunk_elems = std::max<std::size_t>(1, ChunkBytes / es);
    const std::size_t chunks = (n + chunk_elems - 1) / chunk_elems;
    const int parent = r == 0 ? -1 : (r - 1) / 2;
    int children[2];
    int nchildren = 0;
    for (int c = 2 * r + 1; c <= 2 * r + 2; ++c)
      if (c < P) children[nchildren++] = c;
    auto incoming = ctx.scratch(std::min(nbytes, chunk_elems * es) * static_cast<std::size_t>(std::max(nchildren, 1)));
    const std::size_t slot = std::min(nbytes, chunk_elems * es);

    // Up: chunk by chunk, so a parent reduces chunk c while chunk c+1 is on its way.
    std::vector<std::unique_ptr<transfer_batch>> ups;
    ups.reserve(chunks);
    for (std::size_t c = 0; c < chunks; ++c) {
      const std::size_t off = c * chunk_elems, len = std::min(chunk_elems, n - off);
      const auto index = static_cast<std::uint32_t>(c);
      if (nchildren) {
        transfer_batch b(ctx, 2);
        for (int k = 0; k < nchildren; ++k) b.recv(children[k], incoming, static_cast<std::size_t>(k) * slot, len * es, index);
        if (auto ec = co_await b) co_return co_await drain(ups, ec);
        for (int k = 0; k < nchildren; ++k) ctx.reduce(data, off * es, incoming, static_cast<std::size_t>(k) * slot, len);
      }
      if (parent >= 0) {
        auto& b = ups.emplace_back(std::make_unique<transfer_batch>(ctx, 1));
        b->send(parent, data, off * es, len * es, index);
        b->post();
      }
    }
    if (auto ec = co_await drain(ups, {})) co_return ec;
    // Down: the root's result flows back, chunk by chunk.
    std::vector<std::unique_ptr<transfer_batch>> downs;
    downs.reserve(chunks);
    for (std::size_t c = 0; c < chunks; ++c) {
      const std::size_t off = c * chunk_elems, len = std::min(chunk_elems, n - off);
      const auto index = static_cast<std::uint32_t>(chunks + c);
      if (parent >= 0) {
        transfer_batch b(ctx, 1);
        b.recv(parent, data, off * es, len * es, index);
        if (auto ec = co_await b) co_return co_await drain(downs, ec);
      }
      if (nchildren) {
        auto& b = downs.emplace_back(std::make_unique<transfer_batch>(ctx, 2));
        for (int k = 0; k < nchildren; ++k) b->send(children[k], data, off * es, len * es, index);
        b->post();
      }
    }
    co_return co_await drain(downs, {});
  }

  /// Broadcast of ctx.input at the root into ctx.output everywhere (binomial tree).
  static pdcoll::detail::collective_task broadcast(pdcoll::detail::collective_context& ctx) {
    using pdcoll::detail::transfer_batch;
    const int P = ctx.world_size, r = ctx.rank, root = ctx.root;
    const std::size_t nbytes = ctx.bytes(ctx.count);
    if (r == root) ctx.copy(ctx.output, 0, ctx.input, 0, nbytes);
    if (P == 1) co_return std::error_code{};
    const int vr = (r - root + P) % P;
    int mask = 1;
    while (mask < P) {
      if (vr & mask) {
        transfer_batch b(ctx, 1);
        b.recv((vr - mask + root) % P, ctx.output, 0, nbytes, 0);
        if (auto ec = co_await b) co_return ec;
        break;
      }
      mask <<= 1;
    }
    transfer_batch sends(ctx, 4);
    for (mask >>= 1; mask > 0; mask >>= 1)
      if (vr + mask < P) sends.send((vr + mask + root) % P, ctx.output, 0, nbytes, 0);
    co_return co_await sends;
  }

  /// Reduce of every rank's ctx.input into ctx.output at the root (binomial
  /// tree; ctx.output is untouched elsewhere).
  static pdcoll::detail::collective_task reduce(pdcoll::detail::collective_context& ctx) {
    using pdcoll::detail::transfer_batch;
    const int P = ctx.world_size, r = ctx.rank, root = ctx.root;
    const std::size_t nbytes = ctx.bytes(ctx.count);
    auto acc = r == root ? ctx.output : ctx.scratch(nbytes);
    ctx.copy(acc, 0, ctx.input, 0, nbytes);
    if (P == 1) co_return std::error_code{};
    const int vr = (r - root + P) % P;
    auto incoming = ctx.scratch(nbytes);
    for (int mask = 1; mask < P; mask <<= 1) {
      if ((vr & mask) == 0) {
        const int child = vr | mask;
        if (child < P) {
          transfer_batch b(ctx, 1);
          b.recv((child + root) % P, incoming, 0, nbytes, static_cast<std::uint32_t>(mask));
          if (auto ec = co_await b) co_return ec;
          ctx.reduce(acc, 0, incoming, 0, ctx.count);
        }
      } else {
        transfer_batch b(ctx, 1);
        b.send(((vr & ~mask) + root) % P, acc, 0, nbytes, static_cast<std::uint32_t>(mask));
        co_return co_await b;
      }
    }
    co_return std::error_code{};
  }

 private:
  // Awaits every batch still in flight; returns `first` or the first new error.
  static pdcoll::detail::collective_task drain(std::vector<std::unique_ptr<pdcoll::detail::transfer_batch>>& batches,
                                               std::error_code first) {
    if (first)
      for (auto& b : batches) b->cancel();
    for (auto& b : batches) {
      auto ec = co_await *b;
      if (ec && !first) first = ec;
    }
    batches.clear();
    co_return first;
  }
};

/// Tree algorithms with 256 KiB chunks.
using tree = tree_chunked<>;

}  // namespace pdcoll::algo
