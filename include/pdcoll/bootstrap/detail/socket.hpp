// File: bootstrap/detail/socket.hpp — the few POSIX socket calls the
// rendezvous store needs: an owning fd, name resolution, listening, and a
// connect that retries until a deadline. Internal to pdcoll::bootstrap.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <functional>
#include <cstdint>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "pdcoll/error.hpp"

namespace pdcoll::bootstrap::detail {

using clock = std::chrono::steady_clock;

/// An owned file descriptor, closed on destruction.
class unique_fd {
 public:
  unique_fd() = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() { reset(); }
  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

[[noreturn]] inline void throw_error(errc code, const std::string& text) {
  throw std::system_error(make_error_code(code), text);
}

inline std::string errno_text(int error) { return std::error_code(error, std::generic_category()).message(); }

inline std::string endpoint_text(const std::string& host, std::uint16_t port) {
  return host.find(':') != std::string::npos ? "[" + host + "]:" + std::to_string(port)
                                             : host + ":" + std::to_string(port);
}

/// This host's name (gethostname(2)); "localhost" when it has none.
inline std::string local_host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

inline bool set_nonblocking(int fd) noexcept {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  return flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

/// Milliseconds from now to `deadline`, clamped to [0, INT_MAX] for poll(2).
inline int poll_timeout(clock::time_point deadline) noexcept {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - clock::now()).count();
  return left <= 0 ? 0 : left > 0x7fffffff ? 0x7fffffff : static_cast<int>(left);
}

/// getaddrinfo(3) results, freed on destruction.
class address_list {
 public:
  /// Resolves host:port for TCP; `passive` for bind(2), where an empty host
  /// means every address. Returns the gai_strerror text in `error` on failure.
  address_list(const std::string& host, std::uint16_t port, bool passive, std::string& error) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    const std::string service = std::to_string(port);
    status_ = ::getaddrinfo(passive && host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &list_);
    if (status_ != 0) {
      error = ::gai_strerror(status_);
      list_ = nullptr;
    }
  }
  address_list(const address_list&) = delete;
  address_list& operator=(const address_list&) = delete;
  ~address_list() {
    if (list_ != nullptr) ::freeaddrinfo(list_);
  }
  const addrinfo* begin() const noexcept { return list_; }
  /// getaddrinfo's return value: 0, or an EAI_* code.
  int status() const noexcept { return status_; }

 private:
  addrinfo* list_ = nullptr;
  int status_ = 0;
};

/// False, with the reason in `why`, when `host` definitely names nothing
/// (EAI_NONAME, EAI_FAIL); a transient failure (EAI_AGAIN) counts as
/// resolvable, for connect_until to retry.
inline bool host_resolves(const std::string& host, std::string& why) {
  std::string error;
  const address_list addresses(host, 0, false, error);
  if (addresses.status() != EAI_NONAME && addresses.status() != EAI_FAIL) return true;
  why = error;
  return false;
}

/// Opens a non-blocking listening socket on host:port (port 0: ephemeral;
/// host empty: every address) and returns it with the port actually bound.
/// Errors: errc::bootstrap naming the address and the errno text.
inline std::pair<unique_fd, std::uint16_t> listen_on(const std::string& host, std::uint16_t port, int backlog) {
  std::string resolve_error;
  address_list addresses(host, port, true, resolve_error);
  const std::string shown = endpoint_text(host.empty() ? "*" : host, port);
  if (addresses.begin() == nullptr)
    throw_error(errc::bootstrap, "rank 0 could not resolve rendezvous root " + shown + ": " + resolve_error);
  std::vector<const addrinfo*> candidates;
  for (const addrinfo* a = addresses.begin(); a != nullptr; a = a->ai_next) candidates.push_back(a);
  // Every address: the IPv6 wildcard first, made dual-stack below, so that
  // IPv4 and IPv6 clients both reach it; the IPv4 one where IPv6 is missing.
  if (host.empty())
    std::stable_partition(candidates.begin(), candidates.end(),
                          [](const addrinfo* a) { return a->ai_family == AF_INET6; });
  int last_error = 0;
  for (const addrinfo* a : candidates) {
    unique_fd fd{::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol)};
    if (!fd) { last_error = errno; continue; }
    const int one = 1;
    // SO_REUSEADDR lets a job restart on the same port while the previous
    // run's sockets sit in TIME_WAIT; socket(7).
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (host.empty() && a->ai_family == AF_INET6) {
      const int zero = 0;  // whatever net.ipv6.bindv6only says; ipv6(7)
      ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    }
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), backlog) != 0) {
      last_error = errno;
      continue;
    }
    sockaddr_storage bound{};
    socklen_t length = sizeof bound;
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &length);
    const std::uint16_t actual = bound.ss_family == AF_INET6
                                     ? ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port)
                                     : ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
    return {std::move(fd), actual};
  }
  throw_error(errc::bootstrap, "rank 0 could not listen on " + shown + ": " + errno_text(last_error));
}

/// Connects to host:port, retrying refused or unreachable attempts with a
/// growing pause (20 ms … 500 ms) until `deadline`, because the root may
/// start after its clients. Returns a non-blocking connected socket.
/// `prepare`, when given, sees each new socket before its connect().
/// Errors: errc::timeout "could not reach rendezvous root H:P within N ms (…)".
inline unique_fd connect_until(const std::string& host, std::uint16_t port, clock::time_point deadline,
                               std::chrono::milliseconds budget,
                               const std::function<void(int fd)>& prepare = {}) {
  std::string last = "no attempt made";
  auto pause = std::chrono::milliseconds{20};
  do {
    std::string resolve_error;
    address_list addresses(host, port, false, resolve_error);
    if (addresses.begin() == nullptr) last = "cannot resolve: " + resolve_error;
    for (const addrinfo* a = addresses.begin(); a != nullptr && clock::now() < deadline; a = a->ai_next) {
      unique_fd fd{::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol)};
      if (!fd) { last = errno_text(errno); continue; }
      if (prepare) prepare(fd.get());
      int error = 0;
      if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
        error = errno;
        if (error == EINPROGRESS) {
          // connect(2): poll for writability, then read SO_ERROR for the outcome.
          pollfd p{fd.get(), POLLOUT, 0};
          const int ready = ::poll(&p, 1, poll_timeout(deadline));
          socklen_t length = sizeof error;
          if (ready == 1) ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &length);
          else error = ready == 0 ? ETIMEDOUT : errno;
        }
      }
      if (error == 0) {
        const int one = 1;
        ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return fd;
      }
      last = errno_text(error);
    }
    const auto wake = std::min(deadline, clock::now() + pause);
    std::this_thread::sleep_until(wake);
    pause = std::min(pause * 2, std::chrono::milliseconds{500});
  } while (clock::now() < deadline);
  throw_error(errc::timeout, "could not reach rendezvous root " + endpoint_text(host, port) + " within " +
                                 std::to_string(budget.count()) + " ms (last error: " + last + ")");
}

}  // namespace pdcoll::bootstrap::detail
