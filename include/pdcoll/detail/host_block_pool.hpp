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

#include <pdcoll/detail/idle_blocks.hpp>

#include <cstddef>
#include <memory>
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
  explicit host_block_pool(std::size_t max_held_bytes = std::size_t{64} << 20)
      : idle_(max_held_bytes, max_idle_blocks) {}

  /// A block of at least `n` bytes: with n rounded up to 4 KiB, the smallest
  /// idle block no larger than twice that, else a new one of that size.
  /// Throws std::bad_alloc.
  host_block take(std::size_t n) {
    const std::size_t size = (n + 4095) / 4096 * 4096;
    if (auto b = idle_.take(size)) return std::move(*b);
    return host_block{std::unique_ptr<std::byte[]>(new std::byte[size]), size};
  }

  /// Takes `b` back and returns the blocks it lets go of (usually none):
  /// `b` itself when it alone exceeds the bound, else the largest idle
  /// blocks until `b` fits within the bytes and max_idle_blocks. The caller
  /// drops their registrations, then lets them free.
  std::vector<host_block> give(host_block b) {
    std::vector<host_block> dropped;
    if (!b.bytes || idle_.keep_if_room(b)) return dropped;  // the usual case: nothing to let go of, nothing allocated
    dropped.reserve(max_idle_blocks + 1);  // drop() below must not allocate under the lock
    idle_.give(std::move(b), [&](host_block d) { dropped.push_back(std::move(d)); });
    return dropped;
  }

  /// Bytes held in idle blocks.
  std::size_t held_bytes() const { return idle_.held_bytes(); }
  /// Blocks handed out again instead of allocated.
  std::size_t reused() const { return idle_.reused(); }

 private:
  struct size_of {
    std::size_t operator()(const host_block& b) const noexcept { return b.size; }
  };
  idle_blocks<host_block, size_of> idle_;
};

}  // namespace pdcoll::detail
