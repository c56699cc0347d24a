// File: exec/upon_stopped.hpp — upon_stopped(f): turn "stopped" into a value.
#pragma once

#include "pdcoll/exec/then.hpp"

namespace pdcoll::exec {

/// The type of `upon_stopped`.
using upon_stopped_t = detail::then_like_t<set_stopped_t>;

/// `sndr | upon_stopped(f)`: when sndr completes with `set_stopped()`,
/// completes with `set_value(f())` (no value when f returns void); values and
/// errors pass through. If f throws, completes with
/// `set_error(std::exception_ptr)`. No allocation.
inline constexpr upon_stopped_t upon_stopped{};

}  // namespace pdcoll::exec
