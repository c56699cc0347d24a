// File: detail/node_small_all_reduce.hpp — a small all-reduce through node
// memory, run by the operation itself: each rank writes its contribution and
// the collective's signature into a mailbox in its region and reduces
// everyone's mailboxes in rank order (bit-identical to shared_memory).
//
// Below 32 KiB an all-reduce's time is handshakes, not bytes: what counts is
// how many cache lines travel between cores. Run through the chunked
// shared_memory protocol's slot and flags, a small all-reduce moves five per
// rank (the check-ring entry, the step flag, the contribution, `consumed`
// and `checked`, each written by one rank and read by another). A mailbox
// moves one, plus the contribution's
// other lines: its header carries the collective's sequence mark, its
// signature (so every rank checks every other rank's, which the check ring
// does only for the left neighbour) and `done`, the mark of the last mailbox
// collective the owner finished reading.
//
// A rank has two mailboxes, used by sequence parity. It may overwrite one
// once every peer has finished reading what it last held there: a peer's
// `done` in either of its mailboxes, or its `mail_done` flag, says so. In a
// run of small all-reduces the peer's mailbox of the previous collective
// already says so, and this rank read that line to finish it. A rank
// publishes a mailbox only once it finished reading for its previous small
// all-reduce in sequence order (not merely the last one it published: an
// earlier one may still wait for its mailbox), so `done` covers every
// earlier one.
//
// A rank reads its own mailbox lines only where it must. The mark a mailbox
// holds comes from the communicator's record of what the rank last published
// there, and the rank's own contribution from its input (reduce_into): on
// this machine's AMD cores a peer's read of a line this rank wrote takes the
// line away (the coherence protocol hands a modified line over on a read), so
// reading it back costs a transfer on the critical path each time. Skipping
// those reads took a 2-rank 8-byte all-reduce from 0.13 to 0.11 us
// (design-notes item 40).
//
// Other paths interleave with this one in a communicator: it takes no node
// step, and with the signature check on it completes only in sequence order
// (`checked`), advancing the ring's count as a check would. A rank that runs
// collective seq on another path posts a check-ring entry for seq, and a
// rank here finds it at its left neighbour (and a rank there finds this
// rank's mailbox marked with seq): either way, collective_mismatch, even
// where the signatures agree but the algorithms differ.
#pragma once

#include <pdcoll/detail/cpu_relax.hpp>
#include <pdcoll/detail/node_layout.hpp>
#include <pdcoll/transport/poll_policy.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>

namespace pdcoll::detail {

/// One small all-reduce through node memory (see the file comment).
class node_small_all_reduce {
 public:
  /// Where the exchange stands.
  enum class state : std::uint8_t {
    waiting,   ///< a peer has not got this far yet
    ready,     ///< every rank published its contribution: reduce_into() may run
    mismatch,  ///< a peer runs another collective, or this one on another path
  };

  /// How the operation waits on the mailboxes before it leaves the wait to
  /// the endpoint (which yields, then sleeps).
  struct spin_plan {
    /// At most this long: 5 us where every rank has a CPU, the time a peer
    /// running on another core needs to get to the same collective; where
    /// the ranks outnumber the CPUs, as long as the endpoint would poll
    /// before sleeping (`poll`, PDCOLL_POLL_US) up to crowded_bound; never
    /// more than `poll`. The operation's deadline ends it sooner.
    std::chrono::nanoseconds bound;
    /// More ranks than CPUs: the wait yields whenever a peer it waits for may
    /// share this rank's CPU (peers_elsewhere() is false) and at least every
    /// crowded_spin, instead of spinning on.
    bool crowded;
    /// Equal plans.
    friend constexpr bool operator==(const spin_plan&, const spin_plan&) = default;
  };
  /// With more ranks than CPUs, the longest spin between yields: peers last
  /// seen on other CPUs may have moved to this one since.
  static constexpr std::chrono::nanoseconds crowded_spin = std::chrono::microseconds(5);
  /// With more ranks than CPUs, the longest wait in the operation (it holds
  /// the communicator's lock and reads no abort notice meanwhile).
  static constexpr std::chrono::nanoseconds crowded_bound = std::chrono::microseconds(50);
  /// The spin for `world_size` ranks on `cpus` CPUs with PDCOLL_POLL_US `poll`.
  static constexpr spin_plan spin_for(int world_size, unsigned cpus, std::chrono::nanoseconds poll) noexcept {
    const bool crowded = world_size < 1 || static_cast<unsigned>(world_size) > cpus;
    return {std::min<std::chrono::nanoseconds>(crowded ? crowded_bound : std::chrono::microseconds(5), poll), crowded};
  }
  /// spin_for() on this machine (CPUs and PDCOLL_POLL_US read once).
  static spin_plan spin_for(int world_size) noexcept {
    static const unsigned cpus = std::thread::hardware_concurrency();
    static const std::chrono::nanoseconds poll = transport::default_poll_before_sleep();
    return spin_for(world_size, cpus, poll);
  }

  /// Collective `seq` with `signature`; `regions`: node.region(q) for every
  /// rank q (communicator::node_regions); `previous`: the mark (seq + 1) of
  /// this rank's previous small all-reduce, 0 for none, and `held`: that of
  /// its latest one in the mailbox of seq's parity, which the mailbox holds
  /// once that one published (communicator::follow_small_all_reduce);
  /// `verify`: the communicator checks signatures
  /// (options.verify_collectives), so checks complete in
  /// order; `cpu`: the CPU this rank runs on (-1: unknown), recorded in its
  /// mailbox for peers_elsewhere().
  node_small_all_reduce(transport::node_memory& node, std::byte* const* regions, int rank, int world_size,
                        std::uint64_t seq, std::uint64_t previous, std::uint64_t held, std::uint64_t signature,
                        bool verify, int cpu = -1) noexcept
      : check_{&node, rank, world_size, seq}, node_(&node), regions_(regions), rank_(rank),
        world_size_(world_size), seq_(seq), previous_(previous), held_(held), signature_(signature),
        cpu_mark_(cpu < 0 ? 0 : static_cast<std::uint64_t>(cpu) + 1),
        box_offset_(mailbox_offset(seq)), other_box_offset_(mailbox_offset(seq + 1)), verify_(verify) {}

  /// Copies `bytes` (at most node_mail_capacity) from `input` into this
  /// rank's mailbox and publishes it, once every peer has finished reading it;
  /// false while one has not. Call until it returns true. Peers are not
  /// woken yet: wake_peers() or reduce_into() does it.
  bool try_publish(const std::byte* input, std::size_t bytes) noexcept {
    if (published_) return true;
    if (!mailbox_free()) return false;
    std::byte* box = this->box(rank_);
    auto& header = mail_header(box);
    std::memcpy(box + node_mail_payload, input, bytes);
    store_flag(header.signature, signature_);
    store_flag(header.done, previous_);  // mailbox_free(): this rank's mail_done
    store_flag(header.cpu, cpu_mark_);
    store_flag(header.mark, seq_ + 1);
    input_ = input;
    published_ = true;
    woken_ = false;
    return true;
  }
  /// True once try_publish() succeeded.
  bool published() const noexcept { return published_; }
  /// Wakes peers that may sleep waiting for this rank's mailbox, unless
  /// done since it was published. Waking costs a full memory fence, which
  /// waits for the mailbox's cache line: a rank that expects its peers soon
  /// looks at theirs first and wakes once, when it is finished.
  void wake_peers() noexcept {
    if (woken_) return;
    detail::wake_peers(*node_, rank_, world_size_);
    woken_ = true;
  }

  /// After try_publish(): whether every rank published this collective (and
  /// this rank's check may complete), or one runs another.
  state peers() const noexcept {
    bool all = true;
    for (int q = 0; q < world_size_; ++q) {
      if (q == rank_) continue;  // published (see the file comment on own lines)
      auto& header = mail_header(box(q));
      if (load_flag(header.mark) != seq_ + 1) {
        all = false;
      } else if (load_flag(header.signature) != signature_) {
        return state::mismatch;
      }
    }
    if (!all) return verify_ && check_.left_posted() ? state::mismatch : state::waiting;
    if (verify_ && load_flag(own_flags().checked) != seq_) return state::waiting;
    return state::ready;
  }
  /// After try_publish(): true when every rank whose contribution is
  /// missing last published from a known CPU other than this rank's (so it
  /// is probably running, not waiting for this rank's CPU), and when none is
  /// missing any more (the last one usually arrived since peers() looked:
  /// look again rather than yield). Its mailbox of the other parity holds
  /// its latest publication, from an earlier small all-reduce: a rough
  /// guide, which is why the spin on it is bounded.
  bool peers_elsewhere() const noexcept {
    if (!published_ || cpu_mark_ == 0) return false;
    for (int q = 0; q < world_size_; ++q) {
      if (q == rank_ || load_flag(mail_header(box(q)).mark) == seq_ + 1) continue;
      const std::uint64_t cpu = load_flag(mail_header(other_box(q)).cpu);
      if (cpu == 0 || cpu == cpu_mark_) return false;
    }
    return true;
  }
  /// What the exchange waits for, for timeout reports.
  std::string describe() const {
    if (!published_) return "this rank's mailbox (peers still reading it, or its previous small all-reduce unfinished)";
    std::string missing;
    for (int q = 0; q < world_size_; ++q)
      if (load_flag(mail_header(box(q)).mark) != seq_ + 1) missing += " " + std::to_string(q);
    if (!missing.empty()) return "the mailboxes of ranks" + missing;
    return "earlier collectives' signature checks (" + std::to_string(load_flag(own_flags().checked)) + " of " +
           std::to_string(seq_) + " done)";
  }
  /// True when the next try_publish() or peers() call would move on.
  bool can_advance() const noexcept { return published_ ? peers() != state::waiting : mailbox_free(); }

  /// After peers() == ready: output = every rank's contribution of `count`
  /// elements combined in rank order with `apply3` / `apply` (see
  /// reduction_table); then marks the mailboxes read (and the check
  /// complete) and wakes peers (for the publication too). `output` is the
  /// input try_publish() copied (in place) or does not overlap it (the
  /// collective's checks reject any other overlap). That input stands in
  /// for this rank's own mailbox wherever it still holds the contribution
  /// when the reduction gets to it: reading the mailbox lines just written,
  /// while peers pull them to their cores, made a 2-rank 4 KiB exchange
  /// about a fifth slower.
  void reduce_into(std::byte* output, std::size_t count,
                   void (*apply3)(void*, const void*, const void*, std::size_t) noexcept,
                   void (*apply)(void*, const void*, std::size_t) noexcept) noexcept {
    const std::byte* own = own_contribution(output);
    auto source = [&](int q) { return q == rank_ ? own : contribution(q); };
    apply3(output, source(0), source(1), count);
    for (int q = 2; q < world_size_; ++q) apply(output, source(q), count);
    store_flag(own_flags().mail_done, seq_ + 1);
    if (verify_) check_.complete();
    woken_ = false;
    wake_peers();
  }

 private:
  // Rank `rank`'s mailbox of this collective's parity, and of the other one.
  std::byte* box(int rank) const noexcept { return regions_[rank] + box_offset_; }
  std::byte* other_box(int rank) const noexcept { return regions_[rank] + other_box_offset_; }
  node_flags& flags(int rank) const noexcept { return *reinterpret_cast<node_flags*>(regions_[rank]); }
  node_flags& own_flags() const noexcept { return flags(rank_); }
  const std::byte* contribution(int rank) const noexcept { return box(rank) + node_mail_payload; }
  // Where reduce_into() reads this rank's contribution: the published input
  // out of place, or in place where the first combine (ranks 0 and 1,
  // element by element) reads it before writing; otherwise the mailbox's
  // copy, as the output overwrites the input before its turn.
  const std::byte* own_contribution(const std::byte* output) const noexcept {
    return output != input_ || rank_ <= 1 ? input_ : contribution(rank_);
  }

  // This rank finished reading for its previous small all-reduce (so they
  // publish in sequence order and `done` covers every earlier one), and
  // every peer for the collective this mailbox last held.
  bool mailbox_free() const noexcept {
    if (load_flag(own_flags().mail_done) != previous_) return false;
    if (held_ == 0) return true;
    for (int q = 0; q < world_size_; ++q) {
      if (q == rank_) continue;
      // The mailbox of the other parity was written last: look there first.
      if (load_flag(mail_header(other_box(q)).done) >= held_) continue;
      if (load_flag(mail_header(box(q)).done) >= held_) continue;
      if (load_flag(flags(q).mail_done) >= held_) continue;
      return false;
    }
    return true;
  }

  node_check check_;
  transport::node_memory* node_;
  std::byte* const* regions_;
  int rank_;
  int world_size_;
  std::uint64_t seq_;
  std::uint64_t previous_;
  std::uint64_t held_;
  std::uint64_t signature_;
  std::uint64_t cpu_mark_;
  std::size_t box_offset_;        // of this collective's mailbox in a region
  std::size_t other_box_offset_;  // of the other one
  bool verify_;
  const std::byte* input_ = nullptr;  // what try_publish() copied
  bool published_ = false;
  bool woken_ = true;
};

}  // namespace pdcoll::detail
