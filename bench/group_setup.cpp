// group_setup: how long job::split takes (bootstrap/split.hpp, group.hpp).
//
//     tools/pdcoll-run -n 8 build-bench/bench/group_setup [rounds]
//
// Splits the job into two groups (even and odd ranks) `rounds` times
// (default 7), each after a store barrier, and prints rank 0's median,
// lowest and highest time in split() itself: the membership all_gather,
// the group endpoint's setup through the store and the closing round. The
// group's final barrier, when it is destroyed, is not counted.
#include <pdcoll/pdcoll.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 7;
  pdcoll::job job = pdcoll::job::from_environment();
  std::vector<double> ms;
  for (int i = 0; i < rounds; ++i) {
    job.store().barrier();
    const auto start = std::chrono::steady_clock::now();
    auto group = job.split(job.rank() % 2);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  if (job.rank() == 0)
    std::printf("split of %d ranks into 2 groups over %s, %d rounds: median %.2f ms (lowest %.2f, highest %.2f)\n",
                job.world_size(), job.comm().transport_name().c_str(), rounds, ms[ms.size() / 2], ms.front(),
                ms.back());
}
