// File: tests/unit/node_memory_support.hpp — what the inproc tests of the
// node-memory collectives share: small regions, contributions whose
// rank-order float sums the tests know exactly, and the direct question's
// vote as evidence of which path ran.
#pragma once

#include <pdcoll/pdcoll.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace pdcoll::testing {

/// Small node-memory regions: slots of 28 KiB after the flags and
/// mailboxes, so a few thousand floats take several chunks.
inline constexpr std::size_t small_region_bytes = pdcoll::detail::node_slot_offset + 2 * 28 * 1024;

/// Element i of rank r's contribution in test case `salt`.
inline float contribution(int rank, std::size_t i, std::uint64_t salt) {
  return static_cast<float>((static_cast<std::uint64_t>(rank) * 7919 + i * 31 + salt * 17) % 1000) / 7.0f;
}

/// Element i of every rank's contribution summed in rank order: what the
/// node-memory algorithms compute, bit for bit.
inline float rank_order_sum(int world_size, std::size_t i, std::uint64_t salt) {
  float acc = contribution(0, i, salt);
  for (int q = 1; q < world_size; ++q) acc += contribution(q, i, salt);
  return acc;
}

/// Zeroes this rank's votes on the direct question (both parities). Call it
/// between collectives: afterwards voted_yes tells whether one voted.
inline void clear_direct_votes(pdcoll::communicator& comm) {
  auto& flags = pdcoll::detail::flags_of(*comm.endpoint().shared_node_memory(), comm.rank());
  pdcoll::detail::store_flag(flags.direct_vote[0], 0);
  pdcoll::detail::store_flag(flags.direct_vote[1], 0);
}

/// This rank voted yes on a direct question since clear_direct_votes.
inline bool voted_yes(pdcoll::communicator& comm) {
  auto& flags = pdcoll::detail::flags_of(*comm.endpoint().shared_node_memory(), comm.rank());
  return (pdcoll::detail::load_flag(flags.direct_vote[0]) & 1) != 0 ||
         (pdcoll::detail::load_flag(flags.direct_vote[1]) & 1) != 0;
}

/// Zeroes this rank's two slots. A direct collective never writes them;
/// the chunked protocols always do.
inline void clear_slots(pdcoll::communicator& comm) {
  auto& node = *comm.endpoint().shared_node_memory();
  std::memset(node.region(comm.rank()) + pdcoll::detail::node_slot_offset, 0,
              2 * pdcoll::detail::node_step::slot_bytes(node));
}

/// This rank's two slots are all zero (since clear_slots).
inline bool slots_untouched(pdcoll::communicator& comm) {
  auto& node = *comm.endpoint().shared_node_memory();
  const std::byte* slots = node.region(comm.rank()) + pdcoll::detail::node_slot_offset;
  return std::all_of(slots, slots + 2 * pdcoll::detail::node_step::slot_bytes(node),
                     [](std::byte b) { return b == std::byte{0}; });
}

}  // namespace pdcoll::testing
