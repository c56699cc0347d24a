// File: result.hpp — `result<T>`: a value or a std::error_code, for the
// calls that fail as part of normal operation (registration, bootstrap).
// A C++20 stand-in for std::expected<T, std::error_code>.
#pragma once

#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>

namespace pdcoll {

/// Either a T or the std::error_code saying why there is none.
/// Cost: a std::variant; no allocation.
template <class T>
class [[nodiscard]] result {
 public:
  /// A successful result holding `value`.
  result(T value) : state_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit by design
  /// A failed result; `error` must not be empty.
  result(std::error_code error) : state_(std::in_place_index<1>, error) {}  // NOLINT
  /// True when a value is held.
  bool has_value() const noexcept { return state_.index() == 0; }
  /// Same as has_value().
  explicit operator bool() const noexcept { return has_value(); }
  /// The value; throws std::system_error holding error() when there is none.
  T& value() & { check(); return std::get<0>(state_); }
  T&& value() && { check(); return std::get<0>(std::move(state_)); }
  const T& value() const& { check(); return std::get<0>(state_); }
  /// The value, unchecked (has_value() must be true).
  T& operator*() & noexcept { return *std::get_if<0>(&state_); }
  const T& operator*() const& noexcept { return *std::get_if<0>(&state_); }
  /// Member access to the value, unchecked.
  T* operator->() noexcept { return std::get_if<0>(&state_); }
  const T* operator->() const noexcept { return std::get_if<0>(&state_); }
  /// The error; empty when a value is held.
  std::error_code error() const noexcept {
    auto* e = std::get_if<1>(&state_);
    return e ? *e : std::error_code{};
  }

 private:
  void check() const {
    if (!has_value()) throw std::system_error(error());
  }
  std::variant<T, std::error_code> state_;
};

}  // namespace pdcoll
