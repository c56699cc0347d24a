// File: bootstrap/store.hpp — the rendezvous store client every rank holds:
// set/get/wait of keys, all_gather of one byte string per rank (endpoint
// addresses), and barrier, through a TCP connection to rank 0, which also
// runs the server (bootstrap/server.hpp) on a background thread.
//
// Usage:
//   auto info = pdcoll::bootstrap::from_environment();
//   auto store = pdcoll::bootstrap::store::connect(info, std::chrono::seconds{30});
//   std::vector<std::string> addresses = store.all_gather(my_endpoint_address);
//   store.barrier();
//
// Every call has a deadline (the store's timeout, PDCOLL_TIMEOUT_MS, or the
// per-call argument) and throws std::system_error in pdcoll::error_category()
// when it fails: errc::timeout (what() names the ranks that never arrived),
// errc::unauthenticated (wrong token), errc::bootstrap (inconsistent job),
// errc::peer_lost (the root or a rank went away), errc::protocol (garbage
// from the root), errc::invalid_argument (a key or value over its limit,
// nothing was sent). After any error except invalid_argument the store is
// unusable: the ranks no longer agree on where they are, and every later
// call throws the same error again.
//
// The connection stays open for the store's lifetime; the root closing it
// (see native_handle()) is a hint that rank 0 is gone.
#pragma once

#include <pdcoll/detail/deadline.hpp>

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "pdcoll/bootstrap/detail/socket.hpp"
#include "pdcoll/bootstrap/launch_info.hpp"
#include "pdcoll/bootstrap/rendezvous_state.hpp"
#include "pdcoll/bootstrap/server.hpp"
#include "pdcoll/bootstrap/wire.hpp"
#include "pdcoll/error.hpp"
#include "pdcoll/transport/endpoint.hpp"

namespace pdcoll::bootstrap {

/// Knobs of store::connect beyond the launch description; the defaults suit
/// production, tests shorten the server's timeouts.
struct store_options {
  server_options server;  ///< used by rank 0's server
  /// Extra time a timed-out collective waits for the root to say which
  /// ranks are missing, so the error can name them.
  std::chrono::milliseconds diagnosis_timeout{1'000};
};

/// One rank's connection to the job's rendezvous store. Move-only; not
/// thread-safe (one call at a time, like the communicator that owns it).
class store {
 public:
  /// Connects this rank to the rendezvous store at info.root_host:root_port;
  /// rank 0 first starts the server there. Retries an unreachable root until
  /// `timeout`, then says HELLO{token, rank, world_size} and waits for the
  /// root's answer within the same deadline. `timeout` also becomes the
  /// default deadline of every later call.
  /// Cost: one TCP connection (plus a listening socket and a thread on rank 0).
  /// Errors: errc::timeout ("could not reach rendezvous root 127.0.0.1:29500
  /// within 5000 ms"), errc::unauthenticated, errc::bootstrap ("rank 3 joined
  /// twice", world-size mismatch, rank 0 cannot listen).
  static store connect(const launch_info& info, std::chrono::milliseconds timeout, store_options options = {}) {
    if (info.world_size < 1 || info.rank < 0 || info.rank >= info.world_size ||
        static_cast<std::size_t>(info.world_size) > options.server.wire.max_world_size)
      detail::throw_error(errc::bootstrap, "launch_info has rank " + std::to_string(info.rank) + " and world_size " +
                                               std::to_string(info.world_size) + " (at most " +
                                               std::to_string(options.server.wire.max_world_size) + " ranks)");
    if (timeout.count() <= 0) detail::throw_error(errc::invalid_argument, "store timeout must be positive");
    auto s = std::make_unique<state>();
    s->rank = info.rank;
    s->world_size = info.world_size;
    s->timeout = timeout;
    s->options = options;
    s->reader = frame_reader{options.server.wire};
    const auto deadline = pdcoll::detail::deadline_after(detail::clock::now(), timeout);
    std::string host = info.root_host;
    std::uint16_t port = info.root_port;
    if (info.rank == 0) {
      s->server = std::make_unique<rendezvous_server>(info.root_listens_everywhere ? std::string{} : info.root_host,
                                                      info.root_port, info.world_size, info.token, options.server);
      port = s->server->port();
    }
    if (info.root_through_pmix) std::tie(host, port) = root_from_pmix(info.rank, port, deadline);
    s->root = detail::endpoint_text(host, port);
    s->port = port;
    s->fd = detail::connect_until(host, port, deadline, timeout);
    store result{std::move(s)};
    message hello;
    hello.type = message_type::hello;
    hello.token = info.token;
    hello.rank = static_cast<std::uint32_t>(info.rank);
    hello.world_size = static_cast<std::uint32_t>(info.world_size);
    result.send(hello, deadline, "HELLO");
    auto answer = result.receive(deadline, "HELLO");
    if (!answer)
      result.fail(errc::timeout, "rendezvous root " + result.s_->root + " did not answer rank " +
                                     std::to_string(info.rank) + "'s HELLO within " + std::to_string(timeout.count()) + " ms");
    if (answer->type != message_type::welcome) result.unexpected(*answer, "HELLO");
    return result;
  }

  /// Same, with the deadline from the launch description (PDCOLL_TIMEOUT_MS).
  static store connect(const launch_info& info) { return connect(info, info.timeout); }

  store(store&&) noexcept = default;
  store& operator=(store&&) noexcept = default;
  /// Closes the connection; on rank 0 then stops the server after it has
  /// delivered queued replies (bounded by server_options::flush_timeout).
  ~store() {
    if (s_) s_->fd.reset();
  }

  /// This rank.
  int rank() const noexcept { return s_->rank; }
  /// Ranks in the job.
  int world_size() const noexcept { return s_->world_size; }
  /// The TCP port of the root actually used (differs from launch_info's only for port 0).
  std::uint16_t root_port() const noexcept { return s_->port; }
  /// The default deadline of each call.
  std::chrono::milliseconds timeout() const noexcept { return s_->timeout; }
  /// Changes the default deadline of later calls.
  void set_timeout(std::chrono::milliseconds timeout) noexcept { s_->timeout = timeout; }
  /// The socket to the root, for poll(2)ing for its closure (a peer-lost
  /// hint). Do not read or write it.
  int native_handle() const noexcept { return s_->fd.get(); }

  /// Stores `value` under `key` at the root (overwriting) and returns once it
  /// is stored. Keys: 1–256 bytes; values: up to 64 KiB.
  /// Errors: errc::invalid_argument (limits), errc::bootstrap (store full), see the file comment.
  void set(std::string_view key, std::string_view value) { set(key, value, s_->timeout); }
  /// set() with its own deadline.
  void set(std::string_view key, std::string_view value, std::chrono::milliseconds timeout) {
    check_key(key);
    if (value.size() > s_->options.server.wire.max_value)
      detail::throw_error(errc::invalid_argument, "value for key '" + std::string(key) + "' has " +
                                                      std::to_string(value.size()) + " bytes, over the limit of " +
                                                      std::to_string(s_->options.server.wire.max_value));
    message m;
    m.type = message_type::set;
    m.key = key;
    m.value = value;
    request(m, message_type::ok, timeout, "set('" + std::string(key) + "')");
  }

  /// The value of `key`, waiting until some rank sets it.
  /// Errors: errc::timeout "get('k') timed out after N ms: no rank set the key".
  std::string get(std::string_view key) { return get(key, s_->timeout); }
  std::string get(std::string_view key, std::chrono::milliseconds timeout) {
    check_key(key);
    message m;
    m.type = message_type::get;
    m.key = key;
    return request(m, message_type::value, timeout, "get('" + std::string(key) + "')").value;
  }

  /// Removes every key that starts with `prefix` and returns once they are
  /// gone (a rank waiting for one waits on until it is set again). One round
  /// trip. Errors: errc::invalid_argument (an empty or overlong prefix).
  void erase_prefix(std::string_view prefix) {
    check_key(prefix);
    message m;
    m.type = message_type::erase;
    m.key = prefix;
    request(m, message_type::ok, s_->timeout, "erase_prefix('" + std::string(prefix) + "')");
  }

  /// Returns once every key in `keys` is set. One round trip per key.
  void wait(std::initializer_list<std::string_view> keys) { wait(keys, s_->timeout); }
  /// wait() with its own deadline.
  void wait(std::initializer_list<std::string_view> keys, std::chrono::milliseconds timeout) {
    const auto deadline = pdcoll::detail::deadline_after(detail::clock::now(), timeout);
    for (auto key : keys) {
      check_key(key);
      message m;
      m.type = message_type::wait;
      m.key = key;
      request_until(m, message_type::ready, deadline, timeout, "wait('" + std::string(key) + "')");
    }
  }

  /// Every rank's `mine`, indexed by rank; returns when all ranks called it.
  /// `mine` is at most 64 KiB. Cost: one round trip; the root sends each
  /// rank every contribution.
  /// Errors: errc::timeout naming the ranks that never arrived; errc::peer_lost
  /// when a rank left; errc::collective_mismatch when another rank called barrier.
  std::vector<std::string> all_gather(std::string_view mine) { return all_gather(mine, s_->timeout); }
  std::vector<std::string> all_gather(std::string_view mine, std::chrono::milliseconds timeout) {
    if (mine.size() > s_->options.server.wire.max_value)
      detail::throw_error(errc::invalid_argument, "all_gather contribution of " + std::to_string(mine.size()) +
                                                      " bytes is over the limit of " +
                                                      std::to_string(s_->options.server.wire.max_value));
    return collect(collect_kind::all_gather, mine, timeout);
  }

  /// Returns when every rank has called barrier.
  /// Errors: as all_gather.
  void barrier() { barrier(s_->timeout); }
  /// barrier() with its own deadline.
  void barrier(std::chrono::milliseconds timeout) { collect(collect_kind::barrier, {}, timeout); }

  /// all_gather as the transport layer's address_exchange. The store must
  /// outlive the returned function.
  transport::address_exchange exchange() {
    return [this](std::string_view mine) { return all_gather(mine); };
  }

 private:
  struct state {
    int rank = 0;
    int world_size = 1;
    std::chrono::milliseconds timeout{default_timeout};
    store_options options;
    std::string root;
    std::uint16_t port = 0;
    frame_reader reader;
    std::uint32_t next_round = 0;
    std::error_code broken;
    std::string broken_text;
    // Declared after `server` so that it is destroyed first: rank 0's own
    // departure is then already known when the server flushes and stops.
    std::unique_ptr<rendezvous_server> server;
    detail::unique_fd fd;
  };

  explicit store(std::unique_ptr<state> s) : s_(std::move(s)) {}

  /// The root's address handed over through the launcher's PMIx server
  /// (bootstrap/pmix.hpp): rank 0 publishes its host name and `port` and
  /// reaches its own server over loopback; the others must resolve the name,
  /// and are refused at once where it does not exist (not after the timeout).
  static std::pair<std::string, std::uint16_t> root_from_pmix(int rank, std::uint16_t port,
                                                              detail::clock::time_point deadline) {
#if defined(PDCOLL_WITH_PMIX)
    const std::string published = rank == 0 ? detail::endpoint_text(detail::local_host_name(), port) : "";
    const auto address = detail::share_root_through_pmix(rank, published, deadline);
    if (rank == 0) return {"127.0.0.1", port};
    auto root = detail::split_host_port(address, "the root address rank 0 published through PMIx ('" + address + "')");
    if (std::string why; !detail::host_resolves(root.first, why))
      detail::throw_error(errc::bootstrap, "rank 0's host name '" + root.first +
                                               "', published through PMIx, does not resolve here (" + why +
                                               "): set PDCOLL_ROOT=host:port");
    return root;
#else
    (void)rank, (void)port, (void)deadline;
    detail::throw_error(errc::bootstrap, "launch_info asks for PMIx, which this build of pdcoll lacks");
#endif
  }

  [[noreturn]] void fail(errc code, std::string text) {
    s_->broken = make_error_code(code);
    s_->broken_text = text;
    throw std::system_error(s_->broken, text);
  }

  void check_usable() const {
    if (s_->broken)
      throw std::system_error(s_->broken, "rendezvous store unusable after an earlier error: " + s_->broken_text);
  }

  void check_key(std::string_view key) const {
    if (key.empty() || key.size() > s_->options.server.wire.max_key)
      detail::throw_error(errc::invalid_argument, "key of " + std::to_string(key.size()) +
                                                      " bytes is outside [1, " +
                                                      std::to_string(s_->options.server.wire.max_key) + "]");
  }

  void send(const message& m, detail::clock::time_point deadline, const std::string& what) {
    const std::string bytes = encode(m);
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::send(s_->fd.get(), bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n > 0) { done += static_cast<std::size_t>(n); continue; }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        pollfd p{s_->fd.get(), POLLOUT, 0};
        if (::poll(&p, 1, detail::poll_timeout(deadline)) == 0)
          fail(errc::timeout, what + ": rendezvous root " + s_->root + " accepted no data before the deadline");
        continue;
      }
      fail(errc::peer_lost, what + ": rendezvous root " + s_->root + " closed the connection (" +
                                detail::errno_text(errno) + ")");
    }
  }

  /// The next message from the root, or nullopt when `deadline` passes first.
  std::optional<message> receive(detail::clock::time_point deadline, const std::string& what) {
    message m;
    std::string why;
    for (;;) {
      switch (s_->reader.next(m, why)) {
        case frame_reader::status::frame: return m;
        case frame_reader::status::error: fail(errc::protocol, what + ": malformed reply from rendezvous root: " + why);
        case frame_reader::status::need_more: break;
      }
      pollfd p{s_->fd.get(), POLLIN, 0};
      const int ready = ::poll(&p, 1, detail::poll_timeout(deadline));
      if (ready == 0) return std::nullopt;
      if (ready < 0) {
        if (errno == EINTR) continue;
        fail(errc::transport, what + ": poll failed: " + detail::errno_text(errno));
      }
      char buffer[64 * 1024];
      const ssize_t n = ::recv(s_->fd.get(), buffer, sizeof buffer, 0);
      if (n > 0) { s_->reader.feed(std::string_view{buffer, static_cast<std::size_t>(n)}); continue; }
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      fail(errc::peer_lost, what + ": rendezvous root " + s_->root + " closed the connection" +
                                (n < 0 ? " (" + detail::errno_text(errno) + ")" : ""));
    }
  }

  /// Turns an ERROR (or any reply we did not ask for) into the store's failure.
  [[noreturn]] void unexpected(const message& m, const std::string& what) {
    if (m.type == message_type::error) {
      const auto code = m.code >= 1 && m.code <= static_cast<std::uint32_t>(errc::device) ? static_cast<errc>(m.code)
                                                                                          : errc::bootstrap;
      fail(code, what + ": rendezvous root " + s_->root + " says: " + m.text);
    }
    fail(errc::protocol, what + ": unexpected reply type " + std::to_string(static_cast<int>(m.type)) +
                             " from rendezvous root " + s_->root);
  }

  message request(const message& m, message_type expected, std::chrono::milliseconds timeout, const std::string& what) {
    return request_until(m, expected, pdcoll::detail::deadline_after(detail::clock::now(), timeout), timeout, what);
  }

  message request_until(const message& m, message_type expected, detail::clock::time_point deadline,
                        std::chrono::milliseconds timeout, const std::string& what) {
    check_usable();
    send(m, deadline, what);
    for (;;) {
      auto reply = receive(deadline, what);
      if (!reply)
        fail(errc::timeout, what + " timed out after " + std::to_string(timeout.count()) + " ms" +
                                (expected == message_type::ok ? std::string{} : ": no rank set the key"));
      if (reply->type == message_type::status_reply) continue;  // late answer to an earlier diagnosis
      if (reply->type != expected || (m.key != reply->key && expected != message_type::ok)) unexpected(*reply, what);
      return std::move(*reply);
    }
  }

  std::vector<std::string> collect(collect_kind kind, std::string_view mine, std::chrono::milliseconds timeout) {
    check_usable();
    const auto deadline = pdcoll::detail::deadline_after(detail::clock::now(), timeout);
    const std::uint32_t round = s_->next_round++;
    const std::string what = std::string(kind == collect_kind::barrier ? "barrier" : "all_gather") + " round " +
                             std::to_string(round) + " on rank " + std::to_string(s_->rank);
    message m;
    m.type = message_type::collect;
    m.round = round;
    m.kind = kind;
    m.value = mine;
    send(m, deadline, what);
    std::vector<std::string> values;
    std::vector<bool> seen;
    if (kind == collect_kind::all_gather) {
      values.resize(static_cast<std::size_t>(s_->world_size));
      seen.resize(values.size());
    }
    std::size_t parts = 0;
    bool diagnosing = false;
    auto wait_until = deadline;
    for (;;) {
      auto reply = receive(wait_until, what);
      if (!reply) {
        if (diagnosing) fail(errc::timeout, what + " timed out after " + std::to_string(timeout.count()) +
                                                " ms; the root did not say which ranks are missing");
        // Ask the root who is missing, so the error can name them.
        diagnosing = true;
        message status;
        status.type = message_type::status;
        status.round = round;
        wait_until = detail::clock::now() + s_->options.diagnosis_timeout;
        send(status, wait_until, what);
        continue;
      }
      if (reply->type == message_type::status_reply) {
        if (diagnosing && reply->round == round) fail(errc::timeout, describe_missing(what, timeout, *reply));
        continue;
      }
      if (kind == collect_kind::barrier && reply->type == message_type::done && reply->round == round) return {};
      if (kind == collect_kind::all_gather && reply->type == message_type::part && reply->round == round &&
          reply->rank < values.size() && !seen[reply->rank]) {
        seen[reply->rank] = true;
        values[reply->rank] = std::move(reply->value);
        if (++parts == values.size()) return values;
        continue;
      }
      unexpected(*reply, what);
    }
  }

  static std::string describe_missing(const std::string& what, std::chrono::milliseconds timeout, const message& status) {
    std::string text = what + " timed out after " + std::to_string(timeout.count()) + " ms";
    if (status.missing.empty()) return text + " (every rank had arrived; the reply was late)";
    text += ": ranks that never arrived:";
    std::size_t shown = 0;
    for (const auto& [rank, why] : status.missing) {
      if (++shown > 32) {
        text += " … (" + std::to_string(status.missing.size()) + " in all)";
        break;
      }
      text += " " + std::to_string(rank) +
              (why == absence::never_connected ? " (never connected)"
               : why == absence::departed      ? " (left)"
                                               : " (connected)");
      if (shown < status.missing.size()) text += ",";
    }
    return text;
  }

  std::unique_ptr<state> s_;
};

}  // namespace pdcoll::bootstrap
