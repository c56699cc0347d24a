// File: algorithm/rabenseifner.hpp — Rabenseifner's all-reduce
// (recursive-halving reduce-scatter, then recursive-doubling all-gather) and
// the recursive-halving reduce-scatter on its own.
//
// All-reduce cost (P ranks, n bytes): 2·log2 P steps, 2(P'-1)/P'·n bytes
// sent per rank (P' = largest power of two ≤ P) — bandwidth of the ring with
// log-many steps: the middle ground for mid-sized messages. Any world size:
// extra ranks fold into a partner first (one extra exchange of n bytes each way).
#pragma once

#include <pdcoll/algorithm/detail/partition.hpp>
#include <pdcoll/detail/collective_operation.hpp>

#include <vector>

namespace pdcoll::algo {

/// Rabenseifner all-reduce; recursive-halving reduce-scatter.
struct rabenseifner {
  /// Name for diagnostics and PDCOLL_ALGO.
  static constexpr const char* name = "rabenseifner";

  /// All-reduce of ctx.input into ctx.output.
  static pdcoll::detail::collective_task all_reduce(pdcoll::detail::collective_context& ctx) {
    using pdcoll::detail::transfer_batch;
    const int P = ctx.world_size, r = ctx.rank;
    const std::size_t n = ctx.count, es = ctx.element_size, nbytes = ctx.bytes(n);
    ctx.copy(ctx.output, 0, ctx.input, 0, nbytes);
    if (P == 1 || n == 0) co_return std::error_code{};
    const auto& data = ctx.output;
    const detail::fold f(P);
    auto incoming = ctx.scratch(nbytes);
    std::uint32_t index = 0;

    if (r < 2 * f.extra) {
      transfer_batch b(ctx, 1);
      if (f.sits_out(r)) b.send(r + 1, data, 0, nbytes, index);
      else b.recv(r - 1, incoming, 0, nbytes, index);
      if (auto ec = co_await b) co_return ec;
      if (!f.sits_out(r)) ctx.reduce(data, 0, incoming, 0, n);
    }
    ++index;
    if (const int a = f.active_rank(r); a >= 0) {
      // Recursive halving: keep half of the current range, reduce it with the partner's copy.
      std::vector<std::pair<std::size_t, std::size_t>> ranges;  // range held before each halving
      std::size_t lo = 0, hi = n;
      for (int mask = f.pow2 / 2; mask >= 1; mask >>= 1, ++index) {
        const int partner = f.real_rank(a ^ mask);
        const std::size_t mid = lo + (hi - lo) / 2;
        const bool upper = (a & mask) != 0;
        const std::size_t keep_lo = upper ? mid : lo, keep_hi = upper ? hi : mid;
        const std::size_t give_lo = upper ? lo : mid, give_hi = upper ? mid : hi;
        ranges.emplace_back(lo, hi);
        transfer_batch b(ctx, 2);
        b.recv(partner, incoming, 0, (keep_hi - keep_lo) * es, index);
        b.send(partner, data, give_lo * es, (give_hi - give_lo) * es, index);
        if (auto ec = co_await b) co_return ec;
        ctx.reduce(data, keep_lo * es, incoming, 0, keep_hi - keep_lo);
        lo = keep_lo;
        hi = keep_hi;
      }
      // Recursive doubling all-gather: undo the halvings in reverse order.
      for (int mask = 1; mask < f.pow2; mask <<= 1, ++index) {
        const int partner = f.real_rank(a ^ mask);
        auto [parent_lo, parent_hi] = ranges.back();
        ranges.pop_back();
        const std::size_t other_lo = lo == parent_lo ? hi : parent_lo;
        const std::size_t other_hi = lo == parent_lo ? parent_hi : lo;
        transfer_batch b(ctx, 2);
        b.recv(partner, data, other_lo * es, (other_hi - other_lo) * es, index);
        b.send(partner, data, lo * es, (hi - lo) * es, index);
        if (auto ec = co_await b) co_return ec;
        lo = parent_lo;
        hi = parent_hi;
      }
    }
    index = 127;
    if (r < 2 * f.extra) {
      transfer_batch b(ctx, 1);
      if (f.sits_out(r)) b.recv(r + 1, data, 0, nbytes, index);
      else b.send(r - 1, data, 0, nbytes, index);
      if (auto ec = co_await b) co_return ec;
    }
    co_return std::error_code{};
  }

  /// Reduce-scatter by recursive halving: ctx.input holds P blocks of count
  /// elements; rank r ends with the reduced block r in ctx.output.
  static pdcoll::detail::collective_task reduce_scatter(pdcoll::detail::collective_context& ctx) {
    using pdcoll::detail::transfer_batch;
    const int P = ctx.world_size, r = ctx.rank;
    const std::size_t block = ctx.bytes(ctx.count), total = block * static_cast<std::size_t>(P);
    if (P == 1 || block == 0) {
      ctx.copy(ctx.output, 0, ctx.input, static_cast<std::size_t>(r) * block, block);
      co_return std::error_code{};
    }
    const detail::fold f(P);
    // Partial sums live in acc once there are any; until then this rank's
    // contributions are read straight from its input (never copied whole).
    // A rank that sits out only sends its input and receives its block.
    pdcoll::detail::buffer_desc acc{}, incoming{};
    if (!f.sits_out(r)) {
      acc = ctx.scratch(total);
      incoming = ctx.scratch(total);
    }
    const pdcoll::detail::buffer_desc* sums = &ctx.input;
    auto combine = [&](std::size_t off, std::size_t bytes) {
      const std::size_t n = bytes / ctx.element_size;
      if (n == 0) return;
      if (sums == &ctx.input) ctx.red->apply3(acc.address + off, ctx.input.address + off, incoming.address, n);
      else ctx.red->apply(acc.address + off, incoming.address, n);
    };
    std::uint32_t index = 0;
    if (r < 2 * f.extra) {
      transfer_batch b(ctx, 1);
      if (f.sits_out(r)) b.send(r + 1, ctx.input, 0, total, index);
      else b.recv(r - 1, incoming, 0, total, index);
      if (auto ec = co_await b) co_return ec;
      if (!f.sits_out(r)) {
        combine(0, total);
        sums = &acc;
      }
    }
    ++index;
    if (const int a = f.active_rank(r); a >= 0) {
      // Active rank a ends owning the blocks of the real ranks it carries:
      // blocks [first_carried(a), first_carried(a + 1)), contiguous and ordered.
      int glo = 0, ghi = f.pow2;
      for (int mask = f.pow2 / 2; mask >= 1; mask >>= 1, ++index) {
        const int partner = f.real_rank(a ^ mask);
        const int gmid = glo + mask;
        const bool upper = a >= gmid;
        const int keep_lo = upper ? gmid : glo, keep_hi = upper ? ghi : gmid;
        const int give_lo = upper ? glo : gmid, give_hi = upper ? gmid : ghi;
        const std::size_t keep_off = static_cast<std::size_t>(f.first_carried(keep_lo)) * block;
        const std::size_t keep_len = static_cast<std::size_t>(f.first_carried(keep_hi) - f.first_carried(keep_lo)) * block;
        const std::size_t give_off = static_cast<std::size_t>(f.first_carried(give_lo)) * block;
        const std::size_t give_len = static_cast<std::size_t>(f.first_carried(give_hi) - f.first_carried(give_lo)) * block;
        transfer_batch b(ctx, 2);
        b.recv(partner, incoming, 0, keep_len, index);
        b.send(partner, *sums, give_off, give_len, index);
        if (auto ec = co_await b) co_return ec;
        combine(keep_off, keep_len);
        sums = &acc;
        glo = keep_lo;
        ghi = keep_hi;
      }
    }
    index = 127;
    if (r < 2 * f.extra) {
      transfer_batch b(ctx, 1);
      if (f.sits_out(r)) b.recv(r + 1, ctx.output, 0, block, index);
      else b.send(r - 1, *sums, static_cast<std::size_t>(r - 1) * block, block, index);
      if (auto ec = co_await b) co_return ec;
    }
    if (!f.sits_out(r)) ctx.copy(ctx.output, 0, *sums, static_cast<std::size_t>(r) * block, block);
    co_return std::error_code{};
  }
};

/// Recursive halving (reduce-scatter) is Rabenseifner's first half.
using recursive_halving = rabenseifner;

}  // namespace pdcoll::algo
