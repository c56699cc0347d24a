// File: tests/support/outcome.hpp — runs a call or a collective to
// completion and returns how it ended, for tests that expect an error.
#pragma once

#include <pdcoll/pdcoll.hpp>

#include <system_error>
#include <utility>

namespace pdcoll::testing {

/// The error `call()` threw as std::system_error, or {} when it returned.
template <class F>
std::error_code error_of(F&& call) {
  try {
    std::forward<F>(call)();
  } catch (const std::system_error& e) {
    return e.code();
  }
  return {};
}

/// sync_wait(s): the error code it completed with, or {} on success.
inline std::error_code outcome_of(collective_sender s) {
  return error_of([&] { exec::sync_wait(std::move(s)); });
}

}  // namespace pdcoll::testing
