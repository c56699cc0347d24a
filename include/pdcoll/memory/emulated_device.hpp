// File: memory/emulated_device.hpp — `emulated_device`: "device memory"
// carved from one memfd, so CI machines without accelerators exercise the
// device paths: no public host pointer, DMA-BUF-like exports, counted copies.
//
// The arena is one memfd (memfd_create(2) + ftruncate(2)) that the domain
// maps once, MAP_SHARED, for its own use: the copies and the in-place
// reductions (the "device compute") run on that mapping, and it is the
// address the fabric registers (FI_HMEM_SYSTEM: libfabric 1.17 has no
// FI_MR_DMABUF). Exports name the memfd itself with the allocation's offset,
// exactly the {fd, offset, length} triple a DMA-BUF importer takes.
//
// Allocation is first-fit over page-aligned chunks under one mutex; a freed
// chunk's pages are returned to the kernel (FALLOC_FL_PUNCH_HOLE), so a
// 256 MiB arena costs only what is in use.
#pragma once

#include <pdcoll/memory/device_buffer.hpp>
#include <pdcoll/memory/domain.hpp>
#include <pdcoll/memory/scratch_cache.hpp>
#include <pdcoll/memory/view.hpp>

#include <cerrno>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace pdcoll::memory {

/// A memfd-backed stand-in for device memory (CI, tests, examples).
///
/// Thread-safe: allocation, free, export and copies may be called from any
/// thread. Not movable: views and buffers point at it, so it must outlive
/// every buffer allocated from it.
///
///     pdcoll::memory::emulated_device dev;            // 256 MiB arena
///     auto buf = dev.allocate<float>(1024);
///     dev.copy_from_host(std::span<const float>(input), buf.view());
///     auto [fd, offset, length] = dev.export_dmabuf(buf.view());
///     assert(dev.counters().host_to_device_calls == 1);
class emulated_device {
 public:
  /// The memory kind transports dispatch on.
  static constexpr transport::memory_kind kind = transport::memory_kind::emulated_device;
  /// libfabric's FI_HMEM_SYSTEM: the fabric reaches the arena through the
  /// domain's host mapping.
  static constexpr int hmem_iface = 0;
  /// The arena size when none is given.
  static constexpr std::size_t default_capacity = std::size_t{256} << 20;

  /// Creates an arena of `capacity_bytes` (rounded up to whole pages).
  /// Cost: memfd_create, ftruncate and mmap; no memory is touched.
  /// Errors: throws std::system_error: errc::invalid_argument for a zero
  /// capacity, else the failing call's errno in std::system_category().
  explicit emulated_device(std::size_t capacity_bytes = default_capacity) {
    if (capacity_bytes == 0) detail::fail(errc::invalid_argument, "emulated_device: zero capacity");
    if (!detail::round_up(capacity_bytes, detail::page_size(), capacity_))
      detail::fail(errc::count_overflow, "emulated_device: capacity " + std::to_string(capacity_bytes));
    fd_ = ::memfd_create("pdcoll-emulated-device", MFD_CLOEXEC);
    if (fd_ < 0) detail::fail(std::error_code(errno, std::system_category()), "emulated_device: memfd_create");
    if (::ftruncate(fd_, static_cast<off_t>(capacity_)) != 0) {
      const int error = errno;
      ::close(fd_);
      detail::fail(std::error_code(error, std::system_category()), "emulated_device: ftruncate");
    }
    void* mapping = ::mmap(nullptr, capacity_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (mapping == MAP_FAILED) {
      const int error = errno;
      ::close(fd_);
      detail::fail(std::error_code(error, std::system_category()), "emulated_device: mmap");
    }
    mapping_ = static_cast<std::byte*>(mapping);
    arena_ = detail::first_fit_arena(0, capacity_);
  }
  emulated_device(const emulated_device&) = delete;
  emulated_device& operator=(const emulated_device&) = delete;
  /// Unmaps and closes the arena. Precondition: every buffer allocated from
  /// it is gone (their views and exported fds are invalid afterwards).
  ~emulated_device() {
    scratch_.clear();
    ::munmap(mapping_, capacity_);
    ::close(fd_);
  }

  /// Collectives' device scratch, kept between collectives (scratch_cache.hpp).
  scratch_cache<emulated_device>& scratch() noexcept { return scratch_; }

  /// Arena size in bytes (whole pages).
  std::size_t capacity() const noexcept { return capacity_; }
  /// Bytes reserved by live allocations (whole pages each).
  std::size_t bytes_in_use() const {
    std::lock_guard lock(mutex_);
    return arena_.in_use();
  }
  /// Number of live allocations.
  std::size_t allocation_count() const {
    std::lock_guard lock(mutex_);
    return live_.size();
  }

  /// Allocates `count` elements (page-aligned, zero-filled on first use).
  /// count == 0 gives an empty buffer that reserves nothing. Where no free
  /// chunk is large enough, the collectives' idle scratch is freed and the
  /// allocation tried once more.
  /// Cost: a mutex and a walk of the free list (first fit).
  /// Errors: throws std::system_error: errc::count_overflow, or
  /// std::errc::not_enough_memory when no free chunk is large enough.
  template <class T>
  device_buffer<T, emulated_device> allocate(std::size_t count) {
    return allocate_or_reclaim(scratch_, [&] { return allocate_from_arena<T>(count); });
  }

  /// Copies the view's elements into the front of `dst` (device → host) and
  /// counts bytes and calls.
  /// Errors: throws std::system_error: errc::buffer_too_small when `dst` is
  /// shorter than `src`, errc::invalid_argument when `src` is not inside a
  /// live allocation of this domain.
  template <class T, class U>
    requires std::same_as<std::remove_const_t<T>, U>
  void copy_to_host(const pdcoll::view<T, emulated_device>& src, std::span<U> dst) const {
    if (dst.size() < src.size())
      detail::fail(errc::buffer_too_small, "emulated_device::copy_to_host: " + std::to_string(dst.size()) +
                                               " < " + std::to_string(src.size()) + " elements");
    const std::uint64_t address = checked_address(src, "copy_to_host");
    if (src.size_bytes() != 0) std::memcpy(dst.data(), mapping_ + address, src.size_bytes());
    copies_.count_to_host(src.size_bytes());
  }

  /// Copies `src` into the front of the view (host → device) and counts
  /// bytes and calls.
  /// Errors: throws std::system_error: errc::buffer_too_small when `dst` is
  /// shorter than `src`, errc::invalid_argument when `dst` is not inside a
  /// live allocation of this domain.
  template <class U, class T>
    requires(std::same_as<std::remove_const_t<U>, T> && !std::is_const_v<T>)
  void copy_from_host(std::span<U> src, const pdcoll::view<T, emulated_device>& dst) const {
    if (dst.size() < src.size())
      detail::fail(errc::buffer_too_small, "emulated_device::copy_from_host: " + std::to_string(dst.size()) +
                                               " < " + std::to_string(src.size()) + " elements");
    const std::uint64_t address = checked_address(dst, "copy_from_host");
    if (!src.empty()) std::memcpy(mapping_ + address, src.data(), src.size_bytes());
    copies_.count_from_host(src.size_bytes());
  }

  /// The view as {fd, offset, length}: `fd` is the arena's memfd itself,
  /// owned by this domain (do not close it; valid until the domain is
  /// destroyed), `offset` the view's offset in it. Cost: a mutex and a map
  /// lookup; no system call.
  /// Errors: throws std::system_error(errc::invalid_argument) when the view
  /// is not inside a live allocation of this domain.
  template <class T>
  dmabuf_export export_dmabuf(const pdcoll::view<T, emulated_device>& v) const {
    const std::uint64_t address = checked_address(v, "export_dmabuf");
    return {fd_, address, v.size_bytes()};
  }

  /// The copy counters so far (each field read atomically).
  copy_counters counters() const noexcept {
    return copies_.snapshot();
  }
  /// Sets every counter to zero.
  void reset_counters() noexcept {
    copies_.reset();
  }

  /// Subscribes to "this allocation is about to be freed"; the hook gets
  /// fabric_region of the allocation's full view. See invalidation_hooks for
  /// the locking rule.
  hook_id add_invalidation_hook(invalidation_hook hook) { return hooks_.add(std::move(hook)); }
  /// Unsubscribes; no call of the hook runs after this returns.
  void remove_invalidation_hook(hook_id id) { hooks_.remove(id); }
  /// What this domain's regions carry as their free_notice: its hooks,
  /// which announce every free (track_frees tells a communicator so).
  const void* free_notice() const noexcept { return &hooks_; }

  /// True: the emulated device's "compute" is the CPU working on the
  /// domain's own mapping, in place, not a copy to host.
  bool reduces_on_device() const noexcept { return true; }

 private:
  // allocate() without the reclaiming of idle scratch.
  template <class T>
  device_buffer<T, emulated_device> allocate_from_arena(std::size_t count) {
    std::size_t bytes = 0;
    std::size_t reserved = 0;
    if (!detail::checked_bytes<T>(count, bytes) || !detail::round_up(bytes, detail::page_size(), reserved))
      detail::fail(errc::count_overflow, "emulated_device::allocate: " + std::to_string(count) + " elements");
    if (count == 0) return device_buffer<T, emulated_device>(this, 0, 0);
    std::lock_guard lock(mutex_);
    std::uint64_t offset = 0;
    if (arena_.allocate(reserved, offset)) {
      try {
        live_.emplace(offset, allocation{reserved, bytes});
      } catch (...) {  // bad_alloc: the chunk goes back, or it would stay in use for good
        arena_.release(offset, reserved);
        throw;
      }
      return device_buffer<T, emulated_device>(this, offset, count);
    }
    const std::size_t free_bytes = capacity_ - arena_.in_use();
    detail::fail(std::make_error_code(std::errc::not_enough_memory),
                 "emulated_device::allocate: no free chunk of " + std::to_string(reserved) + " bytes (" +
                     std::to_string(free_bytes) + " of " + std::to_string(capacity_) + " bytes free" +
                     (free_bytes >= reserved ? ", fragmented)" : ")"));
  }

  friend struct detail::domain_access;

  struct allocation {
    std::size_t reserved;  // whole pages taken from the arena
    std::size_t bytes;     // what the caller asked for
  };

  transport::memory_region region_of(std::uint64_t address, std::size_t length) const noexcept {
    transport::memory_region region;
    region.address = mapping_ + address;
    region.length = length;
    region.kind = kind;
    region.free_notice = &hooks_;
    region.dmabuf_fd = fd_;
    region.dmabuf_offset = address;
    region.hmem_iface = hmem_iface;
    return region;
  }

  // The device address of `v` once it is known to lie inside a live
  // allocation of this domain; throws otherwise.
  template <class T>
  std::uint64_t checked_address(const pdcoll::view<T, emulated_device>& v, const char* operation) const {
    if (detail::domain_access::domain(v) != this)
      detail::fail(errc::invalid_argument, std::string("emulated_device::") + operation +
                                               ": the view belongs to another domain");
    const std::uint64_t address = v.device_address();
    if (v.empty()) return address;
    std::lock_guard lock(mutex_);
    auto it = live_.upper_bound(address);
    if (it != live_.begin()) {
      --it;
      if (address - it->first <= it->second.bytes && v.size_bytes() <= it->second.bytes - (address - it->first))
        return address;
    }
    detail::fail(errc::invalid_argument, std::string("emulated_device::") + operation +
                                             ": the view is not inside a live allocation (freed?)");
  }

  void release(std::uint64_t address) noexcept {
    std::size_t reserved = 0;
    std::size_t bytes = 0;
    {
      std::lock_guard lock(mutex_);
      const auto it = live_.find(address);
      if (it == live_.end()) return;
      reserved = it->second.reserved;
      bytes = it->second.bytes;
    }
    // Hooks run before the chunk is back on the free list (so no new
    // allocation can reuse it while a stale registration exists) and outside
    // the allocator's lock (a hook may call export_dmabuf or fabric_region).
    hooks_.notify(region_of(address, bytes));
    // fallocate(2): punching the hole frees the pages and makes the next
    // reader see zeros. If it fails (it does not on tmpfs) the pages simply
    // stay resident until reused; nothing is wrong with the data.
    (void)::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(address),
                      static_cast<off_t>(reserved));
    std::lock_guard lock(mutex_);
    live_.erase(address);
    arena_.release(address, reserved);
  }

  int fd_ = -1;
  std::byte* mapping_ = nullptr;
  std::size_t capacity_ = 0;
  mutable std::mutex mutex_;
  detail::first_fit_arena arena_;            // offsets into the memfd
  std::map<std::uint64_t, allocation> live_;  // offset → allocation
  mutable detail::copy_meter copies_;
  detail::invalidation_hooks hooks_;
  scratch_cache<emulated_device> scratch_;  // last: its blocks are freed before the rest goes
};

namespace detail {

/// The domain's own host mapping of an emulated-device view, for the
/// library's in-place reductions (reduces_on_device() is true). Not counted
/// as a copy, because it is the device computing. Never hand it to users.
template <class T>
T* mapped_pointer(const pdcoll::view<T, emulated_device>& v) noexcept {
  const transport::memory_region region = fabric_region(v);
  return static_cast<T*>(region.address);
}

}  // namespace detail

static_assert(device_domain<emulated_device>);

}  // namespace pdcoll::memory
