// File: algorithm/detail/node_direct.hpp — the question a direct collective
// asks before it reads its peers' buffers: are every rank's buffers
// node-shareable (memory/node_shareable.hpp), and has every rank mapped
// them?
//
// The protocol takes one step of the node-memory sequence
// (algorithm/shared_memory.hpp), reserved by the caller:
//   1. once the step's flags are free, each rank writes where its buffers
//      live (or that they are not shareable) into its flags and publishes
//      the step with the collective's signature;
//   2. once every rank has, each checks the signatures; where some rank's
//      buffers are not shareable every rank sees it and none votes (a rank
//      whose own buffers are not shareable knows the answer at once, and
//      does not wait);
//      otherwise each maps every peer's buffers read-only
//      (memory/peer_mappings.hpp, cached and pinned) and votes;
//   3. the collective runs directly when every vote is yes, and falls back
//      to its message algorithm otherwise;
//   4. a direct run ends with the release handshake: each rank marks the
//      step consumed and completes only once every rank has, since the
//      caller may change its buffers as soon as its collective completes.
// From publishing until the release, an early end (timeout, abort) marks
// this rank's buffers keep_pages, so freeing them does not empty the file
// under a peer that may still read it, and marks the step abandoned: a
// peer that was still reading them then fails its release with
// errc::aborted instead of completing on data that may have changed.
#pragma once

#include <pdcoll/detail/collective_operation.hpp>
#include <pdcoll/detail/node_layout.hpp>
#include <pdcoll/memory/node_shareable.hpp>
#include <pdcoll/memory/peer_mappings.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <optional>
#include <vector>

namespace pdcoll::algo::detail {

/// What one rank's buffers of a direct collective are, and every rank's as
/// this process maps them (after node_direct_handshake::ask agreed).
class node_direct_buffers {
 public:
  /// This rank's input (`input_bytes`) and output (`output_bytes`). With
  /// `peers_read_output` the peers read the output too (the all-reduce
  /// copies reduced blocks from their owners' outputs), so both must be
  /// shareable; otherwise only the input is published and mapped.
  node_direct_buffers(int world_size, const std::byte* input, std::size_t input_bytes, const std::byte* output,
                      std::size_t output_bytes, bool peers_read_output)
      : input_(input),
        output_(output),
        input_bytes_(input_bytes),
        output_bytes_(output_bytes),
        peers_read_output_(peers_read_output),
        inputs_(static_cast<std::size_t>(world_size)),
        outputs_(static_cast<std::size_t>(world_size)) {}
  node_direct_buffers(const node_direct_buffers&) = delete;
  node_direct_buffers& operator=(const node_direct_buffers&) = delete;
  /// Unless finish() was called: peers may still read this rank's buffers,
  /// so their pages outlive a free (memory::detail::shareable_table::keep_pages),
  /// and the step is marked abandoned before the caller can change them
  /// (node_direct_handshake::release fails a peer that sees the mark).
  ~node_direct_buffers() {
    if (finished_ || !published_) return;
    memory::detail::shareable_segments().keep_pages(input_);
    if (peers_read_output_) memory::detail::shareable_segments().keep_pages(output_);
    // Sequentially consistent, and fenced: the caller's later stores to its
    // buffers must not become visible before the mark.
    std::atomic_ref<std::uint64_t>(mine_->direct_abandoned[step_ & 1]).store(step_, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }

  /// Rank q's input as mapped here (this rank's own: its input).
  const std::byte* input(int q) const noexcept { return inputs_[static_cast<std::size_t>(q)]; }
  /// Rank q's output as mapped here (only with peers_read_output).
  const std::byte* output(int q) const noexcept { return outputs_[static_cast<std::size_t>(q)]; }
  /// No peer reads this rank's buffers any more.
  void finish() noexcept { finished_ = true; }

  /// Writes this rank's descriptors for `step` into `mine` (before it
  /// publishes the step); false when they say "not shareable".
  bool describe(pdcoll::detail::node_flags& mine, std::uint64_t step) noexcept {
    const auto in = memory::find_shareable(input_, input_bytes_);
    const auto out = peers_read_output_ ? memory::find_shareable(output_, output_bytes_)
                                        : std::optional<memory::shareable_range>{};
    const bool shareable = in && (!peers_read_output_ || out);
    mine.direct_input[step & 1] = shareable ? *in : memory::shareable_range{};
    mine.direct_output[step & 1] = shareable && out ? *out : memory::shareable_range{};
    mine_ = &mine;
    step_ = step;
    published_ = true;
    return shareable;
  }
  /// After every rank consumed the step: some rank ended it early, and its
  /// buffers may have changed while this rank read them.
  static bool abandoned_by_some_rank(const pdcoll::detail::node_step& s) noexcept {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    for (int q = 0; q < s.world_size; ++q)
      if (std::atomic_ref<std::uint64_t>(s.flags(q).direct_abandoned[s.step & 1]).load(std::memory_order_seq_cst) ==
          s.step)
        return true;
    return false;
  }
  /// After every rank published: every rank's buffers are shareable.
  static bool every_rank_shareable(const pdcoll::detail::node_step& s) noexcept {
    for (int q = 0; q < s.world_size; ++q)
      if (!s.flags(q).direct_input[s.step & 1].shareable()) return false;
    return true;
  }
  /// Maps every peer's published buffers (pinned until this object goes);
  /// false when one could not be mapped here.
  bool map(const pdcoll::detail::node_step& s, int rank) {
    auto& cache = memory::detail::peer_segment_mappings();
    for (int q = 0; q < s.world_size; ++q) {
      const auto i = static_cast<std::size_t>(q);
      if (q == rank) {
        inputs_[i] = input_;
        outputs_[i] = output_;
        continue;
      }
      const auto& peer = s.flags(q);
      pins_.push_back(cache.resolve(peer.direct_input[s.step & 1], input_bytes_));
      inputs_[i] = pins_.back().address();
      if (!inputs_[i]) return false;
      if (peers_read_output_) {
        pins_.push_back(cache.resolve(peer.direct_output[s.step & 1], output_bytes_));
        outputs_[i] = pins_.back().address();
        if (!outputs_[i]) return false;
      }
    }
    return true;
  }

 private:
  const std::byte* input_;
  const std::byte* output_;
  std::size_t input_bytes_, output_bytes_;
  bool peers_read_output_;
  pdcoll::detail::node_flags* mine_ = nullptr;
  std::uint64_t step_ = 0;
  bool published_ = false;
  bool finished_ = false;
  std::vector<memory::detail::peer_mappings::pinned> pins_;
  std::vector<const std::byte*> inputs_, outputs_;
};

/// The handshakes of the protocol (see the file comment). Never inlined:
/// inlined into shared_memory_scatter's all-reduce, GCC 12 put their resume
/// code in that function's section group in one translation unit only, and
/// linking two units failed ("defined in discarded section"); as plain
/// inline functions, as static members and as templates alike.
struct node_direct_handshake {
  /// Steps 1 and 2 of the protocol (see the file comment) in step `s`: sets
  /// `agreed` when every rank mapped every rank's buffers. Where it is false
  /// no peer reads this rank's buffers: the caller calls b.finish(), raises
  /// the step consumed and runs its fallback.
  [[gnu::noinline]] static pdcoll::detail::collective_task ask(pdcoll::detail::collective_context& ctx, const pdcoll::detail::node_step& s,
                                             node_direct_buffers& b, bool& agreed) {
    using pdcoll::detail::condition_wait;
    using pdcoll::detail::node_step;
    const int r = ctx.rank;
    const std::uint64_t signature = ctx.signature();
    agreed = false;
    condition_wait slot_free(ctx, &node_step::slot_free, &s);
    if (auto ec = co_await slot_free) co_return ec;
    // This rank's buffers not shareable: the answer is no, and waiting for
    // the peers would only hold this rank's fallback back until every rank
    // has arrived. The peers read the descriptor and copy too.
    if (!b.describe(s.flags(r), s.step)) {
      s.publish(r, signature);
      co_return std::error_code{};
    }
    s.publish(r, signature);

    condition_wait published(ctx, &node_step::all_published, &s);
    if (auto ec = co_await published) co_return ec;
    if (!s.signatures_match(signature)) co_return make_error_code(errc::collective_mismatch);
    // Every rank reads the same descriptors: where one is not shareable, all
    // fall back without a vote. Otherwise each votes, since a mapping may
    // fail on one rank only.
    if (!node_direct_buffers::every_rank_shareable(s)) co_return std::error_code{};
    s.vote(r, b.map(s, r));
    condition_wait voted(ctx, &node_step::all_voted, &s);
    if (auto ec = co_await voted) co_return ec;
    agreed = s.votes_agree();
    co_return std::error_code{};
  }

  /// Step 4 (see the file comment): marks `s` consumed and completes once
  /// every rank has; then no peer reads this rank's buffers. Fails with
  /// errc::aborted when a rank ended the step early (its buffers may have
  /// changed while this rank read them).
  [[gnu::noinline]] static pdcoll::detail::collective_task release(pdcoll::detail::collective_context& ctx,
                                                 const pdcoll::detail::node_step& s, node_direct_buffers& b) {
    using pdcoll::detail::condition_wait;
    s.raise(ctx.rank, &pdcoll::detail::node_flags::consumed);
    condition_wait all_consumed(ctx, &pdcoll::detail::node_step::all_consumed, &s);
    if (auto ec = co_await all_consumed) co_return ec;
    b.finish();
    if (node_direct_buffers::abandoned_by_some_rank(s)) co_return make_error_code(errc::aborted);
    co_return std::error_code{};
  }

  /// After a direct run in step `s` that also reserved the `fallback` steps
  /// after it (for the copies it did not need): marks them consumed so
  /// later steps find their slots free. One of the marks has the parity of
  /// step s - 1, which the collective started just before may still be
  /// reading (this one never waited for it): waits until every rank has
  /// consumed it, or a later step would overwrite a slot still being read,
  /// and that collective's own mark would take the flag backwards.
  [[gnu::noinline]] static pdcoll::detail::collective_task skip(pdcoll::detail::collective_context& ctx,
                                                               const pdcoll::detail::node_step& s,
                                                               std::uint64_t fallback) {
    using pdcoll::detail::condition_wait;
    if (fallback == 0) co_return std::error_code{};
    const pdcoll::detail::node_step next{s.node, s.world_size, s.step + 1};
    condition_wait previous_done(ctx, &pdcoll::detail::node_step::slot_free, &next);
    if (auto ec = co_await previous_done) co_return ec;
    auto& mine = s.flags(ctx.rank);
    const std::uint64_t last = s.step + fallback;
    pdcoll::detail::raise_flag_to(mine.consumed[last & 1], last);
    if (fallback > 1) pdcoll::detail::raise_flag_to(mine.consumed[(last - 1) & 1], last - 1);
    pdcoll::detail::wake_peers(*s.node, ctx.rank, s.world_size);
    co_return std::error_code{};
  }
};

/// Combines rank order's `P` contributions `source(q) + from` of `bytes`
/// into `to` with ctx's reduction (bit-identical to a reduction of the same
/// contributions in the same order anywhere). `to` may be source(0) or
/// source(1) but no later contribution: see node_direct_reduce_block.
template <class Source>
void node_direct_combine(pdcoll::detail::collective_context& ctx, std::byte* to, std::size_t from, std::size_t bytes,
                         Source source) {
  const std::size_t n = bytes / ctx.element_size;
  if (n == 0) return;
  ctx.red->apply3(to, source(0) + from, source(1) + from, n);
  for (int q = 2; q < ctx.world_size; ++q) ctx.red->apply(to, source(q) + from, n);
}

/// `out` = every rank's contribution `source(q)` (`bytes`) combined in rank
/// order, where this rank's own is `source(rank)`. When `out` is that
/// contribution (in place) and the rank is 2 or later, the first partial
/// sums would overwrite it before it is read: they go through `spare` (at
/// least `bytes`, read by no peer) and are copied over.
template <class Source>
void node_combine_into(pdcoll::detail::collective_context& ctx, std::byte* out, std::byte* spare, std::size_t bytes,
                       Source source) {
  std::byte* const to = ctx.rank >= 2 && out == source(ctx.rank) ? spare : out;
  node_direct_combine(ctx, to, 0, bytes, source);
  if (to != out) std::memcpy(out, to, bytes);
}

/// `to` = every rank's contribution `source(q) + from` (`bytes`) combined in
/// rank order. When `to` is this rank's own contribution (in place) and the
/// rank is 2 or later, the first partial sums would overwrite it before it
/// is read: the sums then go through a scratch block that stays in cache.
template <class Source>
void node_direct_reduce_block(pdcoll::detail::collective_context& ctx, std::byte* to, std::size_t from,
                              std::size_t bytes, Source source) {
  if (ctx.rank < 2 || to != source(ctx.rank) + from) {
    node_direct_combine(ctx, to, from, bytes, source);
    return;
  }
  constexpr std::size_t scratch_bytes = std::size_t{64} << 10;  // a multiple of every element size
  const std::size_t block = std::min(scratch_bytes, bytes);
  std::byte* const scratch = ctx.scratch(block).address;
  for (std::size_t done = 0; done < bytes; done += block) {
    const std::size_t n = std::min(block, bytes - done);
    node_direct_combine(ctx, scratch, from + done, n, source);
    std::memcpy(to + done, scratch, n);
  }
}

}  // namespace pdcoll::algo::detail
