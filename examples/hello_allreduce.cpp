// hello_allreduce — the shortest complete pdcoll program: join the job, run an
// all-reduce, check it, and print a small bus-bandwidth table on ordinary
// and on shareable buffers (every timed all-reduce is checked too; a wrong
// element makes the exit status 1).
//
//     tools/pdcoll-run -n 4 build/default/examples/hello_allreduce
#include <pdcoll/pdcoll.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <span>
#include <vector>

int main() try {
  pdcoll::job job = pdcoll::job::from_environment();
  auto& comm = job.comm();
  const int rank = comm.rank(), world = comm.world_size();

  // 1. One all-reduce, checked: rank r contributes r + 1 everywhere, so every
  //    element must come back as 1 + 2 + … + world.
  std::vector<float> grads(1 << 20, static_cast<float>(rank + 1));
  pdcoll::exec::sync_wait(pdcoll::all_reduce(comm, grads, pdcoll::op::sum));
  const float expected = static_cast<float>(world * (world + 1) / 2);
  std::ptrdiff_t wrong = std::count_if(grads.begin(), grads.end(), [&](float x) { return x != expected; });
  if (rank == 0)
    std::printf("all_reduce of %zu floats over %d ranks (%s): every element %s %.0f\n", grads.size(), world,
                comm.transport_name().c_str(), wrong ? "is NOT" : "is", expected);

  // 2. Bus bandwidth (nccl-tests' definition: algbw * 2(n-1)/n), median of
  //    10, on ordinary memory (a vector) and on shareable host memory, which
  //    ranks on one host over shm reduce in place (from 256 KiB) instead of
  //    copying through shared memory. Each result is checked too.
  auto median_seconds = [&](std::span<float> data) {
    std::vector<double> times;
    for (int iter = 0; iter < 12; ++iter) {
      std::fill(data.begin(), data.end(), 1.0f);
      auto t0 = std::chrono::steady_clock::now();
      pdcoll::exec::sync_wait(pdcoll::all_reduce(comm, data, pdcoll::op::sum));
      if (iter >= 2) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      wrong += std::count_if(data.begin(), data.end(), [&](float x) { return x != static_cast<float>(world); });
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  };
  if (rank == 0)
    std::printf("%12s %12s %12s %12s %20s\n", "bytes", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "shareable busbw(GB/s)");
  for (std::size_t bytes = 4 << 10; bytes <= (64u << 20); bytes *= 4) {
    std::vector<float> data(bytes / sizeof(float));
    auto shareable = pdcoll::memory::host::allocate_shareable<float>(bytes / sizeof(float));
    const double t = median_seconds(data), t_shareable = median_seconds(shareable.span());
    const double factor = 2.0 * (world - 1) / world, algbw = static_cast<double>(bytes) / t / 1e9;
    if (rank == 0)
      std::printf("%12zu %12.1f %12.3f %12.3f %20.3f\n", bytes, t * 1e6, algbw, algbw * factor,
                  static_cast<double>(bytes) / t_shareable / 1e9 * factor);
  }
  if (rank == 0 && wrong) std::printf("%lld wrong elements in the bandwidth runs\n", static_cast<long long>(wrong));
  return wrong ? 1 : 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "hello_allreduce: %s\n", e.what());
  return 1;
}
