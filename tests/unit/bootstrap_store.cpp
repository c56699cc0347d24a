// The rendezvous store over real loopback sockets, ranks as threads of one
// process (bootstrap/store.hpp). Every call has a short deadline so that a
// bug fails the test instead of hanging it.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "pdcoll/bootstrap/server.hpp"
#include "pdcoll/bootstrap/store.hpp"

using namespace pdcoll::bootstrap;
using namespace std::chrono_literals;

namespace {

launch_info job(int rank, int world_size, std::uint16_t port, std::string token = "t0ken") {
  launch_info info;
  info.rank = rank;
  info.world_size = world_size;
  info.root_host = "127.0.0.1";
  info.root_port = port;
  info.token = std::move(token);
  info.launcher = "pdcoll";
  return info;
}

/// A loopback port nobody listens on (bound and released; the kernel does
/// not hand it out again right away).
std::uint16_t unused_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

/// True when an IPv6 socket can bind ::1 (the machine has IPv6 loopback).
bool ipv6_loopback() {
  const int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_addr = in6addr_loopback;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  ::close(fd);
  return ok;
}

/// Runs `call` and returns the std::system_error it throws; fails when it does not.
template <class Call>
std::system_error thrown_by(Call&& call) {
  try {
    call();
  } catch (const std::system_error& e) {
    return e;
  }
  FAIL("expected a std::system_error");
  return std::system_error{std::error_code{}};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

store_options fast() {
  store_options options;
  options.diagnosis_timeout = 500ms;
  options.server.flush_timeout = 500ms;
  return options;
}

}  // namespace

TEST_CASE("a one-rank store sets, gets, waits, gathers and passes barriers on an ephemeral port") {
  auto s = store::connect(job(0, 1, 0), 5s, fast());
  CHECK(s.rank() == 0);
  CHECK(s.world_size() == 1);
  CHECK(s.root_port() != 0);
  s.set("k", std::string("v\0v", 3));
  CHECK(s.get("k") == std::string("v\0v", 3));
  s.wait({"k"});
  CHECK(s.all_gather("me") == std::vector<std::string>{"me"});
  s.barrier();
  CHECK(s.all_gather("") == std::vector<std::string>{""});
  CHECK(s.native_handle() >= 0);
}

TEST_CASE("a timeout of milliseconds::max() means no deadline, not one already passed") {
  // now + max() in nanoseconds wrapped to the past: connect failed at once.
  const auto forever = std::chrono::milliseconds::max();
  auto root = store::connect(job(0, 2, 0), forever, fast());
  const std::uint16_t port = root.root_port();
  auto late = std::async(std::launch::async, [port, forever] {
    std::this_thread::sleep_for(50ms);
    auto s = store::connect(job(1, 2, port), forever, fast());
    s.barrier(forever);
    return s.all_gather("1", forever);
  });
  root.barrier(forever);
  CHECK(root.all_gather("0", forever) == std::vector<std::string>{"0", "1"});
  REQUIRE(late.wait_for(10s) == std::future_status::ready);
  CHECK(late.get() == std::vector<std::string>{"0", "1"});
}

TEST_CASE("three ranks exchange addresses, keys and barriers through rank 0's server") {
  auto root = store::connect(job(0, 3, 0), 5s, fast());
  const std::uint16_t port = root.root_port();
  auto rank_main = [port](int rank) {
    auto s = store::connect(job(rank, 3, port), 5s, fast());
    auto all = s.all_gather("addr-" + std::to_string(rank));
    s.set("from-" + std::to_string(rank), std::to_string(rank * 10));
    const std::string other = s.get("from-" + std::to_string((rank + 1) % 3));
    s.barrier();
    return std::make_pair(all, other);
  };
  auto one = std::async(std::launch::async, rank_main, 1);
  auto two = std::async(std::launch::async, rank_main, 2);
  auto all = root.all_gather("addr-0");
  root.set("from-0", "0");
  CHECK(root.get("from-1") == "10");
  auto exchange = root.exchange();
  root.barrier();
  const std::vector<std::string> expected{"addr-0", "addr-1", "addr-2"};
  CHECK(all == expected);
  REQUIRE(one.wait_for(10s) == std::future_status::ready);
  REQUIRE(two.wait_for(10s) == std::future_status::ready);
  auto [all1, other1] = one.get();
  auto [all2, other2] = two.get();
  CHECK(all1 == expected);
  CHECK(all2 == expected);
  CHECK(other1 == "20");
  CHECK(other2 == "0");
}

TEST_CASE("a root told to listen everywhere takes clients that reach it by another address") {
  // Under srun the root is the step's first node by name, which may resolve
  // to a loopback address on that node itself: rank 0 listens on every
  // address there (launch_info::root_listens_everywhere).
  auto everywhere = job(0, 2, 0);
  everywhere.root_listens_everywhere = true;
  auto root = store::connect(everywhere, 5s, fast());
  auto client_info = job(1, 2, root.root_port());
  client_info.root_host = "127.0.0.2";
  auto client = std::async(std::launch::async, [&] {
    auto s = store::connect(client_info, 5s, fast());
    return s.all_gather("one");
  });
  CHECK(root.all_gather("zero") == std::vector<std::string>{"zero", "one"});
  REQUIRE(client.wait_for(10s) == std::future_status::ready);
  CHECK(client.get() == std::vector<std::string>{"zero", "one"});

  // Where the machine has IPv6 loopback, the same root (dual-stack) takes IPv6 clients too.
  if (ipv6_loopback()) {
    auto v6_root_info = job(0, 2, 0);
    v6_root_info.root_listens_everywhere = true;
    auto v6_root = store::connect(v6_root_info, 5s, fast());
    auto v6_info = job(1, 2, v6_root.root_port());
    v6_info.root_host = "::1";
    auto v6_client = std::async(std::launch::async, [&] { return store::connect(v6_info, 5s, fast()).all_gather("6"); });
    CHECK(v6_root.all_gather("4") == std::vector<std::string>{"4", "6"});
    REQUIRE(v6_client.wait_for(10s) == std::future_status::ready);
    CHECK(v6_client.get() == std::vector<std::string>{"4", "6"});
  } else {
    MESSAGE("no IPv6 loopback here: the dual-stack half of this test is skipped");
  }

  // The default: a root bound to 127.0.0.1 alone is not reached at 127.0.0.2.
  auto narrow = store::connect(job(0, 2, 0), 5s, fast());
  auto missed = job(1, 2, narrow.root_port());
  missed.root_host = "127.0.0.2";
  auto e = thrown_by([&] { (void)store::connect(missed, 300ms, fast()); });
  CHECK(e.code() == pdcoll::errc::timeout);
}

TEST_CASE("an unreachable root gives errc::timeout naming the address within the deadline") {
  const auto port = unused_port();
  const auto start = std::chrono::steady_clock::now();
  auto e = thrown_by([&] { (void)store::connect(job(1, 2, port), 300ms); });
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(e.code() == pdcoll::errc::timeout);
  CHECK(contains(e.what(), "could not reach rendezvous root 127.0.0.1:" + std::to_string(port) + " within 300 ms"));
  CHECK(took >= 300ms);
  CHECK(took < 2s);
}

TEST_CASE("a client with the wrong token gets errc::unauthenticated; one claiming a taken rank errc::bootstrap") {
  auto root = store::connect(job(0, 2, 0, "right"), 5s, fast());
  auto wrong = thrown_by([&] { (void)store::connect(job(1, 2, root.root_port(), "wrong"), 2s, fast()); });
  CHECK(wrong.code() == pdcoll::errc::unauthenticated);
  CHECK(contains(wrong.what(), "wrong token"));
  auto twice = thrown_by([&] { (void)store::connect(job(0, 2, root.root_port(), "right"), 2s, fast()); });
  // Rank 0 again: the second connect tries to listen on the same port first.
  CHECK(twice.code() == pdcoll::errc::bootstrap);
  auto world = thrown_by([&] { (void)store::connect(job(1, 3, root.root_port(), "right"), 2s, fast()); });
  CHECK(world.code() == pdcoll::errc::bootstrap);
  CHECK(contains(world.what(), "world_size 3"));
  // The root is still healthy.
  auto one = store::connect(job(1, 2, root.root_port(), "right"), 2s, fast());
  auto dup = thrown_by([&] { (void)store::connect(job(1, 2, root.root_port(), "right"), 2s, fast()); });
  CHECK(dup.code() == pdcoll::errc::bootstrap);
  CHECK(contains(dup.what(), "rank 1 joined twice"));
}

TEST_CASE("a barrier that times out names the ranks that never arrived, then the store stays failed") {
  auto root = store::connect(job(0, 3, 0), 5s, fast());
  auto one = store::connect(job(1, 3, root.root_port()), 5s, fast());
  const auto start = std::chrono::steady_clock::now();
  auto e = thrown_by([&] { root.barrier(200ms); });
  CHECK(std::chrono::steady_clock::now() - start < 2s);
  CHECK(e.code() == pdcoll::errc::timeout);
  CHECK(contains(e.what(), "barrier round 0 on rank 0 timed out after 200 ms"));
  CHECK(contains(e.what(), "1 (connected), 2 (never connected)"));
  auto again = thrown_by([&] { root.barrier(200ms); });
  CHECK(again.code() == pdcoll::errc::timeout);
  CHECK(contains(again.what(), "unusable after an earlier error"));
}

TEST_CASE("get of a key nobody sets times out with errc::timeout") {
  auto s = store::connect(job(0, 1, 0), 5s, fast());
  auto e = thrown_by([&] { (void)s.get("never", 100ms); });
  CHECK(e.code() == pdcoll::errc::timeout);
  CHECK(contains(e.what(), "get('never') timed out after 100 ms"));
}

TEST_CASE("a rank that leaves makes the others' next collective fail with peer_lost") {
  auto root = store::connect(job(0, 2, 0), 5s, fast());
  {
    auto one = store::connect(job(1, 2, root.root_port()), 5s, fast());
  }
  auto e = thrown_by([&] { root.barrier(2s); });
  CHECK(e.code() == pdcoll::errc::peer_lost);
  CHECK(contains(e.what(), "rank 1 left the rendezvous"));
}

TEST_CASE("over-limit keys and values are rejected before anything is sent, and the store stays usable") {
  auto s = store::connect(job(0, 1, 0), 5s, fast());
  CHECK(thrown_by([&] { s.set("", "v"); }).code() == pdcoll::errc::invalid_argument);
  CHECK(thrown_by([&] { s.set(std::string(257, 'k'), "v"); }).code() == pdcoll::errc::invalid_argument);
  CHECK(thrown_by([&] { s.set("k", std::string(64 * 1024 + 1, 'v')); }).code() == pdcoll::errc::invalid_argument);
  CHECK(thrown_by([&] { (void)s.all_gather(std::string(64 * 1024 + 1, 'v')); }).code() ==
        pdcoll::errc::invalid_argument);
  s.set("k", std::string(64 * 1024, 'v'));
  CHECK(s.get("k").size() == 64 * 1024);
}

TEST_CASE("the root going away fails a waiting client with peer_lost, not a hang") {
  auto root = std::make_unique<store>(store::connect(job(0, 2, 0), 5s, fast()));
  auto one = store::connect(job(1, 2, root->root_port()), 5s, fast());
  auto waiting = std::async(std::launch::async, [&] { return thrown_by([&] { (void)one.get("never", 5s); }); });
  std::this_thread::sleep_for(50ms);
  root.reset();
  REQUIRE(waiting.wait_for(5s) == std::future_status::ready);
  auto e = waiting.get();
  CHECK(e.code() == pdcoll::errc::peer_lost);
}

TEST_CASE("a server stopping with replies a client does not read waits out its flush time asleep, not spinning") {
  server_options options;
  options.flush_timeout = 500ms;
  auto server = std::make_unique<rendezvous_server>("127.0.0.1", 0, 1, "t", options);
  // A client that joins, stores a large value and asks for it again and
  // again without reading: replies pile up in the server's outbox.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  const int small = 4096;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(server->port());
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  message m;
  m.type = message_type::hello;
  m.token = "t";
  m.world_size = 1;
  std::string requests = encode(m);
  m.type = message_type::set;
  m.key = "k";
  m.value = std::string(60000, 'v');
  requests += encode(m);
  m.type = message_type::get;
  m.value.clear();
  for (int i = 0; i < 300; ++i) requests += encode(m);  // 18 MB of replies: more than socket buffers hold
  REQUIRE(::send(fd, requests.data(), requests.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(requests.size()));
  std::this_thread::sleep_for(200ms);  // the server answers what it can and the socket fills

  rusage before{}, after{};
  ::getrusage(RUSAGE_SELF, &before);
  const auto start = std::chrono::steady_clock::now();
  server.reset();  // stops with output left for the client
  const auto wall = std::chrono::steady_clock::now() - start;
  ::getrusage(RUSAGE_SELF, &after);
  ::close(fd);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
  const double cpu = seconds(after.ru_utime) - seconds(before.ru_utime) + seconds(after.ru_stime) - seconds(before.ru_stime);
  MESSAGE("stopping took " << std::chrono::duration<double>(wall).count() << " s, " << cpu << " s of CPU");
  CHECK(wall >= 400ms);  // it did wait for the client, up to flush_timeout
  CHECK(cpu < 0.2);
}

TEST_CASE("a server for more ranks than the soft descriptor limit raises it as far as the hard limit allows") {
  // A soft RLIMIT_NOFILE of 1024 (the usual default) is below a large job's
  // sockets: rank 0 accepted ranks past it only after they timed out.
  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
  const rlim_t wanted = 3 * 1000 + pdcoll::detail::spare_descriptors;  // store + a directional mesh
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < wanted) {
    MESSAGE("hard RLIMIT_NOFILE " << saved.rlim_max << " is below " << wanted << ": skipped");
    return;
  }
  rlimit low = saved;
  low.rlim_cur = 512;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  rlimit during{};
  {
    rendezvous_server server("127.0.0.1", 0, 1000, "t");
    ::getrlimit(RLIMIT_NOFILE, &during);
  }
  // Never lowered: a soft limit above the need stays.
  const rlim_t kept = pdcoll::detail::make_room_for_descriptors(10);
  ::setrlimit(RLIMIT_NOFILE, &saved);
  CHECK(during.rlim_cur >= wanted);
  CHECK(during.rlim_max == saved.rlim_max);
  CHECK(kept == during.rlim_cur);
}
