// File: transport/poll_policy.hpp — how long a transport polls before it
// sleeps, by default.
//
// A completion due within microseconds costs less to poll for than a sleep
// and a wake-up; a rank that polls long while it shares a core with the rank
// it waits for only delays that rank. The transports' options default to
// this value; PDCOLL_POLL_US overrides it for a whole job.
#pragma once

#include <chrono>
#include <cstdlib>

namespace pdcoll::transport {

/// PDCOLL_POLL_US (microseconds, 0: sleep at once) when it is a number, else 20.
inline std::chrono::microseconds default_poll_before_sleep() noexcept {
  if (const char* v = std::getenv("PDCOLL_POLL_US"); v && *v) {
    char* end = nullptr;
    const long long us = std::strtoll(v, &end, 10);
    if (*end == '\0' && us >= 0) return std::chrono::microseconds(us);
  }
  return std::chrono::microseconds(20);
}

}  // namespace pdcoll::transport
