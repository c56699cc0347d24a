// File: memory/view.hpp — `pdcoll::view<T, Domain>`: a typed, non-owning
// range of memory tagged with the domain it lives in, and
// `memory::detail::fabric_region(view)`: what a transport registers for it.
//
// A host view is a span with a domain tag. A device view deliberately has no
// data(): device memory is reached only through the domain's counted copies
// or by the fabric, which keeps "the direct path copied nothing" provable.
#pragma once

#include <pdcoll/memory/domain.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>

namespace pdcoll::memory {

/// The host domain: ordinary process memory (memory/host.hpp has its
/// allocation functions).
struct host;

}  // namespace pdcoll::memory

namespace pdcoll {

namespace memory::detail {
// `Source` elements may be viewed as `Target` elements (T → const T), the rule std::span uses.
template <class Source, class Target>
inline constexpr bool view_convertible_v = std::is_convertible_v<Source (*)[], Target (*)[]>;

[[noreturn]] inline void subview_out_of_range(std::size_t offset, std::size_t count, std::size_t size) {
  fail(errc::invalid_argument, "pdcoll::view::subview(" + std::to_string(offset) + ", " +
                                   std::to_string(count) + ") outside a view of " +
                                   std::to_string(size) + " elements");
}
}  // namespace memory::detail

/// A device view: `count` elements of T at a device address of `Domain`.
/// Cheap to copy (a pointer to the domain, an address, a count); it does not
/// own the memory, so it must not outlive the buffer it came from.
///
/// There is no data(): the bytes live on the device. Use the domain's
/// copy_to_host / copy_from_host (counted) or hand the view to a collective.
///
///     pdcoll::memory::emulated_device dev;
///     auto buf = dev.allocate<float>(1024);
///     pdcoll::view<float, pdcoll::memory::emulated_device> v = buf.view();
///     dev.copy_from_host(std::span<const float>(host_data), v.subview(0, 256));
template <class T, class Domain = memory::host>
class view {
 public:
  using element_type = T;  ///< the element type, const-qualified for read-only views
  using value_type = std::remove_cv_t<T>;  ///< the element type without cv-qualifiers
  using domain_type = Domain;  ///< the memory domain the elements live in
  /// The memory kind transports dispatch on.
  static constexpr transport::memory_kind kind = Domain::kind;

  /// An empty view that belongs to no domain (domain() must not be called on it).
  constexpr view() noexcept = default;

  /// A view of const elements from a view of mutable ones.
  template <class U>
    requires(!std::same_as<U, T> && memory::detail::view_convertible_v<U, T>)
  constexpr view(const view<U, Domain>& other) noexcept  // NOLINT: implicit like span's
      : domain_(memory::detail::domain_access::domain(other)),
        address_(memory::detail::domain_access::address(other)),
        count_(other.size()) {}

  /// Number of elements.
  constexpr std::size_t size() const noexcept { return count_; }
  /// Number of bytes (size() * sizeof(T); the domain checked it fits at allocation).
  constexpr std::size_t size_bytes() const noexcept { return count_ * sizeof(T); }
  /// True when the view has no elements.
  constexpr bool empty() const noexcept { return count_ == 0; }
  /// The domain the memory belongs to. Precondition: the view came from a
  /// buffer (not default-constructed).
  Domain& domain() const noexcept { return *domain_; }
  /// The first element's address in the domain's device address space (for
  /// emulated_device, an offset into its memfd; for gaudi, the device virtual
  /// address). A number to compare and key on, never a host pointer.
  constexpr std::uint64_t device_address() const noexcept { return address_; }

  /// The `count` elements starting at element `offset`.
  /// Errors: throws std::system_error(errc::invalid_argument) when the range
  /// is not inside this view.
  constexpr view subview(std::size_t offset, std::size_t count) const {
    if (offset > count_ || count > count_ - offset) memory::detail::subview_out_of_range(offset, count, count_);
    return view(domain_, address_ + offset * sizeof(T), count);
  }
  /// The elements from `offset` to the end (same errors as above).
  constexpr view subview(std::size_t offset) const {
    if (offset > count_) memory::detail::subview_out_of_range(offset, 0, count_);
    return subview(offset, count_ - offset);
  }

 private:
  friend struct memory::detail::domain_access;
  constexpr view(Domain* domain, std::uint64_t address, std::size_t count) noexcept
      : domain_(domain), address_(address), count_(count) {}

  Domain* domain_ = nullptr;
  std::uint64_t address_ = 0;
  std::size_t count_ = 0;
};

/// A host view: a std::span<T> tagged with the host domain. Anything a span
/// converts from (std::span, arrays, std::vector lvalues, …) converts to it.
///
///     std::vector<float> grads(n);
///     pdcoll::view<float> v = grads;          // implicit
///     auto tail = v.subview(n / 2);
template <class T>
class view<T, memory::host> {
 public:
  using element_type = T;  ///< the element type, const-qualified for read-only views
  using value_type = std::remove_cv_t<T>;  ///< the element type without cv-qualifiers
  using domain_type = memory::host;  ///< host memory
  /// The memory kind transports dispatch on.
  static constexpr transport::memory_kind kind = transport::memory_kind::host;

  /// An empty view.
  constexpr view() noexcept = default;
  /// `count` elements at `data`. Precondition: [data, data + count) is valid.
  constexpr view(T* data, std::size_t count) noexcept : data_(data), count_(count) {}
  /// The elements of a span.
  constexpr view(std::span<T> elements) noexcept  // NOLINT: implicit by design (DESIGN.md §5)
      : data_(elements.data()), count_(elements.size()) {}
  /// The elements of a contiguous range that outlives the view (an lvalue
  /// container, or a borrowed range such as a span).
  template <class Range>
    requires(!std::is_same_v<std::remove_cvref_t<Range>, view> &&
             !std::is_same_v<std::remove_cvref_t<Range>, std::span<T>> &&
             std::ranges::contiguous_range<Range> && std::ranges::sized_range<Range> &&
             (std::is_lvalue_reference_v<Range> || std::ranges::borrowed_range<Range>) &&
             memory::detail::view_convertible_v<std::remove_reference_t<std::ranges::range_reference_t<Range>>, T>)
  constexpr view(Range&& range) noexcept  // NOLINT: implicit like span's
      : data_(std::ranges::data(range)), count_(std::ranges::size(range)) {}
  /// A view of const elements from a view of mutable ones.
  template <class U>
    requires(!std::same_as<U, T> && memory::detail::view_convertible_v<U, T>)
  constexpr view(const view<U, memory::host>& other) noexcept  // NOLINT: implicit like span's
      : data_(other.data()), count_(other.size()) {}

  /// The first element.
  constexpr T* data() const noexcept { return data_; }
  /// Number of elements.
  constexpr std::size_t size() const noexcept { return count_; }
  /// Number of bytes.
  constexpr std::size_t size_bytes() const noexcept { return count_ * sizeof(T); }
  /// True when the view has no elements.
  constexpr bool empty() const noexcept { return count_ == 0; }
  /// The same elements as a std::span.
  constexpr std::span<T> span() const noexcept { return {data_, count_}; }
  constexpr operator std::span<T>() const noexcept { return span(); }  // NOLINT: implicit by design
  /// The host domain (stateless).
  memory::host domain() const noexcept;
  /// The host address as an integer (the same key a device view gives).
  std::uint64_t device_address() const noexcept { return reinterpret_cast<std::uintptr_t>(data_); }

  /// The `count` elements starting at element `offset`.
  /// Errors: throws std::system_error(errc::invalid_argument) when the range
  /// is not inside this view.
  constexpr view subview(std::size_t offset, std::size_t count) const {
    if (offset > count_ || count > count_ - offset) memory::detail::subview_out_of_range(offset, count, count_);
    return view(data_ + offset, count);
  }
  /// The elements from `offset` to the end (same errors as above).
  constexpr view subview(std::size_t offset) const {
    if (offset > count_) memory::detail::subview_out_of_range(offset, 0, count_);
    return view(data_ + offset, count_ - offset);
  }

 private:
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

template <class T>
view(T*, std::size_t) -> view<T, memory::host>;
template <class T, std::size_t Extent>
view(std::span<T, Extent>) -> view<T, memory::host>;

}  // namespace pdcoll

namespace pdcoll::memory {

namespace detail {

/// What a transport registers for a host view: the bytes themselves.
template <class T>
transport::memory_region fabric_region(const pdcoll::view<T, host>& v) noexcept {
  transport::memory_region region;
  region.address = const_cast<std::remove_cv_t<T>*>(v.data());
  region.length = v.size_bytes();
  region.kind = transport::memory_kind::host;
  region.hmem_iface = 0;  // FI_HMEM_SYSTEM
  return region;
}

/// What a transport registers for a device view: the address the fabric
/// DMAs to or from, the DMA-BUF fd/offset, the kind and the fi_hmem_iface.
/// Device views are not public about this; the collectives and transports
/// are the only callers.
template <class T, class Domain>
  requires(!std::same_as<Domain, host>)
transport::memory_region fabric_region(const pdcoll::view<T, Domain>& v) noexcept {
  const Domain* domain = domain_access::domain(v);
  if (domain == nullptr) {
    transport::memory_region empty;
    empty.kind = Domain::kind;
    empty.hmem_iface = Domain::hmem_iface;
    return empty;
  }
  return domain_access::region(*domain, domain_access::address(v), v.size_bytes());
}

}  // namespace detail
}  // namespace pdcoll::memory

// host.hpp defines memory::host (and host views' domain()); it needs the
// views above, so it comes last.
#include <pdcoll/memory/host.hpp>
