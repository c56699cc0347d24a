// File: registration/registrar.hpp — the `registrar` role: what the
// registration cache needs from whoever really registers memory (a
// transport), plus the adapter that makes any transport::endpoint one.
#pragma once

#include <system_error>
#include <type_traits>

#include "pdcoll/error.hpp"
#include "pdcoll/result.hpp"
#include "pdcoll/transport/endpoint.hpp"

namespace pdcoll::registration {

namespace detail {
template <class R>
struct result_value {};
template <class T>
struct result_value<result<T>> {
  using type = T;
};
}  // namespace detail

/// Something that registers memory regions with a fabric and releases them.
///  * `r.register_region(region)` returns `result<H>` for some handle type H
///    (e.g. transport::registration_handle); it may be slow (a kernel call)
///    and is never called with the cache's lock held;
///  * `r.deregister(h)` releases a handle obtained from register_region,
///    exactly once; it must not throw (it runs from destructors);
///  * H is movable.
template <class R>
concept registrar = requires(R& r, const transport::memory_region& region) {
  typename detail::result_value<std::remove_cvref_t<decltype(r.register_region(region))>>::type;
} && requires(R& r,
              typename detail::result_value<std::remove_cvref_t<decltype(
                  std::declval<R&>().register_region(std::declval<const transport::memory_region&>()))>>::type& h) {
  { r.deregister(h) } noexcept;
} && std::is_nothrow_move_constructible_v<typename detail::result_value<std::remove_cvref_t<decltype(
         std::declval<R&>().register_region(std::declval<const transport::memory_region&>()))>>::type>;

/// The handle type a registrar's register_region yields.
template <registrar R>
using registrar_handle_t = typename detail::result_value<std::remove_cvref_t<decltype(
    std::declval<R&>().register_region(std::declval<const transport::memory_region&>()))>>::type;

/// Adapts a transport::endpoint to the registrar role: register_region and
/// deregister forward to the endpoint's virtual members. Holds a reference;
/// the endpoint must outlive the adapter and every cache using it.
/// Errors: whatever the endpoint's register_region reports.
/// transport::endpoint is not thread-safe, so a cache over this adapter uses
/// no_lock (the communicator serialises its calls) unless the caller
/// serialises calls into the endpoint some other way.
class endpoint_registrar {
 public:
  /// Adapts `ep`.
  explicit endpoint_registrar(transport::endpoint& ep) noexcept : endpoint_(&ep) {}

  /// Registers `region` with the endpoint's fabric.
  result<transport::registration_handle> register_region(const transport::memory_region& region) {
    transport::registration_handle handle;
    if (std::error_code ec = endpoint_->register_region(region, handle)) return ec;
    return handle;
  }
  /// Releases a registration made by register_region.
  void deregister(transport::registration_handle& handle) noexcept { endpoint_->deregister(handle); }

 private:
  transport::endpoint* endpoint_;
};

static_assert(registrar<endpoint_registrar>);

}  // namespace pdcoll::registration
