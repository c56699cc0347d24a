// File: memory/node_shareable.hpp — host memory that other processes on the
// host can map: memfd(2)-backed allocations, the process-wide table that
// finds the allocation a pointer falls in, and the description a peer maps
// it from.
//
// Why: a shared-memory all-reduce over ordinary process memory must copy
// every byte into memory the peers map, and out again (about 4.5 bytes of
// memory traffic per buffer byte on 2 ranks). When the user's buffers are
// themselves mappable, every rank reduces its block straight from the
// peers' buffers and copies the others' results straight out of them
// (algorithm/shared_memory.hpp): about 2.5 bytes. It is the host
// counterpart of exporting device memory as a DMA-BUF: allocate once with
// host::allocate_shareable, and the collectives notice.
//
// A peer maps a segment by opening /proc/<pid>/fd/<fd> of its owner
// (proc(5): a PTRACE_MODE_READ check, as for /proc/<pid>/maps; Yama does
// not restrict it);
// where that is refused the collectives fall back to copying. Freeing a
// segment truncates its file before closing it, so the pages go back to
// the system at once even while peers still map it (they never read it
// again: a freed segment is never described to them, and a collective
// completes only once no peer reads its buffers). A collective that ended
// early (timeout, abort) marks its buffers keep_pages instead: a peer may
// still be reading, and reading an emptied file faults.
#pragma once

#include <pdcoll/memory/domain.hpp>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace pdcoll::memory {

/// Where a byte range of a node-shareable host allocation lives, as a peer
/// process needs it to map the range (see the file comment). Plain data:
/// it travels through node memory. The file's device and inode name it
/// uniquely while it exists, and a peer's mapping keeps it existing, so a
/// cached mapping is never mistaken for another file (process ids and fd
/// numbers are reused, and a per-process counter would be copied into a
/// forked child).
struct shareable_range {
  std::uint64_t pid = 0;            ///< owner's process id
  std::uint64_t fd = 0;             ///< the memfd in the owner's file table
  std::uint64_t device = 0;         ///< the memfd's st_dev
  std::uint64_t inode = 0;          ///< the memfd's st_ino (0: not shareable)
  std::uint64_t segment_bytes = 0;  ///< the allocation's mapped length
  std::uint64_t offset = 0;         ///< first byte of the range inside the allocation
  std::uint64_t base = 0;           ///< the allocation's address in its owner

  /// True for a range inside a shareable allocation.
  bool shareable() const noexcept { return inode != 0; }
};

namespace detail {

/// One memfd-backed mapping.
struct shareable_segment {
  int fd = -1;
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  std::size_t length = 0;
  pid_t creator = 0;  ///< the process that made it: only it empties the file (a forked child shares it)
};

/// The process's shareable allocations by address (see the file comment).
class shareable_table {
 public:
  /// Records the mapping [base, base + segment.length).
  void add(void* base, shareable_segment segment) {
    std::lock_guard lock(mutex_);
    segments_[reinterpret_cast<std::uintptr_t>(base)] = {segment, false};
  }
  /// Forgets the mapping at base; true when its pages must outlive it
  /// (keep_pages).
  bool remove(void* base) {
    std::lock_guard lock(mutex_);
    auto it = segments_.find(reinterpret_cast<std::uintptr_t>(base));
    if (it == segments_.end()) return false;
    const bool keep = it->second.keep_pages;
    segments_.erase(it);
    return keep;
  }
  /// Marks the allocation holding `address` so that freeing it leaves its
  /// pages to whoever still maps them: after a collective that ended while
  /// peers may still read it (a timeout, an abort), emptying the file would
  /// make their reads fault.
  void keep_pages(const void* address) {
    std::lock_guard lock(mutex_);
    if (auto it = holding(reinterpret_cast<std::uintptr_t>(address)); it != segments_.end()) it->second.keep_pages = true;
  }
  /// The description of [address, address + bytes) when one allocation holds it all.
  std::optional<shareable_range> find(const void* address, std::size_t bytes) const {
    const auto a = reinterpret_cast<std::uintptr_t>(address);
    std::lock_guard lock(mutex_);
    auto it = holding(a);
    if (it == segments_.end()) return std::nullopt;
    const auto& [base, held] = *it;
    const auto& s = held.segment;
    if (bytes > s.length - (a - base)) return std::nullopt;
    return shareable_range{static_cast<std::uint64_t>(::getpid()), static_cast<std::uint64_t>(s.fd), s.device,
                           s.inode, s.length, a - base, base};
  }

 private:
  struct entry {
    shareable_segment segment;
    bool keep_pages;
  };
  using map_type = std::map<std::uintptr_t, entry>;
  // Under mutex_: the allocation whose range holds address, or end().
  map_type::iterator holding(std::uintptr_t address) {
    auto it = segments_.upper_bound(address);
    if (it == segments_.begin()) return segments_.end();
    --it;
    return address - it->first < it->second.segment.length ? it : segments_.end();
  }
  map_type::const_iterator holding(std::uintptr_t address) const {
    return const_cast<shareable_table*>(this)->holding(address);
  }

  mutable std::mutex mutex_;
  map_type segments_;
};

/// The process-wide table.
inline shareable_table& shareable_segments() {
  static shareable_table table;
  return table;
}

/// Creates, sizes and maps a memfd of at least `bytes` (> 0, rounded to
/// pages) and records it. Errors: throws std::system_error with memfd_create's,
/// ftruncate's, fstat's or mmap's errno, or errc::count_overflow.
inline std::pair<void*, shareable_segment> map_shareable(std::size_t bytes) {
  std::size_t length = 0;
  if (!round_up(bytes, page_size(), length))
    fail(errc::count_overflow, "pdcoll shareable allocation of " + std::to_string(bytes) + " bytes");
  const int fd = ::memfd_create("pdcoll-shareable", MFD_CLOEXEC);
  if (fd < 0) fail(std::error_code(errno, std::system_category()), "pdcoll shareable allocation: memfd_create");
  if (::ftruncate(fd, static_cast<off_t>(length)) != 0) {
    const int e = errno;
    ::close(fd);
    fail(std::error_code(e, std::system_category()), "pdcoll shareable allocation: ftruncate");
  }
  struct stat st {};
  void* base = ::fstat(fd, &st) == 0 ? ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (base == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    fail(std::error_code(e, std::system_category()), "pdcoll shareable allocation: fstat or mmap");
  }
  const shareable_segment segment{fd, static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino),
                                  length, ::getpid()};
  shareable_segments().add(base, segment);
  return {base, segment};
}

/// Forgets, empties (ftruncate to 0: the pages are freed even where peers
/// still map the file, unless keep_pages marked it), closes and unmaps a
/// segment from map_shareable. Only the process that created it empties the
/// file: a child forked without exec shares the file and the MAP_SHARED
/// pages with its parent, and its freeing the copy it inherited must not
/// take the parent's live buffer away (the parent's next read: SIGBUS).
inline void unmap_shareable(void* base, const shareable_segment& segment) noexcept {
  const bool keep_pages = shareable_segments().remove(base);
  if (!keep_pages && segment.creator == ::getpid()) (void)::ftruncate(segment.fd, 0);
  ::close(segment.fd);
  ::munmap(base, segment.length);
}

}  // namespace detail

/// The description of [address, address + bytes) if a node-shareable host
/// allocation (host::allocate_shareable) holds all of it; nullopt otherwise.
/// Cost: a mutex and a map lookup.
inline std::optional<shareable_range> find_shareable(const void* address, std::size_t bytes) {
  return detail::shareable_segments().find(address, bytes);
}

}  // namespace pdcoll::memory
