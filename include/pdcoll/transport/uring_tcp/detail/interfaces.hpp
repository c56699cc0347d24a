// File: transport/uring_tcp/detail/interfaces.hpp — this host's interface
// addresses (getifaddrs(3)), for the choices that depend on them: which
// address to advertise (mesh.hpp) and whether a peer's address is local
// (congestion.hpp).
#pragma once

#include <ifaddrs.h>

namespace pdcoll::transport::uring_tcp::detail {

/// Calls `visit(const ifaddrs&)` on this host's interface addresses, in
/// getifaddrs(3) order, until it returns true; returns whether one did
/// (false also when getifaddrs fails). Entries without an address are
/// skipped.
template <class Visit>
bool find_interface_address(Visit visit) noexcept {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return false;
  bool found = false;
  for (const ifaddrs* it = list; it && !found; it = it->ifa_next)
    if (it->ifa_addr) found = visit(*it);
  ::freeifaddrs(list);
  return found;
}

}  // namespace pdcoll::transport::uring_tcp::detail
