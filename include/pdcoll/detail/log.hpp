// File: detail/log.hpp — PDCOLL_DEBUG diagnostics on stderr.
//
// PDCOLL_DEBUG=WARN (default: silent), INFO (choices: provider, data path,
// algorithm thresholds) or TRACE. Diagnostics only: errors reach the caller as
// std::error_code, never only as a log line.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace pdcoll::detail {

/// Verbosity levels of PDCOLL_DEBUG.
enum class log_level { none = 0, warn = 1, info = 2, trace = 3 };

/// The level chosen by PDCOLL_DEBUG, read once.
inline log_level current_log_level() noexcept {
  static const log_level level = [] {
    const char* v = std::getenv("PDCOLL_DEBUG");
    if (!v) return log_level::none;
    if (!std::strcmp(v, "WARN") || !std::strcmp(v, "warn")) return log_level::warn;
    if (!std::strcmp(v, "INFO") || !std::strcmp(v, "info")) return log_level::info;
    if (!std::strcmp(v, "TRACE") || !std::strcmp(v, "trace")) return log_level::trace;
    return log_level::none;
  }();
  return level;
}

/// Writes one line "pdcoll[who] LEVEL: message" when `level` is enabled;
/// `who` names the rank (a group's communicator names its group too).
inline void log(log_level level, const std::string& who, const std::string& message) {
  if (level > current_log_level()) return;
  const char* name = level == log_level::warn ? "WARN" : level == log_level::info ? "INFO" : "TRACE";
  std::fprintf(stderr, "pdcoll[%s] %s: %s\n", who.c_str(), name, message.c_str());
}

/// Writes one line "pdcoll[rank] LEVEL: message" when `level` is enabled.
inline void log(log_level level, int rank, const std::string& message) {
  if (level > current_log_level()) return;
  log(level, std::to_string(rank), message);
}

}  // namespace pdcoll::detail
