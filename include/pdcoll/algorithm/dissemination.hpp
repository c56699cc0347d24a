// File: algorithm/dissemination.hpp — the dissemination barrier.
//
// Cost (P ranks): ceil(log2 P) rounds of one empty message sent and one
// received per rank; no rank leaves before every rank has arrived.
#pragma once

#include <pdcoll/detail/collective_operation.hpp>

namespace pdcoll::algo {

/// Dissemination barrier (Hensgen, Finkel and Manber).
struct dissemination {
  /// Name for diagnostics and PDCOLL_ALGO.
  static constexpr const char* name = "dissemination";

  /// Round k: signal rank r + 2^k, wait for rank r - 2^k.
  static pdcoll::detail::collective_task barrier(pdcoll::detail::collective_context& ctx) {
    using pdcoll::detail::transfer_batch;
    const int P = ctx.world_size, r = ctx.rank;
    std::uint32_t round = 0;
    for (int k = 1; k < P; k <<= 1, ++round) {
      transfer_batch b(ctx, 2);
      b.recv((r - k + P) % P, {}, 0, 0, round);
      b.send((r + k) % P, {}, 0, 0, round);
      if (auto ec = co_await b) co_return ec;
    }
    co_return std::error_code{};
  }
};

}  // namespace pdcoll::algo
