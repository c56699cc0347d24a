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

#include <pdcoll/detail/idle_blocks.hpp>
#include <pdcoll/memory/device_buffer.hpp>

#include <cstddef>
#include <system_error>
#include <utility>

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

  /// A block of at least `bytes`: an idle one no larger than twice that, or
  /// `allocate(bytes)` (which may throw).
  template <class Allocate>
  block take(std::size_t bytes, Allocate&& allocate) {
    if (auto b = idle_.take(bytes)) return std::move(*b);
    return allocate(bytes);
  }

  /// Takes a block back; one over the bounds (or the largest idle ones that
  /// make room for it) is freed here.
  void give(block b) noexcept {
    idle_.give(std::move(b), [](block) {});
  }

  /// Frees every idle block.
  void clear() noexcept {
    idle_.clear([](block) {});
  }

  /// Idle bytes held.
  std::size_t held_bytes() const { return idle_.held_bytes(); }
  /// Blocks handed out again instead of allocated.
  std::size_t reused() const { return idle_.reused(); }

 private:
  struct size_of {
    std::size_t operator()(const block& b) const noexcept { return b.size_bytes(); }
  };
  pdcoll::detail::idle_blocks<block, size_of> idle_{max_bytes, max_blocks};
};

/// Calls `allocate()`; where that fails for want of memory
/// (std::errc::not_enough_memory) while `cache` holds idle blocks, frees
/// them and calls it once more. A domain's allocate goes through it: the
/// idle scratch (up to scratch_cache::max_bytes) must not starve the
/// caller's own buffers, nor a collective's larger scratch.
template <class Domain, class Allocate>
auto allocate_or_reclaim(scratch_cache<Domain>& cache, Allocate&& allocate) -> decltype(allocate()) {
  try {
    return allocate();
  } catch (const std::system_error& e) {
    if (e.code() != std::errc::not_enough_memory || cache.held_bytes() == 0) throw;
  }
  cache.clear();
  return allocate();
}

}  // namespace pdcoll::memory
