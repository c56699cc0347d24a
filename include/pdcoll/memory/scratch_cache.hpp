// File: memory/scratch_cache.hpp — device blocks that collectives borrow as
// scratch and give back, kept by the domain between collectives.
//
// Device allocation is expensive: a Gaudi allocation maps memory through the
// driver, and the emulated device punches freed pages out of its memfd so
// the next allocation faults them in again (measured: 10 % of a 1 MiB
// direct all-reduce in page faults). A collective on device memory needs
// scratch on the device for every call, so each domain keeps its last few
// scratch blocks. The cache lives in the domain and dies with it, so it
// never outlives the memory it holds (a communicator's cache could).
#pragma once

#include <pdcoll/memory/device_buffer.hpp>

#include <cstddef>
#include <mutex>
#include <vector>

namespace pdcoll::memory {

/// Idle scratch blocks of one domain (bounded; thread-safe).
template <class Domain>
class scratch_cache {
 public:
  /// The block type: bytes of the domain.
  using block = device_buffer<std::byte, Domain>;
  /// At most this many idle blocks are kept.
  static constexpr std::size_t max_blocks = 8;
  /// At most this many idle bytes are kept.
  static constexpr std::size_t max_bytes = std::size_t{256} << 20;

  scratch_cache() { idle_.reserve(max_blocks); }

  /// A block of at least `bytes`: an idle one no larger than twice that, or
  /// `allocate(bytes)` (which may throw).
  template <class Allocate>
  block take(std::size_t bytes, Allocate&& allocate) {
    {
      std::lock_guard lock(mutex_);
      std::size_t best = idle_.size();
      for (std::size_t i = 0; i < idle_.size(); ++i) {
        const std::size_t s = idle_[i].size_bytes();
        if (s >= bytes && s / 2 <= bytes && (best == idle_.size() || s < idle_[best].size_bytes())) best = i;
      }
      if (best != idle_.size()) {
        block b = std::move(idle_[best]);
        idle_[best] = std::move(idle_.back());
        idle_.pop_back();
        held_ -= b.size_bytes();
        ++reused_;
        return b;
      }
    }
    return allocate(bytes);
  }

  /// Takes a block back; one over the bounds (or the largest idle ones that
  /// make room for it) is freed here.
  void give(block b) noexcept {
    std::lock_guard lock(mutex_);
    if (b.size_bytes() > max_bytes) return;  // freed on return
    while ((held_ + b.size_bytes() > max_bytes || idle_.size() >= max_blocks) && !idle_.empty()) {
      std::size_t largest = 0;
      for (std::size_t i = 1; i < idle_.size(); ++i)
        if (idle_[i].size_bytes() > idle_[largest].size_bytes()) largest = i;
      held_ -= idle_[largest].size_bytes();
      block victim = std::move(idle_[largest]);  // freed at the end of this iteration
      idle_[largest] = std::move(idle_.back());
      idle_.pop_back();
    }
    held_ += b.size_bytes();
    idle_.push_back(std::move(b));  // within the capacity reserved at construction
  }

  /// Frees every idle block.
  void clear() noexcept {
    std::vector<block> dropped;
    std::lock_guard lock(mutex_);
    dropped.swap(idle_);
    held_ = 0;
  }

  /// Idle bytes held.
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
  std::vector<block> idle_;
  std::size_t held_ = 0;
  std::size_t reused_ = 0;
};

}  // namespace pdcoll::memory
