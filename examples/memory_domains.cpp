// memory_domains — the same collectives on each kind of memory pdcoll knows,
// over whichever transport the environment picks, and how to see what ran:
//
//   * host memory: std::vector / std::span convert to pdcoll::view<T>;
//     pdcoll::memory::host::allocate gives (huge-page backed) host buffers;
//   * emulated device memory: a memfd-backed stand-in for accelerator memory
//     that hands out no host pointer; data goes in and out only through
//     copy_to_host / copy_from_host, which the domain counts;
//   * the data path each collective took (direct, or staged through host
//     bounce buffers) and what the registration cache did.
//
//     tools/pdcoll-run -n 2 build/default/examples/memory_domains                          # libfabric shm
//     PDCOLL_PROVIDER=tcp tools/pdcoll-run -n 3 build/default/examples/memory_domains      # libfabric tcp
//     PDCOLL_TRANSPORT=uring tools/pdcoll-run -n 2 build/default/examples/memory_domains   # io_uring TCP (staged)
#include <pdcoll/memory/domains.hpp>
#include <pdcoll/memory/track.hpp>
#include <pdcoll/pdcoll.hpp>

#include <cstdio>
#include <numeric>
#include <vector>

int main() try {
  pdcoll::job job = pdcoll::job::from_environment();
  auto& comm = job.comm();
  const int rank = comm.rank(), world = comm.world_size();
  const std::size_t n = 1 << 16;
  bool ok = true;

  // 1. Host memory: a vector, in place.
  std::vector<double> host_values(n, rank + 1.0);
  pdcoll::exec::sync_wait(pdcoll::all_reduce(comm, host_values, pdcoll::op::sum));
  ok &= host_values[n - 1] == world * (world + 1) / 2.0;

  // 2. Host memory from the host domain, backed by huge pages where the kernel offers them.
  auto big = pdcoll::memory::host::allocate<float>(n, pdcoll::memory::huge_pages::yes);
  std::fill_n(big.view().data(), n, 1.0f);
  pdcoll::exec::sync_wait(pdcoll::broadcast(comm, big.view(), /*root=*/0));

  // 3. Emulated device memory. track_frees keeps the registration cache
  //    honest: freeing a buffer drops its cached registration.
  pdcoll::memory::emulated_device device(64 << 20);
  auto tracking = pdcoll::track_frees(device, comm);
  auto grads = device.allocate<float>(n);
  std::vector<float> staging(n, static_cast<float>(rank));
  device.copy_from_host(std::span<const float>(staging), grads.view());
  device.reset_counters();  // count only what the collectives copy
  pdcoll::exec::sync_wait(pdcoll::all_reduce(comm, grads.view(), pdcoll::op::max));
  const auto path = comm.last_data_path();
  const auto copies = device.counters();
  device.copy_to_host(grads.const_view(), std::span<float>(staging));
  ok &= staging[0] == static_cast<float>(world - 1);

  if (rank == 0) {
    const auto reg = comm.registration_statistics();
    std::printf("transport %s, %d ranks\n", comm.transport_name().c_str(), world);
    std::printf("host vector all_reduce and host buffer (%s pages) broadcast done\n",
                std::string(pdcoll::memory::to_string(big.backing())).c_str());
    std::printf("device all_reduce took the %s path; device->host bytes %llu, host->device bytes %llu\n",
                std::string(pdcoll::transport::to_string(path)).c_str(),
                static_cast<unsigned long long>(copies.device_to_host_bytes),
                static_cast<unsigned long long>(copies.host_to_device_bytes));
    std::printf("registration cache: %llu hits, %llu misses\n", static_cast<unsigned long long>(reg.hits),
                static_cast<unsigned long long>(reg.misses));
    std::printf("%s\n", ok ? "all results verified" : "WRONG RESULT");
  }
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "memory_domains: %s\n", e.what());
  return 1;
}
