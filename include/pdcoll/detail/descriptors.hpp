// File: detail/descriptors.hpp — room for the file descriptors a job needs.
//
// A job's sockets grow with its world size: rank 0's store holds one per
// rank, and the io_uring transport's mesh one (two with directional
// connections) per peer on every rank. The usual soft RLIMIT_NOFILE of 1024
// is below that for a job of a few hundred ranks, while the hard limit is
// usually far higher; raising the soft limit up to the hard one is what a
// process may always do.
#pragma once

#include <sys/resource.h>

#include <algorithm>

namespace pdcoll::detail {

/// Descriptors kept beside a job's sockets (the process's own files, its
/// libraries', pipes, the store's listener).
inline constexpr rlim_t spare_descriptors = 256;

/// Raises the soft RLIMIT_NOFILE, as far as the hard limit allows, to
/// `sockets` + spare_descriptors; never lowers it. Returns the soft limit
/// in force afterwards (0 when it cannot be read).
inline rlim_t make_room_for_descriptors(rlim_t sockets) noexcept {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  const rlim_t wanted = sockets + spare_descriptors;
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < wanted) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max == RLIM_INFINITY ? wanted : std::min(wanted, limit.rlim_max);
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return limit.rlim_cur;
}

}  // namespace pdcoll::detail
