// File: algorithm/shared_memory.hpp — all-reduces through memory that every
// rank maps (transport/node_memory.hpp), for ranks on one host:
// shared_memory (one reduction of everything, for latency) and
// shared_memory_scatter (a reduce-scatter and an all-gather, for bandwidth);
// and shared_memory's other collectives, which take the same steps (a chunk
// into the own slot, then every peer's out of theirs):
//   - all-gather: each rank's chunk of its block in, every peer's out;
//   - reduce-scatter and all-to-all: a chunk of each other rank's block
//     into its section of the slot; then section r of every slot combined
//     in rank order (reduce-scatter) or copied to its block (all-to-all);
//   - broadcast: only the root fills its slot, the others copy it out;
//     the root fills step s+1 while they read step s;
//   - reduce: every rank but the root fills its slot, and the root
//     combines them in rank order with its own input;
//   - the v forms (all_to_allv, all_gatherv): one step whatever the
//     counts, since no rank knows the others' largest block. Each rank
//     writes the length of every block it sends at the head of its slot,
//     and each block of up to a per-peer section (all_gatherv: the one
//     block, once) after it; larger blocks go as messages posted before the
//     step. Both ends of a pair see the same block size, so they take the
//     same path, and each receiver checks the length its sender wrote.
//
// Every rank copies its contribution into its own region, raises a flag,
// waits for every rank's flag, then reduces all contributions in rank order
// straight from the regions into its output: one step, no messages, and
// bit-identical results on every rank. Where the transport's messages cost
// a queue entry, a completion and (for more than a few KiB) a page-pinning
// copy per message, this costs two cache-line handshakes per chunk.
//
// Cost (P ranks, n bytes): each rank copies n bytes into its region and
// reduces P·n bytes from the regions into its output (the first two
// contributions in one pass); buffers larger than a region's slot go in slot-sized
// chunks, two in flight (each region holds two slots, used alternately).
//
// The protocol. Chunks are numbered by a per-communicator step sequence
// that every rank advances identically: each collective reserves its steps
// when it starts (starts are in the same order on every rank, or the
// signature check fails them), so concurrent collectives interleave safely.
// Step s uses slot s mod 2 of every region. Rank r, for step s:
//   1. waits until every rank has consumed step s-2 (so slot s mod 2 of its
//      region is free), copies its chunk in, stores the collective's
//      signature, then publishes s (release);
//   2. waits until every rank has published s, checks their signatures
//      (a different collective: collective_mismatch), reduces;
//   3. marks s consumed (release).
// After each store it wakes peers that sleep in their endpoint's wait().
// A rank that dies leaves its flags where they were: the survivors' waits
// end with the collective's deadline, like a lost message.
//
// shared_memory_scatter, for larger buffers, splits each chunk into P
// blocks and adds one handshake: after step 2, rank r reduces only block r
// (in rank order, its own contribution read from its input) into block r
// of its own slot and marks the step `reduced`; once every rank has, it
// copies every other block from its owner's slot into its output, then
// marks s consumed. Each rank moves about 4.5n bytes of memory traffic
// (n(P-1)/P copied in, n read and 2n/P written by the reduction, n(P-1)/P
// copied out) where shared_memory moves (P+3)n, and reduces n/P elements
// instead of n; the second handshake costs what that saves below ~32 KiB.
//
// Direct, over node-shareable buffers (memory/node_shareable.hpp): from
// node_direct_bytes up, shared_memory_scatter first spends one step on the
// question. Each rank writes where its input and output live (or that they
// are not shareable) and publishes the step; each maps every peer's buffers
// read-only (memory/peer_mappings.hpp, cached) and votes (no vote when
// some rank's buffers are not shareable: every rank sees that and copies).
// If every vote is yes, rank r reduces block r of the whole buffer in rank order straight
// from every rank's input into its own output, raises `reduced`, copies
// every other block from its owner's output, raises `consumed`, and
// completes only once every rank has (its buffers are the user's again).
// Each rank then moves about 2.5n bytes on 2 ranks (n read and n/2 written
// by the reduction, n/2 copied) against 4.5n through the slots, and the
// copies into node memory are gone. Otherwise every rank runs the chunks
// below in the steps reserved after it. The cost of asking is a few
// stores for a rank whose own buffers are ordinary (it does not wait for
// the others' answers) and two handshakes for shareable ones, noise from
// node_direct_bytes up.
//
// Out of place, from node_stream_output_bytes up, shared_memory_scatter
// writes the output with non-temporal stores (detail/stream_copy.hpp): the
// output is not in cache, and each ordinary store would first read its line
// from memory, a third of a 2-rank out-of-place all-reduce's memory
// traffic. In place the output's lines were just read as input, so plain
// copies stay.
//
// Without node memory (another transport, ranks on several hosts, a staged
// device buffer) the ring runs instead (the tree for broadcast and reduce,
// pairwise exchange for all-to-all).
#pragma once

#include <pdcoll/algorithm/detail/node_direct.hpp>
#include <pdcoll/algorithm/direct.hpp>
#include <pdcoll/algorithm/ring.hpp>
#include <pdcoll/algorithm/tree.hpp>
#include <pdcoll/detail/collective_operation.hpp>
#include <pdcoll/detail/node_layout.hpp>
#include <pdcoll/detail/stream_copy.hpp>
#include <pdcoll/transport/node_memory.hpp>

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <vector>

namespace pdcoll::algo {

/// All-reduces through node memory of at most this many bytes run as the
/// operation's one-step path (detail/node_small_all_reduce.hpp): the same
/// exchange and result as shared_memory's single step, without its
/// coroutines and registrations. Above it those costs are noise.
inline constexpr std::size_t node_small_all_reduce_bytes = std::size_t{32} << 10;

/// Out-of-place all-reduces of at least this many bytes write their output
/// through shared_memory_scatter with non-temporal stores (see the file
/// comment). Measured on the reference machine (pdcoll-bench over shm, float
/// sum, three interleaved runs of each build): 2 ranks out of place 16 MiB
/// 2.8-4.4 -> 2.2-2.7 ms, 64 MiB 12.3-14.9 -> 9.4-11.6 ms, 256 MiB 49-59 ->
/// 38-40 ms; 4 ranks 64 MiB 27-65 -> 22-26 ms; 4 MiB unchanged within the
/// noise. Smaller outputs may still be in cache, and the caller is about
/// to read them.
inline constexpr std::size_t node_stream_output_bytes = std::size_t{8} << 20;

/// shared_memory_scatter all-reduces of at least this many bytes first ask
/// whether every rank's buffers are node-shareable (host::allocate_shareable)
/// and, if so, run directly on them (see the file comment). Below it the
/// extra handshakes cost more than the copies they save.
inline constexpr std::size_t node_direct_bytes = std::size_t{256} << 10;

/// Every collective but the barrier through node memory (see the file
/// comment); without it the message algorithm each member names.
struct shared_memory {
  /// Name for diagnostics and PDCOLL_ALGO.
  static constexpr const char* name = "shared_memory";
  /// Sizes that take the one-step path (collective_spec::node_small_bytes).
  static std::size_t node_small_bytes() noexcept { return node_small_all_reduce_bytes; }

  /// All-reduce of ctx.input into ctx.output.
  static pdcoll::detail::collective_task all_reduce(pdcoll::detail::collective_context& ctx) {
    auto* node = ctx.node_memory();
    if (!node || ctx.world_size == 1 || pdcoll::detail::node_step::slot_bytes(*node) < ctx.element_size)
      return ring::all_reduce(ctx);
    return through(ctx, *node);
  }

  /// Reduce-scatter through node memory: per step, each rank copies a chunk
  /// of every other rank's block into its slot; rank r combines chunk r of
  /// every slot (its own contribution read from its input) in rank order
  /// into its output. The ring without node memory, or with a slot too
  /// small for an element per rank.
  static pdcoll::detail::collective_task reduce_scatter(pdcoll::detail::collective_context& ctx) {
    auto* node = ctx.node_memory();
    const std::uint64_t steps = node ? blockwise_steps(ctx, *node) : 0;
    if (steps == 0) return ring::reduce_scatter(ctx);
    return reduce_scatter_in(ctx, *node, ctx.reserve_node_steps(steps));
  }

  /// All-gather through node memory: per step, each rank copies a chunk of
  /// its block into its slot and then every peer's chunk out of theirs. The
  /// ring without node memory.
  static pdcoll::detail::collective_task all_gather(pdcoll::detail::collective_context& ctx) {
    auto* node = ctx.node_memory();
    const std::uint64_t steps = node ? all_gather_steps(ctx, *node) : 0;
    if (steps == 0) return ring::all_gather(ctx);
    return all_gather_in(ctx, *node, ctx.reserve_node_steps(steps));
  }

  /// Broadcast through node memory: per step, the root copies a chunk of its
  /// input into its slot and every other rank copies it into its output. The
  /// binomial tree (algo::tree) without node memory.
  static pdcoll::detail::collective_task broadcast(pdcoll::detail::collective_context& ctx) {
    auto* node = ctx.node_memory();
    const std::uint64_t steps = node ? whole_steps(ctx, *node, ctx.bytes(ctx.count)) : 0;
    if (steps == 0) return tree::broadcast(ctx);
    return broadcast_in(ctx, *node, ctx.reserve_node_steps(steps));
  }

  /// Reduce through node memory: per step, every rank but the root copies a
  /// chunk of its input into its slot; the root combines every rank's chunk
  /// in rank order (its own read from its input) into its output. The
  /// binomial tree (algo::tree) without node memory.
  static pdcoll::detail::collective_task reduce(pdcoll::detail::collective_context& ctx) {
    auto* node = ctx.node_memory();
    const std::uint64_t steps = node ? whole_steps(ctx, *node, ctx.bytes(ctx.count)) : 0;
    if (steps == 0) return tree::reduce(ctx);
    return reduce_in(ctx, *node, ctx.reserve_node_steps(steps));
  }

  /// All-to-all through node memory: per step, each rank copies a chunk of
  /// every other rank's block into its slot, then chunk r of every peer's
  /// slot into that peer's block of its output. Pairwise exchange
  /// (algo::pairwise) without node memory.
  static pdcoll::detail::collective_task all_to_all(pdcoll::detail::collective_context& ctx) {
    auto* node = ctx.node_memory();
    const std::uint64_t steps = node ? blockwise_steps(ctx, *node) : 0;
    if (steps == 0) return pairwise::all_to_all(ctx);
    return all_to_all_in(ctx, *node, ctx.reserve_node_steps(steps));
  }

  /// all_to_allv through node memory: one step carries every block of up
  /// to v_section_bytes and every block's length, which its receiver checks
  /// (collective_mismatch where the two ends disagree); larger blocks go as
  /// one message each, all posted at once (direct's exchange). Pairwise
  /// exchange without node memory. See v_through.
  static pdcoll::detail::collective_task all_to_allv(pdcoll::detail::collective_context& ctx) {
    return v_form(ctx, false);
  }
  /// all_gatherv through node memory: as all_to_allv, with this rank's one
  /// block in its slot for every peer to read (up to v_section_bytes).
  static pdcoll::detail::collective_task all_gatherv(pdcoll::detail::collective_context& ctx) {
    return v_form(ctx, true);
  }

  /// all_to_allv, or all_gatherv (one_block), as above.
  static pdcoll::detail::collective_task v_form(pdcoll::detail::collective_context& ctx, bool one_block) {
    auto* node = ctx.node_memory();
    if (!node || ctx.world_size == 1 || !v_header_fits(ctx, *node))
      return one_block ? pairwise::all_gatherv(ctx) : pairwise::all_to_allv(ctx);
    return v_through(ctx, *node, ctx.reserve_node_steps(1), v_section_bytes(ctx, *node, one_block), one_block);
  }

  /// Bytes at the start of a slot that hold the v forms' block lengths
  /// (one 8-byte length per rank, in whole cache lines).
  static std::size_t v_header_bytes(const pdcoll::detail::collective_context& ctx) noexcept {
    return (static_cast<std::size_t>(ctx.world_size) * sizeof(std::uint64_t) + 63) / 64 * 64;
  }
  /// The v forms' lengths fit in a slot (every world size short of about a
  /// thousand ranks); else they run by messages.
  static bool v_header_fits(const pdcoll::detail::collective_context& ctx, const transport::node_memory& node) noexcept {
    return v_header_bytes(ctx) <= pdcoll::detail::node_step::slot_bytes(node);
  }
  /// The largest block the v forms' node step carries: a slot's section
  /// per peer (all_to_allv) or the whole slot (all_gatherv, one_block),
  /// after the lengths; a multiple of 64 (possibly 0: only lengths).
  static std::size_t v_section_bytes(const pdcoll::detail::collective_context& ctx, const transport::node_memory& node,
                                     bool one_block) noexcept {
    const std::size_t payload = pdcoll::detail::node_step::slot_bytes(node) - v_header_bytes(ctx);
    return (one_block ? payload : payload / static_cast<std::size_t>(ctx.world_size)) / 64 * 64;
  }

  /// The v forms in node step `first` (reserved by the caller before its
  /// first suspension; one step whatever the counts, so every rank reserves
  /// the same). Blocks of at most `cap` bytes go through the slots and
  /// larger ones as messages; both ends of a pair see the same block size
  /// and so take the same path. Rank r's slot holds, per peer q, the length
  /// of its block for q and, when that is at most cap, the block: in
  /// section q (all_to_allv) or once for every peer (one_block,
  /// all_gatherv, whose every send block is the input), and in its own
  /// entry r, cap: ranks that named different algorithms (shared_memory and
  /// automatic pass different caps where the node's verdict favours
  /// messages) would otherwise disagree on the path of
  /// a block between the two. A receiver finding a length other than it
  /// expects, or another cap, fails with collective_mismatch, which aborts
  /// the communicator, so a message its sender posted for a block it does
  /// not receive is cancelled rather than waited for. Not for staged chunks
  /// (they have no node memory, and may leave blocks out).
  static pdcoll::detail::collective_task v_through(pdcoll::detail::collective_context& ctx,
                                                   transport::node_memory& node, std::uint64_t first, std::size_t cap,
                                                   bool one_block) {
    using pdcoll::detail::condition_wait;
    using pdcoll::detail::transfer_batch;
    const int r = ctx.rank, P = ctx.world_size;
    const std::size_t header = v_header_bytes(ctx), stride = one_block ? 0 : v_section_bytes(ctx, node, false);
    assert(cap <= v_section_bytes(ctx, node, one_block) && ctx.absent_blocks.empty());
    auto section = [&](int q) { return header + static_cast<std::size_t>(q) * stride; };
    // Entry q of a slot's header: the length of the block for q; entry
    // `owner`: the owner's cap.
    auto header_word = [](const std::byte* slot, int q) {
      std::uint64_t word = 0;
      std::memcpy(&word, slot + static_cast<std::size_t>(q) * sizeof word, sizeof word);
      return word;
    };
    ctx.copy(ctx.output, ctx.recv_offset(r), ctx.input, ctx.send_offset(r), ctx.recv_bytes(r));
    // The large blocks, posted before the step (pairwise order, as direct).
    transfer_batch b(ctx, 2 * static_cast<std::size_t>(P - 1));
    for (int k = 1; k < P; ++k) {
      const int to = (r + k) % P, from = (r - k + P) % P;
      if (ctx.recv_bytes(from) > cap) b.recv(from, ctx.output, ctx.recv_offset(from), ctx.recv_bytes(from), 0);
      if (ctx.send_bytes(to) > cap) b.send(to, ctx.input, ctx.send_offset(to), ctx.send_bytes(to), 0);
    }
    b.post();

    const pdcoll::detail::node_step s{&node, P, first};
    const std::uint64_t signature = ctx.signature();
    condition_wait slot_free(ctx, &pdcoll::detail::node_step::slot_free, &s);
    std::error_code ec = co_await slot_free;
    if (!ec) {
      std::byte* const mine = s.slot(r);
      bool filled = false;
      for (int q = 0; q < P; ++q) {
        const std::size_t bytes = ctx.send_bytes(q);
        const std::uint64_t word = q == r ? cap : bytes;
        std::memcpy(mine + static_cast<std::size_t>(q) * sizeof word, &word, sizeof word);
        if (q == r || bytes == 0 || bytes > cap || (one_block && filled)) continue;
        std::memcpy(mine + section(q), ctx.input.address + ctx.send_offset(q), bytes);
        filled = true;
      }
      s.publish(r, signature);
      condition_wait published(ctx, &pdcoll::detail::node_step::all_published, &s);
      ec = co_await published;
    }
    if (!ec && !s.signatures_match(signature)) ec = make_error_code(errc::collective_mismatch);
    for (int q = 0; q < P && !ec; ++q) {
      if (q == r) continue;
      const std::size_t bytes = ctx.recv_bytes(q);
      if (header_word(s.slot(q), r) != bytes || header_word(s.slot(q), q) != cap)
        ec = make_error_code(errc::collective_mismatch);
      else if (bytes != 0 && bytes <= cap)
        std::memcpy(ctx.output.address + ctx.recv_offset(q), s.slot(q) + section(r), bytes);
    }
    if (ec) {
      // The large blocks' transfers end before this frame does, through the
      // operation's progress (where an abort may close a data path that
      // ignores the cancel), never in the batch's bounded drain.
      b.cancel();
      (void)co_await b;
      co_return ec;
    }
    s.raise(r, &pdcoll::detail::node_flags::consumed);
    co_return co_await b;
  }

  /// Bytes of one slot-sized chunk of ctx's elements.
  static std::size_t chunk_bytes(const pdcoll::detail::collective_context& ctx,
                                 const transport::node_memory& node) noexcept {
    return pdcoll::detail::node_step::slot_bytes(node) / ctx.element_size * ctx.element_size;
  }
  /// Node-memory steps that move `bytes` in slot-sized chunks (all-gather's
  /// block, broadcast's and reduce's buffer); 0 (the message algorithm runs)
  /// on one rank, for nothing, or with a slot too small for an element.
  static std::uint64_t whole_steps(const pdcoll::detail::collective_context& ctx, const transport::node_memory& node,
                                   std::size_t bytes) noexcept {
    const std::size_t chunk = chunk_bytes(ctx, node);
    if (ctx.world_size == 1 || bytes == 0 || chunk == 0) return 0;
    return (bytes + chunk - 1) / chunk;
  }
  /// Node-memory steps all_gather takes for ctx (0: it runs the ring).
  static std::uint64_t all_gather_steps(const pdcoll::detail::collective_context& ctx,
                                        const transport::node_memory& node) noexcept {
    return whole_steps(ctx, node, ctx.bytes(ctx.count));
  }
  /// Elements of each block one step moves in the blockwise collectives
  /// (reduce_scatter, all_to_all): P of them fill a slot.
  static std::size_t block_chunk(const pdcoll::detail::collective_context& ctx,
                                 const transport::node_memory& node) noexcept {
    return pdcoll::detail::node_step::slot_bytes(node) / ctx.element_size / static_cast<std::size_t>(ctx.world_size);
  }
  /// Node-memory steps reduce_scatter and all_to_all take for ctx (0: they
  /// run their message algorithm).
  static std::uint64_t blockwise_steps(const pdcoll::detail::collective_context& ctx,
                                       const transport::node_memory& node) noexcept {
    const std::size_t chunk = block_chunk(ctx, node);
    if (ctx.world_size == 1 || ctx.count == 0 || chunk == 0) return 0;
    return (ctx.count + chunk - 1) / chunk;
  }

  /// reduce_scatter in the blockwise_steps(ctx, node) steps from `first`,
  /// which the caller reserved (ctx.reserve_node_steps) before its first
  /// suspension.
  static pdcoll::detail::collective_task reduce_scatter_in(pdcoll::detail::collective_context& ctx,
                                                           transport::node_memory& node, std::uint64_t first) {
    return block_steps(ctx, node, first,
                       [](pdcoll::detail::collective_context& c, const pdcoll::detail::node_step& s,
                          std::size_t e0, std::size_t bytes, std::size_t section) {
                         // Rank order, this rank's own contribution read from
                         // its input; in place on rank 2 and up the sum goes
                         // through section r of this rank's own slot (no peer
                         // reads it).
                         const int r = c.rank;
                         const std::size_t mine = static_cast<std::size_t>(r) * section;
                         const std::byte* const own = c.input.address + (static_cast<std::size_t>(r) * c.count + e0) * c.element_size;
                         detail::node_combine_into(c, c.output.address + e0 * c.element_size, s.slot(r) + mine, bytes,
                                                   [&](int q) -> const std::byte* { return q == r ? own : s.slot(q) + mine; });
                       });
  }

  /// all_gather in the all_gather_steps(ctx, node) steps from `first`,
  /// which the caller reserved before its first suspension.
  static pdcoll::detail::collective_task all_gather_in(pdcoll::detail::collective_context& ctx,
                                                       transport::node_memory& node, std::uint64_t first) {
    // This rank's own block first (in place it is already there).
    const std::size_t block = ctx.bytes(ctx.count);
    ctx.copy(ctx.output, static_cast<std::size_t>(ctx.rank) * block, ctx.input, 0, block);
    return chunk_steps(ctx, node, block, first, copy_input_chunk{},
                       [block](pdcoll::detail::collective_context& c, const pdcoll::detail::node_step& s,
                               std::size_t offset, std::size_t bytes) {
                         for (int q = 0; q < c.world_size; ++q)
                           if (q != c.rank)
                             std::memcpy(c.output.address + static_cast<std::size_t>(q) * block + offset, s.slot(q), bytes);
                       });
  }

  /// broadcast in the whole_steps steps from `first`.
  static pdcoll::detail::collective_task broadcast_in(pdcoll::detail::collective_context& ctx,
                                                      transport::node_memory& node, std::uint64_t first) {
    const std::size_t total = ctx.bytes(ctx.count);
    if (ctx.rank == ctx.root) ctx.copy(ctx.output, 0, ctx.input, 0, total);
    return chunk_steps(
        ctx, node, total, first,
        [](pdcoll::detail::collective_context& c, const pdcoll::detail::node_step& s, std::size_t offset,
           std::size_t bytes) {
          if (c.rank == c.root) std::memcpy(s.slot(c.rank), c.input.address + offset, bytes);
        },
        [](pdcoll::detail::collective_context& c, const pdcoll::detail::node_step& s, std::size_t offset,
           std::size_t bytes) {
          if (c.rank != c.root) std::memcpy(c.output.address + offset, s.slot(c.root), bytes);
        });
  }

  /// reduce in the whole_steps steps from `first`.
  static pdcoll::detail::collective_task reduce_in(pdcoll::detail::collective_context& ctx,
                                                   transport::node_memory& node, std::uint64_t first) {
    return chunk_steps(
        ctx, node, ctx.bytes(ctx.count), first,
        [](pdcoll::detail::collective_context& c, const pdcoll::detail::node_step& s, std::size_t offset,
           std::size_t bytes) {
          if (c.rank != c.root) std::memcpy(s.slot(c.rank), c.input.address + offset, bytes);
        },
        [](pdcoll::detail::collective_context& c, const pdcoll::detail::node_step& s, std::size_t offset,
           std::size_t bytes) {
          if (c.rank != c.root) return;
          // In place on a root of rank 2 or later the sum goes through the
          // root's own slot, which it does not fill and no peer reads.
          const std::byte* const own = c.input.address + offset;
          detail::node_combine_into(c, c.output.address + offset, s.slot(c.rank), bytes,
                                    [&](int q) -> const std::byte* { return q == c.rank ? own : s.slot(q); });
        });
  }

  /// all_to_all in the blockwise_steps(ctx, node) steps from `first`.
  static pdcoll::detail::collective_task all_to_all_in(pdcoll::detail::collective_context& ctx,
                                                       transport::node_memory& node, std::uint64_t first) {
    // This rank's own block (input and output never overlap).
    const std::size_t block = ctx.bytes(ctx.count);
    const auto r = static_cast<std::size_t>(ctx.rank);
    ctx.copy(ctx.output, r * block, ctx.input, r * block, block);
    return block_steps(ctx, node, first,
                       [block](pdcoll::detail::collective_context& c, const pdcoll::detail::node_step& s,
                               std::size_t e0, std::size_t bytes, std::size_t section) {
                         const std::size_t mine = static_cast<std::size_t>(c.rank) * section;
                         for (int q = 0; q < c.world_size; ++q)
                           if (q != c.rank)
                             std::memcpy(c.output.address + static_cast<std::size_t>(q) * block + e0 * c.element_size,
                                         s.slot(q) + mine, bytes);
                       });
  }

 private:
  static pdcoll::detail::collective_task through(pdcoll::detail::collective_context& ctx,
                                                 transport::node_memory& node) {
    const std::size_t total = ctx.bytes(ctx.count);
    const std::size_t chunk = chunk_bytes(ctx, node);
    const std::uint64_t chunks = total == 0 ? 0 : (total + chunk - 1) / chunk;
    return chunk_steps(ctx, node, total, ctx.reserve_node_steps(chunks), copy_input_chunk{},
                       [](pdcoll::detail::collective_context& c, const pdcoll::detail::node_step& s,
                          std::size_t offset, std::size_t bytes) {
                         s.reduce_slots(c.output.address + offset, bytes / c.element_size, c.red->apply3, c.red->apply);
                       });
  }

  /// chunk_steps' usual fill: this rank's chunk of its input into its slot.
  struct copy_input_chunk {
    void operator()(pdcoll::detail::collective_context& c, const pdcoll::detail::node_step& s, std::size_t offset,
                    std::size_t bytes) const noexcept {
      std::memcpy(s.slot(c.rank), c.input.address + offset, bytes);
    }
  };

  /// `total` bytes in slot-sized chunks, one step each from `first`
  /// (reserved by the caller; see the file comment): fill(ctx, step, offset,
  /// bytes) writes what peers read of this rank's slot, the step is
  /// published, and once every rank has published it use(ctx, step, offset,
  /// bytes) reads the slots; then the step is marked consumed. Not inlined,
  /// for the reason detail::node_direct_handshake gives.
  template <class Fill, class Use>
  [[gnu::noinline]] static pdcoll::detail::collective_task chunk_steps(pdcoll::detail::collective_context& ctx,
                                                                      transport::node_memory& node,
                                                                      std::size_t total, std::uint64_t first,
                                                                      Fill fill, Use use) {
    using pdcoll::detail::condition_wait;
    const std::size_t chunk = chunk_bytes(ctx, node);
    const std::uint64_t chunks = total == 0 ? 0 : (total + chunk - 1) / chunk;
    const int r = ctx.rank, P = ctx.world_size;
    const std::uint64_t signature = ctx.signature();
    for (std::uint64_t k = 0; k < chunks; ++k) {
      const pdcoll::detail::node_step s{&node, P, first + k};
      const std::size_t offset = k * chunk, bytes = std::min(chunk, total - offset);

      condition_wait slot_free(ctx, &pdcoll::detail::node_step::slot_free, &s);
      if (auto ec = co_await slot_free) co_return ec;
      fill(ctx, s, offset, bytes);
      s.publish(r, signature);

      condition_wait published(ctx, &pdcoll::detail::node_step::all_published, &s);
      if (auto ec = co_await published) co_return ec;
      if (!s.signatures_match(signature)) co_return make_error_code(errc::collective_mismatch);
      use(ctx, s, offset, bytes);
      s.raise(r, &pdcoll::detail::node_flags::consumed);
    }
    co_return std::error_code{};
  }

  /// The blockwise collectives' steps (ctx.input holds P blocks of
  /// ctx.count elements), blockwise_steps(ctx, node) of them from `first`:
  /// each copies chunk k of every other rank's block q into section q of
  /// this rank's slot (sections of block_chunk elements), publishes, and
  /// once every rank has calls use(ctx, step, e0, bytes, section_bytes) for
  /// the chunk's first element e0 and size; then marks the step consumed.
  /// Not inlined, for the reason detail::node_direct_handshake gives.
  template <class Use>
  [[gnu::noinline]] static pdcoll::detail::collective_task block_steps(pdcoll::detail::collective_context& ctx,
                                                                      transport::node_memory& node,
                                                                      std::uint64_t first, Use use) {
    using pdcoll::detail::condition_wait;
    const int r = ctx.rank, P = ctx.world_size;
    const std::size_t es = ctx.element_size, count = ctx.count;
    const std::size_t chunk = block_chunk(ctx, node), section = chunk * es;
    const std::uint64_t chunks = blockwise_steps(ctx, node);
    const std::uint64_t signature = ctx.signature();
    const std::byte* const in = ctx.input.address;
    for (std::uint64_t k = 0; k < chunks; ++k) {
      const pdcoll::detail::node_step s{&node, P, first + k};
      const std::size_t e0 = k * chunk, bytes = std::min(chunk, count - e0) * es;

      condition_wait slot_free(ctx, &pdcoll::detail::node_step::slot_free, &s);
      if (auto ec = co_await slot_free) co_return ec;
      for (int q = 0; q < P; ++q)
        if (q != r)
          std::memcpy(s.slot(r) + static_cast<std::size_t>(q) * section, in + (static_cast<std::size_t>(q) * count + e0) * es,
                      bytes);
      s.publish(r, signature);

      condition_wait published(ctx, &pdcoll::detail::node_step::all_published, &s);
      if (auto ec = co_await published) co_return ec;
      if (!s.signatures_match(signature)) co_return make_error_code(errc::collective_mismatch);
      use(ctx, s, e0, bytes, section);
      s.raise(r, &pdcoll::detail::node_flags::consumed);
    }
    co_return std::error_code{};
  }
};

/// All-reduce through node memory as a reduce-scatter and an all-gather (see
/// the file comment); from node_direct_bytes, directly on the callers'
/// buffers when every rank's are node-shareable; shared_memory's single
/// step with fewer elements than ranks (or a slot too small for one element
/// per rank), the ring without node memory.
struct shared_memory_scatter {
  /// Name for diagnostics and PDCOLL_ALGO.
  static constexpr const char* name = "shared_memory_scatter";

  /// All-reduce of ctx.input into ctx.output.
  static pdcoll::detail::collective_task all_reduce(pdcoll::detail::collective_context& ctx) {
    auto* node = ctx.node_memory();
    const auto P = static_cast<std::size_t>(ctx.world_size);
    if (!node || P == 1 || ctx.count < P || pdcoll::detail::node_step::slot_bytes(*node) / ctx.element_size < P)
      return shared_memory::all_reduce(ctx);
    return through(ctx, *node);
  }

 private:
  static pdcoll::detail::collective_task through(pdcoll::detail::collective_context& ctx,
                                                 transport::node_memory& node) {
    using pdcoll::detail::condition_wait;
    using pdcoll::detail::node_flags;
    const int r = ctx.rank, P = ctx.world_size;
    const std::size_t es = ctx.element_size;
    // At least one element per rank (all_reduce checked); the last chunk may hold fewer.
    const std::size_t chunk = pdcoll::detail::node_step::slot_bytes(node) / es;
    const std::uint64_t chunks = (ctx.count + chunk - 1) / chunk;
    const std::size_t total = ctx.bytes(ctx.count);
    // A direct attempt takes one step ahead of the chunks; the same on every
    // rank, since the size is (the signature check sees to it).
    const std::uint64_t direct_steps = total >= node_direct_bytes ? 1 : 0;
    // Before the first suspension.
    const std::uint64_t first = ctx.reserve_node_steps(direct_steps + chunks);
    const std::uint64_t signature = ctx.signature();
    std::byte* const out = ctx.output.address;
    const std::byte* const in = ctx.input.address;
    const bool stream = out != in && total >= node_stream_output_bytes;
    auto copy_out = [stream](std::byte* to, const std::byte* from, std::size_t bytes) {
      if (stream) pdcoll::detail::stream_copy(to, from, bytes);
      else std::memcpy(to, from, bytes);
    };
    if (direct_steps != 0) {
      // The direct all-reduce (see the file comment), in step `first`.
      const pdcoll::detail::node_step s{&node, P, first};
      auto begin = [&](int q) { return detail::segment_begin(ctx.count, P, static_cast<std::size_t>(q)) * es; };
      auto size = [&](int q) { return detail::segment_size(ctx.count, P, static_cast<std::size_t>(q)) * es; };
      detail::node_direct_buffers buffers(P, in, total, out, total, /*peers_read_output=*/true);
      bool agreed = false;
      if (auto ec = co_await detail::node_direct_handshake::ask(ctx, s, buffers, agreed)) co_return ec;
      if (agreed) {
        // Block r in rank order from every rank's input into this rank's
        // output (in place, block r of the output is written only by this
        // rank, and peers read only their own blocks of it).
        detail::node_direct_reduce_block(ctx, out + begin(r), begin(r), size(r),
                                         [&](int q) { return buffers.input(q); });
        s.raise(r, &node_flags::reduced);

        condition_wait all_reduced(ctx, &pdcoll::detail::node_step::all_reduced, &s);
        if (auto ec = co_await all_reduced) co_return ec;
        for (int q = 0; q < P; ++q)
          if (q != r) copy_out(out + begin(q), buffers.output(q) + begin(q), size(q));
        // The user may change the buffers once this completes: not before
        // every peer has finished reading them.
        if (auto ec = co_await detail::node_direct_handshake::release(ctx, s, buffers)) co_return ec;
        co_return co_await detail::node_direct_handshake::skip(ctx, s, chunks);
      }
      // Some rank's buffers are not shareable, or not mappable here: copy.
      // No peer reads this rank's buffers.
      buffers.finish();
      s.raise(r, &node_flags::consumed);
    }
    for (std::uint64_t k = 0; k < chunks; ++k) {
      const pdcoll::detail::node_step s{&node, P, first + direct_steps + k};
      const std::size_t first_element = k * chunk, n = std::min(chunk, ctx.count - first_element);
      const std::size_t base = first_element * es;
      // Block q of this chunk: bytes [begin(q), begin(q) + size(q)) from base.
      auto begin = [&](int q) { return detail::segment_begin(n, P, static_cast<std::size_t>(q)) * es; };
      auto size = [&](int q) { return detail::segment_size(n, P, static_cast<std::size_t>(q)) * es; };

      condition_wait slot_free(ctx, &pdcoll::detail::node_step::slot_free, &s);
      if (auto ec = co_await slot_free) co_return ec;
      // Peers read every block but this rank's own from its slot.
      std::memcpy(s.slot(r), in + base, begin(r));
      std::memcpy(s.slot(r) + begin(r + 1), in + base + begin(r + 1), n * es - begin(r + 1));
      s.publish(r, signature);

      condition_wait published(ctx, &pdcoll::detail::node_step::all_published, &s);
      if (auto ec = co_await published) co_return ec;
      if (!s.signatures_match(signature)) co_return make_error_code(errc::collective_mismatch);
      // Block r in rank order (bit-identical everywhere), into this rank's
      // slot for the peers and then into its output. Its own contribution
      // comes from its input: with input == output, block r of the output is
      // written only after it has been read.
      const std::size_t mine = begin(r), count = size(r) / es;
      auto source = [&](int q) { return q == r ? in + base + mine : s.slot(q) + mine; };
      std::byte* const reduced = s.slot(r) + mine;
      ctx.red->apply3(reduced, source(0), source(1), count);
      for (int q = 2; q < P; ++q) ctx.red->apply(reduced, source(q), count);
      s.raise(r, &node_flags::reduced);
      copy_out(out + base + mine, reduced, size(r));

      condition_wait all_reduced(ctx, &pdcoll::detail::node_step::all_reduced, &s);
      if (auto ec = co_await all_reduced) co_return ec;
      for (int q = 0; q < P; ++q)
        if (q != r) copy_out(out + base + begin(q), s.slot(q) + begin(q), size(q));
      s.raise(r, &node_flags::consumed);
    }
    co_return std::error_code{};
  }
};

}  // namespace pdcoll::algo
