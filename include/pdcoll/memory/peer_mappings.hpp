// File: memory/peer_mappings.hpp — this process's read-only mappings of
// other processes' node-shareable allocations (memory/node_shareable.hpp),
// kept in a small LRU cache because mapping costs system calls and page
// faults on first touch, and a training loop reuses the same few buffers.
//
// Mappings are keyed by the file's device and inode, which no other file
// can take while the mapping keeps this one alive. A mapping is pinned
// while a collective reads through it; eviction only unmaps unpinned ones
// (least recently used first, beyond `capacity` mappings or
// `capacity_bytes`), and when every cached mapping is pinned the cache
// grows past its limits rather than fail. An owner that frees a segment
// empties its file first, so a cached mapping of a freed segment holds
// address space only, never memory (but see keep_pages in
// node_shareable.hpp).
#pragma once

#include <pdcoll/memory/node_shareable.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <utility>
#include <vector>

namespace pdcoll::memory::detail {

/// The cache (see the file comment).
class peer_mappings {
  using file_key = std::pair<std::uint64_t, std::uint64_t>;  // st_dev, st_ino

 public:
  /// Mappings kept at most (unless pinned).
  static constexpr std::size_t capacity = 64;
  /// Bytes of mappings kept at most (unless pinned).
  static constexpr std::size_t capacity_bytes = std::size_t{16} << 30;

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
    pinned(peer_mappings* owner, file_key key, const std::byte* address) noexcept
        : owner_(owner), key_(key), address_(address) {}
    void release() noexcept {
      if (owner_) owner_->unpin(key_);
      owner_ = nullptr;
    }
    peer_mappings* owner_ = nullptr;
    file_key key_{};
    const std::byte* address_ = nullptr;
  };

  peer_mappings() = default;
  peer_mappings(const peer_mappings&) = delete;
  peer_mappings& operator=(const peer_mappings&) = delete;
  ~peer_mappings() {
    for (auto& e : entries_) ::munmap(e.base, e.length);
  }

  /// Maps `range`'s allocation (or finds it mapped) and returns the range's
  /// first byte, pinned; the caller reads at most `bytes` from it. A range
  /// of this process resolves to its own address. Address nullptr when the
  /// range does not fit its allocation, or the owner's file cannot be
  /// opened (proc(5) access refused, the owner gone) or is not the file
  /// described.
  pinned resolve(const shareable_range& range, std::size_t bytes) {
    if (!range.shareable() || range.offset > range.segment_bytes || bytes > range.segment_bytes - range.offset)
      return {};
    if (range.pid == static_cast<std::uint64_t>(::getpid()))
      return {nullptr, {}, reinterpret_cast<const std::byte*>(range.base + range.offset)};
    const file_key key{range.device, range.inode};
    std::lock_guard lock(mutex_);
    entry* found = nullptr;
    for (auto& e : entries_)
      if (e.key == key && e.length == range.segment_bytes) found = &e;
    if (!found) {
      void* base = map(range);
      if (!base) return {};
      evict_unpinned(static_cast<std::size_t>(range.segment_bytes));
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
    file_key key;
    void* base;
    std::size_t length;
    std::uint64_t pins;
    std::uint64_t last_use;
  };

  static void* map(const shareable_range& range) noexcept {
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%llu/fd/%llu", static_cast<unsigned long long>(range.pid),
                  static_cast<unsigned long long>(range.fd));
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return nullptr;
    struct stat st {};
    void* base = nullptr;
    if (::fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_dev) == range.device &&
        static_cast<std::uint64_t>(st.st_ino) == range.inode &&
        static_cast<std::uint64_t>(st.st_size) == range.segment_bytes) {
      base = ::mmap(nullptr, static_cast<std::size_t>(range.segment_bytes), PROT_READ, MAP_SHARED, fd, 0);
      if (base == MAP_FAILED) base = nullptr;
    }
    ::close(fd);
    return base;
  }

  // Under mutex_: drops the least recently used unpinned mappings until one
  // more of `incoming` bytes fits.
  void evict_unpinned(std::size_t incoming) noexcept {
    std::size_t held = 0;
    for (const auto& e : entries_) held += e.length;
    while (entries_.size() >= capacity || held + incoming > capacity_bytes) {
      auto victim = entries_.end();
      for (auto it = entries_.begin(); it != entries_.end(); ++it)
        if (it->pins == 0 && (victim == entries_.end() || it->last_use < victim->last_use)) victim = it;
      if (victim == entries_.end()) return;
      held -= victim->length;
      ::munmap(victim->base, victim->length);
      entries_.erase(victim);
    }
  }

  void unpin(file_key key) noexcept {
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
