// File: detail/node_small_all_reduce.hpp — a small all-reduce through node
// memory, run by the operation itself: the shared_memory algorithm's single
// step (algorithm/shared_memory.hpp) fused with the signature check.
//
// Below a few KiB an all-reduce's time is software and handshakes, not
// bytes. The general path runs two coroutines (the algorithm and the check),
// each with its own frame, condition waits and wake-ups, and registers the
// user's buffers although nothing is sent. Here the operation polls one
// object: the rank writes its check entry and its contribution, publishes
// the step, wakes its peers once; when every rank has published and its left
// neighbour's entry is there, it reduces the P slots in rank order (the
// result is bit-identical to shared_memory's), marks the step consumed and
// the check complete, and wakes its peers once more.
//
// The flags are the ones the general path uses (node_layout.hpp), so both
// paths interleave safely in one communicator: the step comes from the same
// sequence, the slot is taken only once every rank has consumed its previous
// use, and checks still complete in sequence order.
#pragma once

#include <pdcoll/detail/node_layout.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace pdcoll::detail {

/// One small all-reduce through node memory (see the file comment).
class node_small_all_reduce {
 public:
  /// Where the exchange stands.
  enum class state : std::uint8_t {
    waiting,   ///< a peer has not got this far yet
    ready,     ///< every rank published the step: reduce_into() may run
    mismatch,  ///< a peer runs another collective
  };

  /// Step `step` of `node`'s sequence for collective `seq` with `signature`;
  /// `verify`: the communicator checks signatures (options.verify_collectives).
  node_small_all_reduce(transport::node_memory& node, int rank, int world_size, std::uint64_t step,
                        std::uint64_t seq, std::uint64_t signature, bool verify) noexcept
      : step_{&node, world_size, step}, check_{&node, rank, world_size, seq}, rank_(rank),
        signature_(signature), verify_(verify) {}

  /// Copies `bytes` from `input` into this rank's slot, posts the check entry,
  /// publishes the step and wakes peers, once the slot (and the entry) are
  /// free; false while they are not. Call until it returns true.
  bool try_publish(const std::byte* input, std::size_t bytes) noexcept {
    if (published_) return true;
    if (!node_step::slot_free(&step_) || (verify_ && !node_check::room(&check_))) return false;
    if (verify_) check_.post(signature_);
    std::memcpy(step_.slot(rank_), input, bytes);
    step_.publish(rank_, signature_);  // wakes peers for the entry too
    published_ = true;
    return true;
  }
  /// True once try_publish() succeeded.
  bool published() const noexcept { return published_; }

  /// After try_publish(): whether every rank published the same collective
  /// (and this rank's check may complete), or one runs another.
  state peers() const noexcept {
    if (verify_ && check_.left_differs(signature_)) return state::mismatch;
    if (!node_step::all_published(&step_)) return state::waiting;
    if (!step_.signatures_match(signature_)) return state::mismatch;
    if (!verify_) return state::ready;
    if (!node_check::arrived(&check_)) return state::waiting;
    return check_.left_matches(signature_) ? state::ready : state::mismatch;
  }
  /// True when the next try_publish() or peers() call would move on.
  bool can_advance() const noexcept {
    if (!published_) return node_step::slot_free(&step_) && (!verify_ || node_check::room(&check_));
    return peers() != state::waiting;
  }

  /// After peers() == ready: output = every rank's contribution of `count`
  /// elements combined in rank order with `apply3` / `apply` (see
  /// reduction_table), then marks the step consumed, the check complete and
  /// wakes peers.
  void reduce_into(std::byte* output, std::size_t count,
                   void (*apply3)(void*, const void*, const void*, std::size_t) noexcept,
                   void (*apply)(void*, const void*, std::size_t) noexcept) noexcept {
    step_.reduce_slots(output, count, apply3, apply);
    if (verify_) check_.complete();
    step_.raise(rank_, &node_flags::consumed);
  }

 private:
  node_step step_;
  node_check check_;
  int rank_;
  std::uint64_t signature_;
  bool verify_;
  bool published_ = false;
};

}  // namespace pdcoll::detail
