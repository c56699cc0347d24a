// Groups across real processes (job::split, job::new_group; group.hpp):
// started by tools/pdcoll-run (tests/multiproc/groups.cmake) on several world
// sizes over each transport. Every rank computes the membership it expects
// from the job's ranks alone, checks the group it got against it, and checks
// the group's collectives against support/reference.hpp, with inputs made
// from the group rank, so the reference is that of a world of the group's
// size.
#include <doctest/doctest.h>

#include <pdcoll/pdcoll.hpp>
#include <support/outcome.hpp>
#include <support/reference.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

namespace {

using namespace pdcoll;
using pdcoll::testing::check_reduced;
using pdcoll::testing::error_of;
using pdcoll::testing::make_input;
namespace ex = pdcoll::exec;

job& the_job() {
  // The progress-driver registry is a function-local static too; touching it
  // first makes it outlive the job, whose communicator unregisters at exit.
  static const std::size_t drivers_before = ex::progress_drivers::size();
  (void)drivers_before;
  static job value = job::from_environment();
  return value;
}

std::string where(const group& g) {
  return "job rank " + std::to_string(the_job().rank()) + ", group rank " + std::to_string(g.rank()) + " of " +
         std::to_string(g.world_size());
}

/// Checks that `g` holds exactly `expected` (job ranks in group order), that
/// its communicator agrees (an all_gather of the members' job ranks), and
/// that its all-reduce matches the reference on random data, in place and
/// out of place, with counts below and above the group's size.
void check_group(const std::optional<group>& maybe, const std::vector<int>& expected, std::uint64_t salt) {
  const int me = the_job().rank();
  const auto at = std::find(expected.begin(), expected.end(), me);
  if (at == expected.end()) {
    CHECK_MESSAGE(!maybe.has_value(), "job rank " << me << " got a group it is not in");
    return;
  }
  REQUIRE_MESSAGE(maybe.has_value(), "job rank " << me << " got no group");
  auto& g = const_cast<group&>(*maybe);
  REQUIRE(g.world_size() == static_cast<int>(expected.size()));
  CHECK_MESSAGE(g.rank() == static_cast<int>(at - expected.begin()), where(g));
  CHECK(std::vector<int>(g.job_ranks().begin(), g.job_ranks().end()) == expected);
  // Its log lines name the job rank and the group rank.
  CHECK(g.comm().log_name().starts_with(std::to_string(me) + " as rank " + std::to_string(g.rank()) + " of group "));
  CHECK(the_job().comm().log_name() == std::to_string(me));

  std::vector<std::int32_t> mine{me}, everyone(expected.size(), -1);
  ex::sync_wait(all_gather(g.comm(), std::span<const std::int32_t>(mine), std::span<std::int32_t>(everyone)));
  CHECK_MESSAGE(std::vector<int>(everyone.begin(), everyone.end()) == expected, where(g));

  const auto P = static_cast<std::size_t>(g.world_size());
  for (std::size_t count : {std::size_t{1}, P + 1, std::size_t{100003}}) {
    for (bool in_place : {false, true}) {
      ++salt;
      auto in = make_input<float>(salt, g.rank(), count, false);
      std::vector<float> out(count);
      if (in_place) {
        ex::sync_wait(all_reduce(g.comm(), std::span<float>(in), op::sum));
        out = in;
      } else {
        ex::sync_wait(all_reduce(g.comm(), std::span<const float>(in), std::span<float>(out), op::sum));
      }
      const auto msg = check_reduced<float, op::sum_t>(out.data(), count, salt, g.world_size());
      CHECK_MESSAGE(msg.empty(), where(g) << ", float sum of " << count << (in_place ? " in place: " : ": ") << msg);

      auto ints = make_input<std::int32_t>(salt, g.rank(), count, false);
      ex::sync_wait(all_reduce(g.comm(), std::span<std::int32_t>(ints), op::sum));
      const auto exact = check_reduced<std::int32_t, op::sum_t>(ints.data(), count, salt, g.world_size());
      CHECK_MESSAGE(exact.empty(), where(g) << ", int32 sum of " << count << ": " << exact);
    }
  }
}

/// The members of `color` under MPI_Comm_split's rule, from every rank's color and key.
std::vector<int> expected_members(int P, int color, auto color_of, auto key_of) {
  std::vector<int> members;
  for (int r = 0; r < P; ++r)
    if (color_of(r) == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return key_of(a) < key_of(b); });
  return members;
}

TEST_CASE("split by parity, ordered by descending job rank") {
  auto& j = the_job();
  const int P = j.world_size(), me = j.rank();
  auto color_of = [](int r) { return r % 2; };
  auto key_of = [](int r) { return -r; };
  auto g = j.split(color_of(me), key_of(me));
  check_group(g, expected_members(P, color_of(me), color_of, key_of), 100);
}

TEST_CASE("split with equal keys keeps the job's order; no_color joins nothing") {
  auto& j = the_job();
  const int P = j.world_size(), me = j.rank();
  // Rank 0 stays out; the others form groups of up to three neighbours.
  auto color_of = [](int r) { return r == 0 ? bootstrap::no_color : (r - 1) / 3; };
  auto key_of = [](int) { return 7; };
  auto g = j.split(color_of(me), key_of(me));
  if (me == 0) {
    CHECK(!g.has_value());
  } else {
    check_group(g, expected_members(P, color_of(me), color_of, key_of), 200);
  }
}

TEST_CASE("new_group of the last and the first rank") {
  auto& j = the_job();
  const int P = j.world_size();
  std::vector<int> list{P - 1};
  if (P > 1) list.push_back(0);
  auto g = j.new_group(list);
  check_group(g, list, 300);
}

TEST_CASE("a group and the job run collectives at once") {
  auto& j = the_job();
  const int P = j.world_size(), me = j.rank();
  auto g = j.split(me < (P + 1) / 2 ? 0 : 1);
  REQUIRE(g.has_value());
  const std::size_t count = 50000;
  for (int round = 0; round < 3; ++round) {
    const std::uint64_t salt = 400 + static_cast<std::uint64_t>(round);
    auto whole = make_input<float>(salt, me, count, false);
    auto part = make_input<float>(salt + 50, g->rank(), count, false);
    ex::sync_wait(ex::when_all(all_reduce(j.comm(), std::span<float>(whole), op::sum),
                               all_reduce(g->comm(), std::span<float>(part), op::sum)) |
                  ex::with_deadline(std::chrono::seconds(60)));
    const auto a = check_reduced<float, op::sum_t>(whole.data(), count, salt, P);
    const auto b = check_reduced<float, op::sum_t>(part.data(), count, salt + 50, g->world_size());
    CHECK_MESSAGE(a.empty(), "job all-reduce: " << a);
    CHECK_MESSAGE(b.empty(), where(*g) << ": " << b);
  }
}

TEST_CASE("groups made and dropped one after another") {
  auto& j = the_job();
  const int me = j.rank();
  std::optional<group> g;  // each assignment ends the previous group (its final barrier) first
  for (int round = 0; round < 4; ++round) {
    g = j.split(me % (round + 1));
    REQUIRE(g.has_value());
    std::vector<std::int32_t> one{1};
    ex::sync_wait(all_reduce(g->comm(), std::span<std::int32_t>(one), op::sum));
    CHECK(one[0] == g->world_size());
  }
}

TEST_CASE("a group split again, three levels deep, with the job splitting between") {
  auto& j = the_job();
  const int P = j.world_size(), me = j.rank();
  // Parity groups in job order; job rank `parity[i]` is group rank i.
  auto g = j.split(me % 2);
  REQUIRE(g.has_value());
  std::vector<int> parity;
  for (int r = me % 2; r < P; r += 2) parity.push_back(r);
  check_group(g, parity, 700);
  const int n = g->world_size(), i = g->rank();
  auto in_job = [&](const std::vector<int>& group_ranks) {
    std::vector<int> job_ranks;
    for (int k : group_ranks) job_ranks.push_back(parity[static_cast<std::size_t>(k)]);
    return job_ranks;
  };
  // Halves of each parity group, ordered by descending group rank.
  auto half_of = [n](int k) { return k < (n + 1) / 2 ? 0 : 1; };
  auto reversed = [](int k) { return -k; };
  auto half = g->split(half_of(i), reversed(i));
  check_group(half, in_job(expected_members(n, half_of(i), half_of, reversed)), 710);
  // A job split between nested ones; then the parity group again, without its rank 0.
  check_group(j.split(0), expected_members(P, 0, [](int) { return 0; }, [](int r) { return r; }), 720);
  auto rest = g->split(i == 0 ? bootstrap::no_color : 0);
  std::vector<int> others;
  for (int k = 1; k < n; ++k) others.push_back(k);
  check_group(rest, i == 0 ? std::vector<int>{} : in_job(others), 730);
  // The half split once more with equal keys: ties go by rank in the half
  // (its descending order), not by job rank.
  REQUIRE(half.has_value());
  auto again = half->split(0, 0);
  REQUIRE(again.has_value());
  check_group(again, std::vector<int>(half->job_ranks().begin(), half->job_ranks().end()), 740);
  // A fresh parity group, then a job split that only rank 0 joins: the
  // others leave it at once and split their new group while rank 0 frees
  // the store's keys of the split that made it.
  auto fresh = j.split(me % 2);
  REQUIRE(fresh.has_value());
  auto alone = j.split(me == 0 ? 0 : bootstrap::no_color);
  CHECK(alone.has_value() == (me == 0));
  check_group(fresh->split(0, -i), in_job(expected_members(n, 0, [](int) { return 0; }, reversed)), 745);
  // Bad arguments on one member fail every member of the parent, which stays usable.
  CHECK(error_of([&] { (void)g->split(i == n - 1 ? -5 : 0); }) == errc::invalid_argument);
  check_group(g->split(0), parity, 750);
}

TEST_CASE("bad splits fail on every rank and leave the job usable") {
  auto& j = the_job();
  const int P = j.world_size(), me = j.rank();
  // Refused on every rank, whether every rank or only one passed bad arguments.
  CHECK(error_of([&] { (void)j.split(-2); }) == errc::invalid_argument);
  CHECK(error_of([&] { (void)j.new_group({0, 0}); }) == errc::invalid_argument);
  CHECK(error_of([&] { (void)j.new_group({P}); }) == errc::invalid_argument);
  CHECK(error_of([&] { (void)j.split(me == P - 1 ? -2 : 0); }) == errc::invalid_argument);
  CHECK(error_of([&] {
          if (me == P - 1) (void)j.new_group({0, 0});
          else (void)j.new_group({0});
        }) == errc::invalid_argument);
  if (P > 1) {
    // Lists that differ between ranks, and split against new_group: every rank hears of it.
    CHECK(error_of([&] { (void)j.new_group({me}); }) == errc::collective_mismatch);
    CHECK(error_of([&] {
            if (me == 0) (void)j.new_group({0});
            else (void)j.split(0);
          }) == errc::collective_mismatch);
  }
  auto g = j.split(0);
  REQUIRE(g.has_value());
  CHECK(g->world_size() == P);
  std::vector<std::int32_t> one{1};
  ex::sync_wait(all_reduce(g->comm(), std::span<std::int32_t>(one), op::sum));
  CHECK(one[0] == P);
}

}  // namespace
