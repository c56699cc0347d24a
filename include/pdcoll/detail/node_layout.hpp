// File: detail/node_layout.hpp — what pdcoll keeps in each rank's region of
// node memory (transport/node_memory.hpp), and the atomic accessors for it.
//
// The region starts with flags, then the two mailboxes of the small
// all-reduce (node_small_all_reduce.hpp), then the shared-memory
// all-reduce's two slots (algorithm/shared_memory.hpp). Only the owning
// rank writes its region; peers read it. A zero-filled region is the
// initial state of every field.
#pragma once

#include <pdcoll/memory/node_shareable.hpp>
#include <pdcoll/transport/node_memory.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace pdcoll::detail {

/// Entries of the signature-check ring (collective_operation.hpp): how many
/// collectives a rank may start ahead of its right neighbour's checks.
inline constexpr std::size_t node_check_entries = 256;

/// The flags at the start of each rank's region.
struct node_flags {
  /// Signature check: collectives this rank has checked against its left
  /// neighbour's entries (checks complete in sequence order).
  alignas(64) std::uint64_t checked;
  /// Signature check: entry seq % node_check_entries holds collective seq's
  /// signature once `sequence` is seq + 1.
  struct check_entry {
    std::uint64_t sequence;
    std::uint64_t signature;
  };
  alignas(64) check_entry check[node_check_entries];
  /// Shared-memory all-reduce: the step whose chunk slot p holds, that
  /// step's collective signature, and the last step of slot p this rank has
  /// finished reading from every region.
  alignas(64) std::uint64_t published[2];
  std::uint64_t signature[2];
  alignas(64) std::uint64_t consumed[2];
  /// Reduce-scatter variant: the last step whose block this rank has
  /// reduced into its own slot p.
  alignas(64) std::uint64_t reduced[2];
  /// Small all-reduce: the mark of the last mailbox collective whose
  /// contributions this rank has finished reading (0: none).
  alignas(64) std::uint64_t mail_done;
  /// Direct collectives (algorithm/detail/node_direct.hpp): this rank's
  /// input and output for the step of parity p, written before it
  /// publishes the step; the input is not shareable() when the buffers peers
  /// read are not all shareable, and the output is empty unless peers read it.
  alignas(64) memory::shareable_range direct_input[2];
  memory::shareable_range direct_output[2];
  /// Direct collectives: the vote for the step of parity p, (step << 1) | 1
  /// when this rank mapped every rank's buffers, (step << 1) when not.
  alignas(64) std::uint64_t direct_vote[2];
  /// Direct collectives: the step of parity p this rank ended early (an
  /// error after publishing), so that its buffers may change under a peer
  /// still reading them; such a peer then fails instead of succeeding.
  alignas(64) std::uint64_t direct_abandoned[2];
};

/// The start of one of a rank's two mailboxes (node_small_all_reduce.hpp);
/// the contribution follows at node_mail_payload, so a few bytes share the
/// header's cache line.
struct node_mail_header {
  std::uint64_t mark;       ///< seq + 1 of the collective whose contribution follows (0: none yet)
  std::uint64_t signature;  ///< that collective's signature
  std::uint64_t done;       ///< the owner's mail_done when it wrote mark
  std::uint64_t cpu;        ///< 1 + the CPU the owner ran on when it wrote mark (0: unknown)
};

/// Offset of the first mailbox in a region.
inline constexpr std::size_t node_mail_offset = 8192;
/// Offset of the contribution in a mailbox.
inline constexpr std::size_t node_mail_payload = 32;
/// The largest contribution a mailbox holds.
inline constexpr std::size_t node_mail_capacity = std::size_t{32} << 10;
/// Distance between a rank's two mailboxes.
inline constexpr std::size_t node_mail_stride = (node_mail_payload + node_mail_capacity + 63) / 64 * 64;
/// Offset of the all-reduce's first slot in a region.
inline constexpr std::size_t node_slot_offset = (node_mail_offset + 2 * node_mail_stride + 4095) / 4096 * 4096;
static_assert(sizeof(node_flags) <= node_mail_offset);
static_assert(sizeof(node_mail_header) <= node_mail_payload);
static_assert(node_slot_offset + 2 * 4096 <= transport::min_node_memory_bytes, "two slots of at least a page");
static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free, "node memory flags need lock-free atomics");

/// Rank `rank`'s flags.
inline node_flags& flags_of(const transport::node_memory& node, int rank) noexcept {
  return *reinterpret_cast<node_flags*>(node.region(rank));
}
/// Reads a flag written by another process (acquire).
inline std::uint64_t load_flag(std::uint64_t& word) noexcept {
  return std::atomic_ref<std::uint64_t>(word).load(std::memory_order_acquire);
}
/// Writes a flag for other processes (release).
inline void store_flag(std::uint64_t& word, std::uint64_t value) noexcept {
  std::atomic_ref<std::uint64_t>(word).store(value, std::memory_order_release);
}
/// Raises a flag for other processes to `value` unless it already holds
/// more (release): flags that count steps never go backwards.
inline void raise_flag_to(std::uint64_t& word, std::uint64_t value) noexcept {
  std::atomic_ref<std::uint64_t> flag(word);
  std::uint64_t seen = flag.load(std::memory_order_relaxed);
  while (seen < value && !flag.compare_exchange_weak(seen, value, std::memory_order_release, std::memory_order_relaxed)) {
  }
}
/// Wakes every rank but `rank` that may sleep waiting for `rank`'s flags.
inline void wake_peers(transport::node_memory& node, int rank, int world_size) noexcept {
  for (int q = 0; q < world_size; ++q)
    if (q != rank) node.wake(q);
}

/// One step of the shared-memory all-reduce's protocol
/// (algorithm/shared_memory.hpp), as its waits see it.
struct node_step {
  transport::node_memory* node = nullptr;
  int world_size = 0;
  std::uint64_t step = 0;

  node_flags& flags(int rank) const noexcept { return flags_of(*node, rank); }
  std::byte* slot(int rank) const noexcept {
    return node->region(rank) + node_slot_offset + (step & 1) * slot_bytes(*node);
  }
  static std::size_t slot_bytes(const transport::node_memory& node) noexcept {
    return (node.region_bytes() - node_slot_offset) / 2 / 64 * 64;
  }
  /// Every rank has consumed step - 2: this rank's slot is free.
  static bool slot_free(const void* self) noexcept {
    const auto& s = *static_cast<const node_step*>(self);
    if (s.step < 4) return true;
    for (int q = 0; q < s.world_size; ++q)
      if (load_flag(s.flags(q).consumed[s.step & 1]) < s.step - 2) return false;
    return true;
  }
  /// Every rank has published step.
  static bool all_published(const void* self) noexcept {
    const auto& s = *static_cast<const node_step*>(self);
    for (int q = 0; q < s.world_size; ++q)
      if (load_flag(s.flags(q).published[s.step & 1]) != s.step) return false;
    return true;
  }
  /// Every rank has reduced its block of step (shared_memory_scatter).
  static bool all_reduced(const void* self) noexcept {
    const auto& s = *static_cast<const node_step*>(self);
    for (int q = 0; q < s.world_size; ++q)
      if (load_flag(s.flags(q).reduced[s.step & 1]) != s.step) return false;
    return true;
  }
  /// Every rank has consumed step (the direct all-reduce's last handshake:
  /// no peer reads this rank's buffers any more).
  static bool all_consumed(const void* self) noexcept {
    const auto& s = *static_cast<const node_step*>(self);
    for (int q = 0; q < s.world_size; ++q)
      if (load_flag(s.flags(q).consumed[s.step & 1]) < s.step) return false;
    return true;
  }
  /// Every rank has voted on step's direct all-reduce.
  static bool all_voted(const void* self) noexcept {
    const auto& s = *static_cast<const node_step*>(self);
    for (int q = 0; q < s.world_size; ++q)
      if (load_flag(s.flags(q).direct_vote[s.step & 1]) >> 1 != s.step) return false;
    return true;
  }
  /// After all_voted: every rank mapped every rank's buffers.
  bool votes_agree() const noexcept {
    for (int q = 0; q < world_size; ++q)
      if ((load_flag(flags(q).direct_vote[step & 1]) & 1) == 0) return false;
    return true;
  }
  /// Casts this rank's vote on step's direct all-reduce and wakes peers.
  void vote(int rank, bool mapped) const noexcept {
    store_flag(flags(rank).direct_vote[step & 1], step << 1 | (mapped ? 1 : 0));
    wake_peers(*node, rank, world_size);
  }
  /// Raises this rank's flag for step (after its chunk is in its slot):
  /// stores the collective's signature, publishes the step, wakes peers.
  void publish(int rank, std::uint64_t signature) const noexcept {
    auto& mine = flags(rank);
    mine.signature[step & 1] = signature;
    store_flag(mine.published[step & 1], step);
    wake_peers(*node, rank, world_size);
  }
  /// After all_published: every rank published step for the same collective.
  bool signatures_match(std::uint64_t signature) const noexcept {
    for (int q = 0; q < world_size; ++q)
      if (flags(q).signature[step & 1] != signature) return false;
    return true;
  }
  /// After all_published: out = every rank's slot of `count` elements
  /// combined in rank order with `apply3` / `apply` (a reduction_table's),
  /// so every rank computes a bit-identical result.
  void reduce_slots(void* out, std::size_t count,
                    void (*apply3)(void*, const void*, const void*, std::size_t) noexcept,
                    void (*apply)(void*, const void*, std::size_t) noexcept) const noexcept {
    apply3(out, slot(0), slot(1), count);
    for (int q = 2; q < world_size; ++q) apply(out, slot(q), count);
  }
  /// Sets this rank's flag `word` of the step's slot to the step and wakes peers.
  void raise(int rank, std::uint64_t (node_flags::*word)[2]) const noexcept {
    store_flag((flags(rank).*word)[step & 1], step);
    wake_peers(*node, rank, world_size);
  }
};

/// Offset in a region of the mailbox for collective `seq` (a rank's two
/// alternate by seq's parity).
constexpr std::size_t mailbox_offset(std::uint64_t seq) noexcept {
  return node_mail_offset + (seq & 1) * node_mail_stride;
}
/// The mailbox for collective `seq` in `region`.
inline std::byte* mailbox_in(std::byte* region, std::uint64_t seq) noexcept { return region + mailbox_offset(seq); }
/// The header at the start of `mailbox`.
inline node_mail_header& mail_header(std::byte* mailbox) noexcept {
  return *reinterpret_cast<node_mail_header*>(mailbox);
}

/// Collective `seq`'s signature check through node memory (see
/// collective_operation.hpp): each rank writes its signature into entry seq
/// of the ring in its own region, once its right neighbour has checked that
/// entry's previous use, and compares it with its left neighbour's entry.
/// Checks complete in sequence order, so one word (`checked`) counts them.
struct node_check {
  transport::node_memory* node = nullptr;
  int rank = 0, world_size = 0;
  std::uint64_t seq = 0;

  node_flags& own() const noexcept { return flags_of(*node, rank); }
  int left_rank() const noexcept { return (rank + world_size - 1) % world_size; }
  node_flags& left() const noexcept { return flags_of(*node, left_rank()); }
  node_flags::check_entry& entry(node_flags& f) const noexcept { return f.check[seq % node_check_entries]; }
  /// The right neighbour has checked this entry's previous use: post() may write it.
  static bool room(const void* self) noexcept {
    const auto& c = *static_cast<const node_check*>(self);
    return c.seq < node_check_entries ||
           load_flag(flags_of(*c.node, (c.rank + 1) % c.world_size).checked) > c.seq - node_check_entries;
  }
  /// Every earlier check has completed and the left neighbour's entry for
  /// seq is there, or it runs seq as a small all-reduce (which writes no entry).
  static bool arrived(const void* self) noexcept {
    const auto& c = *static_cast<const node_check*>(self);
    return load_flag(c.own().checked) == c.seq &&
           (load_flag(c.entry(c.left()).sequence) == c.seq + 1 || c.left_in_mailbox());
  }
  /// The left neighbour runs seq as a small all-reduce.
  bool left_in_mailbox() const noexcept {
    return load_flag(mail_header(mailbox_in(node->region(left_rank()), seq)).mark) == seq + 1;
  }
  /// Writes this rank's entry (after room); the caller wakes peers.
  void post(std::uint64_t signature) const noexcept {
    auto& mine = entry(own());
    mine.signature = signature;
    store_flag(mine.sequence, seq + 1);
  }
  /// After arrived: the left neighbour started the same collective as seq,
  /// the same way (a small all-reduce there means it chose another path).
  bool left_matches(std::uint64_t signature) const noexcept {
    auto& e = entry(left());
    return load_flag(e.sequence) == seq + 1 && e.signature == signature;
  }
  /// The left neighbour posted an entry for seq: it runs seq on another path
  /// than a small all-reduce (known without waiting for the earlier checks).
  bool left_posted() const noexcept { return load_flag(entry(left()).sequence) == seq + 1; }
  /// After arrived: marks seq checked (the caller wakes peers).
  void complete() const noexcept { store_flag(own().checked, seq + 1); }
};

}  // namespace pdcoll::detail
