// File: detail/env.hpp — reading a number from an environment variable.
#pragma once

#include <cstdlib>
#include <optional>

namespace pdcoll::detail {

/// The variable's value when it is a whole decimal number of at least
/// `min`; nullopt when it is unset, empty, anything else or smaller.
inline std::optional<long long> env_number(const char* name, long long min) noexcept {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (*end != '\0' || n < min) return std::nullopt;
  return n;
}

}  // namespace pdcoll::detail
