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
// (proc(5): the same check as reading the owner's memory, PTRACE_MODE_READ);
// where that is refused the collectives fall back to copying. Freeing a
// segment truncates its file before closing it, so the pages go back to
// the system at once even while peers still map it (they never read it
// again: a freed segment is never described to them).
#pragma once

#include <pdcoll/memory/domain.hpp>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>

#include <sys/mman.h>
#include <unistd.h>

namespace pdcoll::memory {

/// Where a byte range of a node-shareable host allocation lives, as a peer
/// process needs it to map the range (see the file comment). Plain data:
/// it travels through node memory.
struct shareable_range {
  std::uint64_t process_token = 0;  ///< owner's process_token() (0: not shareable)
  std::uint64_t pid = 0;            ///< owner's process id
  std::uint64_t fd = 0;             ///< the memfd in the owner's file table
  std::uint64_t segment = 0;        ///< the allocation's number in its owner (from 1)
  std::uint64_t segment_bytes = 0;  ///< the allocation's mapped length
  std::uint64_t offset = 0;         ///< first byte of the range inside the allocation
  std::uint64_t base = 0;           ///< the allocation's address in its owner

  /// True for a range inside a shareable allocation.
  bool shareable() const noexcept { return process_token != 0; }
};

namespace detail {

/// A random number fixed for this process's lifetime: with the segment
/// number it names an allocation uniquely even when a process id is reused.
inline std::uint64_t process_token() {
  static const std::uint64_t token = [] {
    std::random_device device;
    std::uint64_t t = 0;
    while (t == 0) t = (std::uint64_t{device()} << 32) ^ device();
    return t;
  }();
  return token;
}

/// One memfd-backed mapping.
struct shareable_segment {
  int fd = -1;
  std::uint64_t number = 0;
  std::size_t length = 0;
};

/// The process's shareable allocations by address (see the file comment).
class shareable_table {
 public:
  /// Records the mapping [base, base + segment.length).
  void add(void* base, shareable_segment segment) {
    std::lock_guard lock(mutex_);
    segments_[reinterpret_cast<std::uintptr_t>(base)] = segment;
  }
  /// Forgets the mapping at base.
  void remove(void* base) {
    std::lock_guard lock(mutex_);
    segments_.erase(reinterpret_cast<std::uintptr_t>(base));
  }
  /// The description of [address, address + bytes) when one allocation holds it all.
  std::optional<shareable_range> find(const void* address, std::size_t bytes) const {
    const auto a = reinterpret_cast<std::uintptr_t>(address);
    std::lock_guard lock(mutex_);
    auto it = segments_.upper_bound(a);
    if (it == segments_.begin()) return std::nullopt;
    --it;
    const auto& [base, s] = *it;
    if (a - base > s.length || bytes > s.length - (a - base)) return std::nullopt;
    return shareable_range{process_token(), static_cast<std::uint64_t>(::getpid()), static_cast<std::uint64_t>(s.fd),
                           s.number, s.length, a - base, base};
  }
  /// A fresh segment number.
  std::uint64_t next_number() {
    std::lock_guard lock(mutex_);
    return ++last_number_;
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, shareable_segment> segments_;
  std::uint64_t last_number_ = 0;
};

/// The process-wide table.
inline shareable_table& shareable_segments() {
  static shareable_table table;
  return table;
}

/// Creates, sizes and maps a memfd of at least `bytes` (> 0, rounded to
/// pages) and records it. Errors: throws std::system_error with memfd_create,
/// ftruncate or mmap's errno, or errc::count_overflow.
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
  void* base = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    fail(std::error_code(e, std::system_category()), "pdcoll shareable allocation: mmap");
  }
  const shareable_segment segment{fd, shareable_segments().next_number(), length};
  shareable_segments().add(base, segment);
  return {base, segment};
}

/// Forgets, empties (ftruncate to 0: the pages are freed even where peers
/// still map the file), closes and unmaps a segment from map_shareable.
inline void unmap_shareable(void* base, const shareable_segment& segment) noexcept {
  shareable_segments().remove(base);
  (void)::ftruncate(segment.fd, 0);
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
