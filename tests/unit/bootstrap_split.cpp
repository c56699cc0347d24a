// Splitting a job into groups (bootstrap/split.hpp): the membership rule,
// the request's wire form, and the keyed address exchange of groups whose
// transports take different numbers of rounds, over a real store with ranks
// as threads. tests/multiproc/groups.cpp runs job::split itself.
#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <string>
#include <system_error>
#include <vector>

#include "pdcoll/bootstrap/split.hpp"

using namespace pdcoll::bootstrap;
using namespace std::chrono_literals;

namespace {

launch_info rank_of(int rank, int world_size, std::uint16_t port) {
  launch_info info;
  info.rank = rank;
  info.world_size = world_size;
  info.root_host = "127.0.0.1";
  info.root_port = port;
  info.launcher = "pdcoll";
  return info;
}

}  // namespace

TEST_CASE("a split orders each color by key, ties by job rank, and leaves no_color out") {
  //                                   rank: 0         1        2        3         4        5
  const std::vector<split_request> requests{{1, 5}, {0, 9}, {1, 5}, {0, -3}, {no_color, 0}, {1, 2}};
  static_assert(split_request{}.valid, "a request is valid unless refused");
  CHECK(split_members(requests, 0) == std::vector<int>{5, 0, 2});
  CHECK(split_members(requests, 2) == std::vector<int>{5, 0, 2});
  CHECK(split_members(requests, 1) == std::vector<int>{3, 1});
  CHECK(split_members(requests, 4).empty());
}

TEST_CASE("a split request survives its wire form, and anything else is refused") {
  for (const split_request r : {split_request{7, -12, 18446744073709551615ull, true}, split_request{no_color, 3, 9, false}}) {
    const auto back = decode_split_request(encode(r));
    CHECK(back.color == r.color);
    CHECK(back.key == r.key);
    CHECK(back.agreement == r.agreement);
    CHECK(back.valid == r.valid);
  }
  for (const char* bad : {"", "1", "1 1 2", "1 1 2 3 ", "1 1  2 3", "1 x 2 3", "1 1 2 3 4", "2 1 2 3", "1 99999999999 0 0"}) {
    CAPTURE(bad);
    try {
      (void)decode_split_request(bad);
      FAIL("accepted");
    } catch (const std::system_error& e) {
      CHECK(e.code() == pdcoll::errc::protocol);
    }
  }
}

TEST_CASE("groups exchange through the store independently, whatever their number of rounds") {
  // Job ranks 0 and 2 form group A, which exchanges three rounds; rank 1 is
  // group B alone, with one round. A's rounds must not wait for B's.
  store_options options;
  options.server.flush_timeout = 500ms;
  auto root = store::connect(rank_of(0, 3, 0), 5s, options);
  const std::uint16_t port = root.root_port();
  auto rounds = [](store& s, std::string prefix, int members, int index, int count) {
    group_rendezvous rendezvous(s, std::move(prefix), members, index);
    auto exchange = rendezvous.exchange();
    std::vector<std::vector<std::string>> seen;
    for (int round = 0; round < count; ++round)
      seen.push_back(exchange("r" + std::to_string(round) + "i" + std::to_string(index)));
    s.barrier();
    return seen;
  };
  auto two = std::async(std::launch::async, [&] {
    auto s = store::connect(rank_of(2, 3, port), 5s, options);
    return rounds(s, "split/0/A", 2, 1, 3);
  });
  auto one = std::async(std::launch::async, [&] {
    auto s = store::connect(rank_of(1, 3, port), 5s, options);
    return rounds(s, "split/0/B", 1, 0, 1);
  });
  const auto zero = rounds(root, "split/0/A", 2, 0, 3);
  REQUIRE(one.wait_for(10s) == std::future_status::ready);
  REQUIRE(two.wait_for(10s) == std::future_status::ready);
  const auto seen_by_two = two.get();
  const auto seen_by_one = one.get();
  for (int round = 0; round < 3; ++round) {
    const std::string r = "r" + std::to_string(round);
    const std::vector<std::string> expected{r + "i0", r + "i1"};
    CHECK(zero[static_cast<std::size_t>(round)] == expected);
    CHECK(seen_by_two[static_cast<std::size_t>(round)] == expected);
  }
  CHECK(seen_by_one == std::vector<std::vector<std::string>>{{"r0i0"}});
}

TEST_CASE("a member whose setup fails tells the others at once, and the store stays usable") {
  // Job ranks 0, 1 and 2 form one group. Round 0 goes through; then rank 2
  // fails before its second round. Ranks 0 and 1 must hear why at once, not
  // after the store's deadline (which would break the store for good), and
  // every rank must still pass a barrier and have the keys erased.
  store_options options;
  options.server.flush_timeout = 500ms;
  const auto deadline = 20s;  // far above what the test may take
  auto root = store::connect(rank_of(0, 3, 0), deadline, options);
  const std::uint16_t port = root.root_port();
  auto member = [&](store& s, int index) -> std::string {
    group_rendezvous rendezvous(s, "split/4/0", 3, index);
    auto exchange = rendezvous.exchange();
    std::string outcome;
    try {
      (void)exchange("first");
      if (index == 2) {
        rendezvous.fail("cannot bind: Address already in use");
        outcome = "failed";
      } else {
        (void)exchange("second");
        rendezvous.conclude();
        outcome = "completed";
      }
    } catch (const std::system_error& e) {
      outcome = std::string(e.code() == pdcoll::errc::bootstrap ? "bootstrap: " : "other: ") + e.what();
    }
    s.barrier();
    return outcome;
  };
  const auto start = std::chrono::steady_clock::now();
  auto one = std::async(std::launch::async, [&] {
    auto s = store::connect(rank_of(1, 3, port), deadline, options);
    return member(s, 1);
  });
  auto two = std::async(std::launch::async, [&] {
    auto s = store::connect(rank_of(2, 3, port), deadline, options);
    return member(s, 2);
  });
  const std::string zero = member(root, 0);
  REQUIRE(one.wait_for(10s) == std::future_status::ready);
  REQUIRE(two.wait_for(10s) == std::future_status::ready);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  const std::string expected = "bootstrap: group member 2 failed to set up: cannot bind: Address already in use";
  CHECK(zero.substr(0, expected.size()) == expected);
  CHECK(one.get().substr(0, expected.size()) == expected);
  CHECK(two.get() == "failed");
  root.erase_prefix("split/4/");
  root.set("after", "x");
  CHECK(root.get("after") == "x");
}

TEST_CASE("a member failing after the last exchange round fails the closing round of the others") {
  store_options options;
  options.server.flush_timeout = 500ms;
  const auto deadline = 20s;
  auto root = store::connect(rank_of(0, 2, 0), deadline, options);
  const std::uint16_t port = root.root_port();
  auto one = std::async(std::launch::async, [&] {
    auto s = store::connect(rank_of(1, 2, port), deadline, options);
    group_rendezvous rendezvous(s, "split/5/0", 2, 1);
    (void)rendezvous.exchange()("address");
    rendezvous.fail("communicator: out of memory");  // after its endpoint was set up
    s.barrier();
  });
  group_rendezvous rendezvous(root, "split/5/0", 2, 0);
  CHECK(rendezvous.exchange()("address") == std::vector<std::string>{"address", "address"});
  const auto start = std::chrono::steady_clock::now();
  try {
    rendezvous.conclude();
    FAIL("the closing round passed");
  } catch (const std::system_error& e) {
    CHECK(e.code() == pdcoll::errc::bootstrap);
    CHECK(std::string(e.what()).find("member 1 failed to set up: communicator: out of memory") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  root.barrier();
  REQUIRE(one.wait_for(10s) == std::future_status::ready);
}
