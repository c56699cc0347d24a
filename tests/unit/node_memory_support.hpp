// File: tests/unit/node_memory_support.hpp — what the inproc tests of the
// node-memory collectives share: small regions, contributions whose
// rank-order float sums the tests know exactly, and the direct question's
// vote as evidence of which path ran.
#pragma once

#include <doctest/doctest.h>
#include <pdcoll/pdcoll.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

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

/// The failures of every rank of one inproc world (threads), collected
/// under a lock and reported together when the world has ended.
class rank_failures {
 public:
  /// Records what went wrong on `rank` unless nothing did: the collective
  /// failed (`ec`), its result was not `right`, it wrote outside its buffers
  /// (not `fenced`), or its slots were not as its protocol says (not
  /// `slots_ok`).
  void check(int rank, const std::string& what, std::error_code ec, bool right, bool fenced, bool slots_ok) {
    if (!ec && right && fenced && slots_ok) return;
    std::lock_guard lock(mutex_);
    failures_.push_back("rank " + std::to_string(rank) + " " + what + ": " + (ec ? ec.message() : "") +
                        (right ? "" : " wrong") + (fenced ? "" : " wrote outside") +
                        (slots_ok ? "" : " slots not as the protocol says"));
  }
  /// Prints every failure and checks that there was none.
  void report() const {
    for (const auto& f : failures_) MESSAGE(f);
    CHECK(failures_.empty());
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> failures_;
};

}  // namespace pdcoll::testing
