// File: transport/libfabric/doorbell.hpp — a futex word in shared memory
// that lets an idle shm rank sleep until a peer has posted something to it.
//
// libfabric 1.17's shm provider has no wait object for its completion
// queue: a rank with nothing to do can only poll or sleep for a guessed
// time, and a timed sleep costs the kernel's 50 us timer slack at least, so
// two ranks that take turns sleeping settle at tens of microseconds per
// message. With a doorbell, a rank that goes to sleep announces it
// (`sleepers`), checks its queue once more, and waits on `ring` with a
// futex; a peer that has just posted to it checks `sleepers` after a full
// fence and, when someone sleeps, bumps `ring` and wakes it. The fence on
// one side and the read-modify-write on the other make sure that either the
// sleeper sees the message in its re-check or the poster sees the sleeper.
//
// The mapping also holds the owner's rendezvous finish words (a cache line
// after the futex words): a peer that has read one of the owner's
// rendezvous payloads stores its answer there and rings, instead of sending
// a finish message (see endpoint.hpp's file comment).
#pragma once

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "pdcoll/transport/libfabric/shm_object.hpp"

namespace pdcoll::transport::libfabric::detail {

/// The shared words of one rank's doorbell.
struct doorbell_words {
  std::atomic<std::uint32_t> ring{0};      ///< bumped by a peer that woke the owner
  std::atomic<std::uint32_t> sleepers{0};  ///< non-zero while the owner sleeps (or is about to)
};
static_assert(std::atomic<std::uint32_t>::is_always_lock_free, "doorbells need lock-free 32-bit atomics");
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "finish words need lock-free 64-bit atomics");

/// Where the finish words start in a doorbell's mapping.
inline constexpr std::size_t finish_words_offset = 64;

/// Bytes of a doorbell's mapping with `finish_words` finish words.
constexpr std::size_t doorbell_bytes(std::size_t finish_words) noexcept {
  return finish_words_offset + finish_words * sizeof(std::uint64_t);
}

/// A mapping of a doorbell: this rank's own (create) or a peer's (open).
class doorbell {
 public:
  doorbell() = default;
  doorbell(const doorbell&) = delete;
  doorbell& operator=(const doorbell&) = delete;
  doorbell(doorbell&& o) noexcept
      : words(std::exchange(o.words, nullptr)),
        name(std::move(o.name)),
        mapped_bytes_(std::exchange(o.mapped_bytes_, 0)),
        linked_(std::exchange(o.linked_, false)) {}
  doorbell& operator=(doorbell&& o) noexcept {
    if (this != &o) {
      close();
      unlink();
      words = std::exchange(o.words, nullptr);
      name = std::move(o.name);
      mapped_bytes_ = std::exchange(o.mapped_bytes_, 0);
      linked_ = std::exchange(o.linked_, false);
    }
    return *this;
  }
  ~doorbell() {
    close();
    unlink();
  }

  /// Creates and maps this rank's doorbell, with `finish_words` finish words,
  /// under a fresh name (when `enabled`); on failure (errno says why: ENOSPC
  /// for a full /dev/shm) the doorbell stays unmapped and `name` empty.
  void create(bool enabled, std::size_t finish_words) noexcept {
    if (!enabled) return;
    const std::size_t bytes = doorbell_bytes(finish_words);
    attach(create_and_map_shm_object("pdcoll-bell", bytes, name), bytes);
    linked_ = words != nullptr;
  }

  /// Maps a peer's doorbell by name ("-": it has none), created with
  /// `finish_words` finish words. True on success.
  bool open(const char* peer_name, std::size_t finish_words) noexcept {
    if (!peer_name || peer_name[0] != '/') return false;
    const int fd = ::shm_open(peer_name, O_RDWR, 0);
    if (fd < 0) return false;
    const std::size_t bytes = doorbell_bytes(finish_words);
    struct stat st {};
    if (::fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) >= bytes)
      attach(map_shm_object(fd, bytes), bytes);
    ::close(fd);
    return words != nullptr;
  }

  /// Removes the name (own doorbell, once every peer has mapped it).
  void unlink() noexcept {
    if (linked_) ::shm_unlink(name.c_str());
    linked_ = false;
    name.clear();
  }

  /// Unmaps it.
  void close() noexcept {
    if (words) ::munmap(words, mapped_bytes_);
    words = nullptr;
    mapped_bytes_ = 0;
  }

  /// Finish word `i` (of those the owner created it with).
  std::atomic<std::uint64_t>& finish_word(std::size_t i) const noexcept {
    return reinterpret_cast<std::atomic<std::uint64_t>*>(reinterpret_cast<unsigned char*>(words) +
                                                         finish_words_offset)[i];
  }

  /// After a post to the owner: wakes it if it sleeps.
  void ring_if_sleeping() noexcept {
    if (!words) return;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (words->sleepers.load(std::memory_order_relaxed) == 0) return;
    words->ring.fetch_add(1, std::memory_order_seq_cst);
    ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&words->ring), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  }

  /// How a sleep ended.
  enum class woken { ready, rung, timed_out };

  /// Sleeps (own doorbell) until rung or `timeout`, unless `ready()` - the
  /// owner's last look at its queue, made after announcing the sleep - finds
  /// something.
  template <class Ready>
  woken sleep(Ready&& ready, std::chrono::nanoseconds timeout) noexcept {
    words->sleepers.fetch_add(1, std::memory_order_seq_cst);
    // Orders the announcement before ready()'s loads (the peers' side:
    // ring_if_sleeping's fence after their stores).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const std::uint32_t seen = words->ring.load(std::memory_order_seq_cst);
    woken how = woken::ready;
    if (!ready()) {
      if (timeout.count() > 0) {
        timespec ts{static_cast<time_t>(timeout.count() / 1'000'000'000),
                    static_cast<long>(timeout.count() % 1'000'000'000)};
        ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&words->ring), FUTEX_WAIT, seen, &ts, nullptr, 0);
      }
      how = words->ring.load(std::memory_order_acquire) != seen ? woken::rung : woken::timed_out;
    }
    words->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    return how;
  }

  doorbell_words* words = nullptr;  ///< the mapping (nullptr: none)
  std::string name;                 ///< the shm name (own doorbell)

 private:
  /// Takes a mapping of `bytes` (nullptr: none).
  void attach(void* at, std::size_t bytes) noexcept {
    if (!at) return;
    words = static_cast<doorbell_words*>(at);
    mapped_bytes_ = bytes;
  }

  std::size_t mapped_bytes_ = 0;
  bool linked_ = false;
};

}  // namespace pdcoll::transport::libfabric::detail
