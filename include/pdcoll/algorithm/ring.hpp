// File: algorithm/ring.hpp — ring algorithms: bandwidth-optimal all-reduce
// (reduce-scatter then all-gather around the ring), all-gather and
// reduce-scatter.
//
// Cost (P ranks, n bytes): all-reduce 2(P-1) steps, 2(P-1)/P·n bytes sent per
// rank — the best for large messages; latency grows with P. All-reduce runs
// its steps as one chunk pipeline with a small cache-resident scratch (see
// all_reduce); all-gather and reduce-scatter move each step's block in chunks
// of at most ChunkBytes, posted together, each chunk reduced on arrival.
//
// Performance: ChunkBytes trades per-message cost (alpha) against pipeline
// depth. 1 MiB with 8 in flight (8 MiB on the wire, as before) measured best
// on the reference machine (pdcoll-bench, ring forced, float sum, in place,
// same invocation, against 256 KiB × 32): on libfabric tcp 2 ranks 1.9× at
// 1 MiB, 1.5–1.8× at 4 MiB, 1.2–1.5× from 16 MiB; on shm without node
// memory (CMA) 1.2× at 1–4 MiB and even or better from 16 MiB; on 4 tcp
// ranks (on 2 cores) even from 1 MiB. Smaller chunks pay the provider's
// per-message cost (alpha in model/cost_model.hpp) once per chunk.
#pragma once

#include <pdcoll/algorithm/detail/partition.hpp>
#include <pdcoll/detail/collective_operation.hpp>

#include <algorithm>
#include <deque>
#include <memory>
#include <vector>

namespace pdcoll::algo {

/// Ring algorithms with segments moved in chunks of `ChunkBytes`.
template <std::size_t ChunkBytes = std::size_t{1} << 20, std::size_t Window = 8>
struct ring_chunked {
  static_assert(ChunkBytes > 0 && Window > 0);
  /// Name for diagnostics and PDCOLL_ALGO.
  static constexpr const char* name = "ring";
  /// Bytes per chunk (model::ring_chunk_bytes assumes the default's).
  static constexpr std::size_t chunk_bytes = ChunkBytes;

  /// All-reduce: ctx.input (count elements) reduced into ctx.output on every rank.
  ///
  /// The 2(P-1) steps run as one pipeline of chunks: chunk c of step t+1 is
  /// sent as soon as chunk c of step t has been received (and reduced), so
  /// steps overlap and no rank waits for a whole segment. Reduce-scatter
  /// chunks land in `Window` scratch slots (Window·ChunkBytes of scratch, hot
  /// in cache when reduced) and are reduced straight into ctx.output
  /// (out of place: input + incoming, so the buffer is never copied whole);
  /// all-gather chunks land in place. At most `Window` receives and
  /// `Window` sends ahead of the last reduced chunk are posted.
  static pdcoll::detail::collective_task all_reduce(pdcoll::detail::collective_context& ctx) {
    using pdcoll::detail::transfer_batch;
    const int P = ctx.world_size, r = ctx.rank;
    const std::size_t n = ctx.count, es = ctx.element_size;
    if (P == 1 || n == 0) {
      ctx.copy(ctx.output, 0, ctx.input, 0, ctx.bytes(n));
      co_return std::error_code{};
    }
    const bool in_place = ctx.input.address == ctx.output.address;
    const int right = (r + 1) % P, left = (r - 1 + P) % P;
    const int steps = 2 * (P - 1);
    const std::size_t chunk = chunk_elements(es);
    const std::size_t largest = detail::segment_size(n, P, 0);
    const std::size_t per_segment = chunks_in(largest, chunk);  // message indices per step
    const std::size_t slot_bytes = std::min(chunk, largest) * es;

    // The segment sent at step t is the one received at step t-1.
    auto send_segment = [&](int t) {
      return static_cast<std::size_t>(t < P - 1 ? (r - t + P) % P : (r - (t - (P - 1)) + 1 + P) % P);
    };
    auto chunks_of_step = [&](int t) { return chunks_in(detail::segment_size(n, P, send_segment(t)), chunk); };
    // Elements [first, first + size) of chunk c of the segment sent at step t.
    struct piece {
      std::size_t first, size;
      std::uint32_t index;
    };
    auto piece_of = [&](int t, std::size_t c) {
      const std::size_t seg = send_segment(t), size = detail::segment_size(n, P, seg);
      const std::size_t off = std::min(size, c * chunk);
      return piece{detail::segment_begin(n, P, seg) + off, std::min(chunk, size - off),
                   static_cast<std::uint32_t>(static_cast<std::size_t>(t) * per_segment + c)};
    };
    struct cursor {
      int t = 0;
      std::size_t c = 0;
    };
    // Sends at step t cut segment send_segment(t); receives at step t cut send_segment(t + 1).
    auto advance = [&](cursor& k, int ahead) {
      if (++k.c == chunks_of_step(k.t + ahead)) k = {k.t + 1, 0};
    };

    std::size_t total = 0, total_received = 0;  // segments differ by one element: counts may differ
    for (int t = 0; t < steps; ++t) total += chunks_of_step(t), total_received += chunks_of_step(t + 1);
    const std::size_t first_step = chunks_of_step(0);
    // Reduce-scatter receives come first in the order, so slot (k % Window)
    // of receive k never exceeds the number of reduce-scatter chunks.
    std::size_t reduce_chunks = 0;
    for (int t = 1; t < P; ++t) reduce_chunks += chunks_of_step(t);
    auto slots = ctx.scratch(slot_bytes * std::min<std::size_t>(Window, reduce_chunks));
    // Every step sends as many chunks as the step before it received, so
    // send k (k >= first_step) carries what receive k - first_step brought.
    cursor send_at, recv_at, done_at;
    std::size_t sent = 0, posted = 0, processed = 0;
    std::deque<transfer_batch> sends, recvs;
    auto post_send = [&] {
      const auto p = piece_of(send_at.t, send_at.c);
      auto& b = sends.emplace_back(ctx, 1);
      b.send(right, send_at.t == 0 ? ctx.input : ctx.output, p.first * es, p.size * es, p.index);
      b.post();
      advance(send_at, 0);
      ++sent;
    };
    std::error_code first;
    while (processed < total_received) {
      // Receives go out before the sends they unblock: libfabric 1.17 shm
      // stalls on large (CMA) messages that arrive before their receive
      // (ofiwg/libfabric#9853), so each rank keeps its receives posted ahead.
      while (posted < total_received && posted < processed + Window) {
        // Receive at step t brings the segment sent at step t + 1.
        const auto p = piece_of(recv_at.t + 1, recv_at.c);
        auto& b = recvs.emplace_back(ctx, 1);
        if (recv_at.t < P - 1) b.recv(left, slots, (posted % Window) * slot_bytes, p.size * es, p.index - per_segment);
        else b.recv(left, ctx.output, p.first * es, p.size * es, p.index - per_segment);
        b.post();
        advance(recv_at, 1);
        ++posted;
      }
      while (sent < total && sent < processed + Window && (sent < first_step || processed > sent - first_step))
        post_send();
      while (!sends.empty() && sends.front().done() && !sends.front().error()) sends.pop_front();
      if (auto ec = co_await recvs.front()) {
        first = ec;
        break;
      }
      if (done_at.t < P - 1) {  // reduce-scatter: output = (input or output) + incoming
        const auto p = piece_of(done_at.t + 1, done_at.c);
        if (!in_place) ctx.copy(ctx.output, p.first * es, ctx.input, p.first * es, p.size * es);
        ctx.reduce(ctx.output, p.first * es, slots, (processed % Window) * slot_bytes, p.size);
      }
      recvs.pop_front();
      advance(done_at, 1);
      ++processed;
    }
    if (!first)  // everything is received, so every send is ready; the window held back the last ones
      while (sent < total) post_send();
    if (first) {
      for (auto& b : recvs) b.cancel();
      for (auto& b : sends) b.cancel();
    }
    for (auto& b : recvs)
      if (auto ec = co_await b; ec && !first) first = ec;
    for (auto& b : sends)
      if (auto ec = co_await b; ec && !first) first = ec;
    co_return first;
  }

  /// All-gather: ctx.input (count elements) from every rank, concatenated in
  /// rank order into ctx.output (P·count elements).
  static pdcoll::detail::collective_task all_gather(pdcoll::detail::collective_context& ctx) {
    const int P = ctx.world_size, r = ctx.rank;
    const std::size_t block = ctx.bytes(ctx.count);
    ctx.copy(ctx.output, static_cast<std::size_t>(r) * block, ctx.input, 0, block);
    if (P == 1 || block == 0) co_return std::error_code{};
    const int right = (r + 1) % P, left = (r - 1 + P) % P;
    const std::size_t chunk = chunk_elements(ctx.element_size) * ctx.element_size;
    const std::size_t chunks = (block + chunk - 1) / chunk;
    for (int s = 0; s < P - 1; ++s) {
      const auto send_blk = static_cast<std::size_t>((r - s + P) % P);
      const auto recv_blk = static_cast<std::size_t>((r - s - 1 + P) % P);
      if (auto ec = co_await exchange_chunked(ctx, chunk, right, ctx.output, send_blk * block, block, left,
                                              ctx.output, recv_blk * block, block,
                                              static_cast<std::uint32_t>(s * chunks), [](std::size_t, std::size_t) {}))
        co_return ec;
    }
    co_return std::error_code{};
  }

  /// Reduce-scatter: ctx.input holds P blocks of count elements; rank r ends
  /// with the reduction of every rank's block r in ctx.output.
  ///
  /// Step s sends the partial sum of block r-s-1 (at step 0 straight from
  /// the input) and receives the partial sum of block r-s-2, combined with
  /// this rank's own block chunk by chunk as it arrives. Partial sums
  /// alternate between two block-sized scratch buffers (a step's send has
  /// completed before the next step receives over it); the last step's
  /// block is this rank's own and is combined straight into the output.
  /// Nothing is copied whole: each rank reads its input once.
  static pdcoll::detail::collective_task reduce_scatter(pdcoll::detail::collective_context& ctx) {
    const int P = ctx.world_size, r = ctx.rank;
    const std::size_t block = ctx.bytes(ctx.count), es = ctx.element_size;
    if (P == 1 || block == 0) {
      ctx.copy(ctx.output, 0, ctx.input, static_cast<std::size_t>(r) * block, block);
      co_return std::error_code{};
    }
    const bool in_place = ctx.output.address == ctx.input.address + static_cast<std::size_t>(r) * block;
    pdcoll::detail::buffer_desc partial[2] = {};
    if (P > 2) partial[0] = ctx.scratch(block), partial[1] = ctx.scratch(block);
    // In place the output is this rank's input block: the last step's
    // arrivals wait in scratch until they are combined into it.
    pdcoll::detail::buffer_desc last_in = in_place ? (P > 2 ? partial[(P - 2) & 1] : ctx.scratch(block)) : ctx.output;
    const int right = (r + 1) % P, left = (r - 1 + P) % P;
    // Whole elements per chunk, so that each chunk reduces on its own.
    const std::size_t chunk = chunk_elements(es) * es;
    const std::size_t chunks = (block + chunk - 1) / chunk;
    for (int s = 0; s < P - 1; ++s) {
      const auto send_blk = static_cast<std::size_t>((r - s - 1 + 2 * P) % P);
      const auto recv_blk = static_cast<std::size_t>((r - s - 2 + 2 * P) % P);
      const bool last = s == P - 2;
      const auto& send_buf = s == 0 ? ctx.input : partial[(s - 1) & 1];
      const std::size_t send_off = s == 0 ? send_blk * block : 0;
      const auto& recv_buf = last ? last_in : partial[s & 1];
      if (auto ec = co_await exchange_chunked(
              ctx, chunk, right, send_buf, send_off, block, left, recv_buf, 0, block, static_cast<std::uint32_t>(s * chunks),
              [&](std::size_t off, std::size_t bytes) {
                // op(own, incoming), as the all-reduce's ring combines (custom
                // ops need not be commutative in ties).
                if (bytes == 0) return;
                std::byte* const to = (last && in_place ? ctx.output.address : recv_buf.address) + off;
                ctx.red->apply3(to, ctx.input.address + recv_blk * block + off, recv_buf.address + off, bytes / es);
              }))
        co_return ec;
    }
    co_return std::error_code{};
  }

  /// Elements per chunk for elements of `element_size` bytes (at least one).
  static constexpr std::size_t chunk_elements(std::size_t element_size) noexcept {
    return std::max<std::size_t>(1, ChunkBytes / element_size);
  }
  /// Chunks a segment of `elements` is cut into (one, possibly empty, for an empty segment).
  static constexpr std::size_t chunks_in(std::size_t elements, std::size_t chunk) noexcept {
    return elements == 0 ? 1 : (elements + chunk - 1) / chunk;
  }

  /// Sends `send_bytes` at send_buf+send_off to `to` and receives
  /// `recv_bytes` into recv_buf+recv_off from `from`, both in chunks of
  /// `chunk` bytes (whole elements, see chunk_elements);
  /// calls on_chunk(offset, bytes) for each received chunk as soon as it is in.
  template <class OnChunk>
  static pdcoll::detail::collective_task exchange_chunked(pdcoll::detail::collective_context& ctx, std::size_t chunk,
                                                          int to, pdcoll::detail::buffer_desc send_buf,
                                                          std::size_t send_off,
                                                          std::size_t send_bytes, int from,
                                                          pdcoll::detail::buffer_desc recv_buf, std::size_t recv_off,
                                                          std::size_t recv_bytes, std::uint32_t index_base,
                                                          OnChunk on_chunk) {
    using pdcoll::detail::transfer_batch;
    const std::size_t send_chunks = send_bytes == 0 ? 1 : (send_bytes + chunk - 1) / chunk;
    const std::size_t recv_chunks = recv_bytes == 0 ? 1 : (recv_bytes + chunk - 1) / chunk;
    transfer_batch sends(ctx, send_chunks);
    for (std::size_t c = 0; c < send_chunks; ++c) {
      std::size_t off = c * chunk, len = std::min(chunk, send_bytes - std::min(send_bytes, off));
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
      std::size_t off = c * chunk, len = std::min(chunk, recv_bytes - off);
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
      if (!first) on_chunk(c * chunk, std::min(chunk, recv_bytes - c * chunk));
    }
    auto send_ec = co_await sends;
    co_return first ? first : send_ec;
  }
};

/// Ring algorithms with the default 1 MiB chunks, up to 8 in flight.
using ring = ring_chunked<>;

}  // namespace pdcoll::algo
