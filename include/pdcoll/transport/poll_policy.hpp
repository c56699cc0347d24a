// File: transport/poll_policy.hpp — how long a transport polls before it
// sleeps, by default.
//
// A completion due within microseconds costs less to poll for than a sleep
// and a wake-up; a rank that polls long while it shares a core with the rank
// it waits for only delays that rank. The transports' options default to
// this value; PDCOLL_POLL_US overrides it for a whole job.
#pragma once

#include <pdcoll/detail/env.hpp>

#include <chrono>

namespace pdcoll::transport {

/// PDCOLL_POLL_US (microseconds, 0: sleep at once) when it is a number, else 20.
inline std::chrono::microseconds default_poll_before_sleep() noexcept {
  return std::chrono::microseconds(pdcoll::detail::env_number("PDCOLL_POLL_US", 0).value_or(20));
}

}  // namespace pdcoll::transport
