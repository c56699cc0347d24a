// File: detail/node_layout.hpp — what pdcoll keeps in each rank's region of
// node memory (transport/node_memory.hpp), and the atomic accessors for it.
//
// The region starts with flags and then holds the shared-memory
// all-reduce's two slots (algorithm/shared_memory.hpp). Only the owning
// rank writes its region; peers read it. A zero-filled region is the
// initial state of every field.
#pragma once

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
};

/// Offset of the all-reduce's first slot in a region.
inline constexpr std::size_t node_slot_offset = 8192;
static_assert(sizeof(node_flags) <= node_slot_offset);
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
/// Wakes every rank but `rank` that may sleep waiting for `rank`'s flags.
inline void wake_peers(transport::node_memory& node, int rank, int world_size) noexcept {
  for (int q = 0; q < world_size; ++q)
    if (q != rank) node.wake(q);
}

}  // namespace pdcoll::detail
