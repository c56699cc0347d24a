// Tests of the uring_tcp transport with every rank in this process: setup
// runs on one thread per rank, then one thread drives all endpoints.
#include <algorithm>
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <deque>
#include <thread>

#include "pdcoll/job.hpp"
#include "unit/uring_support.hpp"

using namespace uring_test;
using pdcoll::errc;
using pdcoll::transport::any_peer;
using pdcoll::transport::data_path;
using pdcoll::transport::memory_kind;
namespace uring = pdcoll::transport::uring_tcp;

namespace {
const std::error_code canceled = std::make_error_code(std::errc::operation_canceled);
}

TEST_CASE("a one-rank uring_tcp world delivers sends to itself, 0 bytes included") {
  auto world = make_world(1);
  auto& ep = *world[0];
  CHECK(ep.rank() == 0);
  CHECK(ep.world_size() == 1);
  CHECK(ep.name() == "uring_tcp");

  recorder send_empty, recv_empty, send_data, recv_data;
  auto data = pattern(1000, 1);
  std::vector<unsigned char> into(1000);
  REQUIRE_FALSE(ep.post_send(0, nullptr, 0, 7, nullptr, &send_empty));
  REQUIRE_FALSE(ep.post_recv(0, into.data(), into.size(), 9, 0, nullptr, &recv_data));
  REQUIRE_FALSE(ep.post_send(0, data.data(), data.size(), 9, nullptr, &send_data));
  REQUIRE_FALSE(ep.post_recv(any_peer, nullptr, 0, 7, 0, nullptr, &recv_empty));
  CHECK_FALSE(send_empty.done());  // completions come from progress(), never from post_*
  REQUIRE(drive({&ep}, [&] { return recv_empty.done() && recv_data.done() && send_data.done() && send_empty.done(); }));
  CHECK_FALSE(recv_empty.result->error);
  CHECK(recv_empty.result->bytes == 0);
  CHECK(recv_empty.result->peer == 0);
  CHECK_FALSE(recv_data.result->error);
  CHECK(recv_data.result->bytes == 1000);
  CHECK(into == data);
  CHECK(send_data.calls == 1);
}

TEST_CASE("with no bind address an endpoint listens on every interface and still connects") {
  auto world = make_world(2, {.token = "t"});
  int value = 8, got = 0;
  recorder s, r;
  REQUIRE_FALSE(world[1]->post_recv(0, &got, 4, 0, 0, nullptr, &r));
  REQUIRE_FALSE(world[0]->post_send(1, &value, 4, 0, nullptr, &s));
  REQUIRE(drive(raw(world), [&] { return r.done() && s.done(); }));
  CHECK(got == 8);
}

TEST_CASE("uring_tcp rejects bad arguments before posting anything") {
  auto world = make_world(2);
  auto& ep = *world[0];
  recorder r;
  char byte = 0;
  CHECK(ep.post_send(2, &byte, 1, 0, nullptr, &r) == errc::root_out_of_range);
  CHECK(ep.post_send(any_peer, &byte, 1, 0, nullptr, &r) == errc::root_out_of_range);
  CHECK(ep.post_recv(-2, &byte, 1, 0, 0, nullptr, &r) == errc::root_out_of_range);
  CHECK(ep.post_send(1, nullptr, 1, 0, nullptr, &r) == errc::null_buffer);
  CHECK(ep.post_recv(1, &byte, 1, 0, 0, nullptr, nullptr) == errc::invalid_argument);
  pdcoll::transport::completion_context no_callback;
  CHECK(ep.post_send(1, &byte, 1, 0, nullptr, &no_callback) == errc::invalid_argument);
  for (int i = 0; i < 5; ++i) ep.progress();
  CHECK(r.calls == 0);
}

TEST_CASE("uring_tcp reports host-staged paths and needs no registration") {
  auto world = make_world(1);
  auto& ep = *world[0];
  CHECK(ep.path_for(memory_kind::host) == data_path::host);
  CHECK(ep.path_for(memory_kind::emulated_device) == data_path::host_staged);
  CHECK(ep.path_for(memory_kind::gaudi) == data_path::host_staged);
  CHECK_FALSE(ep.needs_registration(memory_kind::host));
  pdcoll::transport::registration_handle handle{reinterpret_cast<void*>(1), 5, nullptr};
  CHECK_FALSE(ep.register_region({}, handle));
  CHECK(handle.descriptor == nullptr);
  ep.deregister(handle);
}

TEST_CASE("two uring_tcp ranks exchange messages from 0 bytes to 4 MiB with data intact") {
  // Both ways at once, over one connection per pair and over one per
  // direction, receiving with multishot recvs or one recv at a time.
  bool directional = false;
  bool multishot = true;
  SUBCASE("one connection per pair") { directional = false; }
  SUBCASE("one connection per direction") { directional = true; }
  SUBCASE("one connection per pair, one recv at a time") { multishot = false; }
  SUBCASE("one connection per direction, one recv at a time") {
    directional = true;
    multishot = false;
  }
  CAPTURE(directional);
  CAPTURE(multishot);
  auto world = make_world(
      2, {.bind_address = "127.0.0.1", .directional_connections = directional, .receiving = receiving(multishot)});
  auto eps = raw(world);
  if (!multishot) CHECK_FALSE(as_tcp(*eps[0]).multishot_receive_enabled());
  CHECK(eps[0]->name() == (directional ? "uring_tcp:directional" : "uring_tcp"));
  for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{4095},
                           std::size_t{16384}, std::size_t{65536}, std::size_t{65537}, std::size_t{1} << 20,
                           std::size_t{4} << 20}) {
    CAPTURE(size);
    auto there = pattern(size, 3);
    auto back = pattern(size, 4);
    std::vector<unsigned char> at1(size), at0(size);
    recorder s0, r1, s1, r0;
    REQUIRE_FALSE(eps[1]->post_recv(0, at1.data(), size, 100, 0, nullptr, &r1));
    REQUIRE_FALSE(eps[0]->post_send(1, there.data(), size, 100, nullptr, &s0));
    REQUIRE_FALSE(eps[0]->post_recv(1, at0.data(), size, 101, 0, nullptr, &r0));
    REQUIRE_FALSE(eps[1]->post_send(0, back.data(), size, 101, nullptr, &s1));
    REQUIRE(drive(eps, [&] { return s0.done() && r1.done() && s1.done() && r0.done(); }));
    CHECK_FALSE(r1.result->error);
    CHECK_FALSE(r0.result->error);
    CHECK(r1.result->bytes == size);
    CHECK(r1.result->tag == 100);
    CHECK(r1.result->peer == 0);
    CHECK(s0.result->bytes == size);
    CHECK(at1 == there);
    CHECK(at0 == back);
    CHECK(s0.calls + r1.calls + s1.calls + r0.calls == 4);
  }
}

TEST_CASE("zero-copy sends deliver intact data and complete only after the kernel lets go of the buffer") {
  auto world = make_world(2, {.bind_address = "127.0.0.1", .zero_copy_threshold = 4096});
  auto eps = raw(world);
  for (std::size_t size : {std::size_t{0}, std::size_t{100}, std::size_t{4096}, std::size_t{1} << 20,
                           std::size_t{16} << 20}) {
    CAPTURE(size);
    auto data = pattern(size, 12);
    std::vector<unsigned char> into(size);
    recorder s, small_s, r, small_r;
    int small = 6, got_small = 0;
    REQUIRE_FALSE(eps[0]->post_send(1, data.data(), size, 1, nullptr, &s));
    REQUIRE_FALSE(eps[0]->post_send(1, &small, 4, 2, nullptr, &small_s));
    REQUIRE_FALSE(eps[1]->post_recv(0, into.data(), size, 1, 0, nullptr, &r));
    REQUIRE_FALSE(eps[1]->post_recv(0, &got_small, 4, 2, 0, nullptr, &small_r));
    REQUIRE(drive(eps, [&] { return s.done() && r.done() && small_s.done() && small_r.done(); }));
    // Overwriting the source after completion must not change what arrived.
    std::fill(data.begin(), data.end(), 0);
    CHECK_FALSE(r.result->error);
    CHECK(into == pattern(size, 12));
    CHECK(got_small == 6);
    CHECK(s.calls == 1);
  }
  auto& tcp = as_tcp(*eps[0]);
  if (tcp.zero_copy_supported()) {
    CHECK(tcp.zero_copy_enabled());
    CHECK(tcp.stats().zero_copy_submissions >= 3);
  } else {
    CHECK(tcp.stats().zero_copy_submissions == 0);
  }
}

TEST_CASE("a zero-copy send to a peer that stopped reading ends at close(), not never") {
  // shutdown(2) keeps the send queue, and a live peer answers zero-window
  // probes: the kernel held the pages, the notification never came and the
  // destructor gave up with the callback uncalled.
  uring::options opts{.bind_address = "127.0.0.1"};
  opts.zero_copy_threshold = 1;
  auto world = make_world(2, opts);
  auto eps = raw(world);
  const std::size_t size = std::size_t{32} << 20;  // more than both sockets' buffers hold
  auto data = pattern(size, 1);
  recorder send;
  REQUIRE_FALSE(eps[0]->post_send(1, data.data(), size, 5, nullptr, &send));
  drive({eps[0]}, [&] { return send.done(); }, std::chrono::milliseconds(300));  // rank 1 never reads
  REQUIRE_FALSE(send.done());
  eps[0]->close();
  REQUIRE(drive({eps[0]}, [&] { return send.done(); }, std::chrono::seconds(20)));
  CHECK(send.calls == 1);
  CHECK(send.result->error);
}

TEST_CASE("a post from a callback the destructor runs is refused, not freed unrun") {
  struct chained : completion_context {
    endpoint* ep = nullptr;
    recorder* next = nullptr;
    std::error_code post_result;
    char byte = 0;
  };
  auto world = make_world(2);
  recorder second;
  chained first;
  first.ep = world[0].get();
  first.next = &second;
  first.on_complete = [](completion_context* self, const completion&) noexcept {
    auto* c = static_cast<chained*>(self);
    c->post_result = c->ep->post_recv(c->ep->rank(), &c->byte, 1, 77, 0, nullptr, c->next);
  };
  int x = 0;
  REQUIRE_FALSE(world[0]->post_recv(1, &x, sizeof x, 1, 0, nullptr, &first));
  world[0].reset();  // ends `first`, whose callback posts again
  CHECK(first.post_result == errc::aborted);
  CHECK(second.calls == 0);
}

TEST_CASE("a staging buffer over 1 GiB is refused: io_uring's receive lengths are 32-bit") {
  uring::options opts{.bind_address = "127.0.0.1"};
  opts.staging_bytes = std::size_t{4} << 30;  // was cut to 0: every receive read as the peer's orderly close
  try {
    auto world = make_world(1, opts);
    FAIL("a 4 GiB staging buffer was accepted");
  } catch (const std::system_error& e) {
    CHECK(e.code() == errc::invalid_argument);
  }
}

TEST_CASE("a large payload with its receive posted first lands in the user's buffer without staging") {
  bool multishot = true;
  SUBCASE("multishot recv") { multishot = true; }
  SUBCASE("one recv at a time") { multishot = false; }
  auto world = make_world(2, {.bind_address = "127.0.0.1", .receiving = receiving(multishot)});
  auto eps = raw(world);
  const std::size_t size = 8 << 20;
  auto data = pattern(size, 5);
  std::vector<unsigned char> into(size);
  recorder s, r;
  REQUIRE_FALSE(eps[1]->post_recv(0, into.data(), size, 1, 0, nullptr, &r));
  REQUIRE(drive(eps, [] { return true; }));
  REQUIRE_FALSE(eps[0]->post_send(1, data.data(), size, 1, nullptr, &s));
  REQUIRE(drive(eps, [&] { return s.done() && r.done(); }));
  CHECK(into == data);
  auto& st = as_tcp(*eps[1]).stats();
  CHECK(st.unexpected_messages == 0);
  CHECK(st.unexpected_bytes_copied == 0);
  // Only what shared a recv with the header went through the 64 KiB staging
  // buffer (or the four 16 KiB provided buffers a multishot recv fills
  // before its cancel lands), plus at most a tail under the in-place
  // threshold (a quarter of it) where an in-place recv returned short of
  // the end.
  CHECK(st.bytes_staged < 64 * 1024 + 16 * 1024);
  CHECK(st.bytes_received_in_place + st.bytes_staged == size);
}

TEST_CASE("hundreds of outstanding messages per peer arrive in order, expected or unexpected") {
  bool multishot = true;
  SUBCASE("multishot recv") { multishot = true; }
  SUBCASE("one recv at a time") { multishot = false; }
  auto world = make_world(2, {.bind_address = "127.0.0.1", .receiving = receiving(multishot)});
  auto eps = raw(world);
  constexpr int count = 600;
  std::deque<recorder> sends(count), recvs(count);
  std::vector<std::vector<unsigned char>> out(count), in(count);
  for (int i = 0; i < count; ++i) {
    out[i] = pattern(static_cast<std::size_t>(i * 37 % 3000), static_cast<unsigned>(i));
    in[i].resize(3000);
  }
  // The first half is sent before its receives exist (unexpected path); the
  // second half finds its receives posted. All share one tag: order decides.
  for (int i = 0; i < count / 2; ++i) {
    REQUIRE_FALSE(eps[0]->post_send(1, out[i].data(), out[i].size(), 42, nullptr, &sends[i]));
  }
  REQUIRE(drive(eps, [&] { return as_tcp(*eps[1]).stats().messages_received == count / 2; }));
  for (int i = 0; i < count; ++i) {
    REQUIRE_FALSE(eps[1]->post_recv(0, in[i].data(), in[i].size(), 42, 0, nullptr, &recvs[i]));
  }
  for (int i = count / 2; i < count; ++i) {
    REQUIRE_FALSE(eps[0]->post_send(1, out[i].data(), out[i].size(), 42, nullptr, &sends[i]));
  }
  REQUIRE(drive(eps, [&] {
    for (auto& r : recvs) if (!r.done()) return false;
    for (auto& s : sends) if (!s.done()) return false;
    return true;
  }));
  for (int i = 0; i < count; ++i) {
    CAPTURE(i);
    REQUIRE_FALSE(recvs[i].result->error);
    REQUIRE(recvs[i].result->bytes == out[i].size());
    CHECK(std::equal(out[i].begin(), out[i].end(), in[i].begin()));
    CHECK(recvs[i].calls == 1);
    CHECK(sends[i].calls == 1);
  }
  auto& st = as_tcp(*eps[0]).stats();
  CHECK(st.send_submissions < st.messages_sent);  // small messages were coalesced
}

TEST_CASE("a multishot recv stays armed from message to message; one recv at a time is posted per arrival") {
  // Ping-pong of small messages: each arrives alone, so one recv at a time
  // needs a recv per message, while a multishot recv is armed once.
  for (bool multishot : {true, false}) {
    CAPTURE(multishot);
    auto world = make_world(2, {.bind_address = "127.0.0.1", .receiving = receiving(multishot)});
    auto eps = raw(world);
    auto& receiver = as_tcp(*eps[1]);
    constexpr int rounds = 300;
    for (int i = 0; i < rounds; ++i) {
      std::uint64_t out = 1000 + static_cast<std::uint64_t>(i), in = 0, echo = 0;
      recorder s, r, s_back, r_back;
      REQUIRE_FALSE(eps[1]->post_recv(0, &in, sizeof in, 7, 0, nullptr, &r));
      REQUIRE_FALSE(eps[0]->post_recv(1, &echo, sizeof echo, 8, 0, nullptr, &r_back));
      REQUIRE_FALSE(eps[0]->post_send(1, &out, sizeof out, 7, nullptr, &s));
      REQUIRE(drive(eps, [&] { return r.done() && s.done(); }));
      REQUIRE_FALSE(eps[1]->post_send(0, &in, sizeof in, 8, nullptr, &s_back));
      REQUIRE(drive(eps, [&] { return r_back.done() && s_back.done(); }));
      REQUIRE_FALSE(r.result->error);
      REQUIRE_FALSE(r_back.result->error);
      REQUIRE(echo == out);
    }
    const auto& st = receiver.stats();
    CHECK(st.messages_received == rounds);
    if (multishot && receiver.multishot_receive_enabled()) {
      CHECK(st.provided_buffer_bytes == rounds * (16 + sizeof(std::uint64_t)));
      CHECK(st.recv_submissions < rounds / 10);
    } else {
      CHECK_FALSE(receiver.multishot_receive_enabled());
      CHECK(st.provided_buffer_bytes == 0);
      CHECK(st.recv_submissions >= rounds);
    }
  }
}

TEST_CASE("by default connections receive with a multishot recv only where ranks outnumber the host's CPUs") {
  const bool supported =
      as_tcp(*make_world(2, {.bind_address = "127.0.0.1", .receiving = uring::receive_mode::multishot})[0])
          .multishot_receive_enabled();
  const unsigned cpus = std::thread::hardware_concurrency();
  for (int ranks : {2, 3, 5}) {
    CAPTURE(ranks);
    auto world = make_world(ranks);  // all on loopback: every peer is on this host
    for (auto* ep : raw(world)) CHECK(as_tcp(*ep).multishot_receive_enabled() == (supported && unsigned(ranks) > cpus));
  }
  auto single = make_world(3, {.bind_address = "127.0.0.1", .receiving = uring::receive_mode::single});
  CHECK_FALSE(as_tcp(*single[0]).multishot_receive_enabled());
  CHECK(pdcoll::job_options::uring_receive_mode("1") == uring::receive_mode::multishot);
  CHECK(pdcoll::job_options::uring_receive_mode("0") == uring::receive_mode::single);
  CHECK(pdcoll::job_options::uring_receive_mode("auto") == uring::receive_mode::automatic);
}

TEST_CASE("a header cut by the end of a receive buffer is put together from two completions") {
  // Two messages in one sendmsg: 16 + 65,512 bytes, then a header at bytes
  // 65,528-65,543, across the 64 KiB mark where a full provided or staging
  // buffer ends, and 8 payload bytes.
  for (bool multishot : {true, false}) {
    CAPTURE(multishot);
    auto world = make_world(2, {.bind_address = "127.0.0.1", .receiving = receiving(multishot)});
    auto eps = raw(world);
    for (bool posted_first : {true, false}) {
      CAPTURE(posted_first);
      auto first = pattern(65512, posted_first ? 21 : 22);
      std::uint64_t second = posted_first ? 0x1122334455667788u : 0x8877665544332211u, got_second = 0;
      std::vector<unsigned char> got_first(first.size());
      recorder s1, s2, r1, r2;
      auto post_receives = [&] {
        REQUIRE_FALSE(eps[1]->post_recv(0, got_first.data(), got_first.size(), 31, 0, nullptr, &r1));
        REQUIRE_FALSE(eps[1]->post_recv(0, &got_second, sizeof got_second, 32, 0, nullptr, &r2));
      };
      if (posted_first) post_receives();
      REQUIRE_FALSE(eps[0]->post_send(1, first.data(), first.size(), 31, nullptr, &s1));
      REQUIRE_FALSE(eps[0]->post_send(1, &second, sizeof second, 32, nullptr, &s2));
      if (!posted_first) {
        REQUIRE(drive(eps, [&] { return s1.done() && s2.done() && as_tcp(*eps[1]).stats().messages_received >= 2; }));
        post_receives();
      }
      REQUIRE(drive(eps, [&] { return s1.done() && s2.done() && r1.done() && r2.done(); }));
      REQUIRE_FALSE(r1.result->error);
      REQUIRE_FALSE(r2.result->error);
      CHECK(got_first == first);
      CHECK(got_second == second);
    }
  }
}

TEST_CASE("receives match by tag regardless of arrival order, and report the sender's tag") {
  auto world = make_world(2);
  auto eps = raw(world);
  std::array<std::uint64_t, 3> values{11, 22, 33};
  std::array<std::uint64_t, 3> got{};
  std::array<recorder, 3> sends, recvs;
  for (int i = 0; i < 3; ++i) {
    REQUIRE_FALSE(eps[0]->post_send(1, &values[i], 8, 1000 + i, nullptr, &sends[i]));
  }
  // Posted in reverse order; the third receive is posted before the messages arrive.
  REQUIRE_FALSE(eps[1]->post_recv(0, &got[2], 8, 1002, 0, nullptr, &recvs[2]));
  REQUIRE(drive(eps, [&] { return recvs[2].done(); }));
  REQUIRE_FALSE(eps[1]->post_recv(0, &got[1], 8, 1001, 0, nullptr, &recvs[1]));
  REQUIRE_FALSE(eps[1]->post_recv(0, &got[0], 8, 1000, 0, nullptr, &recvs[0]));
  REQUIRE(drive(eps, [&] { return recvs[0].done() && recvs[1].done(); }));
  for (int i = 0; i < 3; ++i) {
    CHECK(got[i] == values[i]);
    CHECK(recvs[i].result->tag == 1000u + i);
  }
}

TEST_CASE("an ignore mask matches any value in the ignored bits and reports the full tag") {
  auto world = make_world(2);
  auto eps = raw(world);
  const std::uint64_t base = 0xabcd'0000'0000'0000;
  std::uint32_t a = 1, b = 2, got_a = 0, got_b = 0, got_c = 0;
  recorder sa, sb, ra, rb, rc;
  REQUIRE_FALSE(eps[0]->post_send(1, &a, 4, base | 0x1234, nullptr, &sa));
  REQUIRE_FALSE(eps[0]->post_send(1, &b, 4, (base + (1ull << 48)) | 0x5678, nullptr, &sb));
  // Ignores the low 32 bits: matches the first message only (the second differs above them).
  REQUIRE_FALSE(eps[1]->post_recv(0, &got_a, 4, base, 0xffff'ffff, nullptr, &ra));
  REQUIRE_FALSE(eps[1]->post_recv(0, &got_c, 4, base, 0xffff'ffff, nullptr, &rc));
  REQUIRE_FALSE(eps[1]->post_recv(0, &got_b, 4, 0, ~0ull, nullptr, &rb));
  REQUIRE(drive(eps, [&] { return ra.done() && rb.done(); }));
  CHECK(got_a == 1);
  CHECK(ra.result->tag == (base | 0x1234));
  CHECK(got_b == 2);
  CHECK(rb.result->tag == ((base + (1ull << 48)) | 0x5678));
  for (int i = 0; i < 20; ++i) eps[1]->progress();
  CHECK_FALSE(rc.done());
  eps[1]->cancel(&rc);
  REQUIRE(drive(eps, [&] { return rc.done(); }));
  CHECK(rc.result->error == canceled);
}

TEST_CASE("any_peer receives take messages from every rank and name the sender") {
  auto world = make_world(3);
  auto eps = raw(world);
  int from1 = 1, from2 = 2;
  std::array<int, 2> got{};
  recorder s1, s2, r0, r1;
  REQUIRE_FALSE(eps[0]->post_recv(any_peer, &got[0], 4, 5, 0, nullptr, &r0));
  REQUIRE_FALSE(eps[0]->post_recv(any_peer, &got[1], 4, 5, 0, nullptr, &r1));
  REQUIRE_FALSE(eps[1]->post_send(0, &from1, 4, 5, nullptr, &s1));
  REQUIRE_FALSE(eps[2]->post_send(0, &from2, 4, 5, nullptr, &s2));
  REQUIRE(drive(eps, [&] { return r0.done() && r1.done() && s1.done() && s2.done(); }));
  CHECK(got[0] == r0.result->peer);
  CHECK(got[1] == r1.result->peer);
  CHECK(r0.result->peer != r1.result->peer);
}

TEST_CASE("a receive posted earlier wins over a later one, whether per-peer or any_peer") {
  auto world = make_world(2);
  auto eps = raw(world);
  int value = 9, first = 0, second = 0;
  recorder s, r_any, r_peer;
  REQUIRE_FALSE(eps[1]->post_recv(any_peer, &first, 4, 3, 0, nullptr, &r_any));
  REQUIRE_FALSE(eps[1]->post_recv(0, &second, 4, 3, 0, nullptr, &r_peer));
  REQUIRE_FALSE(eps[0]->post_send(1, &value, 4, 3, nullptr, &s));
  REQUIRE(drive(eps, [&] { return r_any.done(); }));
  CHECK(first == 9);
  CHECK(r_any.result->peer == 0);
  CHECK_FALSE(r_peer.done());
  eps[1]->cancel(&r_peer);
  REQUIRE(drive(eps, [&] { return r_peer.done(); }));
  CHECK(r_peer.result->error == canceled);
  CHECK(r_peer.calls == 1);
}

TEST_CASE("a message longer than its receive completes the receive with collective_mismatch") {
  auto world = make_world(2);
  auto eps = raw(world);
  auto big = pattern(100000, 8);
  std::vector<unsigned char> small(10);
  int after = 77, got_after = 0;
  recorder s_posted, r_posted, s_unexpected, r_unexpected, s_after, r_after;
  // Receive posted first: truncation seen at the header.
  REQUIRE_FALSE(eps[1]->post_recv(0, small.data(), small.size(), 1, 0, nullptr, &r_posted));
  REQUIRE_FALSE(eps[0]->post_send(1, big.data(), big.size(), 1, nullptr, &s_posted));
  // Unexpected message, receive posted later.
  REQUIRE_FALSE(eps[0]->post_send(1, big.data(), big.size(), 2, nullptr, &s_unexpected));
  REQUIRE_FALSE(eps[0]->post_send(1, &after, 4, 3, nullptr, &s_after));
  REQUIRE(drive(eps, [&] { return r_posted.done() && as_tcp(*eps[1]).stats().messages_received == 3; }));
  REQUIRE_FALSE(eps[1]->post_recv(0, small.data(), small.size(), 2, 0, nullptr, &r_unexpected));
  REQUIRE_FALSE(eps[1]->post_recv(0, &got_after, 4, 3, 0, nullptr, &r_after));
  REQUIRE(drive(eps, [&] { return r_unexpected.done() && r_after.done() && s_after.done(); }));
  CHECK(r_posted.result->error == errc::collective_mismatch);
  CHECK(r_unexpected.result->error == errc::collective_mismatch);
  // The stream stays in step after a discarded payload.
  CHECK_FALSE(r_after.result->error);
  CHECK(got_after == 77);
  CHECK_FALSE(s_posted.result->error);
}

TEST_CASE("a receive whose peer never sends is cancelled at its deadline and completes once") {
  auto world = make_world(2);
  auto eps = raw(world);
  int never = 0;
  recorder r;
  REQUIRE_FALSE(eps[1]->post_recv(0, &never, 4, 66, 0, nullptr, &r));
  auto start = clock_type::now();
  CHECK_FALSE(drive(eps, [&] { return r.done(); }, std::chrono::milliseconds(200)));
  eps[1]->cancel(&r);
  eps[1]->cancel(&r);  // a second request changes nothing
  REQUIRE(drive(eps, [&] { return r.done(); }));
  CHECK(clock_type::now() - start >= std::chrono::milliseconds(200));
  CHECK(r.result->error == canceled);
  for (int i = 0; i < 10; ++i) eps[1]->progress();
  CHECK(r.calls == 1);
  // The context can be reused, and the endpoint still works.
  int value = 5;
  recorder s;
  REQUIRE_FALSE(eps[1]->post_recv(0, &never, 4, 66, 0, nullptr, &r));
  REQUIRE_FALSE(eps[0]->post_send(1, &value, 4, 66, nullptr, &s));
  REQUIRE(drive(eps, [&] { return r.calls == 2; }));
  CHECK_FALSE(r.result->error);
  CHECK(never == 5);
}

TEST_CASE("cancelling a receive while its payload streams in place is too late: it completes normally, once, and the next message reaches the next receive") {
  auto world = make_world(2);
  auto eps = raw(world);
  const std::size_t size = 32 << 20;
  auto data = pattern(size, 9);
  std::vector<unsigned char> into(size);
  int tail = 123, got_tail = 0;
  recorder s, r, s_tail, r_tail;
  REQUIRE_FALSE(eps[1]->post_recv(0, into.data(), size, 1, 0, nullptr, &r));
  REQUIRE_FALSE(eps[0]->post_send(1, data.data(), size, 1, nullptr, &s));
  REQUIRE_FALSE(eps[0]->post_send(1, &tail, 4, 2, nullptr, &s_tail));
  REQUIRE_FALSE(eps[1]->post_recv(0, &got_tail, 4, 2, 0, nullptr, &r_tail));
  REQUIRE(drive(eps, [&] { return as_tcp(*eps[1]).stats().bytes_received_in_place > 0 || r.done(); }));
  eps[1]->cancel(&r);
  REQUIRE(drive(eps, [&] { return r.done() && r_tail.done() && s.done() && s_tail.done(); }));
  CHECK(r.calls == 1);
  // Ending it early would drop the message (MPI and libfabric do not cancel
  // a matched receive either); a stopped p2p recv would lose it silently.
  CHECK_FALSE(r.result->error);
  CHECK(r.result->bytes == size);
  CHECK(into == data);
  CHECK_FALSE(r_tail.result->error);
  CHECK(got_tail == 123);
}

TEST_CASE("a receive that claimed a message still arriving and is cancelled passes it to the next one posted") {
  auto world = make_world(2);
  auto eps = raw(world);
  const std::size_t size = 32 << 20;  // arrives over many progress turns
  auto data = pattern(size, 5);
  std::vector<unsigned char> first(size), second(size);
  recorder s, r_first, r_second;
  REQUIRE_FALSE(eps[0]->post_send(1, data.data(), size, 7, nullptr, &s));
  // No receive yet: the message is unexpected, its payload still arriving.
  REQUIRE(drive(eps, [&] { return as_tcp(*eps[1]).stats().unexpected_messages == 1; }));
  REQUIRE(as_tcp(*eps[1]).stats().messages_received == 0);
  REQUIRE_FALSE(eps[1]->post_recv(0, first.data(), size, 7, 0, nullptr, &r_first));  // claims it
  REQUIRE_FALSE(eps[1]->post_recv(0, second.data(), size, 7, 0, nullptr, &r_second));  // waits behind the claim
  eps[1]->cancel(&r_first);
  REQUIRE(drive(eps, [&] { return r_first.done() && r_second.done() && s.done(); }));
  CHECK(r_first.result->error == canceled);
  CHECK_FALSE(r_second.result->error);
  CHECK(r_second.result->bytes == size);
  CHECK(second == data);
}

TEST_CASE("what a peer sent before it went away still reaches receives when a send to it fails first") {
  // One recv at a time into a small staging buffer: the ten messages take
  // several recvs, and each completed receive answers with a send. The peer
  // is gone, so the second answer meets a reset connection while no recv is
  // in flight; the messages still in the socket must arrive all the same.
  const uring::options opts{.bind_address = "127.0.0.1", .staging_bytes = 4096, .receiving = receiving(false)};
  auto world = make_world(2, opts);
  auto eps = raw(world);
  constexpr int messages = 10;
  std::vector<std::vector<unsigned char>> sent;
  std::vector<recorder> sends(messages);
  for (int i = 0; i < messages; ++i) {
    sent.push_back(pattern(1024, static_cast<unsigned>(i)));
    REQUIRE_FALSE(eps[0]->post_send(1, sent.back().data(), 1024, static_cast<std::uint64_t>(i), nullptr, &sends[i]));
  }
  REQUIRE(drive({eps[0]}, [&] { return std::all_of(sends.begin(), sends.end(), [](auto& r) { return r.done(); }); }));
  world[0].reset();
  struct answering : pdcoll::transport::completion_context {
    pdcoll::transport::endpoint* ep = nullptr;
    std::optional<pdcoll::transport::completion> result;
    recorder answer;
    unsigned char byte = 1;
    answering() { on_complete = &done; }
    static void done(pdcoll::transport::completion_context* self, const pdcoll::transport::completion& c) noexcept {
      auto* a = static_cast<answering*>(self);
      a->result = c;
      if (!c.error) (void)a->ep->post_send(0, &a->byte, 1, 99, nullptr, &a->answer);
    }
  };
  std::vector<answering> receives(messages);
  std::vector<std::vector<unsigned char>> got(messages, std::vector<unsigned char>(1024));
  for (int i = 0; i < messages; ++i) {
    receives[i].ep = eps[1];
    REQUIRE_FALSE(eps[1]->post_recv(0, got[i].data(), 1024, static_cast<std::uint64_t>(i), 0, nullptr, &receives[i]));
  }
  REQUIRE(drive({eps[1]}, [&] {
    return std::all_of(receives.begin(), receives.end(), [](auto& r) { return r.result.has_value(); });
  }));
  for (int i = 0; i < messages; ++i) {
    CAPTURE(i);
    CHECK_FALSE(receives[i].result->error);
    CHECK(got[i] == sent[i]);
  }
}

TEST_CASE("cancelling queued and in-flight sends completes each once without corrupting the stream") {
  auto world = make_world(2);
  auto eps = raw(world);
  const std::size_t size = 64 << 20;  // far more than the socket buffers hold
  auto data = pattern(size, 10);
  std::vector<unsigned char> into(size);
  int marker = 1, got_marker = 0;
  recorder big, queued, s_marker, r_big, r_marker;
  REQUIRE_FALSE(eps[0]->post_send(1, data.data(), size, 1, nullptr, &big));
  REQUIRE_FALSE(eps[0]->post_send(1, data.data(), 1000, 2, nullptr, &queued));
  REQUIRE_FALSE(eps[0]->post_send(1, &marker, 4, 3, nullptr, &s_marker));
  for (int i = 0; i < 5; ++i) eps[0]->progress();  // rank 1 does not read yet
  eps[0]->cancel(&queued);
  eps[0]->cancel(&big);  // partly on the wire already: must complete normally
  REQUIRE(drive({eps[0]}, [&] { return queued.done(); }, std::chrono::seconds(5)));
  CHECK(queued.result->error == canceled);
  REQUIRE_FALSE(eps[1]->post_recv(0, into.data(), size, 1, 0, nullptr, &r_big));
  REQUIRE_FALSE(eps[1]->post_recv(0, &got_marker, 4, ~0ull, ~0ull, nullptr, &r_marker));
  REQUIRE(drive(eps, [&] { return big.done() && r_big.done() && r_marker.done() && s_marker.done(); }));
  CHECK_FALSE(big.result->error);
  CHECK(into == data);
  // The next message after the big one is the marker: the cancelled send never reached the wire.
  CHECK(r_marker.result->tag == 3);
  CHECK(got_marker == 1);
  CHECK(big.calls == 1);
  CHECK(queued.calls == 1);
}

TEST_CASE("when a peer's endpoint goes away, pending operations with it complete with peer_lost") {
  auto world = make_world(3);
  auto eps = raw(world);
  int x = 0;
  recorder r_from1, r_any, s_to1;
  std::vector<unsigned char> big(8 << 20);
  REQUIRE_FALSE(eps[0]->post_recv(1, &x, 4, 1, 0, nullptr, &r_from1));
  REQUIRE_FALSE(eps[0]->post_recv(any_peer, &x, 4, 1, 0, nullptr, &r_any));
  REQUIRE_FALSE(eps[0]->post_send(1, big.data(), big.size(), 9, nullptr, &s_to1));
  REQUIRE(drive({eps[0]}, [] { return true; }));
  world[1].reset();
  REQUIRE(drive({eps[0], eps[2]}, [&] { return r_from1.done() && s_to1.done(); }));
  CHECK(r_from1.result->error == errc::peer_lost);
  CHECK(s_to1.result->error == errc::peer_lost);
  CHECK_FALSE(r_any.done());  // rank 2 is still there
  recorder later;
  CHECK(eps[0]->post_send(1, &x, 4, 1, nullptr, &later) == errc::peer_lost);
  CHECK(eps[0]->post_recv(1, &x, 4, 1, 0, nullptr, &later) == errc::peer_lost);
  world[2].reset();
  REQUIRE(drive({eps[0]}, [&] { return r_any.done(); }));
  CHECK(r_any.result->error == errc::peer_lost);
  CHECK(later.calls == 0);
}

TEST_CASE("wait blocks until its deadline when nothing arrives and returns early when a message does") {
  auto world = make_world(2);
  auto eps = raw(world);
  for (int i = 0; i < 3; ++i) eps[0]->progress();
  auto start = clock_type::now();
  eps[0]->wait(start + std::chrono::milliseconds(150));
  auto waited = clock_type::now() - start;
  CHECK(waited >= std::chrono::milliseconds(140));
  CHECK(waited < std::chrono::seconds(2));

  int value = 4, got = 0;
  recorder s, r;
  REQUIRE_FALSE(eps[0]->post_recv(1, &got, 4, 1, 0, nullptr, &r));
  eps[0]->progress();
  std::thread sender([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    (void)eps[1]->post_send(0, &value, 4, 1, nullptr, &s);
    drive({eps[1]}, [&] { return s.done(); }, std::chrono::seconds(5));
  });
  start = clock_type::now();
  bool arrived = drive({eps[0]}, [&] { return r.done(); }, std::chrono::seconds(5));
  sender.join();
  CHECK(arrived);
  CHECK(clock_type::now() - start < std::chrono::seconds(2));
  CHECK(got == 4);
}

namespace {
/// First line of a /proc/sys file ("" when unreadable).
std::string sysctl_line(const char* path) {
  std::string line;
  if (FILE* f = std::fopen(path, "r")) {
    char buffer[256] = {};
    if (std::fgets(buffer, sizeof buffer, f)) line = buffer;
    std::fclose(f);
  }
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
  return line;
}

/// Whether this process may set CUBIC: with CAP_NET_ADMIN (root here) any
/// available one, else only the allowed list. Where it may not, the default
/// keeps the system's choice.
bool may_set_cubic() {
  const std::string allowed = " " + sysctl_line("/proc/sys/net/ipv4/tcp_allowed_congestion_control") + " ";
  return ::geteuid() == 0 || allowed.find(" cubic ") != std::string::npos;
}
}  // namespace

TEST_CASE("loopback connections use CUBIC by default, the system's choice or a named one on request") {
  const std::string system = sysctl_line("/proc/sys/net/ipv4/tcp_congestion_control");
  const std::string available = " " + sysctl_line("/proc/sys/net/ipv4/tcp_available_congestion_control") + " ";
  REQUIRE_FALSE(system.empty());
  // CUBIC is Linux's own default; a kernel without it cannot run this case.
  REQUIRE(available.find(" cubic ") != std::string::npos);
  struct setting {
    std::string option, expected;  // reno is always allowed
  };
  for (const auto& [option, expected] : {setting{"", may_set_cubic() ? "cubic" : system}, setting{"system", system},
                                         setting{"reno", "reno"}}) {
    for (bool directional : {false, true}) {
      CAPTURE(option);
      CAPTURE(directional);
      auto world = make_world(2, {.bind_address = "127.0.0.1",
                                  .directional_connections = directional,
                                  .congestion_control = option});
      // Rank 0 sends on the first mesh's connection, rank 1 on the second's.
      for (int r = 0; r < 2; ++r) {
        auto& ep = static_cast<uring::tcp_endpoint&>(*world[static_cast<std::size_t>(r)]);
        CHECK(ep.congestion_control(1 - r) == expected);
        CHECK(ep.congestion_control(r).empty());
        CHECK(ep.congestion_control(2).empty());
      }
      // Data still flows.
      auto eps = raw(world);
      std::vector<unsigned char> out = pattern(1 << 20, 9), in(1 << 20);
      recorder s, rv;
      REQUIRE_FALSE(eps[1]->post_recv(0, in.data(), in.size(), 7, 0, nullptr, &rv));
      REQUIRE_FALSE(eps[0]->post_send(1, out.data(), out.size(), 7, nullptr, &s));
      REQUIRE(drive(eps, [&] { return s.done() && rv.done(); }));
      CHECK(in == out);
    }
  }
}

TEST_CASE("a congestion control the kernel does not offer fails setup with its errno and the name") {
  std::string message;
  std::error_code error;
  try {
    make_world(2, {.bind_address = "127.0.0.1", .timeout = std::chrono::seconds(5), .congestion_control = "no-such-cc"});
  } catch (const std::system_error& e) {
    error = e.code();
    message = e.what();
  }
  CHECK(error == std::errc::no_such_file_or_directory);
  CHECK(message.find("no-such-cc") != std::string::npos);
}

TEST_CASE("same_host: loopback and a shared address stay on the host, a non-IP socket is not judged") {
  // 127.0.0.1 to 127.0.0.2: different addresses, both loopback.
  uring::detail::file_descriptor server(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(server.valid());
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(0x7f000002);  // 127.0.0.2
  REQUIRE(::bind(server.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  REQUIRE(::listen(server.get(), 1) == 0);
  socklen_t length = sizeof address;
  REQUIRE(::getsockname(server.get(), reinterpret_cast<sockaddr*>(&address), &length) == 0);
  uring::detail::file_descriptor client(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in from{};
  from.sin_family = AF_INET;
  from.sin_addr.s_addr = htonl(0x7f000001);
  REQUIRE(::bind(client.get(), reinterpret_cast<sockaddr*>(&from), sizeof from) == 0);
  REQUIRE(::connect(client.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  uring::detail::file_descriptor accepted(::accept(server.get(), nullptr, nullptr));
  REQUIRE(accepted.valid());
  CHECK(uring::detail::same_host(client.get()));
  CHECK(uring::detail::same_host(accepted.get()));
  // The default sets CUBIC there; "system" leaves the socket as it was.
  const std::string before = uring::detail::congestion_control_of(accepted.get());
  uring::detail::apply_congestion_control(accepted.get(), "system");
  CHECK(uring::detail::congestion_control_of(accepted.get()) == before);
  uring::detail::apply_congestion_control(client.get(), "reno");
  uring::detail::apply_congestion_control(client.get(), "");
  if (may_set_cubic()) CHECK(uring::detail::congestion_control_of(client.get()) == "cubic");
  // Neither a listening socket (no peer) nor a UNIX socket is judged to stay on the host.
  CHECK_FALSE(uring::detail::same_host(server.get()));
  int pair[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0);
  uring::detail::file_descriptor a(pair[0]), b(pair[1]);
  CHECK_FALSE(uring::detail::same_host(a.get()));
}

TEST_CASE("a connection has its congestion control before it exists: preset on the socket, inherited from the listener") {
  // Set on an established connection, a congestion control inherits the
  // pacing that the system's BBR turned on at its init (congestion.hpp):
  // so neither end of a mesh connection may be given it afterwards.
  for (const std::string choice : {"", "reno"}) {
    CAPTURE(choice);
    const std::string expected = choice.empty() ? "cubic" : choice;
    if (expected == "cubic" && !may_set_cubic()) continue;
    const uring::detail::socket_settings settings{0, choice};
    auto listening = uring::detail::make_listener("127.0.0.1", 4, settings);
    CHECK(uring::detail::congestion_control_of(listening.socket.get()) == expected);
    uring::detail::file_descriptor client(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(client.valid());
    uring::detail::prepare_socket(client.get(), settings, true);
    CHECK(uring::detail::congestion_control_of(client.get()) == expected);
    sockaddr_in address{};
    socklen_t length = sizeof address;
    REQUIRE(::getsockname(listening.socket.get(), reinterpret_cast<sockaddr*>(&address), &length) == 0);
    REQUIRE(::connect(client.get(), reinterpret_cast<sockaddr*>(&address), length) == 0);
    pollfd p{listening.socket.get(), POLLIN, 0};
    REQUIRE(::poll(&p, 1, 5000) == 1);
    uring::detail::file_descriptor accepted(::accept(listening.socket.get(), nullptr, nullptr));
    REQUIRE(accepted.valid());
    CHECK(uring::detail::congestion_control_of(accepted.get()) == expected);  // nothing set on it
    // What setup then applies is a no-op on both ends.
    uring::detail::apply_congestion_control(accepted.get(), choice);
    uring::detail::apply_congestion_control(client.get(), choice);
    CHECK(uring::detail::congestion_control_of(accepted.get()) == expected);
    CHECK(uring::detail::congestion_control_of(client.get()) == expected);
  }
  // "system" leaves every socket the kernel's default, and so does the
  // default on a socket that will connect to another host (a congestion
  // control that needs ECN must have it for the SYN).
  const std::string system = uring::detail::system_default_congestion_control();
  CHECK_FALSE(system.empty());
  {
    uring::detail::file_descriptor remote(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(remote.valid());
    uring::detail::prepare_socket(remote.get(), {0, ""}, false);
    CHECK(uring::detail::congestion_control_of(remote.get()) == system);
    sockaddr_in loopback{}, documentation{};
    loopback.sin_family = documentation.sin_family = AF_INET;
    loopback.sin_addr.s_addr = htonl(0x7f000001);       // 127.0.0.1
    documentation.sin_addr.s_addr = htonl(0xc0000201);  // 192.0.2.1 (RFC 5737): no host's
    CHECK(uring::detail::local_address(reinterpret_cast<sockaddr*>(&loopback)));
    CHECK_FALSE(uring::detail::local_address(reinterpret_cast<sockaddr*>(&documentation)));
  }
  auto listening = uring::detail::make_listener("127.0.0.1", 4, {0, "system"});
  CHECK(uring::detail::congestion_control_of(listening.socket.get()) == system);
}

TEST_CASE("a rank with a different job token is refused and setup fails by its deadline") {
  local_exchange exchange(2);
  std::error_code errors[2];
  std::thread ranks[2];
  for (int r = 0; r < 2; ++r) {
    ranks[r] = std::thread([&, r] {
      uring::options opts{.bind_address = "127.0.0.1", .token = r == 0 ? "alpha" : "bravo",
                          .timeout = std::chrono::milliseconds(500)};
      try {
        auto ep = uring::make_endpoint(r, 2, exchange.for_rank(r), opts);
      } catch (const std::system_error& e) {
        errors[r] = e.code();
      }
    });
  }
  for (auto& t : ranks) t.join();
  CHECK(errors[0] == errc::unauthenticated);  // rank 1 closed its handshake
  CHECK(errors[1] == errc::timeout);          // rank 0 never authenticated
}

TEST_CASE("ranks that disagree on directional connections fail setup with a bootstrap error naming it") {
  local_exchange exchange(2);
  std::error_code errors[2];
  std::string messages[2];
  std::thread ranks[2];
  for (int r = 0; r < 2; ++r) {
    ranks[r] = std::thread([&, r] {
      uring::options opts{.bind_address = "127.0.0.1", .token = "job-1", .timeout = std::chrono::seconds(5),
                          .directional_connections = r == 1};
      try {
        auto ep = uring::make_endpoint(r, 2, exchange.for_rank(r), opts);
      } catch (const std::system_error& e) {
        errors[r] = e.code();
        messages[r] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(errors[r] == errc::bootstrap);
    CHECK(messages[r].find("PDCOLL_URING_DIRECTIONAL") != std::string::npos);
  }
}

TEST_CASE("a stranger connecting with garbage is dropped and the mesh still forms") {
  local_exchange exchange(2);
  std::vector<std::unique_ptr<endpoint>> world(2);
  int stranger = -1;
  std::thread ranks[2];
  for (int r = 0; r < 2; ++r) {
    ranks[r] = std::thread([&, r] {
      auto inner = exchange.for_rank(r);
      auto exchange_with_intruder = [&, inner](std::string_view mine) {
        auto all = inner(mine);
        if (r == 0) {
          // Before connecting properly, knock on rank 1's door with nonsense.
          auto address = uring::detail::parse_address(all[1]);
          stranger = ::socket(address.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
          if (::connect(stranger, address.get(), address.length) == 0) {
            const char junk[32] = "GET / HTTP/1.0\r\n\r\n";
            (void)::send(stranger, junk, sizeof junk, MSG_NOSIGNAL);
          }
        }
        return all;
      };
      world[r] = uring::make_endpoint(r, 2, exchange_with_intruder,
                                      {.bind_address = "127.0.0.1", .token = "job-1",
                                       .timeout = std::chrono::seconds(10)});
    });
  }
  for (auto& t : ranks) t.join();
  REQUIRE(world[0]);
  REQUIRE(world[1]);
  // The stranger's connection was closed: reading it gives EOF (or a reset).
  timeval limit{5, 0};
  ::setsockopt(stranger, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  char byte;
  errno = 0;
  auto n = ::recv(stranger, &byte, 1, 0);
  CHECK((n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)));
  ::close(stranger);
  int value = 3, got = 0;
  recorder s, r;
  REQUIRE_FALSE(world[1]->post_recv(0, &got, 4, 0, 0, nullptr, &r));
  REQUIRE_FALSE(world[0]->post_send(1, &value, 4, 0, nullptr, &s));
  REQUIRE(drive(raw(world), [&] { return r.done() && s.done(); }));
  CHECK(got == 3);
}

TEST_CASE("destroying an endpoint completes its outstanding operations with aborted") {
  auto world = make_world(2);
  int x;
  recorder r;
  REQUIRE_FALSE(world[0]->post_recv(1, &x, 4, 1, 0, nullptr, &r));
  world[0].reset();
  CHECK(r.calls == 1);
  CHECK(r.result->error == errc::aborted);
}
