// File: bootstrap/rendezvous_state.hpp — the rendezvous store server's state
// machine, without sockets: connections are numbers, input is bytes, output
// is bytes waiting in per-connection queues. The socket server
// (bootstrap/server.hpp), the unit tests and the fuzzer all drive this one
// type, so what the fuzzer proves holds for the real server.
//
// Protocol (message types in wire.hpp):
//  * A connection's first message must be HELLO{token, rank, world_size}.
//    A wrong or missing token → ERROR{unauthenticated} and close; a rank out
//    of range or a different world size → ERROR{bootstrap} and close; a rank
//    that already joined → ERROR{bootstrap, "rank 3 joined twice"} and close
//    (a rank that left cannot rejoin: its peers may already count it lost).
//    A connection that says nothing for hello_timeout is dropped.
//  * Then one request at a time (STATUS excepted): SET → OK; GET → VALUE and
//    WAIT → READY once the key is set; COLLECT{round, kind, value} → every
//    rank's PART (all_gather) or DONE (barrier) once all ranks arrived.
//    Rounds are numbered 0, 1, 2 … per rank, and every rank must call the
//    same collective in the same round.
//  * A collective that cannot complete (a rank left, kinds differ, too many
//    bytes) fails for everyone with ERROR, and so does every later one: the
//    ranks disagree about the job, and going on would only hide it.
//  * Malformed input, an oversized frame, or a second HELLO → ERROR{protocol}
//    and close. Nothing a client sends can make the state grow beyond the
//    limits, or block other connections.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pdcoll/bootstrap/wire.hpp"
#include "pdcoll/error.hpp"

namespace pdcoll::bootstrap {

namespace detail {

/// The collective round the ranks are in: who contributed what so far.
struct open_round {
  std::uint32_t number = 0;
  collect_kind kind{};
  std::vector<std::optional<std::string>> values;
  int arrived = 0;
  int first_rank = -1;
  std::size_t bytes = 0;
};

}  // namespace detail

/// Server-side knobs of the rendezvous store.
struct server_options {
  limits wire;                                          ///< per-message bounds
  std::chrono::milliseconds hello_timeout{10'000};      ///< drop a connection that has not said HELLO by then
  std::chrono::milliseconds flush_timeout{2'000};       ///< longest wait to deliver a closing connection's last bytes
  std::size_t max_store_bytes = 64u << 20;              ///< keys + values held by SET
  std::size_t max_gather_bytes = 256u << 20;            ///< bytes of one all_gather round
  std::size_t max_extra_connections = 64;               ///< connections allowed beyond world_size (unauthenticated)
  /// Replies queued for one connection above which its further requests wait
  /// unread until the client takes its replies (see receive()).
  std::size_t max_backlog_bytes = 1u << 20;
};

/// The server's protocol logic over abstract connections. Single-threaded;
/// the socket server calls it from its one thread.
/// Cost: O(1) per message plus the payload, except a completed round (one
/// shared buffer for everyone) and STATUS (O(world_size)).
class rendezvous_state {
 public:
  using connection_id = std::uint64_t;      ///< the caller's name for one client connection
  using clock = std::chrono::steady_clock;  ///< the clock of idle and wait deadlines

  /// A store for `world_size` ranks that admits clients presenting `token`.
  rendezvous_state(int world_size, std::string token, server_options options = {})
      : world_size_(world_size), token_(std::move(token)), options_(options),
        ranks_(static_cast<std::size_t>(std::max(world_size, 0))) {}

  /// Registers a new connection opened at `now`. Past the connection limit it
  /// is registered already closing (the server closes it at once).
  connection_id open(clock::time_point now) {
    const connection_id id = next_id_++;
    connection& c = connections_[id];
    // Until HELLO the only frame a client may send is a HELLO: an
    // unauthenticated connection cannot make the store buffer a megabyte.
    limits before_hello = options_.wire;
    before_hello.max_frame = std::min(before_hello.max_frame, hello_frame_bytes(options_.wire));
    c.reader = frame_reader{before_hello};
    c.hello_deadline = now + options_.hello_timeout;
    if (connections_.size() > static_cast<std::size_t>(world_size_) + options_.max_extra_connections)
      close_later(c, now);
    return id;
  }

  /// Feeds bytes received on `id` at `now` and handles the requests they
  /// complete. Bytes arriving after the connection started closing are
  /// ignored. While more than options.max_backlog_bytes of replies wait for
  /// the client, its further requests stay unparsed (a client that sends
  /// STATUS after STATUS and never reads cannot grow the store's memory
  /// without bound); resume_input() takes them up once it has read.
  void receive(connection_id id, std::string_view bytes, clock::time_point now) {
    auto it = connections_.find(id);
    if (it == connections_.end() || it->second.closing) return;
    it->second.reader.feed(bytes);
    resume_input(id, now);
  }

  /// Handles the requests received on `id` and not handled yet because its
  /// replies were backed up (see receive()). Cheap when there are none.
  void resume_input(connection_id id, clock::time_point now) {
    message m;
    std::string why;
    for (;;) {
      auto found = connections_.find(id);  // handlers never erase, but stay honest
      if (found == connections_.end() || found->second.closing) return;
      if (found->second.queued > options_.max_backlog_bytes) return;
      switch (found->second.reader.next(m, why)) {
        case frame_reader::status::need_more: return;
        case frame_reader::status::error: fatal(found->second, errc::protocol, why, now); return;
        case frame_reader::status::frame: handle(id, found->second, m, now); break;
      }
    }
  }

  /// The connection is gone (peer closed, I/O error, or the server closed
  /// it). A rank that leaves fails the collective it has not joined.
  void disconnected(connection_id id) {
    auto it = connections_.find(id);
    if (it == connections_.end()) return;
    const int rank = it->second.rank;
    connections_.erase(it);
    if (rank < 0) return;
    rank_slot& slot = ranks_[static_cast<std::size_t>(rank)];
    slot.connection = 0;
    slot.departed = true;
    if (round_ && !round_->values[static_cast<std::size_t>(rank)])
      fail_collectives(errc::peer_lost, "rank " + std::to_string(rank) + " left the rendezvous before " +
                                            describe(round_->kind, round_->number) + " completed");
  }

  /// Starts closing connections whose HELLO deadline passed at `now`.
  void tick(clock::time_point now) {
    for (auto& [id, c] : connections_)
      if (!c.closing && c.rank < 0 && now >= c.hello_deadline) close_later(c, now);
  }

  /// The earliest time tick() has work to do (a HELLO or flush deadline).
  std::optional<clock::time_point> next_deadline() const {
    std::optional<clock::time_point> earliest;
    for (const auto& [id, c] : connections_) {
      auto t = c.closing ? c.close_deadline : (c.rank < 0 ? std::optional{c.hello_deadline} : std::nullopt);
      if (t && (!earliest || *t < *earliest)) earliest = t;
    }
    return earliest;
  }

  /// The next bytes to send on `id` (empty when nothing is queued). Valid
  /// until the next call that changes the state.
  std::string_view pending_output(connection_id id) const {
    auto it = connections_.find(id);
    if (it == connections_.end() || it->second.outbox.empty()) return {};
    const auto& front = *it->second.outbox.front();
    return std::string_view{front}.substr(it->second.sent);
  }

  /// Marks `n` bytes of pending_output(id) as sent.
  void consumed(connection_id id, std::size_t n) {
    auto it = connections_.find(id);
    if (it == connections_.end()) return;
    connection& c = it->second;
    while (n > 0 && !c.outbox.empty()) {
      const std::size_t left = c.outbox.front()->size() - c.sent;
      const std::size_t step = std::min(n, left);
      c.sent += step;
      c.queued -= step;
      n -= step;
      if (c.sent == c.outbox.front()->size()) {
        c.outbox.pop_front();
        c.sent = 0;
      }
    }
  }

  /// True once `id` should be closed by the server: it is closing and its
  /// last bytes are out, or its flush deadline passed.
  bool should_drop(connection_id id, clock::time_point now) const {
    auto it = connections_.find(id);
    if (it == connections_.end()) return true;
    const connection& c = it->second;
    return c.closing && (c.outbox.empty() || now >= *c.close_deadline);
  }

  /// Bytes of replies queued for `id` and not yet consumed.
  std::size_t backlog(connection_id id) const {
    auto it = connections_.find(id);
    return it == connections_.end() ? 0 : it->second.queued;
  }

  /// True while `id` has bytes to send.
  bool wants_write(connection_id id) const {
    auto it = connections_.find(id);
    return it != connections_.end() && !it->second.outbox.empty();
  }

  /// True when `id` is closing (the server stops reading it).
  bool closing(connection_id id) const {
    auto it = connections_.find(id);
    return it == connections_.end() || it->second.closing;
  }

  /// Every registered connection.
  std::vector<connection_id> connections() const {
    std::vector<connection_id> ids;
    ids.reserve(connections_.size());
    for (const auto& entry : connections_) ids.push_back(entry.first);
    return ids;
  }

  /// Number of ranks that said HELLO successfully (departed ones included).
  int joined() const noexcept {
    return static_cast<int>(std::count_if(ranks_.begin(), ranks_.end(), [](const rank_slot& s) { return s.joined; }));
  }
  /// Keys + values bytes held.
  std::size_t store_bytes() const noexcept { return store_bytes_; }
  /// Rounds completed so far.
  std::uint32_t completed_rounds() const noexcept { return completed_; }

 private:
  using shared_bytes = std::shared_ptr<const std::string>;

  enum class pending : std::uint8_t { none, get, wait, collect };

  struct connection {
    frame_reader reader;
    std::deque<shared_bytes> outbox;
    std::size_t sent = 0;             // bytes of outbox.front() already written
    std::size_t queued = 0;           // bytes in outbox not yet written
    int rank = -1;                    // set by a successful HELLO
    pending waiting = pending::none;
    std::string waiting_key;
    clock::time_point hello_deadline{};
    std::optional<clock::time_point> close_deadline;
    bool closing = false;
  };

  struct rank_slot {
    connection_id connection = 0;
    std::uint32_t next_round = 0;
    bool joined = false;
    bool departed = false;
  };

  static std::string describe(collect_kind kind, std::uint32_t number) {
    return std::string(kind == collect_kind::barrier ? "barrier" : "all_gather") + " round " + std::to_string(number);
  }

  void send(connection& c, const message& m) { send(c, std::make_shared<const std::string>(encode(m))); }
  void send(connection& c, shared_bytes bytes) {
    if (c.closing) return;
    c.queued += bytes->size();
    c.outbox.push_back(std::move(bytes));
  }

  /// The largest HELLO body: type, token (16-bit length first), rank, world size.
  static std::size_t hello_frame_bytes(const limits& lim) noexcept { return 1 + 2 + lim.max_token + 4 + 4; }

  void close_later(connection& c, clock::time_point now) {
    c.closing = true;
    c.close_deadline = now + options_.flush_timeout;
  }

  static message error_message(errc code, std::string text) {
    message m;
    m.type = message_type::error;
    m.code = static_cast<std::uint32_t>(code);
    m.text = std::move(text);
    return m;
  }

  /// Sends ERROR and closes: the connection cannot be trusted any further.
  void fatal(connection& c, errc code, std::string text, clock::time_point now) {
    send(c, error_message(code, std::move(text)));
    close_later(c, now);
  }

  void reply(connection& c, message_type type, std::string key = {}, std::string value = {}) {
    message m;
    m.type = type;
    m.key = std::move(key);
    m.value = std::move(value);
    send(c, m);
  }

  void handle(connection_id id, connection& c, const message& m, clock::time_point now) {
    if (c.rank < 0) {
      hello(id, c, m, now);
      return;
    }
    if (m.type == message_type::status) {
      status(c, m.round);
      return;
    }
    if (static_cast<std::uint8_t>(m.type) >= 64 || m.type == message_type::hello) {
      fatal(c, errc::protocol, "unexpected message type " + std::to_string(static_cast<int>(m.type)), now);
      return;
    }
    if (c.waiting != pending::none) {
      fatal(c, errc::protocol, "a request arrived while another was pending", now);
      return;
    }
    switch (m.type) {
      case message_type::set: set(c, m.key, m.value); break;
      case message_type::get:
      case message_type::wait: lookup(c, m.type, m.key); break;
      case message_type::collect: collect(c, m, now); break;
      case message_type::erase: erase_prefix(c, m.key); break;
      default: break;
    }
  }

  void hello(connection_id id, connection& c, const message& m, clock::time_point now) {
    if (m.type != message_type::hello) {
      fatal(c, errc::unauthenticated, "the first message must be HELLO", now);
      return;
    }
    if (!same_token(m.token)) {
      fatal(c, errc::unauthenticated, m.token.empty() ? "missing token" : "wrong token", now);
      return;
    }
    if (m.world_size != static_cast<std::uint32_t>(world_size_)) {
      fatal(c, errc::bootstrap,
            "rank " + std::to_string(m.rank) + " says world_size " + std::to_string(m.world_size) +
                " but the rendezvous root serves world_size " + std::to_string(world_size_),
            now);
      return;
    }
    if (m.rank >= static_cast<std::uint32_t>(world_size_)) {
      fatal(c, errc::bootstrap, "rank " + std::to_string(m.rank) + " is not below world_size " + std::to_string(world_size_), now);
      return;
    }
    rank_slot& slot = ranks_[m.rank];
    if (slot.joined) {
      fatal(c, errc::bootstrap, "rank " + std::to_string(m.rank) + " joined twice", now);
      return;
    }
    slot.joined = true;
    slot.connection = id;
    c.rank = static_cast<int>(m.rank);
    c.reader.set_limits(options_.wire);
    reply(c, message_type::welcome);
  }

  /// Compares without an early exit, so the time taken says nothing about
  /// how much of a guessed token was right.
  bool same_token(std::string_view offered) const noexcept {
    unsigned char diff = offered.size() == token_.size() ? 0 : 1;
    for (std::size_t i = 0; i < offered.size(); ++i)
      diff |= static_cast<unsigned char>(offered[i] ^ (i < token_.size() ? token_[i] : 0));
    return diff == 0;
  }

  void set(connection& c, const std::string& key, const std::string& value) {
    auto it = store_.find(key);
    const std::size_t old = it == store_.end() ? 0 : key.size() + it->second.size();
    if (store_bytes_ - old + key.size() + value.size() > options_.max_store_bytes) {
      send(c, error_message(errc::bootstrap, "the rendezvous store is full (" + std::to_string(options_.max_store_bytes) + " bytes)"));
      return;
    }
    store_bytes_ = store_bytes_ - old + key.size() + value.size();
    store_[key] = value;
    reply(c, message_type::ok);
    auto waiters = waiters_.find(key);
    if (waiters == waiters_.end()) return;
    for (connection_id waiter : waiters->second) {
      auto w = connections_.find(waiter);
      if (w == connections_.end() || w->second.waiting_key != key) continue;
      answer(w->second, key, value);
    }
    waiters_.erase(waiters);
  }

  /// Removes every key that starts with `prefix` (ranks waiting for one of
  /// them go on waiting for it to be set again).
  void erase_prefix(connection& c, const std::string& prefix) {
    auto it = store_.lower_bound(prefix);
    while (it != store_.end() && std::string_view(it->first).substr(0, prefix.size()) == prefix) {
      store_bytes_ -= it->first.size() + it->second.size();
      it = store_.erase(it);
    }
    reply(c, message_type::ok);
  }

  void answer(connection& c, const std::string& key, const std::string& value) {
    const bool wants_value = c.waiting == pending::get;
    c.waiting = pending::none;
    c.waiting_key.clear();
    if (wants_value) reply(c, message_type::value, key, value);
    else reply(c, message_type::ready, key);
  }

  void lookup(connection& c, message_type type, const std::string& key) {
    c.waiting = type == message_type::get ? pending::get : pending::wait;
    c.waiting_key = key;
    auto it = store_.find(key);
    if (it != store_.end()) {
      answer(c, key, it->second);
      return;
    }
    auto& list = waiters_[key];
    // One pending request per connection bounds the lists by the connection count.
    list.push_back(ranks_[static_cast<std::size_t>(c.rank)].connection);
  }

  void collect(connection& c, const message& m, clock::time_point now) {
    rank_slot& slot = ranks_[static_cast<std::size_t>(c.rank)];
    if (m.round != slot.next_round) {
      fatal(c, errc::protocol,
            "rank " + std::to_string(c.rank) + " sent round " + std::to_string(m.round) + " but its next round is " +
                std::to_string(slot.next_round),
            now);
      return;
    }
    ++slot.next_round;
    if (failure_) {
      send(c, error_message(failure_->first, failure_->second));
      return;
    }
    for (std::size_t r = 0; r < ranks_.size(); ++r) {
      if (ranks_[r].departed) {
        c.waiting = pending::collect;
        if (!round_) start_round(m, c.rank);
        fail_collectives(errc::peer_lost, "rank " + std::to_string(r) + " left the rendezvous before " +
                                              describe(m.kind, m.round) + " completed");
        return;
      }
    }
    if (!round_) start_round(m, c.rank);
    if (round_->kind != m.kind) {
      c.waiting = pending::collect;
      fail_collectives(errc::collective_mismatch,
                       "rank " + std::to_string(c.rank) + " called " + describe(m.kind, m.round) + " but rank " +
                           std::to_string(round_->first_rank) + " called " + describe(round_->kind, round_->number));
      return;
    }
    round_->bytes += m.value.size();
    if (round_->bytes > options_.max_gather_bytes) {
      c.waiting = pending::collect;
      fail_collectives(errc::bootstrap, describe(m.kind, m.round) + " exceeds " +
                                            std::to_string(options_.max_gather_bytes) + " bytes");
      return;
    }
    round_->values[static_cast<std::size_t>(c.rank)] = m.value;
    ++round_->arrived;
    c.waiting = pending::collect;
    if (round_->arrived == world_size_) complete_round();
  }

  void start_round(const message& m, int rank) {
    round_.emplace();
    round_->number = m.round;
    round_->kind = m.kind;
    round_->first_rank = rank;
    round_->values.resize(static_cast<std::size_t>(world_size_));
  }

  void complete_round() {
    std::string out;
    message reply_message;
    if (round_->kind == collect_kind::barrier) {
      reply_message.type = message_type::done;
      reply_message.round = round_->number;
      encode(reply_message, out);
    } else {
      out.reserve(round_->bytes + static_cast<std::size_t>(world_size_) * 17);
      reply_message.type = message_type::part;
      reply_message.round = round_->number;
      for (std::size_t r = 0; r < round_->values.size(); ++r) {
        reply_message.rank = static_cast<std::uint32_t>(r);
        reply_message.value = std::move(*round_->values[r]);
        encode(reply_message, out);
      }
    }
    auto shared = std::make_shared<const std::string>(std::move(out));
    for (auto& [id, c] : connections_) {
      if (c.waiting != pending::collect) continue;
      c.waiting = pending::none;
      send(c, shared);
    }
    round_.reset();
    ++completed_;
  }

  /// Fails the open collective for everyone waiting in it, and every later one.
  void fail_collectives(errc code, std::string text) {
    if (!failure_) failure_.emplace(code, std::move(text));
    auto shared = std::make_shared<const std::string>(encode(error_message(failure_->first, failure_->second)));
    for (auto& [id, c] : connections_) {
      if (c.waiting != pending::collect) continue;
      c.waiting = pending::none;
      send(c, shared);
    }
    round_.reset();
  }

  void status(connection& c, std::uint32_t number) {
    message m;
    m.type = message_type::status_reply;
    m.round = number;
    m.state = number < completed_ || (failure_ && !round_) ? round_state::completed
              : (round_ && round_->number == number) ? round_state::open
                                                      : round_state::not_started;
    for (std::size_t r = 0; r < ranks_.size(); ++r) {
      const rank_slot& slot = ranks_[r];
      if (slot.next_round > number) continue;
      m.missing.emplace_back(static_cast<std::uint32_t>(r), !slot.joined ? absence::never_connected
                                                           : slot.departed ? absence::departed
                                                                           : absence::connected);
    }
    send(c, m);
  }

  int world_size_;
  std::string token_;
  server_options options_;
  std::vector<rank_slot> ranks_;
  std::map<connection_id, connection> connections_;
  connection_id next_id_ = 1;
  std::map<std::string, std::string, std::less<>> store_;
  std::size_t store_bytes_ = 0;
  std::map<std::string, std::vector<connection_id>, std::less<>> waiters_;
  std::optional<detail::open_round> round_;
  std::optional<std::pair<errc, std::string>> failure_;
  std::uint32_t completed_ = 0;
};

}  // namespace pdcoll::bootstrap
