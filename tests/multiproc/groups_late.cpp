// Groups when a member is late or the job's communicator has failed:
// started by tools/pdcoll-run with PDCOLL_TIMEOUT_MS=8000
// (tests/multiproc/groups.cmake).
// - A group split waits for a member up to twice the job's deadline, as
//   group.hpp says and job::split does (the group's own deadline ended it
//   after one).
// - A job whose communicator aborted still keeps its store for the ranks
//   that go on splitting: rank 0, which serves it, leaving first used to
//   take it from them.
#include <doctest/doctest.h>

#include <pdcoll/pdcoll.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

TEST_CASE("a late member joins a group split within twice the deadline; an aborted job keeps its store for the others") {
  auto job = std::make_unique<pdcoll::job>(pdcoll::job::from_environment());
  const int rank = job->rank();
  const int last = job->world_size() - 1;
  std::optional<pdcoll::group> everyone = job->split(0);
  REQUIRE(everyone.has_value());

  // 1.3 deadlines late: past the group's own deadline, inside twice the job's.
  if (rank == last) std::this_thread::sleep_for(10400ms);
  std::optional<pdcoll::group> again = everyone->split(0);
  REQUIRE(again.has_value());
  std::vector<int> one{1};
  pdcoll::exec::sync_wait(pdcoll::all_reduce(again->comm(), one));
  CHECK(one[0] == job->world_size());
  again.reset();

  // The job's communicator fails (here: aborted, as a timed-out collective
  // would); its store goes on serving the groups.
  job->comm().abort();
  std::optional<pdcoll::group> without_zero = job->split(rank == 0 ? pdcoll::bootstrap::no_color : 0);
  CHECK(without_zero.has_value() == (rank != 0));
  if (rank == 0) {
    job.reset();  // waits at its final barrier for the others
    return;
  }
  std::this_thread::sleep_for(300ms);  // rank 0 is in its destructor by now
  std::optional<pdcoll::group> deeper = without_zero->split(0);  // through the store
  REQUIRE(deeper.has_value());
  std::vector<int> ones{1};
  pdcoll::exec::sync_wait(pdcoll::all_reduce(deeper->comm(), ones));
  CHECK(ones[0] == job->world_size() - 1);
}
