// File: detail/idle_blocks.hpp — a bounded set of idle memory blocks, the
// common part of the host block pool (detail/host_block_pool.hpp) and the
// device domains' scratch cache (memory/scratch_cache.hpp).
#pragma once

#include <cstddef>
#include <mutex>
#include <optional>
#include <vector>

namespace pdcoll::detail {

/// Idle blocks of type Block (movable; `SizeOf{}(block)` gives its bytes),
/// at most `max_blocks` of them and `max_bytes` in all. Thread-safe.
template <class Block, class SizeOf>
class idle_blocks {
 public:
  /// Keeps at most `max_blocks` blocks and `max_bytes` bytes.
  idle_blocks(std::size_t max_bytes, std::size_t max_blocks) : max_bytes_(max_bytes), max_blocks_(max_blocks) {
    idle_.reserve(max_blocks);
  }

  /// The smallest idle block of at least `bytes` and at most twice that, if any.
  std::optional<Block> take(std::size_t bytes) {
    std::lock_guard lock(mutex_);
    std::size_t best = idle_.size();
    for (std::size_t i = 0; i < idle_.size(); ++i) {
      const std::size_t s = SizeOf{}(idle_[i]);
      if (s >= bytes && s / 2 <= bytes && (best == idle_.size() || s < SizeOf{}(idle_[best]))) best = i;
    }
    if (best == idle_.size()) return std::nullopt;
    std::optional<Block> b(std::move(idle_[best]));
    idle_[best] = std::move(idle_.back());
    idle_.pop_back();
    held_ -= SizeOf{}(*b);
    ++reused_;
    return b;
  }

  /// Keeps `b` (moved from) when that lets go of no block, and says so;
  /// otherwise leaves `b` alone and returns false (use give()).
  bool keep_if_room(Block& b) {
    std::lock_guard lock(mutex_);
    const std::size_t size = SizeOf{}(b);
    if (held_ + size > max_bytes_ || idle_.size() >= max_blocks_) return false;
    held_ += size;
    idle_.push_back(std::move(b));  // within the capacity reserved at construction
    return true;
  }

  /// Keeps `b`, letting go of the largest idle blocks until it fits the
  /// bounds (or of `b` itself when it alone exceeds max_bytes); each block
  /// let go is passed to `drop` (under the lock; `drop` must not call back).
  template <class Drop>
  void give(Block b, Drop&& drop) {
    std::lock_guard lock(mutex_);
    if (SizeOf{}(b) > max_bytes_) {
      drop(std::move(b));
      return;
    }
    while ((held_ + SizeOf{}(b) > max_bytes_ || idle_.size() >= max_blocks_) && !idle_.empty()) {
      std::size_t largest = 0;
      for (std::size_t i = 1; i < idle_.size(); ++i)
        if (SizeOf{}(idle_[i]) > SizeOf{}(idle_[largest])) largest = i;
      held_ -= SizeOf{}(idle_[largest]);
      Block victim = std::move(idle_[largest]);
      idle_[largest] = std::move(idle_.back());
      idle_.pop_back();
      drop(std::move(victim));
    }
    held_ += SizeOf{}(b);
    idle_.push_back(std::move(b));  // within the capacity reserved at construction
  }

  /// Hands every idle block to `drop`, one at a time outside the lock.
  /// Allocates nothing, and the list keeps the capacity reserved at
  /// construction, so give() and keep_if_room() stay allocation-free.
  template <class Drop>
  void clear(Drop&& drop) {
    for (;;) {
      std::optional<Block> b;
      {
        std::lock_guard lock(mutex_);
        if (idle_.empty()) return;
        b.emplace(std::move(idle_.back()));
        idle_.pop_back();
        held_ -= SizeOf{}(*b);
      }
      drop(std::move(*b));
    }
  }

  /// Idle bytes held.
  std::size_t held_bytes() const {
    std::lock_guard lock(mutex_);
    return held_;
  }
  /// Blocks handed out again by take().
  std::size_t reused() const {
    std::lock_guard lock(mutex_);
    return reused_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<Block> idle_;
  std::size_t held_ = 0;
  std::size_t reused_ = 0;
  std::size_t max_bytes_;
  std::size_t max_blocks_;
};

}  // namespace pdcoll::detail
