// File: memory/host.hpp — the host memory domain: page-aligned allocations
// (optionally on huge pages) that tell the registration cache when they go.
//
// Performance: host_buffer maps whole pages with mmap(2), one system call per
// allocation and per free: allocate communication buffers once and reuse
// them, not per call. Huge pages cut TLB misses and let the NIC register a
// buffer as a few large pages.
#pragma once

#include <pdcoll/memory/domain.hpp>
#include <pdcoll/memory/node_shareable.hpp>
#include <pdcoll/memory/view.hpp>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <sys/mman.h>

namespace pdcoll::memory {

/// Which pages back a host_buffer (host::allocate with huge_pages::yes
/// reports what it got rather than silently settling for less).
enum class page_backing : std::uint8_t {
  regular = 0,                 ///< ordinary pages
  transparent_huge_pages = 1,  ///< madvise(MADV_HUGEPAGE) accepted: the kernel may use THP
  hugetlb = 2,                 ///< MAP_HUGETLB: reserved huge pages (hugetlbfs pool)
};

/// Printable name of a page backing ("regular", "thp", "hugetlb").
constexpr std::string_view to_string(page_backing backing) noexcept {
  switch (backing) {
    case page_backing::regular: return "regular";
    case page_backing::transparent_huge_pages: return "thp";
    case page_backing::hugetlb: return "hugetlb";
  }
  return "?";
}

namespace detail {

/// Process-wide invalidation hooks of the (stateless) host domain.
inline invalidation_hooks& host_hooks() {
  static invalidation_hooks hooks;
  return hooks;
}

/// The default huge page size ("Hugepagesize:" in /proc/meminfo, see
/// proc(5)); MAP_HUGETLB without a size flag uses this one. 2 MiB when the
/// file cannot be read.
inline std::size_t huge_page_size() noexcept {
  static const std::size_t size = [] {
    std::size_t kib = 0;
    if (std::FILE* meminfo = std::fopen("/proc/meminfo", "re")) {
      char line[256];
      while (std::fgets(line, sizeof line, meminfo) != nullptr) {
        unsigned long value = 0;
        if (std::sscanf(line, "Hugepagesize: %lu kB", &value) == 1) {
          kib = value;
          break;
        }
      }
      std::fclose(meminfo);
    }
    return kib != 0 ? kib * 1024 : std::size_t{2} << 20;
  }();
  return size;
}

/// One mapping: what munmap needs, what backs it, and its memfd when it
/// is node-shareable (memory/node_shareable.hpp).
struct host_mapping {
  void* base = nullptr;
  std::size_t length = 0;
  page_backing backing = page_backing::regular;
  shareable_segment shared{};  ///< fd -1: an anonymous mapping
};

/// Maps at least `bytes` (> 0) of zero-filled, page-aligned memory.
/// Errors: the mmap errno in std::system_category(), or errc::count_overflow.
inline host_mapping map_host(std::size_t bytes, huge_pages pages) {
  const std::size_t huge = huge_page_size();
  std::size_t length = 0;
  if (!round_up(bytes, pages == huge_pages::yes ? huge : page_size(), length))
    fail(errc::count_overflow, "pdcoll host allocation of " + std::to_string(bytes) + " bytes");
  constexpr int prot = PROT_READ | PROT_WRITE;
  constexpr int flags = MAP_PRIVATE | MAP_ANONYMOUS;
  if (pages == huge_pages::no) {
    void* base = ::mmap(nullptr, length, prot, flags, -1, 0);
    if (base == MAP_FAILED)
      fail(std::error_code(errno, std::system_category()), "pdcoll host allocation: mmap");
    return {base, length, page_backing::regular};
  }
#ifdef MAP_HUGETLB
  // mmap(2): MAP_HUGETLB fails with ENOMEM when the hugetlbfs pool
  // (vm.nr_hugepages) has too few free pages; that is the common case on
  // machines nobody configured, so fall through to THP.
  if (void* base = ::mmap(nullptr, length, prot, flags | MAP_HUGETLB, -1, 0); base != MAP_FAILED)
    return {base, length, page_backing::hugetlb};
#endif
  // THP only backs huge-page-aligned ranges: over-map by one huge page and
  // trim so the range starts on a huge page boundary.
  if (length > std::numeric_limits<std::size_t>::max() - huge)
    fail(errc::count_overflow, "pdcoll host allocation of " + std::to_string(bytes) + " bytes");
  const std::size_t padded = length + huge;
  void* raw = ::mmap(nullptr, padded, prot, flags, -1, 0);
  if (raw == MAP_FAILED)
    fail(std::error_code(errno, std::system_category()), "pdcoll host allocation: mmap");
  const auto raw_address = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (raw_address + huge - 1) / huge * huge;
  if (aligned > raw_address) ::munmap(raw, aligned - raw_address);
  const std::size_t tail = raw_address + padded - (aligned + length);
  if (tail > 0) ::munmap(reinterpret_cast<void*>(aligned + length), tail);
  void* base = reinterpret_cast<void*>(aligned);
  // madvise(2): EINVAL when the kernel has no THP support; the pages are
  // still good, only regular.
  const bool advised = ::madvise(base, length, MADV_HUGEPAGE) == 0;
  return {base, length, advised ? page_backing::transparent_huge_pages : page_backing::regular};
}

}  // namespace detail

/// An owning, move-only host allocation of `size()` zero-filled elements,
/// page-aligned (huge-page-aligned with huge pages). Destruction runs the
/// host domain's invalidation hooks with the buffer's region, then unmaps it.
///
///     auto buf = pdcoll::memory::host::allocate<float>(n, pdcoll::memory::huge_pages::yes);
///     std::printf("backed by %s pages\n", to_string(buf.backing()).data());
///     pdcoll::view<float> v = buf.view();
template <class T>
class host_buffer {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>,
                "host_buffer holds bytes; T must be trivially copyable and destructible");

 public:
  /// An empty buffer.
  host_buffer() noexcept = default;
  host_buffer(host_buffer&& other) noexcept
      : mapping_(std::exchange(other.mapping_, {})), count_(std::exchange(other.count_, 0)) {}
  host_buffer& operator=(host_buffer&& other) noexcept {
    if (this != &other) {
      reset();
      mapping_ = std::exchange(other.mapping_, {});
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }
  host_buffer(const host_buffer&) = delete;
  host_buffer& operator=(const host_buffer&) = delete;
  ~host_buffer() { reset(); }

  /// The first element (nullptr when empty).
  T* data() const noexcept { return static_cast<T*>(mapping_.base); }
  /// Number of elements.
  std::size_t size() const noexcept { return count_; }
  /// Number of bytes of elements (the mapping may be larger: whole pages).
  std::size_t size_bytes() const noexcept { return count_ * sizeof(T); }
  /// True when the buffer holds no elements.
  bool empty() const noexcept { return count_ == 0; }
  /// The elements as a span.
  std::span<T> span() const noexcept { return {data(), count_}; }
  /// The elements as a host view.
  pdcoll::view<T, host> view() const noexcept { return {data(), count_}; }
  /// Which pages back the buffer.
  page_backing backing() const noexcept { return mapping_.backing; }
  /// Bytes actually mapped (whole pages).
  std::size_t mapped_bytes() const noexcept { return mapping_.length; }
  /// True when other processes on the host can map the buffer
  /// (host::allocate_shareable), so shared-memory collectives read it in place.
  bool shareable() const noexcept { return mapping_.shared.fd >= 0; }

  /// Runs the invalidation hooks and unmaps; the buffer is empty afterwards.
  void reset() noexcept {
    if (mapping_.base == nullptr) return;
    // Hooks first: a registration of these pages must be gone before the
    // address range can be handed out again.
    detail::host_hooks().notify(detail::fabric_region(view()));
    if (shareable()) detail::unmap_shareable(mapping_.base, mapping_.shared);
    else ::munmap(mapping_.base, mapping_.length);
    mapping_ = {};
    count_ = 0;
  }

 private:
  friend struct host;
  host_buffer(detail::host_mapping mapping, std::size_t count) noexcept : mapping_(mapping), count_(count) {}

  detail::host_mapping mapping_{};
  std::size_t count_ = 0;
};

/// The host domain: ordinary process memory. Stateless: any two `host`
/// objects are the same domain.
struct host {
  /// The memory kind transports dispatch on.
  static constexpr transport::memory_kind kind = transport::memory_kind::host;
  /// libfabric's FI_HMEM_SYSTEM.
  static constexpr int hmem_iface = 0;
  /// Reductions run in place on host memory: always true.
  static constexpr bool reduces_on_device() noexcept { return true; }

  /// Allocates `count` zero-filled elements with mmap(2); with
  /// huge_pages::yes, MAP_HUGETLB when the hugetlbfs pool has pages, else
  /// THP-aligned with madvise(MADV_HUGEPAGE): host_buffer::backing() says
  /// which. count == 0 gives an empty buffer without a system call.
  /// Errors: throws std::system_error: errc::count_overflow, or mmap's errno
  /// in std::system_category().
  template <class T>
  static host_buffer<T> allocate(std::size_t count, huge_pages pages = huge_pages::no) {
    std::size_t bytes = 0;
    if (!detail::checked_bytes<T>(count, bytes))
      detail::fail(errc::count_overflow, "pdcoll host allocation of " + std::to_string(count) + " elements");
    if (count == 0) return {};
    return host_buffer<T>(detail::map_host(bytes, pages), count);
  }

  /// Allocates `count` zero-filled elements that other processes on the
  /// host can map (a memfd(2), memory/node_shareable.hpp), on regular
  /// pages. shared_memory_scatter all-reduces (automatic's choice over
  /// libfabric shm from 32 KiB) of at least algo::node_direct_bytes
  /// (256 KiB) whose buffers are shareable on every rank read and write
  /// them in place: no copy into node memory and out again
  /// (algorithm/shared_memory.hpp).
  /// Cost: four system calls to allocate and three to free; a peer maps
  /// the buffer once and keeps it in an LRU cache (64 mappings, 16 GiB;
  /// memory/peer_mappings.hpp). Errors: throws std::system_error:
  /// errc::count_overflow, or memfd_create's, ftruncate's, fstat's or
  /// mmap's errno in std::system_category().
  ///
  ///     auto grads = pdcoll::memory::host::allocate_shareable<float>(n);
  ///     pdcoll::exec::sync_wait(pdcoll::all_reduce(comm, grads.view(), pdcoll::op::sum));
  template <class T>
  static host_buffer<T> allocate_shareable(std::size_t count) {
    std::size_t bytes = 0;
    if (!detail::checked_bytes<T>(count, bytes))
      detail::fail(errc::count_overflow, "pdcoll shareable allocation of " + std::to_string(count) + " elements");
    if (count == 0) return {};
    auto [base, segment] = detail::map_shareable(bytes);
    return host_buffer<T>(detail::host_mapping{base, segment.length, page_backing::regular, segment}, count);
  }

  /// Subscribes to "this host_buffer is about to be freed". Process-wide
  /// (the domain is stateless); memory the user owns (vectors, spans) is not
  /// tracked. Cost: a mutex and a vector append.
  static hook_id add_invalidation_hook(invalidation_hook hook) {
    return detail::host_hooks().add(std::move(hook));
  }
  /// Unsubscribes; no call of the hook runs after this returns.
  static void remove_invalidation_hook(hook_id id) { detail::host_hooks().remove(id); }
};

}  // namespace pdcoll::memory

namespace pdcoll {
template <class T>
memory::host view<T, memory::host>::domain() const noexcept {
  return {};
}
}  // namespace pdcoll
