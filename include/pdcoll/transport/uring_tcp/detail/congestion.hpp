// File: transport/uring_tcp/detail/congestion.hpp — the TCP congestion
// control of the uring_tcp connections (options::congestion_control).
//
// Why it matters: BBR, the default congestion control of many cloud images
// (this machine's included), paces every connection from a kernel timer
// when no fq qdisc does it (tcp_pace_kick). On a connection that stays on
// the host there is no link to pace for. Measured on the reference machine
// (options.hpp has the figures), CUBIC instead of BBR made all-reduces
// from 4 MiB up 0.94-1.9x as fast (1.2x and more in most cells) and 1 MiB
// about 0.8x as fast. So by default connections that stay on the host
// (loopback, or a host talking to itself) use CUBIC, and connections to
// other hosts keep the system's choice, which their operators made for
// their network.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>

namespace pdcoll::transport::uring_tcp::detail {

/// options::congestion_control's value that leaves every connection to the
/// kernel's default (net.ipv4.tcp_congestion_control).
inline constexpr const char* system_congestion_control = "system";
/// What the default policy sets on connections within one host.
inline constexpr const char* local_congestion_control = "cubic";

/// Whether connected socket `fd` stays on this host: its peer is a
/// loopback address (127.0.0.0/8, ::1) or both ends share one address.
/// False when either address is unknown or not IP.
inline bool same_host(int fd) noexcept {
  sockaddr_storage local{}, peer{};
  socklen_t local_length = sizeof local, peer_length = sizeof peer;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_length) != 0) return false;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_length) != 0) return false;
  if (local.ss_family != peer.ss_family) return false;
  if (peer.ss_family == AF_INET) {
    const in_addr_t mine = reinterpret_cast<const sockaddr_in&>(local).sin_addr.s_addr;
    const in_addr_t theirs = reinterpret_cast<const sockaddr_in&>(peer).sin_addr.s_addr;
    return (ntohl(theirs) >> 24) == 127 || mine == theirs;
  }
  if (peer.ss_family == AF_INET6) {
    const in6_addr& mine = reinterpret_cast<const sockaddr_in6&>(local).sin6_addr;
    const in6_addr& theirs = reinterpret_cast<const sockaddr_in6&>(peer).sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&theirs) || std::memcmp(&mine, &theirs, sizeof theirs) == 0;
  }
  return false;
}

/// The congestion control socket `fd` uses now ("" when the kernel does not say).
inline std::string congestion_control_of(int fd) {
  char name[16] = {};  // the kernel's TCP_CA_NAME_MAX
  socklen_t length = sizeof name;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &length) != 0) return {};
  return std::string(name, ::strnlen(name, length));
}

/// Applies options::congestion_control `choice` to connected socket `fd`:
/// "" chooses (CUBIC within one host, else the system's), "system" leaves
/// it, any other name is set. A name the kernel refuses throws
/// std::system_error with its errno (ENOENT: not available; EPERM: not in
/// net.ipv4.tcp_allowed_congestion_control). When the default's CUBIC is
/// refused the connection keeps the system's choice.
inline void apply_congestion_control(int fd, const std::string& choice) {
  if (choice == system_congestion_control) return;
  if (choice.empty()) {
    if (!same_host(fd)) return;
    ::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, local_congestion_control,
                 static_cast<socklen_t>(std::strlen(local_congestion_control)));
    return;
  }
  if (::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, choice.data(), static_cast<socklen_t>(choice.size())) != 0) {
    const int error = errno;
    throw std::system_error(error, std::generic_category(),
                            "uring_tcp: congestion control '" + choice +
                                "' refused (see net.ipv4.tcp_available_congestion_control and "
                                "net.ipv4.tcp_allowed_congestion_control)");
  }
}

}  // namespace pdcoll::transport::uring_tcp::detail
