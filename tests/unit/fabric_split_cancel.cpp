// A message longer than the provider's largest goes as chunks; once a chunk
// has moved, the peer's receive has matched it and waits for the rest, so a
// cancel of either side is too late: both complete normally and whole, as
// fi_cancel leaves a matched operation. A cancel that reaches the first
// chunk while it is still queued wins, and no byte of the message arrives.
#include <doctest/doctest.h>

#include "multiproc/fork_harness.hpp"
#include "pdcoll/transport/libfabric/endpoint.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <system_error>
#include <vector>

namespace {

namespace transport = pdcoll::transport;
using pdcoll::test::drive_until;
using pdcoll::test::recorded_op;

constexpr std::size_t message_bytes = 100000;  // 25 chunks of 4096 bytes

transport::libfabric::options chunked(const char* provider) {
  transport::libfabric::options opts;
  opts.provider = provider;
  opts.max_message_size = 4096;
  opts.rendezvous_threshold = 0;  // every byte as tagged messages
  return opts;
}

/// Sends `message_bytes` to self, cancels the send (`cancel_send`) or the
/// receive after `turns` progress() calls, and checks that the pair ends
/// consistently: whole on both sides, or (the first chunk's cancel won) the
/// send cancelled with nothing received, in which case the next message on
/// the tag reaches the receive.
void cancel_after(const char* provider, int turns, bool cancel_send) {
  CAPTURE(provider);
  CAPTURE(turns);
  CAPTURE(cancel_send);
  auto self = [](std::string_view s) { return std::vector<std::string>{std::string(s)}; };
  transport::libfabric::fabric_endpoint ep(0, 1, self, chunked(provider));
  std::vector<unsigned char> out(message_bytes), in(2 * message_bytes, 0);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<unsigned char>(i * 7 + 1);
  recorded_op send, receive;
  REQUIRE_FALSE(ep.post_recv(0, in.data(), in.size(), 5, 0, nullptr, &receive));
  REQUIRE_FALSE(ep.post_send(0, out.data(), out.size(), 5, nullptr, &send));
  for (int i = 0; i < turns; ++i) ep.progress();
  ep.cancel(cancel_send ? static_cast<transport::completion_context*>(&send) : &receive);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  REQUIRE(drive_until(
      ep, [&] { return (receive.done() && (send.done() || receive.result.error)) || (send.done() && send.result.error); },
      deadline));
  auto whole = [&](const recorded_op& r, const std::vector<unsigned char>& into) {
    CHECK_FALSE(r.result.error);
    CHECK(r.result.bytes == message_bytes);
    CHECK(std::equal(out.begin(), out.end(), into.begin()));
  };
  if (receive.done() && receive.result.error) {
    // The receive's cancel won before any chunk matched it: the message
    // stays whole for the next receive.
    CHECK_FALSE(cancel_send);
    CHECK(receive.result.error == std::errc::operation_canceled);
    std::vector<unsigned char> again(2 * message_bytes, 0);
    recorded_op receive_again;
    REQUIRE_FALSE(ep.post_recv(0, again.data(), again.size(), 5, 0, nullptr, &receive_again));
    REQUIRE(drive_until(ep, [&] { return send.done() && receive_again.done(); }, deadline));
    CHECK_FALSE(send.result.error);
    whole(receive_again, again);
  } else if (receive.done()) {
    // The message moved: whole on both sides, neither cancelled nor cut.
    REQUIRE(drive_until(ep, [&] { return send.done(); }, deadline));
    CHECK_FALSE(send.result.error);
    whole(receive, in);
  } else {
    // The send's cancel won before its first chunk left: nothing of it
    // arrives, and the receive is still open for the next message.
    CHECK(cancel_send);
    CHECK(send.result.error == std::errc::operation_canceled);
    const unsigned char next[10] = {9, 9, 9, 9, 9, 9, 9, 9, 9, 9};
    recorded_op send_next;
    REQUIRE_FALSE(ep.post_send(0, next, sizeof next, 5, nullptr, &send_next));
    REQUIRE(drive_until(ep, [&] { return receive.done() && send_next.done(); }, deadline));
    CHECK_FALSE(receive.result.error);
    CHECK(receive.result.bytes == sizeof next);
  }
  CHECK(receive.completions == 1);
  CHECK(send.completions == 1);
}

}  // namespace

TEST_CASE("libfabric: a chunked message whose send or receive is cancelled after a chunk moved completes whole") {
  for (const char* provider : {"tcp", "shm"}) {
    for (int turns : {0, 1, 3, 6, 12}) {
      cancel_after(provider, turns, true);
      cancel_after(provider, turns, false);
    }
  }
}
