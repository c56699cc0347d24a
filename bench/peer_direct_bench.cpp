// File: bench/peer_direct_bench.cpp — Peer Direct versus host staging:
// all-reduce bus bandwidth on emulated device memory from 64 KiB to 256 MiB,
// in one run over one provider, for three communicators side by side:
// direct with the registration cache, direct without it
// (cache_registrations = false: register/deregister around every
// operation), and host-staged (force_host_staging).
//
//     tools/pdcoll-run -n 2 build-rel/bench/peer_direct_bench [max_bytes]
//     PDCOLL_PROVIDER=tcp tools/pdcoll-run -n 4 build-rel/bench/peer_direct_bench
//
// Build optimised (-DCMAKE_BUILD_TYPE=Release). busbw is nccl-tests'
// algbw * 2(P-1)/P; each cell is the median of several runs (fewer for
// large sizes). Nothing here is tuned for the emulation: the emulated
// device's copies are plain memcpy on the calling core.
#include <pdcoll/memory/domains.hpp>
#include <pdcoll/memory/track.hpp>
#include <pdcoll/pdcoll.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace {

using device = pdcoll::memory::emulated_device;

double median_seconds(pdcoll::communicator& comm, device& dev, std::size_t bytes, int iters) {
  auto buf = dev.allocate<float>(bytes / sizeof(float));
  std::vector<double> times;
  for (int i = 0; i < iters + 1; ++i) {
    pdcoll::exec::sync_wait(pdcoll::barrier(comm));
    auto t0 = std::chrono::steady_clock::now();
    pdcoll::exec::sync_wait(pdcoll::all_reduce(comm, buf.view(), pdcoll::op::sum) |
                            pdcoll::exec::with_deadline(std::chrono::seconds(120)));
    if (i > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

std::unique_ptr<pdcoll::communicator> twin(pdcoll::job& job, bool cache, bool staged) {
  pdcoll::communicator_options o;
  o.cache_registrations = cache;
  o.force_host_staging = staged;
  auto ep = pdcoll::transport::libfabric::make_endpoint(job.rank(), job.world_size(), job.store().exchange());
  return std::make_unique<pdcoll::communicator>(std::move(ep), o);
}

}  // namespace

int main(int argc, char** argv) try {
  const std::size_t max_bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : std::size_t{256} << 20;
  pdcoll::job job = pdcoll::job::from_environment();
  if (job.comm().transport_name().rfind("libfabric", 0) != 0) {
    std::fprintf(stderr, "peer_direct_bench: needs PDCOLL_TRANSPORT=libfabric (uring can only stage)\n");
    return 2;
  }
  const int P = job.world_size();
  device dev(2 * max_bytes + (std::size_t{64} << 20));  // the buffer plus algorithm scratch (rabenseifner: n)
  auto direct = twin(job, true, false);
  auto uncached = twin(job, false, false);
  auto staged = twin(job, true, true);
  auto t1 = pdcoll::track_frees(dev, *direct);
  auto t2 = pdcoll::track_frees(dev, *staged);
  if (job.rank() == 0) {
    std::printf("# all_reduce sum float32 on emulated_device memory, %d ranks, %s; busbw in GB/s\n", P,
                direct->transport_name().c_str());
    std::printf("%12s %12s %14s %12s %14s %14s\n", "bytes", "direct", "direct-nocache", "staged", "direct/staged",
                "cache on/off");
  }
  for (std::size_t bytes = 64 << 10; bytes <= max_bytes; bytes *= 4) {
    const int iters = static_cast<int>(std::clamp<std::size_t>((std::size_t{64} << 20) / bytes, 3, 20));
    const double f = 2.0 * (P - 1) / P / 1e9 * static_cast<double>(bytes);
    const double bw_direct = f / median_seconds(*direct, dev, bytes, iters);
    const double bw_uncached = f / median_seconds(*uncached, dev, bytes, iters);
    const double bw_staged = f / median_seconds(*staged, dev, bytes, iters);
    if (job.rank() == 0) {
      std::printf("%12zu %12.3f %14.3f %12.3f %14.2f %14.2f\n", bytes, bw_direct, bw_uncached, bw_staged,
                  bw_direct / bw_staged, bw_direct / bw_uncached);
      std::fflush(stdout);
    }
  }
  const auto reg = direct->registration_statistics();
  const auto st = staged->data_path_statistics();
  if (job.rank() == 0)
    std::printf("# direct: %llu registrations, %llu hits, %llu misses; staged: %llu MiB through host in %llu chunks\n",
                static_cast<unsigned long long>(reg.registrations), static_cast<unsigned long long>(reg.hits),
                static_cast<unsigned long long>(reg.misses), static_cast<unsigned long long>(st.staged_bytes >> 20),
                static_cast<unsigned long long>(st.staged_chunks));
  for (auto* c : {direct.get(), uncached.get(), staged.get()}) pdcoll::exec::sync_wait(pdcoll::barrier(*c));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "peer_direct_bench: %s\n", e.what());
  return 1;
}
