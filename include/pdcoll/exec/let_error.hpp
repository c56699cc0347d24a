// File: exec/let_error.hpp — let_error(f): recover from an error with the
// sender that f returns.
#pragma once

#include "pdcoll/exec/let_value.hpp"

namespace pdcoll::exec {

/// The type of `let_error`.
using let_error_t = detail::let_like_t<set_error_t>;

/// `sndr | let_error(f)`: when sndr completes with `set_error(e)`, stores e,
/// calls `f(stored_e)` and runs the sender it returns in place, completing as
/// it does. Values and stopped of sndr pass through. If f or the connect
/// throws, completes with `set_error(std::exception_ptr)`. No allocation.
///
///     auto retry = post(...) | let_error([&](std::error_code&) { return post(...); });
inline constexpr let_error_t let_error{};

}  // namespace pdcoll::exec
