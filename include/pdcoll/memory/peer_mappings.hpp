// File: memory/peer_mappings.hpp — this process's read-only mappings of
// other processes' node-shareable allocations (memory/node_shareable.hpp),
// kept in a small LRU cache because mapping costs system calls and page
// faults on first touch, and a training loop reuses the same few buffers.
//
// A mapping is pinned while a collective reads through it; eviction only
// unmaps unpinned ones, and when every cached mapping is pinned the cache
// grows past its capacity rather than fail. An owner that frees a segment
// empties its file first, so a cached mapping of a freed segment holds
// address space only, never memory.
#pragma once

#include <pdcoll/memory/node_shareable.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace pdcoll::memory::detail {

/// The cache (see the file comment).
class peer_mappings {
 public:
  /// Unpinned mappings kept at most.
  static constexpr std::size_t capacity = 64;

  /// A resolved range: its first byte in this process, pinned until destroyed.
  class pinned {
   public:
    pinned() = default;
    pinned(pinned&& other) noexcept
        : owner_(std::exchange(other.owner_, nullptr)), key_(other.key_), address_(other.address_) {}
    pinned& operator=(pinned&& other) noexcept {
      if (this != &other) {
        release();
        owner_ = std::exchange(other.owner_, nullptr);
        key_ = other.key_;
        address_ = other.address_;
      }
      return *this;
    }
    pinned(const pinned&) = delete;
    pinned& operator=(const pinned&) = delete;
    ~pinned() { release(); }
    /// The range's first byte (nullptr: it could not be mapped).
    const std::byte* address() const noexcept { return address_; }

   private:
    friend class peer_mappings;
    pinned(peer_mappings* owner, std::pair<std::uint64_t, std::uint64_t> key, const std::byte* address) noexcept
        : owner_(owner), key_(key), address_(address) {}
    void release() noexcept {
      if (owner_) owner_->unpin(key_);
      owner_ = nullptr;
    }
    peer_mappings* owner_ = nullptr;
    std::pair<std::uint64_t, std::uint64_t> key_{};
    const std::byte* address_ = nullptr;
  };

  peer_mappings() = default;
  peer_mappings(const peer_mappings&) = delete;
  peer_mappings& operator=(const peer_mappings&) = delete;
  ~peer_mappings() {
    for (auto& e : entries_) ::munmap(e.base, e.length);
  }

  /// Maps `range`'s allocation (or finds it mapped) and returns the range's
  /// first byte, pinned. A range of this process resolves to its own
  /// address. Address nullptr when the owner's file cannot be opened (proc(5)
  /// access refused, the owner gone) or is not the size described.
  pinned resolve(const shareable_range& range) {
    if (!range.shareable()) return {};
    if (range.process_token == process_token())
      return {nullptr, {}, reinterpret_cast<const std::byte*>(range.base + range.offset)};
    const std::pair key{range.process_token, range.segment};
    std::lock_guard lock(mutex_);
    entry* found = nullptr;
    for (auto& e : entries_)
      if (e.key == key) found = &e;
    if (!found) {
      void* base = map(range);
      if (!base) return {};
      evict_unpinned();
      entries_.push_back({key, base, static_cast<std::size_t>(range.segment_bytes), 0, 0});
      found = &entries_.back();
    }
    ++found->pins;
    found->last_use = ++clock_;
    return {this, key, static_cast<const std::byte*>(found->base) + range.offset};
  }

  /// Mappings held (pinned or not).
  std::size_t size() const {
    std::lock_guard lock(mutex_);
    return entries_.size();
  }

 private:
  struct entry {
    std::pair<std::uint64_t, std::uint64_t> key;
    void* base;
    std::size_t length;
    std::uint64_t pins;
    std::uint64_t last_use;
  };

  static void* map(const shareable_range& range) noexcept {
    const std::string path = "/proc/" + std::to_string(range.pid) + "/fd/" + std::to_string(range.fd);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return nullptr;
    struct stat st {};
    void* base = nullptr;
    if (::fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_size) == range.segment_bytes &&
        range.offset <= range.segment_bytes) {
      base = ::mmap(nullptr, static_cast<std::size_t>(range.segment_bytes), PROT_READ, MAP_SHARED, fd, 0);
      if (base == MAP_FAILED) base = nullptr;
    }
    ::close(fd);
    return base;
  }

  // Under mutex_: drops the least recently used unpinned mappings until a new one fits.
  void evict_unpinned() noexcept {
    while (entries_.size() >= capacity) {
      auto victim = entries_.end();
      for (auto it = entries_.begin(); it != entries_.end(); ++it)
        if (it->pins == 0 && (victim == entries_.end() || it->last_use < victim->last_use)) victim = it;
      if (victim == entries_.end()) return;
      ::munmap(victim->base, victim->length);
      entries_.erase(victim);
    }
  }

  void unpin(std::pair<std::uint64_t, std::uint64_t> key) noexcept {
    std::lock_guard lock(mutex_);
    for (auto& e : entries_)
      if (e.key == key && e.pins > 0) --e.pins;
  }

  mutable std::mutex mutex_;
  std::vector<entry> entries_;
  std::uint64_t clock_ = 0;
};

/// The process-wide cache.
inline peer_mappings& peer_segment_mappings() {
  static peer_mappings mappings;
  return mappings;
}

}  // namespace pdcoll::memory::detail
