// hello_allreduce — the shortest complete pdcoll program: join the job, run an
// all-reduce, check it, and print a small bus-bandwidth table.
//
//     tools/pdcoll-run -n 4 build/default/examples/hello_allreduce
#include <pdcoll/pdcoll.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
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
  const auto wrong = std::count_if(grads.begin(), grads.end(), [&](float x) { return x != expected; });
  if (rank == 0)
    std::printf("all_reduce of %zu floats over %d ranks (%s): every element %s %.0f\n", grads.size(), world,
                comm.transport_name().c_str(), wrong ? "is NOT" : "is", expected);

  // 2. Bus bandwidth (nccl-tests' definition: algbw * 2(n-1)/n), median of 10.
  if (rank == 0) std::printf("%12s %12s %12s %12s\n", "bytes", "time(us)", "algbw(GB/s)", "busbw(GB/s)");
  for (std::size_t bytes = 4 << 10; bytes <= (64u << 20); bytes *= 4) {
    std::vector<float> data(bytes / sizeof(float), 1.0f);
    std::vector<double> times;
    for (int iter = 0; iter < 12; ++iter) {
      auto t0 = std::chrono::steady_clock::now();
      pdcoll::exec::sync_wait(pdcoll::all_reduce(comm, data, pdcoll::op::sum));
      if (iter >= 2) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    const double t = times[times.size() / 2], algbw = static_cast<double>(bytes) / t / 1e9;
    if (rank == 0)
      std::printf("%12zu %12.1f %12.3f %12.3f\n", bytes, t * 1e6, algbw, algbw * 2.0 * (world - 1) / world);
  }
  return wrong ? 1 : 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "hello_allreduce: %s\n", e.what());
  return 1;
}
