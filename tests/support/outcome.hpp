// File: tests/support/outcome.hpp — runs a collective to completion and
// returns how it ended, for tests that expect an error.
#pragma once

#include <pdcoll/pdcoll.hpp>

#include <system_error>
#include <utility>

namespace pdcoll::testing {

/// sync_wait(s): the error code it completed with, or {} on success.
inline std::error_code outcome_of(collective_sender s) {
  try {
    exec::sync_wait(std::move(s));
  } catch (const std::system_error& e) {
    return e.code();
  }
  return {};
}

}  // namespace pdcoll::testing
