// Smoke test of the collective engine over inproc (the full matrix is in collectives_matrix.cpp).
#include <doctest/doctest.h>

#include <pdcoll/pdcoll.hpp>
#include <support/inproc_world.hpp>

#include <numeric>
#include <vector>

TEST_CASE("ring all_reduce sums int32 over 3 ranks") {
  pdcoll::testing::run_inproc(3, [](pdcoll::communicator& comm) {
    std::vector<int> data(10);
    std::iota(data.begin(), data.end(), comm.rank() * 100);
    pdcoll::exec::sync_wait(pdcoll::all_reduce<pdcoll::algo::ring>(comm, data, pdcoll::op::sum));
    for (int i = 0; i < 10; ++i) CHECK(data[i] == 3 * i + 300);
  });
}
