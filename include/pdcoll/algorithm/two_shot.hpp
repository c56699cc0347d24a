// File: algorithm/two_shot.hpp — the two-shot all-reduce: a direct
// reduce-scatter (every rank sends each peer that peer's segment) then a
// direct all-gather (every rank sends its reduced segment to every peer),
// pipelined in chunks.
//
// Cost (P ranks, n bytes): two steps whatever P, 2(P-1)/P·n bytes sent per
// rank — the ring's bandwidth with recursive doubling's step count of 2 at
// P = 4, and every transfer of a step posted at once, so a rank that gets
// the CPU finds work from each of its peers instead of waiting for one
// neighbour. P-1 connections in use at once per rank, so it is meant for
// small worlds on links that gain from parallel streams; automatic does not
// pick it (on TCP loopback here it trails the ring: design-notes item 31).
//
// Rank r alone reduces segment r (its own contribution first, then its
// peers' in rank order) and sends the result to everyone, so all ranks get
// bit-identical results.
#pragma once

#include <pdcoll/algorithm/detail/partition.hpp>
#include <pdcoll/detail/collective_operation.hpp>

#include <algorithm>
#include <deque>

namespace pdcoll::algo {

/// Two-shot all-reduce moving segments in chunks of `ChunkBytes`, `Window` chunks ahead.
template <std::size_t ChunkBytes = std::size_t{256} << 10, std::size_t Window = 4>
struct two_shot_chunked {
  static_assert(ChunkBytes > 0 && Window > 0);
  /// Name for diagnostics and PDCOLL_ALGO.
  static constexpr const char* name = "two_shot";
  /// Bytes per chunk.
  static constexpr std::size_t chunk_bytes = ChunkBytes;

  /// All-reduce: ctx.input (count elements) reduced into ctx.output on every rank.
  ///
  /// Segment p (detail::segment_begin) is cut into the same number of chunks
  /// C on every rank (those of the largest segment; a shorter segment's last
  /// chunk may be empty). Chunk c runs in two messages per pair of ranks:
  /// index c carries rank q's input for segment p to rank p (reduce-scatter,
  /// into `Window`·(P-1) cache-sized scratch slots), index C + c carries
  /// rank p's reduced chunk of segment p to rank q (all-gather, straight
  /// into ctx.output). Up to `Window` chunks of receives and reduce-scatter
  /// sends are posted ahead of the chunk being reduced. In place, the
  /// all-gather overwrites input that this rank sent to the segment's owner
  /// for the same chunk: the owner reduced it before sending its result.
  static pdcoll::detail::collective_task all_reduce(pdcoll::detail::collective_context& ctx) {
    using pdcoll::detail::transfer_batch;
    const int P = ctx.world_size, r = ctx.rank;
    const std::size_t n = ctx.count, es = ctx.element_size;
    if (P == 1 || n == 0) {
      ctx.copy(ctx.output, 0, ctx.input, 0, ctx.bytes(n));
      co_return std::error_code{};
    }
    const bool in_place = ctx.input.address == ctx.output.address;
    const std::size_t chunk = std::max<std::size_t>(1, ChunkBytes / es);
    const std::size_t largest = detail::segment_size(n, static_cast<std::size_t>(P), 0);
    const std::size_t chunks = (largest + chunk - 1) / chunk;  // C; largest >= 1 as n >= 1
    const std::size_t slot_bytes = std::min(chunk, largest) * es;
    const std::size_t peers = static_cast<std::size_t>(P - 1);
    struct piece {
      std::size_t first, size;  // elements
    };
    auto piece_of = [&](int segment, std::size_t c) {
      const auto seg = static_cast<std::size_t>(segment);
      const std::size_t size = detail::segment_size(n, static_cast<std::size_t>(P), seg);
      const std::size_t off = std::min(size, c * chunk);
      return piece{detail::segment_begin(n, static_cast<std::size_t>(P), seg) + off, std::min(chunk, size - off)};
    };
    auto peer_at = [&](std::size_t q) { return static_cast<int>((static_cast<std::size_t>(r) + 1 + q) % P); };
    auto slot_of = [&](std::size_t c, std::size_t q) { return ((c % Window) * peers + q) * slot_bytes; };
    const auto scatter_index = [](std::size_t c) { return static_cast<std::uint32_t>(c); };
    const auto gather_index = [&](std::size_t c) { return static_cast<std::uint32_t>(chunks + c); };

    auto slots = ctx.scratch(slot_bytes * peers * std::min(Window, chunks));
    std::deque<transfer_batch> arrivals;  // per chunk: the peers' contributions to this rank's segment
    std::deque<transfer_batch> gathered;  // per chunk: the peers' reduced segments
    std::deque<transfer_batch> sends;
    std::size_t posted = 0;
    // Chunk c's receives, then its reduce-scatter sends (receives first: see ring.hpp).
    auto post_chunk = [&](std::size_t c) {
      auto& in = arrivals.emplace_back(ctx, peers);
      const auto mine = piece_of(r, c);
      for (std::size_t q = 0; q < peers; ++q) in.recv(peer_at(q), slots, slot_of(c, q), mine.size * es, scatter_index(c));
      in.post();
      auto& out = gathered.emplace_back(ctx, peers);
      for (std::size_t q = 0; q < peers; ++q) {
        const auto p = piece_of(peer_at(q), c);
        out.recv(peer_at(q), ctx.output, p.first * es, p.size * es, gather_index(c));
      }
      out.post();
      auto& s = sends.emplace_back(ctx, peers);
      for (std::size_t q = 0; q < peers; ++q) {
        const auto p = piece_of(peer_at(q), c);
        s.send(peer_at(q), ctx.input, p.first * es, p.size * es, scatter_index(c));
      }
      s.post();
    };
    std::error_code first;
    for (std::size_t c = 0; c < chunks && !first; ++c) {
      while (posted < chunks && posted < c + Window) post_chunk(posted++);
      while (!sends.empty() && sends.front().done() && !sends.front().error()) sends.pop_front();
      while (!gathered.empty() && gathered.front().done() && !gathered.front().error()) gathered.pop_front();
      if (auto ec = co_await arrivals.front()) {
        first = ec;
        break;
      }
      // This rank's chunk: its own input, then the peers' in rank order.
      const auto mine = piece_of(r, c);
      if (!in_place) ctx.copy(ctx.output, mine.first * es, ctx.input, mine.first * es, mine.size * es);
      for (int p = 0; p < P; ++p) {
        if (p == r) continue;
        const auto q = static_cast<std::size_t>((p - r - 1 + P) % P);
        ctx.reduce(ctx.output, mine.first * es, slots, slot_of(c, q), mine.size);
      }
      arrivals.pop_front();
      auto& s = sends.emplace_back(ctx, peers);
      for (std::size_t q = 0; q < peers; ++q) s.send(peer_at(q), ctx.output, mine.first * es, mine.size * es, gather_index(c));
      s.post();
    }
    if (first) {
      for (auto& b : arrivals) b.cancel();
      for (auto& b : gathered) b.cancel();
      for (auto& b : sends) b.cancel();
    }
    for (auto& b : arrivals)
      if (auto ec = co_await b; ec && !first) first = ec;
    for (auto& b : gathered)
      if (auto ec = co_await b; ec && !first) first = ec;
    for (auto& b : sends)
      if (auto ec = co_await b; ec && !first) first = ec;
    co_return first;
  }
};

/// The two-shot all-reduce with its default chunks (256 KiB, 4 ahead).
using two_shot = two_shot_chunked<>;

}  // namespace pdcoll::algo
