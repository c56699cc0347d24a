// File: tests/consumer/main.cpp — the README's "Using it from a runtime"
// program, built by the consumer tests against pdcoll as a user gets it
// (find_package from an install prefix, add_subdirectory, pkg-config) and
// run with `pdcoll-run -n 2`. It checks what the README's code computes.
#include <pdcoll/pdcoll.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <vector>

int main() try {
  // --- the README's code, unchanged ---
  pdcoll::job job = pdcoll::job::from_environment();   // pdcoll-run, mpirun, srun or torchrun
  auto& comm = job.comm();

  std::vector<float> bucket0(1 << 20, 1.0f), bucket1(1 << 18, 2.0f);
  // Both all-reduces are in flight at once; when_all completes when both have.
  auto step = pdcoll::exec::when_all(
      pdcoll::all_reduce(comm, bucket0, pdcoll::op::sum),
      pdcoll::all_reduce<pdcoll::algo::recursive_doubling>(comm, bucket1, pdcoll::op::avg));
  pdcoll::exec::sync_wait(std::move(step) | pdcoll::exec::with_deadline(std::chrono::seconds(30)));
  // --- end of the README's code ---

  // Sum of ones is the world size (exact in float); the average of 2.0 is 2.0.
  const float world = static_cast<float>(comm.world_size());
  const bool sum_ok = std::all_of(bucket0.begin(), bucket0.end(), [&](float x) { return x == world; });
  const bool avg_ok = std::all_of(bucket1.begin(), bucket1.end(), [](float x) { return x == 2.0f; });
  std::printf("consumer: rank %d of %d over %s: sum %s, avg %s\n", comm.rank(), comm.world_size(),
              comm.transport_name().c_str(), sum_ok ? "ok" : "WRONG", avg_ok ? "ok" : "WRONG");
  return sum_ok && avg_ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "consumer: %s\n", e.what());
  return 1;
}
