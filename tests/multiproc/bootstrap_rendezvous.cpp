// Multi-process rendezvous test, started by tools/pdcoll-run with N ranks
// (tests/multiproc/bootstrap.cmake). Every rank runs every test case in the
// same order against one store; rank 0 also attacks its own server with
// hostile raw connections while the real ranks rendezvous.
#include <doctest/doctest.h>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>
#include <system_error>
#include <vector>

#include "pdcoll/bootstrap/detail/socket.hpp"
#include "pdcoll/bootstrap/store.hpp"

using namespace pdcoll::bootstrap;
using namespace std::chrono_literals;

namespace {

constexpr auto hello_timeout = 500ms;

const launch_info& info() {
  static const launch_info value = from_environment();
  return value;
}

/// The job's one store, connected on first use and kept for the process's lifetime.
store& job_store() {
  static store value = [] {
    store_options options;
    options.server.hello_timeout = hello_timeout;  // so the silent hostile client is dropped quickly
    return store::connect(info(), 30s, options);
  }();
  return value;
}

/// What the server did with one hostile connection.
struct verdict {
  std::vector<message> replies;
  bool closed = false;  // the server closed the connection before the deadline
};

/// Connects to the root, sends `bytes`, and reads until the server closes
/// the connection or `patience` passes.
verdict attack(const std::string& bytes, std::chrono::milliseconds patience) {
  verdict result;
  const auto deadline = detail::clock::now() + patience;
  auto fd = detail::connect_until(info().root_host, job_store().root_port(), deadline, patience);
  if (!bytes.empty()) ::send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
  frame_reader reader;
  for (;;) {
    pollfd p{fd.get(), POLLIN, 0};
    if (::poll(&p, 1, detail::poll_timeout(deadline)) <= 0) break;
    char buffer[4096];
    const ssize_t n = ::recv(fd.get(), buffer, sizeof buffer, 0);
    if (n <= 0) {
      result.closed = true;
      break;
    }
    reader.feed(std::string_view{buffer, static_cast<std::size_t>(n)});
  }
  message m;
  std::string why;
  while (reader.next(m, why) == frame_reader::status::frame) result.replies.push_back(m);
  return result;
}

std::string hello_bytes(std::string token, std::uint32_t rank) {
  message m;
  m.type = message_type::hello;
  m.token = std::move(token);
  m.rank = rank;
  m.world_size = static_cast<std::uint32_t>(info().world_size);
  return encode(m);
}

bool refused_with(const verdict& v, pdcoll::errc code) {
  return v.closed && v.replies.size() == 1 && v.replies[0].type == message_type::error &&
         v.replies[0].code == static_cast<std::uint32_t>(code);
}

/// Every hostile client rank 0 runs; each returns a failure description or "".
std::vector<std::string> run_hostile_clients() {
  std::vector<std::string> failures;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) failures.push_back(what);
  };
  expect(refused_with(attack(hello_bytes("not-the-token", 0), 5s), pdcoll::errc::unauthenticated), "wrong token");
  expect(refused_with(attack(hello_bytes("", 0), 5s), pdcoll::errc::unauthenticated), "missing token");
  expect(refused_with(attack(std::string("\xff\xff\xff\x7f", 4) + "xxxx", 5s), pdcoll::errc::protocol),
         "oversized length prefix");
  // A truncated HELLO: the server waits for the rest, then drops it at the HELLO deadline.
  const std::string hello = hello_bytes(info().token, 0);
  const auto truncated = attack(hello.substr(0, hello.size() / 2), 5s);
  expect(truncated.closed && truncated.replies.empty(), "truncated message");
  const auto start = detail::clock::now();
  const auto silent = attack("", 5s);
  const auto took = detail::clock::now() - start;
  expect(silent.closed && silent.replies.empty() && took >= hello_timeout - 50ms && took < 3s,
         "connects-and-sends-nothing");
  // A client with the right token claiming rank 0, which has joined.
  const auto twice = attack(hello, 5s);
  expect(refused_with(twice, pdcoll::errc::bootstrap) && twice.replies[0].text == "rank 0 joined twice",
         "duplicate rank");
  // Our own client with a wrong token reports errc::unauthenticated.
  launch_info wrong = info();
  wrong.rank = info().world_size > 1 ? 1 : 0;
  wrong.token = "wrong";
  wrong.root_port = job_store().root_port();
  if (wrong.rank != 0) {
    try {
      (void)store::connect(wrong, 5s);
      failures.push_back("store::connect with a wrong token succeeded");
    } catch (const std::system_error& e) {
      expect(e.code() == pdcoll::errc::unauthenticated, std::string("store::connect wrong token: ") + e.what());
    }
  }
  return failures;
}

}  // namespace

TEST_CASE("every rank learns every rank's address through all_gather") {
  store& s = job_store();
  REQUIRE(s.rank() == info().rank);
  REQUIRE(s.world_size() == info().world_size);
  // Contributions of different sizes, one of them empty, binary bytes included.
  const std::string mine = "rank-" + std::to_string(s.rank()) + std::string(static_cast<std::size_t>(s.rank()) * 1000, '\0');
  auto all = s.all_gather(mine);
  REQUIRE(all.size() == static_cast<std::size_t>(s.world_size()));
  for (int r = 0; r < s.world_size(); ++r)
    CHECK(all[static_cast<std::size_t>(r)] == "rank-" + std::to_string(r) + std::string(static_cast<std::size_t>(r) * 1000, '\0'));
}

TEST_CASE("keys set before a barrier are visible to every rank after it") {
  store& s = job_store();
  s.set("key-" + std::to_string(s.rank()), std::to_string(s.rank() * 7));
  s.barrier();
  for (int r = 0; r < s.world_size(); ++r) CHECK(s.get("key-" + std::to_string(r), 5s) == std::to_string(r * 7));
  s.wait({"key-0"});
  s.barrier();
}

TEST_CASE("hostile clients against rank 0's server do not disturb the ranks' rendezvous") {
  store& s = job_store();
  std::future<std::vector<std::string>> hostile;
  if (s.rank() == 0) hostile = std::async(std::launch::async, run_hostile_clients);
  // The real ranks rendezvous several times while the attacks run.
  for (int round = 0; round < 5; ++round) {
    auto all = s.all_gather(std::to_string(round * 100 + s.rank()));
    REQUIRE(all.size() == static_cast<std::size_t>(s.world_size()));
    for (int r = 0; r < s.world_size(); ++r) CHECK(all[static_cast<std::size_t>(r)] == std::to_string(round * 100 + r));
  }
  if (s.rank() == 0) {
    REQUIRE(hostile.wait_for(30s) == std::future_status::ready);
    for (const auto& failure : hostile.get()) FAIL_CHECK("hostile client not handled: " << failure);
  }
  s.barrier();
}

TEST_CASE("an unreachable root gives errc::timeout naming the root within the deadline") {
  launch_info elsewhere = info();
  elsewhere.rank = 1;  // a client, so that it does not try to serve
  elsewhere.world_size = 2;
  elsewhere.root_host = "127.0.0.1";
  elsewhere.root_port = 1;  // privileged and unused: every connect is refused at once
  const auto start = std::chrono::steady_clock::now();
  try {
    (void)store::connect(elsewhere, 400ms);
    FAIL("connected to a root that does not exist");
  } catch (const std::system_error& e) {
    CHECK(e.code() == pdcoll::errc::timeout);
    CHECK(std::string(e.what()).find("could not reach rendezvous root 127.0.0.1:1 within 400 ms") != std::string::npos);
  }
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took >= 400ms);
  CHECK(took < 3s);
  job_store().barrier();
}
