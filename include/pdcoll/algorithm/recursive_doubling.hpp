// File: algorithm/recursive_doubling.hpp — latency-optimal algorithms:
// recursive-doubling all-reduce and the Bruck all-gather.
//
// All-reduce cost (P ranks, n bytes): ceil(log2 P) exchanges of the whole
// buffer, plus two for a world that is not a power of two (the extra ranks
// fold their data into a partner first and get the result back at the end).
// Best for small messages; each rank sends n·log2 P bytes.
#pragma once

#include <pdcoll/algorithm/detail/partition.hpp>
#include <pdcoll/detail/collective_operation.hpp>

namespace pdcoll::algo {

/// Recursive doubling (all-reduce) and Bruck (all-gather, any world size).
struct recursive_doubling {
  /// Name for diagnostics and PDCOLL_ALGO.
  static constexpr const char* name = "recursive_doubling";

  /// All-reduce of ctx.input into ctx.output.
  static pdcoll::detail::collective_task all_reduce(pdcoll::detail::collective_context& ctx) {
    using pdcoll::detail::transfer_batch;
    const int P = ctx.world_size, r = ctx.rank;
    const std::size_t nbytes = ctx.bytes(ctx.count);
    ctx.copy(ctx.output, 0, ctx.input, 0, nbytes);
    if (P == 1 || nbytes == 0) co_return std::error_code{};
    const auto& data = ctx.output;
    const detail::fold f(P);
    auto incoming = ctx.scratch(nbytes);
    std::uint32_t index = 0;

    if (r < 2 * f.extra) {  // fold the extra ranks into their partners
      transfer_batch b(ctx, 1);
      if (f.sits_out(r)) b.send(r + 1, data, 0, nbytes, index);
      else b.recv(r - 1, incoming, 0, nbytes, index);
      if (auto ec = co_await b) co_return ec;
      if (!f.sits_out(r)) ctx.reduce(data, 0, incoming, 0, ctx.count);
    }
    ++index;
    // In a power-of-two world every rank meets both ring neighbours along the
    // way (detail::hypercube_partner): the signature check may wait for the
    // data message it can share a write with.
    const bool on_gray_cube = f.extra == 0;
    if (on_gray_cube) ctx.hold_signature_check();
    if (const int a = f.active_rank(r); a >= 0) {
      for (int mask = 1; mask < f.pow2; mask <<= 1, ++index) {
        const int partner = on_gray_cube ? detail::hypercube_partner(a, mask) : f.real_rank(a ^ mask);
        transfer_batch b(ctx, 2);
        b.recv(partner, incoming, 0, nbytes, index);
        b.send(partner, data, 0, nbytes, index);
        if (auto ec = co_await b) co_return ec;
        // Both partners put the lower rank's data first, so that they hold
        // the same bits afterwards whatever the op does with ties.
        if (partner < r) ctx.reduce_src_first(data, 0, incoming, 0, ctx.count);
        else ctx.reduce(data, 0, incoming, 0, ctx.count);
      }
    }
    index = 63;
    if (r < 2 * f.extra) {  // hand the result back to the ranks that sat out
      transfer_batch b(ctx, 1);
      if (f.sits_out(r)) b.recv(r + 1, data, 0, nbytes, index);
      else b.send(r - 1, data, 0, nbytes, index);
      if (auto ec = co_await b) co_return ec;
    }
    co_return std::error_code{};
  }

  /// All-gather by Bruck's algorithm: ceil(log2 P) steps for any P; blocks
  /// are gathered rotated in scratch and put in rank order at the end.
  static pdcoll::detail::collective_task all_gather(pdcoll::detail::collective_context& ctx) {
    using pdcoll::detail::transfer_batch;
    const int P = ctx.world_size, r = ctx.rank;
    const std::size_t block = ctx.bytes(ctx.count);
    if (P == 1 || block == 0) {
      ctx.copy(ctx.output, static_cast<std::size_t>(r) * block, ctx.input, 0, block);
      co_return std::error_code{};
    }
    auto rotated = ctx.scratch(block * static_cast<std::size_t>(P));
    ctx.copy(rotated, 0, ctx.input, 0, block);
    std::uint32_t index = 0;
    for (int k = 1; k < P; k <<= 1, ++index) {
      const int blocks = std::min(k, P - k);
      transfer_batch b(ctx, 2);
      b.recv((r + k) % P, rotated, static_cast<std::size_t>(k) * block, static_cast<std::size_t>(blocks) * block, index);
      b.send((r - k + P) % P, rotated, 0, static_cast<std::size_t>(blocks) * block, index);
      if (auto ec = co_await b) co_return ec;
    }
    for (int i = 0; i < P; ++i)
      ctx.copy(ctx.output, static_cast<std::size_t>((r + i) % P) * block, rotated, static_cast<std::size_t>(i) * block,
               block);
    co_return std::error_code{};
  }
};

}  // namespace pdcoll::algo
