// File: detail/frame_cache.hpp — a per-thread cache of coroutine frames, so
// that a collective repeated in a loop reuses the frames its algorithm's
// coroutines had last time instead of allocating them again.
//
// A small all-reduce runs three coroutines (automatic's dispatch, the
// algorithm, the signature check); with each frame from malloc and back,
// they were a third of the allocations of an 8-byte all-reduce. Frames are
// kept per thread, 16 at most, sizes rounded up to 64 bytes; a frame freed on
// another thread than it was allocated on simply joins that thread's cache,
// and one freed while the thread ends (or, on the main thread, while static
// objects are destroyed) goes straight back to operator delete.
// Under AddressSanitizer a cached frame is poisoned, so a use after the
// coroutine ended is still reported.
#pragma once

#include <array>
#include <cstddef>
#include <new>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PDCOLL_FRAME_CACHE_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define PDCOLL_FRAME_CACHE_ASAN 1
#endif
#ifdef PDCOLL_FRAME_CACHE_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace pdcoll::detail {

/// The calling thread's idle coroutine frames.
class frame_cache {
 public:
  /// Frames larger than this are never kept.
  static constexpr std::size_t max_frame_bytes = std::size_t{16} << 10;
  /// At most this many idle frames per thread.
  static constexpr std::size_t slots = 16;

  /// Memory for a frame of `bytes`: an idle frame of the same rounded size, else new memory.
  static void* allocate(std::size_t bytes) {
    const std::size_t size = rounded(bytes);
    if (size <= max_frame_bytes) {
      auto& c = local();
      if (c.closed) return ::operator new(size);
      for (std::size_t i = c.count; i-- > 0;) {
        if (c.idle[i].size != size) continue;
        void* frame = c.idle[i].frame;
        c.idle[i] = c.idle[--c.count];
        unpoison(frame, size);
        return frame;
      }
    }
    return ::operator new(size);
  }

  /// Gives back a frame of `bytes` from allocate(): kept idle. When the
  /// cache is full an idle frame is freed to make room (in turn), so the
  /// sizes a thread uses now displace those it used before.
  static void deallocate(void* frame, std::size_t bytes) noexcept {
    const std::size_t size = rounded(bytes);
    if (size > max_frame_bytes) return ::operator delete(frame);
    auto& c = local();
    if (c.closed) return ::operator delete(frame);
    if (c.count == slots) {
      auto& victim = c.idle[c.next_victim];
      c.next_victim = (c.next_victim + 1) % slots;
      unpoison(victim.frame, victim.size);
      ::operator delete(victim.frame);
      victim = c.idle[--c.count];
    }
    poison(frame, size);
    c.idle[c.count++] = {frame, size};
  }

 private:
  struct idle_frame {
    void* frame = nullptr;
    std::size_t size = 0;
  };
  // Trivially destructible, so that it stays usable while the thread's (or
  // the program's) other objects are destroyed: frames freed then go
  // straight back to operator delete (`closed`).
  struct cache {
    std::array<idle_frame, slots> idle;
    std::size_t count;
    std::size_t next_victim;
    bool closed;
  };
  // Frees the idle frames when the thread ends, and closes the cache.
  struct closer {
    cache* c;
    explicit closer(cache* owner) noexcept : c(owner) {}
    closer(const closer&) = delete;
    closer& operator=(const closer&) = delete;
    ~closer() {
      while (c->count > 0) {
        auto& f = c->idle[--c->count];
        unpoison(f.frame, f.size);
        ::operator delete(f.frame);
      }
      c->closed = true;
    }
  };

  static cache& local() noexcept {
    thread_local constinit cache c{};
    thread_local closer close_at_exit{&c};
    return c;
  }
  static constexpr std::size_t rounded(std::size_t bytes) noexcept { return (bytes + 63) / 64 * 64; }

  static void poison([[maybe_unused]] void* p, [[maybe_unused]] std::size_t n) noexcept {
#ifdef PDCOLL_FRAME_CACHE_ASAN
    ASAN_POISON_MEMORY_REGION(p, n);
#endif
  }
  static void unpoison([[maybe_unused]] void* p, [[maybe_unused]] std::size_t n) noexcept {
#ifdef PDCOLL_FRAME_CACHE_ASAN
    ASAN_UNPOISON_MEMORY_REGION(p, n);
#endif
  }
};

}  // namespace pdcoll::detail
