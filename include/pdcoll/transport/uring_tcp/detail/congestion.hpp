// File: transport/uring_tcp/detail/congestion.hpp — the TCP congestion
// control of the uring_tcp connections (options::congestion_control).
//
// Why it matters: BBR, the default congestion control of many cloud images
// (this machine's included), paces every connection from a kernel timer
// when no fq qdisc does it (tcp_pace_kick). On a connection that stays on
// the host there is no link to pace for. So by default connections that
// stay on the host (loopback, or a host talking to itself) use CUBIC, and
// connections to other hosts keep the system's choice, which their
// operators made for their network.
//
// The choice must be made before the connection exists: a socket that
// connects to an address of this host gets it before connect(), the
// listener before listen() (accepted sockets inherit the listener's), and
// an accepted connection that turns out to come from another host goes
// back to the system's choice; connections to other hosts never get it. Setting it on an established connection
// (as pdcoll did before) switches the algorithm but not the pacing: BBR's
// init turns the socket's internal pacing on (sk_pacing_status), and
// nothing but closing the socket turns it off, so such a "CUBIC"
// connection still sent each burst from a pacing timer, at 1.2 times
// cwnd/srtt once out of slow start. Measured on the reference machine
// (pdcoll-bench, io_uring, automatic, float sum, in place, 4 ranks on 2
// cores, 3 alternations with the system default switched between BBR and
// CUBIC): CUBIC from the start against CUBIC set after BBR, 1.33x at
// 256 KiB, 1.06x at 4 MiB, 1.22-1.24x at 16-64 MiB; the pacing timer's
// lock was 14 % of all CPU samples (_raw_spin_unlock_irqrestore under
// tcp_write_xmit), 2.6 % without it.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>

#include "pdcoll/transport/uring_tcp/detail/interfaces.hpp"

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

/// Sets congestion control `name` on `fd`; throws std::system_error with
/// the kernel's errno (ENOENT: not available; EPERM: not in
/// net.ipv4.tcp_allowed_congestion_control) when `required`, else ignores a
/// refusal. Setting the one the socket has is a no-op.
inline void set_congestion_control(int fd, const std::string& name, bool required) {
  if (::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(), static_cast<socklen_t>(name.size())) == 0) return;
  if (!required) return;
  const int error = errno;
  throw std::system_error(error, std::generic_category(),
                          "uring_tcp: congestion control '" + name +
                              "' refused (see net.ipv4.tcp_available_congestion_control and "
                              "net.ipv4.tcp_allowed_congestion_control)");
}

/// The congestion control a new TCP socket gets (net.ipv4.tcp_congestion_control;
/// "" when the kernel does not say). Read once per process.
inline const std::string& system_default_congestion_control() {
  static const std::string name = [] {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return std::string();
    std::string n = congestion_control_of(fd);
    ::close(fd);
    return n;
  }();
  return name;
}

/// Whether `address` (IPv4 or IPv6) belongs to this host: a loopback
/// address or one of its interfaces' (getifaddrs(3)). False when unknown.
inline bool local_address(const sockaddr* address) noexcept {
  if (!address) return false;
  if (address->sa_family == AF_INET) {
    const in_addr_t a = reinterpret_cast<const sockaddr_in*>(address)->sin_addr.s_addr;
    if ((ntohl(a) >> 24) == 127) return true;
  } else if (address->sa_family == AF_INET6) {
    if (IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr)) return true;
  } else {
    return false;
  }
  return find_interface_address([&](const ifaddrs& it) {
    if (it.ifa_addr->sa_family != address->sa_family) return false;
    if (address->sa_family == AF_INET)
      return reinterpret_cast<const sockaddr_in*>(it.ifa_addr)->sin_addr.s_addr ==
             reinterpret_cast<const sockaddr_in*>(address)->sin_addr.s_addr;
    return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(it.ifa_addr)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr, sizeof(in6_addr)) == 0;
  });
}

/// Applies options::congestion_control `choice` to a socket before
/// connect() or listen() (see the file comment): "" sets CUBIC where the
/// connection will stay on the host (`stays_on_host`: a connecting socket
/// whose target is local_address(), or a listener, whose accepted sockets
/// from other hosts apply_congestion_control hands back), and a refusal
/// leaves the system's choice; "system" leaves the system's choice; any
/// other name is set or throws (set_congestion_control). A connection to
/// another host keeps the system's choice from its first packet: a
/// congestion control that needs ECN (DCTCP) must have it when the SYN is
/// sent.
inline void preset_congestion_control(int fd, const std::string& choice, bool stays_on_host = true) {
  if (choice == system_congestion_control) return;
  if (!choice.empty()) return set_congestion_control(fd, choice, true);
  if (stays_on_host) set_congestion_control(fd, local_congestion_control, false);
}

/// Completes `choice` on connected socket `fd`, after
/// preset_congestion_control: with the default (""), a connection that
/// stays on the host is made sure of CUBIC (a no-op when it has it), and
/// one accepted from another host with the listener's CUBIC goes back to
/// the system's choice (one that something else chose, a route's congctl
/// say, is left alone). A named choice is set (a no-op when preset).
inline void apply_congestion_control(int fd, const std::string& choice) {
  if (choice == system_congestion_control) return;
  if (!choice.empty()) return set_congestion_control(fd, choice, true);
  if (same_host(fd)) return set_congestion_control(fd, local_congestion_control, false);
  const std::string& system = system_default_congestion_control();
  if (!system.empty() && congestion_control_of(fd) == local_congestion_control && system != local_congestion_control)
    set_congestion_control(fd, system, false);
}

}  // namespace pdcoll::transport::uring_tcp::detail
