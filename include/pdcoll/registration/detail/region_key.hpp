// File: registration/detail/region_key.hpp — how the registration cache
// names memory: an address space plus a byte range inside it.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <limits>
#include <system_error>
#include <tuple>

#include "pdcoll/error.hpp"
#include "pdcoll/result.hpp"
#include "pdcoll/transport/endpoint.hpp"

namespace pdcoll::registration::detail {

/// Which address space a range lives in. Host memory and memory mapped for an
/// hmem iface are named by address (the space is the iface and device);
/// DMA-BUF memory by the buffer's identity (st_dev, st_ino of the fd, see
/// fstat(2)), never by the fd number: the process may close the fd and get
/// the same number for a different buffer.
struct address_space {
  std::uint8_t by_identity = 0;  ///< 1 for DMA-BUF identity, 0 for addresses
  std::uint64_t first = 0;       ///< st_dev, or the hmem iface
  std::uint64_t second = 0;      ///< st_ino, or the device id
  friend bool operator==(const address_space&, const address_space&) = default;
  friend bool operator<(const address_space& a, const address_space& b) noexcept {
    return std::tie(a.by_identity, a.first, a.second) < std::tie(b.by_identity, b.first, b.second);
  }
};

/// A half-open byte range [start, end) in one address space: addresses for
/// host memory, offsets into the buffer for DMA-BUF memory.
struct region_key {
  address_space space;
  std::uint64_t start = 0;
  std::uint64_t end = 0;
  std::uint64_t bytes() const noexcept { return end - start; }
  bool contains(const region_key& other) const noexcept {
    return space == other.space && start <= other.start && other.end <= end;
  }
  bool overlaps(const region_key& other) const noexcept {
    return space == other.space && start < other.end && other.start < end;
  }
};

/// The space of a DMA-BUF fd: its (st_dev, st_ino). Fails with
/// errc::invalid_argument when fstat(2) fails (a closed or bad fd).
inline result<address_space> dmabuf_space(int fd) noexcept {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return std::error_code{errc::invalid_argument};
  return address_space{1, static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)};
}

/// The key of `region`. Fails with errc::invalid_argument for an empty
/// region, a bad DMA-BUF fd or a range that wraps around, and with
/// errc::null_buffer for host memory at address 0.
inline result<region_key> key_of(const transport::memory_region& region) noexcept {
  if (region.length == 0) return std::error_code{errc::invalid_argument};
  region_key key;
  if (region.dmabuf_fd >= 0) {
    auto space = dmabuf_space(region.dmabuf_fd);
    if (!space) return space.error();
    key.space = *space;
    key.start = region.dmabuf_offset;
  } else {
    if (region.address == nullptr) return std::error_code{errc::null_buffer};
    key.space = address_space{0, static_cast<std::uint64_t>(region.hmem_iface), region.device_id};
    key.start = reinterpret_cast<std::uintptr_t>(region.address);
  }
  if (region.length > std::numeric_limits<std::uint64_t>::max() - key.start)
    return std::error_code{errc::invalid_argument};
  key.end = key.start + region.length;
  return key;
}

/// The region to register for `key`, a range that contains the one
/// `request` asked for (the two differ when overlapping entries are merged):
/// every field comes from the request, with address and offset moved back by
/// the distance from key.start to the request's start.
inline transport::memory_region region_for(const region_key& key, const region_key& requested,
                                           const transport::memory_region& request) noexcept {
  transport::memory_region r = request;
  const std::uint64_t lead = requested.start - key.start;
  r.length = static_cast<std::size_t>(key.bytes());
  if (r.dmabuf_fd >= 0) r.dmabuf_offset = key.start;
  // A DMA-BUF request may carry no address at all (the fd and offset name the
  // bytes); keep it null rather than inventing one.
  if (r.address != nullptr)
    r.address = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(r.address) - lead);
  return r;
}

}  // namespace pdcoll::registration::detail
