// peer_direct — the same all-reduce on (emulated) device memory two ways:
// directly (the fabric registers the device memory and moves it in place:
// Peer Direct) and through host bounce buffers (the "before Peer Direct"
// picture), on the same provider, printing what each one cost.
//
//     tools/pdcoll-run -n 2 build/default/examples/peer_direct            # libfabric shm
//     PDCOLL_PROVIDER=tcp tools/pdcoll-run -n 4 build/default/examples/peer_direct
//     PDCOLL_TRANSPORT=uring tools/pdcoll-run -n 2 build/default/examples/peer_direct
//
// Over libfabric the staged run uses a second communicator on the same
// provider with communicator_options::force_host_staging (what
// PDCOLL_FORCE_STAGING=1 sets). io_uring TCP can only stage, so there both
// runs take the staged path and the program says so.
#include <pdcoll/memory/domains.hpp>
#include <pdcoll/memory/track.hpp>
#include <pdcoll/pdcoll.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace {

using device = pdcoll::memory::emulated_device;

struct outcome {
  double busbw_gbs = 0;
  bool correct = false;
};

// Runs `iters` all-reduces of `n` floats on device memory and checks the last.
outcome measure(pdcoll::communicator& comm, device& dev, std::size_t n, int iters) {
  const int P = comm.world_size();
  std::vector<float> host(n, 1.0f);
  auto buf = dev.allocate<float>(n);
  std::vector<double> times;
  for (int i = 0; i < iters + 1; ++i) {
    dev.copy_from_host(std::span<const float>(host), buf.view());  // fresh input (counted below as setup)
    auto t0 = std::chrono::steady_clock::now();
    pdcoll::exec::sync_wait(pdcoll::all_reduce(comm, buf.view(), pdcoll::op::sum) |
                            pdcoll::exec::with_deadline(std::chrono::seconds(60)));
    if (i > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::vector<float> out(n);
  dev.copy_to_host(buf.const_view(), std::span<float>(out));
  std::sort(times.begin(), times.end());
  const double t = times[times.size() / 2];
  const double algbw = static_cast<double>(n * sizeof(float)) / t / 1e9;
  outcome o;
  o.busbw_gbs = algbw * 2.0 * (P - 1) / P;
  o.correct = std::all_of(out.begin(), out.end(), [&](float x) { return x == static_cast<float>(P); });
  return o;
}

/// Runs `label`'s all-reduces, prints rank 0's line; returns whether this
/// rank's result was right.
bool report(const char* label, pdcoll::communicator& comm, device& dev, std::size_t n, int iters) {
  const auto regs0 = comm.registration_statistics();
  const auto path0 = comm.data_path_statistics();
  dev.reset_counters();
  const auto o = measure(comm, dev, n, iters);
  const auto c = dev.counters();
  const auto regs = comm.registration_statistics();
  const auto path = comm.data_path_statistics();
  // The program's own uploads/downloads: iters + 1 uploads and one download of n floats.
  const std::uint64_t own = static_cast<std::uint64_t>(iters + 2) * n * sizeof(float);
  if (comm.rank() != 0) return o.correct;
  std::printf("%-8s path %-12s result %-7s staged through host %8.1f MiB (%llu chunks)  "
              "registrations %llu  cache hits %llu misses %llu  busbw %.2f GB/s\n",
              label, std::string(pdcoll::transport::to_string(path.last_path)).c_str(), o.correct ? "correct" : "WRONG",
              static_cast<double>(path.staged_bytes - path0.staged_bytes) / (1 << 20),
              static_cast<unsigned long long>(path.staged_chunks - path0.staged_chunks),
              static_cast<unsigned long long>(regs.registrations - regs0.registrations),
              static_cast<unsigned long long>(regs.hits - regs0.hits),
              static_cast<unsigned long long>(regs.misses - regs0.misses), o.busbw_gbs);
  std::printf("%-8s domain copies: %.1f MiB device->host, %.1f MiB host->device (of which %.1f MiB are this "
              "program's uploads/downloads)\n",
              "", static_cast<double>(c.device_to_host_bytes) / (1 << 20),
              static_cast<double>(c.host_to_device_bytes) / (1 << 20), static_cast<double>(own) / (1 << 20));
  return o.correct;
}

}  // namespace

int main() try {
  pdcoll::job job = pdcoll::job::from_environment();
  auto& comm = job.comm();
  device dev(std::size_t{256} << 20);
  auto tracking = pdcoll::track_frees(dev, comm);  // frees invalidate cached registrations
  const std::size_t n = std::size_t{16} << 20 >> 2;  // 16 MiB of floats
  const int iters = 5;
  if (comm.rank() == 0)
    std::printf("all_reduce of %zu MiB of emulated device memory over %d ranks, %s\n", n * sizeof(float) >> 20,
                comm.world_size(), comm.transport_name().c_str());

  bool correct = report("direct", comm, dev, n, iters);

  if (comm.transport_name().rfind("libfabric", 0) == 0) {
    // A second communicator on the same provider that always stages.
    pdcoll::communicator_options staged_options;
    staged_options.force_host_staging = true;
    pdcoll::communicator staged(
        pdcoll::transport::libfabric::make_endpoint(job.rank(), job.world_size(), job.store().exchange()),
        staged_options);
    auto staged_tracking = pdcoll::track_frees(dev, staged);
    correct = report("staged", staged, dev, n, iters) && correct;
    pdcoll::exec::sync_wait(pdcoll::barrier(staged) | pdcoll::exec::with_deadline(std::chrono::seconds(60)));
  } else if (comm.rank() == 0) {
    std::printf("(%s reaches device memory only through host staging: the run above is the staged one)\n",
                comm.transport_name().c_str());
  }
  if (!correct) std::fprintf(stderr, "peer_direct: rank %d got a wrong all-reduce result\n", comm.rank());
  return correct ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "peer_direct: %s\n", e.what());
  return 1;
}
