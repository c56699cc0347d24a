// File: exec/upon_error.hpp — upon_error(f): turn an error into a value.
#pragma once

#include "pdcoll/exec/then.hpp"

namespace pdcoll::exec {

/// The type of `upon_error`.
using upon_error_t = detail::then_like_t<set_error_t>;

/// `sndr | upon_error(f)`: when sndr completes with `set_error(e)`, completes
/// with `set_value(f(e))` (no value when f returns void); values and stopped
/// pass through. If f throws, completes with `set_error(std::exception_ptr)`.
/// No allocation.
///
///     auto s = just_error(std::error_code{errc::timeout})
///            | upon_error([](std::error_code ec) { return ec.value(); });
inline constexpr upon_error_t upon_error{};

}  // namespace pdcoll::exec
