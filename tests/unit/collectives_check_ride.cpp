// Unit tests: the signature check's message rides with a data message.
// Recursive doubling places ranks on the hypercube by Gray code
// (algo::detail::hypercube_partner), so that every rank meets rank + 1, the
// peer its check goes to, and holds the check until that step: both leave in
// one write (unless a round takes longer than check_hold_limit). A held
// check still leaves on its own when the step is late.
#include <doctest/doctest.h>

#include <pdcoll/pdcoll.hpp>
#include <unit/failure_endpoints.hpp>

#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <set>
#include <system_error>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;
using pdcoll::algo::detail::gray_code;
using pdcoll::algo::detail::gray_decode;
using pdcoll::algo::detail::hypercube_partner;

constexpr std::uint64_t check_index = pdcoll::detail::tag_index_mask;

std::uint64_t index_of(std::uint64_t tag) { return tag & pdcoll::detail::tag_index_mask; }
std::uint64_t seq_of(std::uint64_t tag) {
  return (tag >> pdcoll::detail::tag_seq_shift) & pdcoll::detail::tag_seq_mask;
}

using pdcoll::testing::short_timeout;

}  // namespace

TEST_SUITE("collectives.check_ride") {

TEST_CASE("Gray placement: each round pairs every rank, and the rounds meet both ring neighbours") {
  for (int code = 0; code < 4096; ++code) CHECK(gray_code(gray_decode(code)) == code);
  for (int pow2 = 1; pow2 <= 256; pow2 *= 2) {
    CAPTURE(pow2);
    for (int r = 0; r < pow2; ++r) {
      std::set<int> met;
      for (int mask = 1; mask < pow2; mask <<= 1) {
        const int partner = hypercube_partner(r, mask);
        REQUIRE(partner >= 0);
        REQUIRE(partner < pow2);
        CHECK(partner != r);
        CHECK(hypercube_partner(partner, mask) == r);  // a perfect matching per round
        met.insert(partner);
      }
      CHECK(met.size() == static_cast<std::size_t>(std::countr_zero(static_cast<unsigned>(pow2))));  // log2 rounds
      if (pow2 > 1) {
        CHECK(met.count((r + 1) % pow2) == 1);
        CHECK(met.count((r + pow2 - 1) % pow2) == 1);
      }
    }
  }
}

TEST_CASE("recursive doubling hands each check to the transport with a data message to the same peer") {
  // Same progress turn: the io_uring transport writes both in one sendmsg.
  // Without the hold, the ranks that meet rank + 1 only in a later round
  // post their check turns before that round's data. A round slower than
  // check_hold_limit (a loaded machine) lets one check go alone: one is
  // tolerated per rank.
  for (int world_size : {2, 4, 8}) {
    CAPTURE(world_size);
    pdcoll::testing::wrapped_world world(world_size, [](int) { return pdcoll::testing::endpoint_faults{}; },
                                         short_timeout(10s));
    constexpr int rounds = 5;
    world.run([&](int rank, pdcoll::communicator& comm) {
      for (int i = 0; i < rounds; ++i) {
        std::vector<float> data(7, static_cast<float>(rank + i));
        pdcoll::exec::sync_wait(pdcoll::all_reduce<pdcoll::algo::recursive_doubling>(comm, data));
        const float expected = static_cast<float>(world_size * (world_size - 1) / 2 + world_size * i);
        for (float v : data) REQUIRE(v == expected);
      }
    });
    for (int r = 0; r < world_size; ++r) {
      CAPTURE(r);
      const auto& sends = world.counters[static_cast<std::size_t>(r)]->posted_sends;
      int checks = 0, alone = 0;
      for (std::size_t i = 0; i < sends.size(); ++i) {
        if (index_of(sends[i].tag) != check_index) continue;
        ++checks;
        CHECK(sends[i].peer == (r + 1) % world_size);
        const bool rides = i + 1 < sends.size() && sends[i + 1].peer == sends[i].peer &&
                           index_of(sends[i + 1].tag) != check_index &&
                           seq_of(sends[i + 1].tag) == seq_of(sends[i].tag) && sends[i + 1].turn == sends[i].turn;
        alone += rides ? 0 : 1;
      }
      CHECK(checks == rounds);
      CHECK(alone <= 1);
    }
  }
}

TEST_CASE("a held check leaves on its own when the step it waits for is late") {
  // Rank 1 meets rank 2 (its check's peer) only in the second round; its
  // first-round partner, rank 0, starts 4 hold limits late. The check must
  // not wait for rank 0: it leaves after check_hold_limit (looked at after
  // 2.5).
  pdcoll::testing::wrapped_world world(4, [](int) { return pdcoll::testing::endpoint_faults{}; }, short_timeout(10s));
  REQUIRE(hypercube_partner(1, 1) == 0);
  REQUIRE(hypercube_partner(1, 2) == 2);
  std::atomic<int> rank1_checks_early{-1};
  std::thread observer([&] {
    std::this_thread::sleep_for(5 * pdcoll::detail::check_hold_limit / 2);
    rank1_checks_early = world.counters[1]->check_sends.load();
  });
  world.run([&](int rank, pdcoll::communicator& comm) {
    if (rank == 0) std::this_thread::sleep_for(4 * pdcoll::detail::check_hold_limit);
    std::vector<int> data(3, rank + 1);
    pdcoll::exec::sync_wait(pdcoll::all_reduce<pdcoll::algo::recursive_doubling>(comm, data));
    for (int v : data) REQUIRE(v == 10);
  });
  observer.join();
  CHECK(rank1_checks_early.load() == 1);
}

TEST_CASE("a held check still reports a mismatch: three ranks all-reduce, one broadcasts") {
  for (int odd_one : {0, 1, 2, 3}) {
    CAPTURE(odd_one);
    pdcoll::testing::wrapped_world world(4, [](int) { return pdcoll::testing::endpoint_faults{}; }, short_timeout(5s));
    std::error_code ec[4];
    const auto start = clock_type::now();
    world.run([&](int rank, pdcoll::communicator& comm) {
      std::vector<float> data(1000, 1.0f);
      try {
        if (rank == odd_one) {
          pdcoll::exec::sync_wait(pdcoll::broadcast(comm, data, 0));
        } else {
          pdcoll::exec::sync_wait(pdcoll::all_reduce<pdcoll::algo::recursive_doubling>(comm, data));
        }
      } catch (const std::system_error& e) {
        ec[rank] = e.code();
      }
    });
    for (int r = 0; r < 4; ++r) {
      CAPTURE(r);
      CHECK(ec[r] == pdcoll::errc::collective_mismatch);
    }
    CHECK(clock_type::now() - start < 4s);
  }
}

}  // TEST_SUITE
