// File: transport/uring_tcp/detail/mesh.hpp — building the TCP full mesh of
// the uring_tcp transport: listening socket, "host:port" addresses, and the
// connect/accept handshake that carries the connecting rank and the job token.
//
// Setup is not on the data path, so it uses plain non-blocking sockets and
// poll(2) with the setup deadline; all data transfers afterwards go through
// io_uring (see ../endpoint.hpp).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "pdcoll/error.hpp"
#include "pdcoll/transport/uring_tcp/detail/congestion.hpp"
#include "pdcoll/transport/uring_tcp/detail/interfaces.hpp"

namespace pdcoll::transport::uring_tcp::detail {

using setup_clock = std::chrono::steady_clock;

/// Owns one file descriptor; closes it on destruction.
class file_descriptor {
 public:
  file_descriptor() = default;
  explicit file_descriptor(int fd) noexcept : fd_(fd) {}
  file_descriptor(file_descriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  file_descriptor& operator=(file_descriptor&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  file_descriptor(const file_descriptor&) = delete;
  file_descriptor& operator=(const file_descriptor&) = delete;
  ~file_descriptor() { reset(); }

  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

/// A socket address of either family.
struct socket_address {
  sockaddr_storage storage{};
  socklen_t length = 0;
  const sockaddr* get() const noexcept { return reinterpret_cast<const sockaddr*>(&storage); }
  int family() const noexcept { return storage.ss_family; }
};

[[noreturn]] inline void throw_errno(int error, const std::string& what) {
  throw std::system_error(error, std::generic_category(), "uring_tcp: " + what);
}

[[noreturn]] inline void throw_pdcoll(errc code, const std::string& what) {
  throw std::system_error(make_error_code(code), "uring_tcp: " + what);
}

/// Resolves a host (numeric or name) to its first address; port 0.
inline socket_address resolve_host(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_family = AF_UNSPEC;
  addrinfo* found = nullptr;
  // getaddrinfo(3): errors come back as EAI_* codes, not errno.
  if (int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0 || !found) {
    throw_pdcoll(errc::bootstrap, "cannot resolve '" + host + "': " + ::gai_strerror(rc));
  }
  socket_address out;
  std::memcpy(&out.storage, found->ai_addr, found->ai_addrlen);
  out.length = found->ai_addrlen;
  ::freeaddrinfo(found);
  return out;
}

/// Formats an address as "a.b.c.d:port" or "[v6]:port".
inline std::string format_address(const socket_address& address) {
  char host[INET6_ADDRSTRLEN] = {};
  std::uint16_t port = 0;
  if (address.family() == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&address.storage);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  auto* a = reinterpret_cast<const sockaddr_in*>(&address.storage);
  ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
  port = ntohs(a->sin_port);
  return std::string(host) + ":" + std::to_string(port);
}

/// Parses "host:port" or "[v6]:port" as produced by format_address (numeric
/// hosts; names are resolved). Throws std::system_error(errc::bootstrap).
inline socket_address parse_address(std::string_view text) {
  auto colon = text.rfind(':');
  if (colon == std::string_view::npos || colon + 1 >= text.size()) {
    throw_pdcoll(errc::bootstrap, "malformed peer address '" + std::string(text) + "'");
  }
  std::string host(text.substr(0, colon));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  unsigned long port = 0;
  for (char c : text.substr(colon + 1)) {
    if (c < '0' || c > '9' || (port = port * 10 + static_cast<unsigned long>(c - '0')) > 65535) {
      throw_pdcoll(errc::bootstrap, "malformed port in peer address '" + std::string(text) + "'");
    }
  }
  socket_address out = resolve_host(host);
  if (out.family() == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(&out.storage)->sin6_port = htons(static_cast<std::uint16_t>(port));
  } else {
    reinterpret_cast<sockaddr_in*>(&out.storage)->sin_port = htons(static_cast<std::uint16_t>(port));
  }
  return out;
}

/// The first IPv4 address of an interface that is up and not loopback, or
/// 127.0.0.1: what peers on other hosts can most likely reach when the user
/// named no address.
inline std::string default_advertised_host() {
  char host[INET_ADDRSTRLEN] = {};
  const bool found = find_interface_address([&](const ifaddrs& it) {
    if (it.ifa_addr->sa_family != AF_INET || !(it.ifa_flags & IFF_UP) || (it.ifa_flags & IFF_LOOPBACK)) return false;
    return ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(it.ifa_addr)->sin_addr, host, sizeof host) !=
           nullptr;
  });
  return found ? std::string(host) : std::string("127.0.0.1");
}

/// Socket options every connection gets. Buffer sizes must be set before
/// connect()/listen() so that TCP picks a matching window scale (tcp(7)).
inline void tune_socket(int fd, int buffer_bytes) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (buffer_bytes > 0) {
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof buffer_bytes);
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof buffer_bytes);
  }
}

/// What every socket of the mesh gets before connect()/listen() (accepted
/// sockets inherit the listener's): its buffer sizes, and its congestion
/// control, which a connection must start with (congestion.hpp).
struct socket_settings {
  int buffer_bytes = 0;            ///< options::socket_buffer_bytes
  std::string congestion_control;  ///< options::congestion_control
};

/// tune_socket and preset_congestion_control on a socket not yet connected
/// (`stays_on_host`: a listener, or a socket connecting to a local address).
inline void prepare_socket(int fd, const socket_settings& settings, bool stays_on_host) {
  tune_socket(fd, settings.buffer_bytes);
  preset_congestion_control(fd, settings.congestion_control, stays_on_host);
}

/// A listening socket and the "host:port" string peers connect to.
struct listener {
  file_descriptor socket;
  std::string advertised;
};

/// Listens on an ephemeral port of `bind_host` ("" = every IPv4 interface).
inline listener make_listener(const std::string& bind_host, int backlog, const socket_settings& settings) {
  socket_address address;
  std::string advertised_host;
  if (bind_host.empty()) {
    auto* a = reinterpret_cast<sockaddr_in*>(&address.storage);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_ANY);
    address.length = sizeof(sockaddr_in);
    advertised_host = default_advertised_host();
  } else {
    address = resolve_host(bind_host);
  }
  listener out;
  out.socket.reset(::socket(address.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!out.socket.valid()) throw_errno(errno, "socket()");
  int one = 1;
  ::setsockopt(out.socket.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  prepare_socket(out.socket.get(), settings, true);  // accepted sockets inherit the settings
  if (::bind(out.socket.get(), address.get(), address.length) != 0) {
    throw_errno(errno, "bind(" + bind_host + ")");
  }
  if (::listen(out.socket.get(), backlog) != 0) throw_errno(errno, "listen()");
  socket_address bound;
  bound.length = sizeof bound.storage;
  ::getsockname(out.socket.get(), reinterpret_cast<sockaddr*>(&bound.storage), &bound.length);
  if (!advertised_host.empty()) {
    auto port = ntohs(reinterpret_cast<sockaddr_in*>(&bound.storage)->sin_port);
    out.advertised = advertised_host + ":" + std::to_string(port);
  } else {
    out.advertised = format_address(bound);
  }
  return out;
}

/// First bytes on a new connection, from the connecting (lower) rank.
struct hello {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint16_t token_length;
  std::uint32_t rank;
  std::uint32_t world_size;
};
static_assert(sizeof(hello) == 16);

/// The accepting rank's answer: the handshake was accepted.
struct hello_ack {
  std::uint32_t magic;
  std::uint32_t rank;
};

inline constexpr std::uint32_t hello_magic = 0x50445552;  // "PDUR"
inline constexpr std::uint32_t ack_magic = 0x50444143;    // "PDAC"
inline constexpr std::uint16_t wire_version = 1;
inline constexpr std::size_t max_token_bytes = 4096;

/// One connection being set up, in either direction.
struct pending_connection {
  enum class phase : std::uint8_t { connecting, sending, receiving, done };
  file_descriptor socket;
  phase state = phase::connecting;
  int peer = -1;                    ///< known up front when connecting; from the hello when accepting
  std::vector<unsigned char> out;   ///< bytes still to write
  std::size_t out_offset = 0;
  std::vector<unsigned char> in;    ///< bytes read so far
  std::size_t in_needed = 0;        ///< bytes the current read phase needs
  setup_clock::time_point retry_at{};
};

/// Builds the full mesh: connects to every higher rank, accepts every lower
/// rank, with the handshake described above. Returns one connected, blocking,
/// tuned socket per rank (invalid at `rank`). Throws std::system_error:
/// errc::timeout when `deadline` passes, errc::unauthenticated when a higher
/// rank closes our handshake (token or world size mismatch), errc::bootstrap
/// for malformed addresses, errno codes for socket failures.
inline std::vector<file_descriptor> connect_mesh(int rank, int world_size, file_descriptor& listening,
                                                 const std::vector<std::string>& addresses,
                                                 const std::string& token, const socket_settings& settings,
                                                 setup_clock::time_point deadline) {
  std::vector<file_descriptor> connected(static_cast<std::size_t>(world_size));
  std::vector<pending_connection> outgoing;
  std::vector<pending_connection> incoming;
  int accepted = 0;

  std::vector<unsigned char> my_hello(sizeof(hello) + token.size());
  {
    hello h{hello_magic, wire_version, static_cast<std::uint16_t>(token.size()),
            static_cast<std::uint32_t>(rank), static_cast<std::uint32_t>(world_size)};
    std::memcpy(my_hello.data(), &h, sizeof h);
    std::memcpy(my_hello.data() + sizeof h, token.data(), token.size());
  }

  auto start_connect = [&](pending_connection& c) {
    socket_address target = parse_address(addresses[static_cast<std::size_t>(c.peer)]);
    c.socket.reset(::socket(target.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!c.socket.valid()) throw_errno(errno, "socket()");
    prepare_socket(c.socket.get(), settings, local_address(target.get()));
    c.state = pending_connection::phase::connecting;
    c.out = my_hello;
    c.out_offset = 0;
    c.in.clear();
    c.in_needed = sizeof(hello_ack);
    if (::connect(c.socket.get(), target.get(), target.length) != 0 && errno != EINPROGRESS) {
      // Refused or unreachable right now: the peer may still be starting; retry.
      c.socket.reset();
      c.retry_at = setup_clock::now() + std::chrono::milliseconds(20);
    }
  };
  for (int peer = rank + 1; peer < world_size; ++peer) {
    outgoing.emplace_back().peer = peer;
    start_connect(outgoing.back());
  }

  // Reads into c.in until c.in_needed bytes; false when the peer closed or failed.
  auto read_some = [](pending_connection& c) {
    while (c.in.size() < c.in_needed) {
      unsigned char buffer[512];
      std::size_t want = std::min(sizeof buffer, c.in_needed - c.in.size());
      ssize_t n = ::recv(c.socket.get(), buffer, want, 0);
      if (n > 0) {
        c.in.insert(c.in.end(), buffer, buffer + n);
      } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        return true;
      } else {
        return false;
      }
    }
    return true;
  };
  auto write_some = [](pending_connection& c) {
    while (c.out_offset < c.out.size()) {
      ssize_t n = ::send(c.socket.get(), c.out.data() + c.out_offset, c.out.size() - c.out_offset,
                         MSG_NOSIGNAL);
      if (n > 0) {
        c.out_offset += static_cast<std::size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        return true;
      } else {
        return false;
      }
    }
    return true;
  };

  auto all_done = [&] {
    if (accepted != rank) return false;
    return std::all_of(outgoing.begin(), outgoing.end(),
                       [](const pending_connection& c) { return c.state == pending_connection::phase::done; });
  };

  std::vector<pollfd> polls;
  std::vector<pending_connection*> polled;
  std::vector<file_descriptor> fresh;
  while (!all_done()) {
    auto now = setup_clock::now();
    if (now >= deadline) {
      throw_pdcoll(errc::timeout, "mesh setup of rank " + std::to_string(rank) + " passed its deadline (" +
                                      std::to_string(accepted) + " of " + std::to_string(rank) +
                                      " lower ranks connected)");
    }
    auto wake = deadline;
    polls.clear();
    polled.clear();
    if (accepted < rank) {
      polls.push_back({listening.get(), POLLIN, 0});
      polled.push_back(nullptr);
    }
    for (auto* list : {&outgoing, &incoming}) {
      for (auto& c : *list) {
        if (c.state == pending_connection::phase::done) continue;
        if (!c.socket.valid()) {
          if (c.retry_at <= now) {
            start_connect(c);
          }
          if (!c.socket.valid()) {
            wake = std::min(wake, c.retry_at);
            continue;
          }
        }
        short events = c.state == pending_connection::phase::receiving ? POLLIN : POLLOUT;
        polls.push_back({c.socket.get(), events, 0});
        polled.push_back(&c);
      }
    }
    auto timeout_ms = std::chrono::ceil<std::chrono::milliseconds>(wake - now).count();
    int ready = ::poll(polls.data(), polls.size(), static_cast<int>(std::max<long long>(timeout_ms, 0)));
    if (ready < 0 && errno != EINTR) throw_errno(errno, "poll()");
    if (ready <= 0) continue;

    for (std::size_t i = 0; i < polls.size(); ++i) {
      if (!polls[i].revents) continue;
      pending_connection* c = polled[i];
      if (!c) {
        // accept4(2): drain the backlog; each new socket must first send a hello.
        // Appended after this pass: `polled` points into `incoming`.
        for (;;) {
          int fd = ::accept4(listening.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0) break;
          fresh.emplace_back(fd);
        }
        continue;
      }
      bool outgoing_side = c->peer >= 0 && c->peer > rank;
      if (c->state == pending_connection::phase::connecting) {
        int error = 0;
        socklen_t length = sizeof error;
        ::getsockopt(c->socket.get(), SOL_SOCKET, SO_ERROR, &error, &length);
        if (error != 0) {
          c->socket.reset();
          c->retry_at = setup_clock::now() + std::chrono::milliseconds(20);
          continue;
        }
        c->state = pending_connection::phase::sending;
      }
      if (c->state == pending_connection::phase::sending) {
        if (!write_some(*c)) {
          if (outgoing_side) {
            throw_pdcoll(errc::unauthenticated, "rank " + std::to_string(c->peer) +
                                                    " closed the connection during the handshake "
                                                    "(token or world size mismatch?)");
          }
          c->socket.reset();
          c->state = pending_connection::phase::done;
          continue;
        }
        if (c->out_offset < c->out.size()) continue;
        if (outgoing_side) {
          c->state = pending_connection::phase::receiving;
        } else {
          // The ack is out: this lower rank is connected.
          connected[static_cast<std::size_t>(c->peer)] = std::move(c->socket);
          c->state = pending_connection::phase::done;
          ++accepted;
        }
        continue;
      }
      // receiving
      if (!read_some(*c)) {
        if (outgoing_side) {
          throw_pdcoll(errc::unauthenticated, "rank " + std::to_string(c->peer) +
                                                  " closed the connection during the handshake "
                                                  "(token or world size mismatch?)");
        }
        c->socket.reset();  // a client that went away or spoke garbage
        c->state = pending_connection::phase::done;
        continue;
      }
      if (c->in.size() < c->in_needed) continue;
      if (outgoing_side) {
        hello_ack ack;
        std::memcpy(&ack, c->in.data(), sizeof ack);
        if (ack.magic != ack_magic || ack.rank != static_cast<std::uint32_t>(c->peer)) {
          throw_pdcoll(errc::protocol, "bad handshake answer from rank " + std::to_string(c->peer));
        }
        connected[static_cast<std::size_t>(c->peer)] = std::move(c->socket);
        c->state = pending_connection::phase::done;
        continue;
      }
      // Accepting side: validate the fixed hello, then read and check the token.
      hello h;
      std::memcpy(&h, c->in.data(), sizeof h);
      bool valid = h.magic == hello_magic && h.version == wire_version &&
                   h.world_size == static_cast<std::uint32_t>(world_size) &&
                   h.rank < static_cast<std::uint32_t>(rank) && h.token_length == token.size() &&
                   !connected[h.rank].valid();
      if (!valid) {
        c->socket.reset();  // wrong job, wrong token length, duplicate or impossible rank
        c->state = pending_connection::phase::done;
        continue;
      }
      if (c->in.size() < sizeof(hello) + token.size()) {
        c->in_needed = sizeof(hello) + token.size();
        if (!read_some(*c)) {
          c->socket.reset();
          c->state = pending_connection::phase::done;
          continue;
        }
        if (c->in.size() < c->in_needed) continue;
      }
      // Compare every byte so the time taken does not tell how much matched.
      unsigned char difference = 0;
      for (std::size_t k = 0; k < token.size(); ++k) {
        difference |= static_cast<unsigned char>(c->in[sizeof(hello) + k] ^ static_cast<unsigned char>(token[k]));
      }
      if (difference != 0) {
        c->socket.reset();
        c->state = pending_connection::phase::done;
        continue;
      }
      c->peer = static_cast<int>(h.rank);
      hello_ack ack{ack_magic, static_cast<std::uint32_t>(rank)};
      c->out.assign(reinterpret_cast<unsigned char*>(&ack), reinterpret_cast<unsigned char*>(&ack) + sizeof ack);
      c->out_offset = 0;
      c->state = pending_connection::phase::sending;
      if (!write_some(*c)) {
        c->socket.reset();
        c->state = pending_connection::phase::done;
        continue;
      }
      if (c->out_offset == c->out.size()) {
        connected[h.rank] = std::move(c->socket);
        c->state = pending_connection::phase::done;
        ++accepted;
      }
    }
    for (auto& fd : fresh) {
      auto& in = incoming.emplace_back();
      in.socket = std::move(fd);
      in.state = pending_connection::phase::receiving;
      in.in_needed = sizeof(hello);
    }
    fresh.clear();
    // Forget finished setups so the vectors stay small under a flood of bad clients.
    incoming.erase(std::remove_if(incoming.begin(), incoming.end(),
                                  [](const pending_connection& c) {
                                    return c.state == pending_connection::phase::done;
                                  }),
                   incoming.end());
  }

  // io_uring parks blocking sockets on poll instead of failing with EAGAIN,
  // which it would report for O_NONBLOCK ones; so hand over blocking sockets.
  for (auto& fd : connected) {
    if (!fd.valid()) continue;
    int flags = ::fcntl(fd.get(), F_GETFL);
    ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
    tune_socket(fd.get(), 0);
  }
  return connected;
}

}  // namespace pdcoll::transport::uring_tcp::detail
