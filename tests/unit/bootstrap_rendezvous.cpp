// The rendezvous wire format and the server state machine, driven with bytes
// (bootstrap/wire.hpp, bootstrap/rendezvous_state.hpp): no sockets, no threads.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

#include "pdcoll/bootstrap/rendezvous_state.hpp"
#include "pdcoll/bootstrap/wire.hpp"

using namespace pdcoll::bootstrap;
using namespace std::chrono_literals;

namespace {

message make(message_type type) {
  message m;
  m.type = type;
  return m;
}

message hello(std::uint32_t rank, std::string token = "secret", std::uint32_t world = 3) {
  message m = make(message_type::hello);
  m.token = std::move(token);
  m.rank = rank;
  m.world_size = world;
  return m;
}

message keyed(message_type type, std::string key, std::string value = {}) {
  message m = make(type);
  m.key = std::move(key);
  m.value = std::move(value);
  return m;
}

message collect(std::uint32_t round, collect_kind kind, std::string value = {}) {
  message m = make(message_type::collect);
  m.round = round;
  m.kind = kind;
  m.value = std::move(value);
  return m;
}

/// One simulated client connection: sends encoded messages, reads back what
/// the server queued for it.
class client {
 public:
  client(rendezvous_state& state, rendezvous_state::clock::time_point now) : state_(state), id_(state.open(now)) {}
  void send(const message& m, rendezvous_state::clock::time_point now = {}) { send_bytes(encode(m), now); }
  void send_bytes(const std::string& bytes, rendezvous_state::clock::time_point now = {}) {
    state_.receive(id_, bytes, now);
  }
  /// Every message the server queued since the last call.
  std::vector<message> received() {
    for (std::string_view out = state_.pending_output(id_); !out.empty(); out = state_.pending_output(id_)) {
      reader_.feed(out);
      state_.consumed(id_, out.size());
    }
    std::vector<message> all;
    message m;
    std::string why;
    while (reader_.next(m, why) == frame_reader::status::frame) all.push_back(m);
    return all;
  }
  /// The single message received, checked to be of `type`.
  message expect(message_type type) {
    auto all = received();
    REQUIRE(all.size() == 1);
    CHECK(static_cast<int>(all[0].type) == static_cast<int>(type));
    return all[0];
  }
  bool closing() const { return state_.closing(id_); }
  rendezvous_state::connection_id id() const { return id_; }

 private:
  rendezvous_state& state_;
  rendezvous_state::connection_id id_;
  frame_reader reader_;
};

const auto t0 = rendezvous_state::clock::time_point{} + std::chrono::hours{1};

/// A client of `state` that has said HELLO as `rank` of `world` and read its WELCOME.
client welcomed(rendezvous_state& state, std::uint32_t rank, std::string token, std::uint32_t world) {
  client c{state, t0};
  c.send(hello(rank, std::move(token), world));
  c.expect(message_type::welcome);
  return c;
}

}  // namespace

TEST_CASE("every message type survives an encode/decode round trip") {
  message status = make(message_type::status_reply);
  status.round = 7;
  status.state = round_state::open;
  status.missing = {{1, absence::never_connected}, {4, absence::departed}};
  message error = make(message_type::error);
  error.code = 15;
  error.text = "rank 3 joined twice";
  message part = make(message_type::part);
  part.round = 2;
  part.rank = 1;
  part.value = std::string("\0bin\xff", 5);
  const std::vector<message> all = {hello(2), keyed(message_type::set, "k", "v"), keyed(message_type::get, "k"),
                                    keyed(message_type::wait, "k"), collect(3, collect_kind::barrier),
                                    make(message_type::welcome), error, make(message_type::ok),
                                    keyed(message_type::value, "k", "v"), keyed(message_type::ready, "k"), part,
                                    status, keyed(message_type::erase, "k/")};
  std::string stream;
  for (const auto& m : all) encode(m, stream);
  frame_reader reader;
  // Byte by byte: a frame split anywhere must reassemble.
  std::vector<message> decoded;
  for (char c : stream) {
    reader.feed(std::string_view{&c, 1});
    message m;
    std::string why;
    while (reader.next(m, why) == frame_reader::status::frame) decoded.push_back(m);
  }
  REQUIRE(decoded.size() == all.size());
  for (std::size_t i = 0; i < all.size(); ++i) CHECK(encode(decoded[i]) == encode(all[i]));
  CHECK(decoded[11].missing.size() == 2);
  CHECK(decoded[10].value == part.value);
  CHECK(reader.buffered() == 0);
}

TEST_CASE("the frame reader rejects oversized, empty, truncated and unknown frames") {
  limits lim;
  auto verdict = [&](const std::string& bytes, std::string& why) {
    frame_reader reader{lim};
    reader.feed(bytes);
    message m;
    return reader.next(m, why);
  };
  std::string why;
  CHECK(verdict(std::string("\xff\xff\xff\x7f", 4), why) == frame_reader::status::error);
  CHECK(why.find("frame length 2147483647") != std::string::npos);
  CHECK(verdict(std::string("\0\0\0\0", 4), why) == frame_reader::status::error);
  // A declared length within bounds but not yet arrived is simply incomplete.
  CHECK(verdict(std::string("\x10\0\0\0\x01", 5), why) == frame_reader::status::need_more);
  // A field that claims more bytes than its frame holds: truncated.
  std::string truncated = encode(hello(0));
  truncated[0] = static_cast<char>(truncated[0] - 2);
  truncated.resize(truncated.size() - 2);
  CHECK(verdict(truncated, why) == frame_reader::status::error);
  CHECK(why.find("truncated") != std::string::npos);
  CHECK(verdict(std::string("\x01\0\0\0\x63", 5), why) == frame_reader::status::error);
  CHECK(why.find("unknown message type 99") != std::string::npos);
  std::string trailing = encode(make(message_type::ok));
  trailing[0] = 2;
  trailing.push_back('x');
  CHECK(verdict(trailing, why) == frame_reader::status::error);
  CHECK(why.find("trailing") != std::string::npos);
  // A value over max_value is refused even when the frame itself fits.
  lim.max_value = 8;
  CHECK(verdict(encode(keyed(message_type::set, "k", std::string(9, 'v'))), why) == frame_reader::status::error);
  CHECK(verdict(encode(keyed(message_type::get, "")), why) == frame_reader::status::error);
  CHECK(why == "empty key");
}

TEST_CASE("a correct HELLO is welcomed and a wrong or missing token is refused and closed") {
  rendezvous_state state{3, "secret"};
  client good{state, t0}, wrong{state, t0}, missing{state, t0}, rude{state, t0};
  good.send(hello(0));
  good.expect(message_type::welcome);
  CHECK_FALSE(good.closing());

  wrong.send(hello(1, "guess"));
  auto refused = wrong.expect(message_type::error);
  CHECK(refused.code == static_cast<std::uint32_t>(pdcoll::errc::unauthenticated));
  CHECK(refused.text == "wrong token");
  CHECK(wrong.closing());

  missing.send(hello(1, ""));
  CHECK(missing.expect(message_type::error).text == "missing token");
  CHECK(missing.closing());

  rude.send(keyed(message_type::set, "k", "v"));
  CHECK(rude.expect(message_type::error).code == static_cast<std::uint32_t>(pdcoll::errc::unauthenticated));
  CHECK(state.store_bytes() == 0);
  CHECK(state.joined() == 1);
}

TEST_CASE("a rank joining twice, a wrong world size and an out-of-range rank are refused") {
  rendezvous_state state{3, "secret"};
  client first{state, t0}, second{state, t0}, other_world{state, t0}, too_big{state, t0};
  first.send(hello(2));
  first.expect(message_type::welcome);
  second.send(hello(2));
  auto twice = second.expect(message_type::error);
  CHECK(twice.text == "rank 2 joined twice");
  CHECK(twice.code == static_cast<std::uint32_t>(pdcoll::errc::bootstrap));
  CHECK(second.closing());
  CHECK_FALSE(first.closing());

  other_world.send(hello(1, "secret", 4));
  CHECK(other_world.expect(message_type::error).text.find("world_size 4") != std::string::npos);
  too_big.send(hello(3));
  CHECK(too_big.expect(message_type::error).text == "rank 3 is not below world_size 3");
}

TEST_CASE("malformed input and a second HELLO close the connection with a protocol error") {
  rendezvous_state state{3, "secret"};
  client a{state, t0}, b{state, t0};
  a.send(hello(0));
  a.expect(message_type::welcome);
  a.send(hello(1));
  CHECK(a.expect(message_type::error).code == static_cast<std::uint32_t>(pdcoll::errc::protocol));
  CHECK(a.closing());
  b.send_bytes(std::string("\xff\xff\xff\xff", 4));
  CHECK(b.expect(message_type::error).text.find("frame length") != std::string::npos);
  CHECK(b.closing());
  // Bytes after the connection started closing are ignored, not parsed.
  b.send(hello(1));
  CHECK(b.received().empty());
}

TEST_CASE("a connection that says nothing is dropped at its HELLO deadline, a welcomed one is kept") {
  server_options options;
  options.hello_timeout = 100ms;
  rendezvous_state state{3, "secret", options};
  client silent{state, t0}, ranked{state, t0};
  ranked.send(hello(0));
  ranked.received();
  REQUIRE(state.next_deadline().has_value());
  CHECK(*state.next_deadline() == t0 + 100ms);
  state.tick(t0 + 99ms);
  CHECK_FALSE(silent.closing());
  state.tick(t0 + 100ms);
  CHECK(silent.closing());
  CHECK(state.should_drop(silent.id(), t0 + 100ms));
  CHECK_FALSE(ranked.closing());
}

TEST_CASE("get and wait are answered when the key is set, at once when it already is") {
  rendezvous_state state{3, "secret"};
  client r0{state, t0}, r1{state, t0}, r2{state, t0};
  r0.send(hello(0));
  r1.send(hello(1));
  r2.send(hello(2));
  r0.received(), r1.received(), r2.received();
  r1.send(keyed(message_type::get, "addr"));
  r2.send(keyed(message_type::wait, "addr"));
  CHECK(r1.received().empty());
  CHECK(r2.received().empty());
  r0.send(keyed(message_type::set, "addr", "tcp://x"));
  r0.expect(message_type::ok);
  CHECK(r1.expect(message_type::value).value == "tcp://x");
  CHECK(r2.expect(message_type::ready).key == "addr");
  r2.send(keyed(message_type::get, "addr"));
  CHECK(r2.expect(message_type::value).value == "tcp://x");
  CHECK(state.store_bytes() == std::string("addr").size() + std::string("tcp://x").size());
}

TEST_CASE("erase removes exactly the keys under a prefix and frees their bytes") {
  rendezvous_state state{1, ""};
  client r0 = welcomed(state, 0, "", 1);
  for (const char* key : {"split/1/0", "split/1/1", "split/10/0", "split/0", "split0"}) {
    r0.send(keyed(message_type::set, key, "vv"));
    r0.expect(message_type::ok);
  }
  r0.send(keyed(message_type::erase, "split/1/"));
  r0.expect(message_type::ok);
  CHECK(state.store_bytes() == std::string("split/10/0split/0split0").size() + 3 * 2);
  r0.send(keyed(message_type::get, "split/10/0"));
  CHECK(r0.expect(message_type::value).value == "vv");
  r0.send(keyed(message_type::get, "split/1/0"));  // gone: waits until set again
  CHECK(r0.received().empty());
  r0.send(keyed(message_type::set, "x", "y"));
  CHECK(r0.expect(message_type::error).text == "a request arrived while another was pending");
}

TEST_CASE("a second request while one is pending is a protocol error") {
  rendezvous_state state{3, "secret"};
  client r0{state, t0};
  r0.send(hello(0));
  r0.received();
  r0.send(keyed(message_type::get, "never"));
  r0.send(keyed(message_type::get, "again"));
  CHECK(r0.expect(message_type::error).text == "a request arrived while another was pending");
  CHECK(r0.closing());
}

TEST_CASE("the store refuses a SET that would exceed its byte budget without closing") {
  server_options options;
  options.max_store_bytes = 10;
  rendezvous_state state{1, "", options};
  client r0 = welcomed(state, 0, "", 1);
  r0.send(keyed(message_type::set, "k", "123456789"));
  r0.expect(message_type::ok);
  r0.send(keyed(message_type::set, "k2", "1"));
  CHECK(r0.expect(message_type::error).text.find("full") != std::string::npos);
  CHECK_FALSE(r0.closing());
  r0.send(keyed(message_type::set, "k", "12"));  // overwriting frees the old value's bytes
  r0.expect(message_type::ok);
  CHECK(state.store_bytes() == 3);
}

TEST_CASE("all_gather completes when the last rank arrives and gives every rank every value in rank order") {
  rendezvous_state state{3, "secret"};
  client r0{state, t0}, r1{state, t0}, r2{state, t0};
  for (auto* c : {&r0, &r1, &r2}) {
    c->send(hello(static_cast<std::uint32_t>(c == &r0 ? 0 : c == &r1 ? 1 : 2)));
    c->received();
  }
  r2.send(collect(0, collect_kind::all_gather, "c"));
  r0.send(collect(0, collect_kind::all_gather, "a"));
  CHECK(r0.received().empty());
  r1.send(collect(0, collect_kind::all_gather, "b"));
  for (auto* c : {&r0, &r1, &r2}) {
    auto parts = c->received();
    REQUIRE(parts.size() == 3);
    for (std::uint32_t r = 0; r < 3; ++r) {
      CHECK(parts[r].type == message_type::part);
      CHECK(parts[r].rank == r);
      CHECK(parts[r].value == std::string(1, static_cast<char>('a' + r)));
    }
  }
  // Then a barrier in round 1.
  r0.send(collect(1, collect_kind::barrier));
  r1.send(collect(1, collect_kind::barrier));
  CHECK(r0.received().empty());
  r2.send(collect(1, collect_kind::barrier));
  for (auto* c : {&r0, &r1, &r2}) CHECK(c->expect(message_type::done).round == 1);
  CHECK(state.completed_rounds() == 2);
}

TEST_CASE("status names the ranks that have not arrived and why") {
  rendezvous_state state{4, "secret"};
  client r0{state, t0}, r1{state, t0}, r2{state, t0};
  r0.send(hello(0, "secret", 4));
  r1.send(hello(1, "secret", 4));
  r2.send(hello(2, "secret", 4));
  r0.received(), r1.received(), r2.received();
  r0.send(collect(0, collect_kind::barrier));
  r1.send(collect(0, collect_kind::barrier));
  message status = make(message_type::status);
  status.round = 0;
  r0.send(status);
  auto reply = r0.expect(message_type::status_reply);
  CHECK(reply.state == round_state::open);
  REQUIRE(reply.missing.size() == 2);
  CHECK(reply.missing[0] == std::pair{std::uint32_t{2}, absence::connected});
  CHECK(reply.missing[1] == std::pair{std::uint32_t{3}, absence::never_connected});
}

TEST_CASE("a rank leaving fails the open collective for everyone with peer_lost, and later ones too") {
  rendezvous_state state{3, "secret"};
  client r0{state, t0}, r1{state, t0}, r2{state, t0};
  r0.send(hello(0));
  r1.send(hello(1));
  r2.send(hello(2));
  r0.received(), r1.received(), r2.received();
  r0.send(collect(0, collect_kind::barrier));
  state.disconnected(r2.id());
  auto lost = r0.expect(message_type::error);
  CHECK(lost.code == static_cast<std::uint32_t>(pdcoll::errc::peer_lost));
  CHECK(lost.text == "rank 2 left the rendezvous before barrier round 0 completed");
  r1.send(collect(0, collect_kind::barrier));
  CHECK(r1.expect(message_type::error).code == static_cast<std::uint32_t>(pdcoll::errc::peer_lost));
}

TEST_CASE("ranks calling different collectives in one round fail with collective_mismatch") {
  rendezvous_state state{2, "secret"};
  client r0{state, t0}, r1{state, t0};
  r0.send(hello(0, "secret", 2));
  r1.send(hello(1, "secret", 2));
  r0.received(), r1.received();
  r0.send(collect(0, collect_kind::barrier));
  r1.send(collect(0, collect_kind::all_gather, "x"));
  auto e0 = r0.expect(message_type::error);
  auto e1 = r1.expect(message_type::error);
  CHECK(e0.code == static_cast<std::uint32_t>(pdcoll::errc::collective_mismatch));
  CHECK(e0.text == "rank 1 called all_gather round 0 but rank 0 called barrier round 0");
  CHECK(e1.text == e0.text);
}

TEST_CASE("a round number out of sequence is a protocol error") {
  rendezvous_state state{2, "secret"};
  client r0{state, t0};
  r0.send(hello(0, "secret", 2));
  r0.received();
  r0.send(collect(5, collect_kind::barrier));
  CHECK(r0.expect(message_type::error).text == "rank 0 sent round 5 but its next round is 0");
}

TEST_CASE("before HELLO a frame longer than any HELLO closes the connection, after it the full limits apply") {
  rendezvous_state state{3, "secret"};
  client stranger{state, t0};
  std::string header(4, '\0');
  header[0] = static_cast<char>(0xa0), header[1] = static_cast<char>(0x86), header[2] = 0x01;  // 100,000 bytes
  stranger.send_bytes(header);
  CHECK(stranger.expect(message_type::error).text.find("frame length 100000") != std::string::npos);
  CHECK(stranger.closing());
  client r0{state, t0};
  r0.send(hello(0));
  r0.expect(message_type::welcome);
  r0.send(keyed(message_type::set, "big", std::string(60000, 'v')));
  r0.expect(message_type::ok);
}

TEST_CASE("a client that does not read its replies has its further requests wait until it does") {
  server_options options;
  options.max_backlog_bytes = 200;
  rendezvous_state state{4, "secret", options};
  client r0 = welcomed(state, 0, "secret", 4);
  message status = make(message_type::status);
  std::string requests;
  for (int i = 0; i < 50; ++i) requests += encode(status);
  r0.send_bytes(requests);  // 50 STATUS at once, none of the replies read
  CHECK(state.backlog(r0.id()) > 200);  // parsing stopped once the replies passed the limit
  auto first = r0.received();
  REQUIRE_FALSE(first.empty());
  const std::size_t one_reply = encode(first.front()).size();
  CHECK(first.size() < 50);
  CHECK(first.size() <= 200 / one_reply + 1);
  std::size_t answered = first.size();
  for (int turn = 0; turn < 100 && answered < 50; ++turn) {
    CHECK(state.backlog(r0.id()) == 0);  // received() took every reply
    state.resume_input(r0.id(), t0);
    CHECK(state.backlog(r0.id()) <= 200 + one_reply);
    answered += r0.received().size();
  }
  CHECK(answered == 50);
  CHECK_FALSE(r0.closing());
}

TEST_CASE("connections beyond world_size plus the allowance are closed at once") {
  server_options options;
  options.max_extra_connections = 1;
  rendezvous_state state{1, "secret", options};
  client a{state, t0}, b{state, t0}, c{state, t0};
  CHECK_FALSE(a.closing());
  CHECK_FALSE(b.closing());
  CHECK(c.closing());
  CHECK(state.should_drop(c.id(), t0));
}
