// A group that outlives its job (group.hpp: "It may outlive the job
// object"): started by tools/pdcoll-run (tests/multiproc/groups.cmake). The
// job is made in a scope and moved once while its group is alive (the group
// still splits), then ends; the group's collectives still run, its split
// fails with errc::aborted, and destroying it touches no freed store.
#include <doctest/doctest.h>

#include <pdcoll/pdcoll.hpp>

#include <optional>
#include <system_error>
#include <utility>
#include <vector>

TEST_CASE("a group outlives its job: collectives run, a split fails with aborted, and it ends cleanly") {
  std::optional<pdcoll::group> everyone;
  {
    pdcoll::job made = pdcoll::job::from_environment();
    everyone = made.split(0);
    REQUIRE(everyone.has_value());
    pdcoll::job moved = std::move(made);  // the group's splits go on through the moved job's store
    auto half = everyone->split(everyone->rank() % 2);
    REQUIRE(half.has_value());
    std::vector<int> one{1};
    pdcoll::exec::sync_wait(pdcoll::all_reduce(half->comm(), one));
    CHECK(one[0] == half->world_size());
  }  // `half` ends, then the job (its final barrier through the store)
  std::vector<int> one{1};
  pdcoll::exec::sync_wait(pdcoll::all_reduce(everyone->comm(), one));
  CHECK(one[0] == everyone->world_size());
  std::error_code ec;
  try {
    (void)everyone->split(0);
  } catch (const std::system_error& e) {
    ec = e.code();
  }
  CHECK(ec == pdcoll::errc::aborted);
  everyone.reset();  // its final barrier; the keys of its split stay with the store that is gone
}
