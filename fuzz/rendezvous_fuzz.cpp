// libFuzzer target over the rendezvous store's wire parser and server state
// machine (bootstrap/wire.hpp, bootstrap/rendezvous_state.hpp).
//
// The input is a script of operations on up to 8 simulated connections to a
// store for 3 ranks with token "fuzz-token" (fuzz/make_rendezvous_corpus.py
// writes valid scripts as seeds):
//   0 open a connection        1 k len_lo len_hi bytes…: feed bytes to connection k
//   2 k: connection k closes   3 t: advance the clock t × 50 ms and tick
//   4 k n: send n × 16 bytes of k's output   5: send everything
// Checked after every step: everything the server sends parses as valid
// server messages, state stays within its limits, and a closing connection
// drains. Crashes, leaks and UB are the sanitizers' job.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "pdcoll/bootstrap/rendezvous_state.hpp"
#include "pdcoll/bootstrap/wire.hpp"

namespace {

using pdcoll::bootstrap::frame_reader;
using pdcoll::bootstrap::message;
using pdcoll::bootstrap::rendezvous_state;

void require(bool condition) {
  if (!condition) __builtin_trap();
}

pdcoll::bootstrap::server_options small_options() {
  pdcoll::bootstrap::server_options options;
  options.wire.max_value = 4096;
  options.wire.max_frame = 8192;
  options.max_store_bytes = 16384;
  options.max_gather_bytes = 8192;
  options.max_extra_connections = 4;
  options.hello_timeout = std::chrono::milliseconds{1000};
  options.flush_timeout = std::chrono::milliseconds{500};
  return options;
}

/// What a client sees of one connection: the server's bytes, parsed.
struct client_view {
  frame_reader reader;
  bool ended = false;  // the server sent an ERROR that closes
};

void deliver(rendezvous_state& state, std::map<rendezvous_state::connection_id, client_view>& views,
             rendezvous_state::connection_id id, std::size_t budget) {
  while (budget > 0) {
    std::string_view out = state.pending_output(id);
    if (out.empty()) return;
    const std::size_t n = std::min(budget, out.size());
    views[id].reader.feed(out.substr(0, n));
    state.consumed(id, n);
    budget -= n;
    message m;
    std::string why;
    for (;;) {
      auto status = views[id].reader.next(m, why);
      require(status != frame_reader::status::error);  // the server never sends garbage
      if (status == frame_reader::status::need_more) break;
      require(static_cast<std::uint8_t>(m.type) >= 64);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // The parser alone, over the raw input.
  {
    frame_reader reader{small_options().wire};
    reader.feed(std::string_view{reinterpret_cast<const char*>(data), size});
    message m;
    std::string why;
    while (reader.next(m, why) == frame_reader::status::frame) {
      std::string again = pdcoll::bootstrap::encode(m);  // what decodes re-encodes
      require(again.size() >= 5);
    }
  }

  const auto options = small_options();
  rendezvous_state state{3, "fuzz-token", options};
  std::map<rendezvous_state::connection_id, client_view> views;
  std::vector<rendezvous_state::connection_id> ids;
  auto now = std::chrono::steady_clock::time_point{} + std::chrono::hours{1};
  std::size_t at = 0;
  auto next = [&]() -> std::uint8_t { return at < size ? data[at++] : 0; };
  auto pick = [&]() -> rendezvous_state::connection_id {
    const std::uint8_t k = next();
    return ids.empty() ? 0 : ids[k % ids.size()];
  };
  auto reap = [&] {
    for (auto id : state.connections())
      if (state.should_drop(id, now)) {
        state.disconnected(id);
        views.erase(id);
      }
    ids = state.connections();
  };

  while (at < size) {
    switch (next() % 6) {
      case 0:
        if (ids.size() < 8) ids.push_back(state.open(now));
        break;
      case 1: {
        const auto id = pick();
        std::size_t length = next();
        length |= static_cast<std::size_t>(next()) << 8;
        length = std::min(length, size - at);
        state.receive(id, std::string_view{reinterpret_cast<const char*>(data + at), length}, now);
        at += length;
        break;
      }
      case 2: {
        const auto id = pick();
        state.disconnected(id);
        views.erase(id);
        break;
      }
      case 3:
        now += std::chrono::milliseconds{50} * next();
        state.tick(now);
        break;
      case 4: {
        const auto id = pick();
        deliver(state, views, id, 16u * next());
        break;
      }
      case 5:
        for (auto id : state.connections()) deliver(state, views, id, ~std::size_t{0});
        break;
    }
    reap();
    require(state.store_bytes() <= options.max_store_bytes);
    require(state.joined() <= 3);
    require(state.connections().size() <= 3 + options.max_extra_connections + 1);
  }
  for (auto id : state.connections()) deliver(state, views, id, ~std::size_t{0});
  // With all output delivered, every closing connection is ready to drop.
  for (auto id : state.connections())
    if (state.closing(id)) require(state.should_drop(id, now));
  return 0;
}
