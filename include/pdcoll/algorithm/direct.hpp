// File: algorithm/direct.hpp — one-shot algorithms: every rank exchanges
// with every other rank at once (direct all-reduce and all-to-all); and the
// pairwise all-to-all, which takes P-1 steps of one exchange each.
//
// All-to-all: direct posts every receive and send in one batch, so each
// block moves as soon as both ends are ready and no rank waits for a step
// to finish; pairwise keeps one send and one receive in flight per rank,
// which bounds the messages in flight on large worlds. The v forms
// (all_to_allv, all_gatherv) run the same exchanges with each peer's block
// at its own offset and size (collective_context::send_offset and the
// like): one message per pair of ranks, empty blocks included, so that a
// count on which sender and receiver disagree fails the receive (a staged
// v chunk leaves out the blocks that ended in an earlier chunk:
// collective_context::sends_block).
//
// All-reduce cost (P ranks, n bytes): one step; each rank sends and receives
// (P-1)·n bytes and holds (P-1)·n bytes of scratch. The lowest latency for
// tiny messages on small worlds, and the worst bandwidth: keep it for a few
// KiB. Every rank reduces the contributions in rank order, so all ranks get
// bit-identical results.
#pragma once

#include <pdcoll/detail/collective_operation.hpp>

namespace pdcoll::algo {

/// Direct (one-shot) all-reduce and all-to-all.
struct direct {
  /// Name for diagnostics and PDCOLL_ALGO.
  static constexpr const char* name = "direct";

  /// All-reduce of ctx.input into ctx.output.
  static pdcoll::detail::collective_task all_reduce(pdcoll::detail::collective_context& ctx) {
    using pdcoll::detail::transfer_batch;
    const int P = ctx.world_size, r = ctx.rank;
    const std::size_t nbytes = ctx.bytes(ctx.count);
    if (P == 1 || nbytes == 0) {
      ctx.copy(ctx.output, 0, ctx.input, 0, nbytes);
      co_return std::error_code{};
    }
    // Slot p holds rank p's contribution (own slot unused: read from input).
    auto slots = ctx.scratch(nbytes * static_cast<std::size_t>(P));
    {
      transfer_batch b(ctx, 2 * static_cast<std::size_t>(P));
      for (int p = 0; p < P; ++p) {
        if (p == r) continue;
        b.recv(p, slots, static_cast<std::size_t>(p) * nbytes, nbytes, 0);
        b.send(p, ctx.input, 0, nbytes, 0);
      }
      if (auto ec = co_await b) co_return ec;
    }
    ctx.copy(slots, static_cast<std::size_t>(r) * nbytes, ctx.input, 0, nbytes);
    ctx.copy(ctx.output, 0, slots, 0, nbytes);
    for (int p = 1; p < P; ++p) ctx.reduce(ctx.output, 0, slots, static_cast<std::size_t>(p) * nbytes, ctx.count);
    co_return std::error_code{};
  }

  /// All-to-all with every receive and send posted at once.
  static pdcoll::detail::collective_task all_to_all(pdcoll::detail::collective_context& ctx) {
    using pdcoll::detail::transfer_batch;
    const int P = ctx.world_size, r = ctx.rank;
    ctx.copy(ctx.output, ctx.recv_offset(r), ctx.input, ctx.send_offset(r), ctx.recv_bytes(r));
    if (P == 1) co_return std::error_code{};
    transfer_batch b(ctx, 2 * static_cast<std::size_t>(P - 1));
    // Peers in the pairwise order, so that each rank's first send meets its
    // receiver's first receive.
    for (int s = 1; s < P; ++s) {
      const int to = (r + s) % P, from = (r - s + P) % P;
      if (ctx.receives_block(from)) b.recv(from, ctx.output, ctx.recv_offset(from), ctx.recv_bytes(from), 0);
      if (ctx.sends_block(to)) b.send(to, ctx.input, ctx.send_offset(to), ctx.send_bytes(to), 0);
    }
    co_return co_await b;
  }
  /// All-to-all with blocks of varied sizes: the same exchange.
  static pdcoll::detail::collective_task all_to_allv(pdcoll::detail::collective_context& ctx) { return all_to_all(ctx); }
  /// All-gather with blocks of varied sizes: an all-to-all whose every send
  /// block is this rank's input.
  static pdcoll::detail::collective_task all_gatherv(pdcoll::detail::collective_context& ctx) { return all_to_all(ctx); }
};

/// Pairwise-exchange all-to-all.
struct pairwise {
  /// Name for diagnostics.
  static constexpr const char* name = "pairwise";

  /// All-to-all by pairwise exchange: in step s (1 ≤ s < P) rank r sends its
  /// block for r+s and receives the block from r-s, so each step pairs every
  /// rank with one sender and one receiver.
  static pdcoll::detail::collective_task all_to_all(pdcoll::detail::collective_context& ctx) {
    using pdcoll::detail::transfer_batch;
    const int P = ctx.world_size, r = ctx.rank;
    ctx.copy(ctx.output, ctx.recv_offset(r), ctx.input, ctx.send_offset(r), ctx.recv_bytes(r));
    for (int s = 1; s < P; ++s) {
      const int to = (r + s) % P, from = (r - s + P) % P;
      transfer_batch b(ctx, 2);
      if (ctx.receives_block(from))
        b.recv(from, ctx.output, ctx.recv_offset(from), ctx.recv_bytes(from), static_cast<std::uint32_t>(s));
      if (ctx.sends_block(to)) b.send(to, ctx.input, ctx.send_offset(to), ctx.send_bytes(to), static_cast<std::uint32_t>(s));
      if (auto ec = co_await b) co_return ec;
    }
    co_return std::error_code{};
  }
  /// All-to-all with blocks of varied sizes: the same steps.
  static pdcoll::detail::collective_task all_to_allv(pdcoll::detail::collective_context& ctx) { return all_to_all(ctx); }
  /// All-gather with blocks of varied sizes: P-1 steps, each sending this
  /// rank's input to one peer and receiving another's block.
  static pdcoll::detail::collective_task all_gatherv(pdcoll::detail::collective_context& ctx) { return all_to_all(ctx); }
};

}  // namespace pdcoll::algo
