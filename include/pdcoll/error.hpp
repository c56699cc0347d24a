// File: error.hpp — pdcoll's error codes and their std::error_category.
//
// Every failure in pdcoll completes a sender with set_error(std::error_code) in
// pdcoll::error_category(). libfabric errors keep their fi_errno and text in
// their own category (transport/libfabric/errors.hpp).
#pragma once

#include <cstdint>
#include <new>
#include <string>
#include <system_error>

namespace pdcoll {

/// Error conditions reported by pdcoll. Values are stable (they travel in abort
/// notices between ranks), so only append.
enum class errc : int {
  ok = 0,
  timeout = 1,              ///< a deadline passed before the operation completed
  peer_lost = 2,            ///< a peer closed, crashed or became unreachable
  invalid_argument = 3,     ///< bad input, rejected before anything was posted
  collective_mismatch = 4,  ///< ranks issued different collectives / counts / types
  registration_failed = 5,  ///< memory registration with the fabric failed
  transport = 6,            ///< the transport reported an error (see message)
  aborted = 7,              ///< the communicator was aborted
  null_buffer = 8,          ///< a null buffer with a non-zero count
  buffer_too_small = 9,     ///< a buffer smaller than the collective needs
  count_overflow = 10,      ///< count * sizeof(T) does not fit in size_t
  root_out_of_range = 11,   ///< root or peer rank outside [0, world_size)
  unsupported_op = 12,      ///< the reduction op is not defined for the type
  unreachable_domain = 13,  ///< the transport cannot reach the buffer's memory domain
  overlapping_buffers = 14, ///< input and output overlap where the collective forbids it
  bootstrap = 15,           ///< rank discovery or rendezvous failed (see message)
  unauthenticated = 16,     ///< a rendezvous client presented a wrong or no token
  protocol = 17,            ///< a malformed or oversized message
  device = 18,              ///< a device driver call failed
};

/// The category of pdcoll::errc. Names are stable and greppable.
class error_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "pdcoll"; }
  std::string message(int value) const override {
    switch (static_cast<errc>(value)) {
      case errc::ok: return "success";
      case errc::timeout: return "timeout: deadline passed";
      case errc::peer_lost: return "peer lost";
      case errc::invalid_argument: return "invalid argument";
      case errc::collective_mismatch: return "collective mismatch: ranks issued different collectives";
      case errc::registration_failed: return "memory registration failed";
      case errc::transport: return "transport error";
      case errc::aborted: return "communicator aborted";
      case errc::null_buffer: return "null buffer with non-zero count";
      case errc::buffer_too_small: return "buffer too small for the collective";
      case errc::count_overflow: return "count * sizeof(T) overflows";
      case errc::root_out_of_range: return "root or peer out of range";
      case errc::unsupported_op: return "reduction op not supported for this type";
      case errc::unreachable_domain: return "transport cannot reach the buffer's memory domain";
      case errc::overlapping_buffers: return "input and output buffers overlap";
      case errc::bootstrap: return "bootstrap failed";
      case errc::unauthenticated: return "rendezvous client not authenticated";
      case errc::protocol: return "malformed or oversized message";
      case errc::device: return "device driver call failed";
    }
    return "unknown pdcoll error";
  }
};

/// The one instance of pdcoll's error category.
inline const std::error_category& error_category() noexcept {
  // Never destroyed: a job or communicator with static storage duration,
  // made before the category's first use, reports errors from its
  // destructor after a function-local static category would be gone.
  // Built in static storage, not with new: this is noexcept, and its first
  // use may come where memory has run out.
  alignas(error_category_impl) static unsigned char storage[sizeof(error_category_impl)];
  static const error_category_impl* const instance = ::new (static_cast<void*>(storage)) error_category_impl;
  return *instance;
}

/// Makes `std::error_code{e}` work through ADL.
inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), error_category()};
}

}  // namespace pdcoll

template <>
struct std::is_error_code_enum<pdcoll::errc> : std::true_type {};
