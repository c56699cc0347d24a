// File: detail/host_block_pool.hpp — host memory blocks that collectives
// borrow for scratch and staging and give back when they end.
//
// Allocating a fresh block per collective costs a page fault per 4 KiB
// (a ring all-reduce's 8 MiB of chunk slots: 2048 faults and 8 MiB zeroed,
// per call) and, on providers that register memory, a registration-cache
// miss per call because the address changes. The pool keeps blocks between
// collectives, up to a bound on the bytes it holds; the communicator
// invalidates a block's registrations when the pool lets it go.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace pdcoll::detail {

/// One block of host memory: `size` usable bytes at `bytes`.
struct host_block {
  std::unique_ptr<std::byte[]> bytes;
  std::size_t size = 0;
};

/// A bounded set of idle host blocks. Thread-safe.
class host_block_pool {
 public:
  /// At most this many idle blocks are kept (takes scan them).
  static constexpr std::size_t max_idle_blocks = 64;

  /// Keeps at most `max_held_bytes` of idle blocks.
  explicit host_block_pool(std::size_t max_held_bytes = std::size_t{64} << 20) noexcept
      : max_held_(max_held_bytes) {}

  /// A block of at least `n` bytes: with n rounded up to 4 KiB, the smallest
  /// idle block no larger than twice that, else a new one of that size.
  /// Throws std::bad_alloc.
  host_block take(std::size_t n) {
    const std::size_t size = (n + 4095) / 4096 * 4096;
    {
      std::lock_guard lock(mutex_);
      std::size_t best = idle_.size();
      for (std::size_t i = 0; i < idle_.size(); ++i) {
        const std::size_t s = idle_[i].size;
        if (s >= size && s / 2 <= size && (best == idle_.size() || s < idle_[best].size)) best = i;
      }
      if (best != idle_.size()) {
        host_block b = std::move(idle_[best]);
        idle_[best] = std::move(idle_.back());
        idle_.pop_back();
        held_ -= b.size;
        ++reused_;
        return b;
      }
    }
    return host_block{std::unique_ptr<std::byte[]>(new std::byte[size]), size};
  }

  /// Takes `b` back and returns the blocks it lets go of (usually none):
  /// `b` itself when it alone exceeds the bound, else the largest idle
  /// blocks until `b` fits within the bytes and max_idle_blocks. The caller drops their registrations, then
  /// lets them free.
  std::vector<host_block> give(host_block b) {
    std::vector<host_block> dropped;
    if (!b.bytes) return dropped;
    std::lock_guard lock(mutex_);
    if (b.size > max_held_) {
      dropped.push_back(std::move(b));
      return dropped;
    }
    while ((held_ + b.size > max_held_ || idle_.size() >= max_idle_blocks) && !idle_.empty()) {
      std::size_t largest = 0;
      for (std::size_t i = 1; i < idle_.size(); ++i)
        if (idle_[i].size > idle_[largest].size) largest = i;
      held_ -= idle_[largest].size;
      dropped.push_back(std::move(idle_[largest]));
      idle_[largest] = std::move(idle_.back());
      idle_.pop_back();
    }
    held_ += b.size;
    idle_.push_back(std::move(b));
    return dropped;
  }

  /// Bytes held in idle blocks.
  std::size_t held_bytes() const {
    std::lock_guard lock(mutex_);
    return held_;
  }
  /// Blocks handed out again instead of allocated.
  std::size_t reused() const {
    std::lock_guard lock(mutex_);
    return reused_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<host_block> idle_;
  std::size_t held_ = 0;
  std::size_t reused_ = 0;
  std::size_t max_held_;
};

}  // namespace pdcoll::detail
