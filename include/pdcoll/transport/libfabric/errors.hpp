// File: transport/libfabric/errors.hpp — libfabric's error numbers as a
// std::error_category that keeps fi_errno and the fi_strerror / provider text.
//
// Two outcomes leave this category on purpose, because the transport contract
// names them (transport/endpoint.hpp): FI_ECANCELED becomes
// std::errc::operation_canceled and FI_ETRUNC becomes
// pdcoll::errc::collective_mismatch. Everything else keeps its fi_errno as the
// value, so `ec.value()` can be compared against FI_E* constants.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <map>
#include <mutex>
#include <string>
#include <system_error>

#include "pdcoll/error.hpp"

namespace pdcoll::transport::libfabric {

/// The category of libfabric errors. Values are positive fi_errno numbers
/// (FI_EIO, FI_ECONNREFUSED, ...). message() is fi_strerror(3)'s text plus
/// the most recent provider-specific text (fi_cq_strerror) recorded for the
/// same value, so logs carry what the provider said without the error_code
/// growing beyond two words.
class fabric_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "libfabric"; }

  std::string message(int value) const override {
    std::string text = ::fi_strerror(value);
    std::lock_guard lock(mutex_);
    if (auto it = provider_text_.find(value); it != provider_text_.end() && !it->second.empty())
      text += " (provider: " + it->second + ")";
    return text;
  }

  /// fi_errno values below FI_ERRNO_OFFSET are plain errno numbers
  /// (fi_errno(3)); they compare equal to the matching std::errc.
  std::error_condition default_error_condition(int value) const noexcept override {
    if (value > 0 && value < FI_ERRNO_OFFSET) return {value, std::generic_category()};
    return {value, *this};
  }

  /// Remembers the provider's own text for `value` (last one wins). Cost: a
  /// mutex and a string copy; only called on error paths.
  void record_provider_text(int value, std::string text) const {
    std::lock_guard lock(mutex_);
    provider_text_[value] = std::move(text);
  }

 private:
  mutable std::mutex mutex_;
  mutable std::map<int, std::string> provider_text_;
};

/// The one instance of the libfabric category.
inline const fabric_category_impl& fabric_category() noexcept {
  // Never destroyed: a job or communicator with static storage duration,
  // made before the category's first use, reports errors from its
  // destructor after a function-local static category would be gone.
  static const fabric_category_impl* const instance = new fabric_category_impl;
  return *instance;
}

/// Turns a libfabric return value or fi_errno (either sign) into the
/// error_code the transport reports: empty for 0, operation_canceled for
/// FI_ECANCELED, collective_mismatch for FI_ETRUNC, else {|value|, fabric_category()}.
inline std::error_code make_fabric_error(long long fi_return) noexcept {
  const int value = static_cast<int>(fi_return < 0 ? -fi_return : fi_return);
  if (value == 0) return {};
  if (value == FI_ECANCELED) return std::make_error_code(std::errc::operation_canceled);
  if (value == FI_ETRUNC) return make_error_code(pdcoll::errc::collective_mismatch);
  return {value, fabric_category()};
}

namespace detail {

/// The message used for setup failures: "fi_xxx failed: <fi_strerror> (-N)".
inline std::string describe_call(const char* call, long long fi_return) {
  const int value = static_cast<int>(fi_return < 0 ? -fi_return : fi_return);
  return std::string(call) + " failed: " + ::fi_strerror(value) + " (-" + std::to_string(value) + ")";
}

/// Throws std::system_error for a failed setup call (constructors only).
[[noreturn]] inline void throw_fabric_error(const char* call, long long fi_return) {
  const int value = static_cast<int>(fi_return < 0 ? -fi_return : fi_return);
  throw std::system_error(std::error_code(value, fabric_category()), describe_call(call, fi_return));
}

}  // namespace detail
}  // namespace pdcoll::transport::libfabric
