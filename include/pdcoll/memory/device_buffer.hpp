// File: memory/device_buffer.hpp — `device_buffer<T, Domain>`: the owning,
// move-only handle of one device allocation (what `domain.allocate<T>(n)`
// returns). Its destructor runs the domain's invalidation hooks, then frees.
#pragma once

#include <pdcoll/memory/domain.hpp>
#include <pdcoll/memory/view.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace pdcoll::memory {

/// One allocation of `size()` elements of T in device domain `Domain`.
/// Move-only; the domain must outlive it. It has no host pointer: take a
/// view() and use the domain's copies, or hand the view to a collective.
///
///     pdcoll::memory::emulated_device dev(64 << 20);
///     pdcoll::memory::device_buffer<float, pdcoll::memory::emulated_device> buf =
///         dev.allocate<float>(1 << 20);
///     auto v = buf.view();                  // view<float, emulated_device>
///     buf.reset();                          // hooks run, memory returns to dev
template <class T, class Domain>
class device_buffer {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>,
                "device memory holds bytes; T must be trivially copyable and destructible");

 public:
  /// An empty buffer (no domain, no memory).
  device_buffer() noexcept = default;
  device_buffer(device_buffer&& other) noexcept
      : domain_(std::exchange(other.domain_, nullptr)),
        address_(std::exchange(other.address_, 0)),
        count_(std::exchange(other.count_, 0)) {}
  device_buffer& operator=(device_buffer&& other) noexcept {
    if (this != &other) {
      reset();
      domain_ = std::exchange(other.domain_, nullptr);
      address_ = std::exchange(other.address_, 0);
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { reset(); }

  /// The whole allocation as a view.
  pdcoll::view<T, Domain> view() const noexcept {
    return detail::domain_access::make_view<T>(domain_, address_, count_);
  }
  /// The whole allocation as a view of const elements.
  pdcoll::view<const T, Domain> const_view() const noexcept {
    return detail::domain_access::make_view<const T>(domain_, address_, count_);
  }
  /// Number of elements.
  std::size_t size() const noexcept { return count_; }
  /// Number of bytes.
  std::size_t size_bytes() const noexcept { return count_ * sizeof(T); }
  /// True when the buffer holds no elements.
  bool empty() const noexcept { return count_ == 0; }
  /// The owning domain. Precondition: the buffer came from allocate().
  Domain& domain() const noexcept { return *domain_; }

  /// Runs the domain's invalidation hooks and frees the memory; the buffer
  /// is empty afterwards. Failures of the free are kept by the domain (see
  /// its last_release_error()), since a destructor cannot report them.
  void reset() noexcept {
    if (domain_ != nullptr && count_ != 0) detail::domain_access::release(*domain_, address_);
    domain_ = nullptr;
    address_ = 0;
    count_ = 0;
  }

 private:
  friend Domain;
  device_buffer(Domain* domain, std::uint64_t address, std::size_t count) noexcept
      : domain_(domain), address_(address), count_(count) {}

  Domain* domain_ = nullptr;
  std::uint64_t address_ = 0;
  std::size_t count_ = 0;
};

}  // namespace pdcoll::memory
