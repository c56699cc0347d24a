// File: bootstrap/server.hpp — the rendezvous store's TCP server: one
// background thread running poll(2) over non-blocking sockets and feeding
// rendezvous_state. Rank 0's store owns one; nothing else needs it.
//
// Why poll and one thread: a store serves at most a few thousand ranks, each
// sending a handful of small messages, so readiness on O(n) descriptors per
// wake is cheap; what matters is that no connection can block another,
// which non-blocking sockets with per-connection buffers guarantee.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "pdcoll/bootstrap/detail/socket.hpp"
#include "pdcoll/bootstrap/rendezvous_state.hpp"
#include "pdcoll/detail/descriptors.hpp"
#include "pdcoll/detail/log.hpp"

namespace pdcoll::bootstrap {

/// Serves a rendezvous_state on host:port from a background thread, started
/// by the constructor and joined by the destructor. Not copyable or movable
/// (the thread refers to it).
class rendezvous_server {
 public:
  /// Listens on host:port (port 0: an ephemeral port, see port()) for
  /// `world_size` ranks presenting `token`. Raises the process's soft
  /// RLIMIT_NOFILE towards three descriptors per rank (the store's
  /// connection, and the transport's mesh of up to two per peer) plus
  /// detail::spare_descriptors; where the hard limit is lower still, the
  /// ranks past it wait in the backlog and a warning names the limit.
  /// Errors: throws std::system_error{errc::bootstrap} when it cannot
  /// resolve, bind or listen ("rank 0 could not listen on …: Address already in use").
  rendezvous_server(const std::string& host, std::uint16_t port, int world_size, std::string token,
                    server_options options = {})
      : state_(world_size, std::move(token), options), options_(options) {
    pdcoll::detail::make_room_for_descriptors(3 * static_cast<rlim_t>(world_size > 0 ? world_size : 0));
    auto [listener, bound] = detail::listen_on(host, port, 1024);
    listener_ = std::move(listener);
    port_ = bound;
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_NONBLOCK | O_CLOEXEC) != 0)
      detail::throw_error(errc::bootstrap, "rank 0 could not create the store's wake pipe: " + detail::errno_text(errno));
    wake_read_.reset(pipe_fds[0]);
    wake_write_.reset(pipe_fds[1]);
    thread_ = std::thread([this] { run(); });
  }

  rendezvous_server(const rendezvous_server&) = delete;
  rendezvous_server& operator=(const rendezvous_server&) = delete;

  /// Stops accepting, delivers queued replies for up to
  /// server_options::flush_timeout, closes every connection and joins the thread.
  ~rendezvous_server() {
    const char byte = 1;
    [[maybe_unused]] auto written = ::write(wake_write_.get(), &byte, 1);
    thread_.join();
  }

  /// The TCP port the server listens on.
  std::uint16_t port() const noexcept { return port_; }

 private:
  using clock = detail::clock;

  void run() noexcept {
    try {
      serve();
    } catch (...) {
      // Only allocation failure can land here; dropping every connection
      // makes each client fail fast with peer_lost instead of hanging.
    }
    sockets_.clear();
    // Clients that connect from now on are refused at once instead of
    // waiting out their deadline in a backlog nobody accepts from.
    listener_.reset();
  }

  void serve() {
    bool stopping = false;
    clock::time_point stop_deadline{};
    std::vector<pollfd> fds;
    std::vector<rendezvous_state::connection_id> ids;
    for (;;) {
      fds.clear();
      ids.clear();
      // Once stopping, the wake pipe (never drained) and the listener are
      // left out, or poll() would return at once on every turn.
      fds.push_back({stopping ? -1 : wake_read_.get(), POLLIN, 0});
      const bool accepting = !stopping && clock::now() >= accept_paused_until_;
      fds.push_back({accepting ? listener_.get() : -1, POLLIN, 0});
      for (auto& [id, fd] : sockets_) {
        // A client whose replies are backed up is not read: its requests
        // wait in its socket, and TCP slows it down.
        short events = state_.closing(id) || state_.backlog(id) > options_.max_backlog_bytes ? 0 : POLLIN;
        if (state_.wants_write(id)) events |= POLLOUT;
        fds.push_back({fd.get(), events, 0});
        ids.push_back(id);
      }
      auto wake = clock::now() + std::chrono::seconds{1};
      if (auto deadline = state_.next_deadline()) wake = std::min(wake, *deadline);
      if (!stopping && !accepting) wake = std::min(wake, accept_paused_until_);
      if (stopping) wake = std::min(wake, stop_deadline);
      const int ready = ::poll(fds.data(), fds.size(), detail::poll_timeout(wake));
      if (ready < 0 && errno != EINTR) return;
      const auto now = clock::now();

      if (fds[0].revents != 0 && !stopping) {
        stopping = true;
        stop_deadline = now + options_.flush_timeout;
      }
      if (accepting && (fds[1].revents & POLLIN)) accept_all(now);

      std::vector<rendezvous_state::connection_id> gone;
      for (std::size_t i = 0; i < ids.size(); ++i) {
        const auto id = ids[i];
        const short revents = fds[i + 2].revents;
        if ((revents & (POLLIN | POLLHUP | POLLERR)) && !state_.closing(id) && !read_from(id, now)) {
          gone.push_back(id);
          continue;
        }
        if ((revents & (POLLHUP | POLLERR)) && state_.closing(id)) gone.push_back(id);
      }
      for (auto id : gone) drop(id);

      state_.tick(now);
      for (const auto id : state_.connections()) {
        if (!write_to(id)) { drop(id); continue; }
        if (state_.should_drop(id, now)) drop(id);
      }
      // Requests left unparsed while a client's replies were backed up,
      // now that some of them went out (what they queue goes next turn:
      // its connection then asks poll() for POLLOUT).
      bool output_left = false;
      for (const auto id : state_.connections()) {
        state_.resume_input(id, now);
        output_left = output_left || state_.wants_write(id);
      }
      if (stopping && (!output_left || now >= stop_deadline)) return;
    }
  }

  void accept_all(clock::time_point now) {
    for (;;) {
      const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        // EAGAIN: drained. Out of descriptors or memory, the connection
        // stays queued and the listener readable: look again in 100 ms
        // instead of spinning on it.
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          if ((errno == EMFILE || errno == ENFILE) && !descriptors_reported_) {
            descriptors_reported_ = true;  // once: ranks past the limit then time out naming no cause
            rlimit limit{};
            ::getrlimit(RLIMIT_NOFILE, &limit);
            pdcoll::detail::log(pdcoll::detail::log_level::warn, 0,
                                "the rendezvous store is out of file descriptors (" + detail::errno_text(errno) +
                                    ", RLIMIT_NOFILE " + std::to_string(limit.rlim_cur) + "/" +
                                    std::to_string(limit.rlim_max) + ") with " + std::to_string(sockets_.size()) +
                                    " ranks connected: raise the hard limit (ulimit -Hn) to about three per rank");
          }
          accept_paused_until_ = now + std::chrono::milliseconds{100};
        }
        return;
      }
      const auto id = state_.open(now);
      sockets_.emplace(id, detail::unique_fd{fd});
    }
  }

  /// Reads what is available (at most 1 MiB per wake, so one chatty client
  /// cannot starve the rest). Returns false when the peer is gone.
  bool read_from(rendezvous_state::connection_id id, clock::time_point now) {
    char buffer[64 * 1024];
    for (int i = 0; i < 16; ++i) {
      const ssize_t n = ::recv(sockets_.at(id).get(), buffer, sizeof buffer, 0);
      if (n > 0) {
        state_.receive(id, std::string_view{buffer, static_cast<std::size_t>(n)}, now);
        if (state_.closing(id) || state_.backlog(id) > options_.max_backlog_bytes) return true;
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      if (n < 0 && errno == EINTR) continue;
      return false;
    }
    return true;
  }

  /// Writes queued output until the socket would block. Returns false when
  /// the peer is gone.
  bool write_to(rendezvous_state::connection_id id) {
    auto socket = sockets_.find(id);
    if (socket == sockets_.end()) return false;
    for (;;) {
      const std::string_view out = state_.pending_output(id);
      if (out.empty()) return true;
      // MSG_NOSIGNAL: a peer that closed gives EPIPE, not SIGPIPE; send(2).
      const ssize_t n = ::send(socket->second.get(), out.data(), out.size(), MSG_NOSIGNAL);
      if (n > 0) { state_.consumed(id, static_cast<std::size_t>(n)); continue; }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      if (n < 0 && errno == EINTR) continue;
      return false;
    }
  }

  void drop(rendezvous_state::connection_id id) {
    sockets_.erase(id);
    state_.disconnected(id);
  }

  rendezvous_state state_;
  server_options options_;
  detail::unique_fd listener_;
  detail::unique_fd wake_read_;
  detail::unique_fd wake_write_;
  std::uint16_t port_ = 0;
  clock::time_point accept_paused_until_{};
  bool descriptors_reported_ = false;  // the warning that accept ran out of descriptors was logged
  std::map<rendezvous_state::connection_id, detail::unique_fd> sockets_;
  std::thread thread_;
};

}  // namespace pdcoll::bootstrap
