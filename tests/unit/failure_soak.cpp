// Soak: 10,000 collectives of random kinds, sizes, algorithms and ops on 4
// ranks over inproc; zero wrong results, resident memory flat after warm-up,
// the registration cache within its capacity.
#include <doctest/doctest.h>

#include <pdcoll/pdcoll.hpp>
#include <support/inproc_world.hpp>

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <fstream>
#include <random>
#include <system_error>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
// A small quarantine keeps ASan's own retention from looking like a leak in the RSS check.
extern "C" const char* __asan_default_options() { return "quarantine_size_mb=16"; }
#endif

namespace {

long resident_kib() {
  std::ifstream statm("/proc/self/statm");
  long size = 0, resident = 0;
  statm >> size >> resident;
  return resident * (::sysconf(_SC_PAGESIZE) / 1024);
}

}  // namespace

TEST_CASE("10000 random collectives on 4 ranks give no wrong result and keep memory flat") {
  constexpr int world = 4, iterations = 10000;
  std::atomic<int> wrong{0}, errors{0};
  std::atomic<long> warm_kib{0}, peak_kib{0};
  std::atomic<std::size_t> cache_entries{0};
  pdcoll::communicator_options options;
  options.timeout = std::chrono::seconds(30);
  pdcoll::testing::run_inproc(world, [&](pdcoll::communicator& comm) {
    const int rank = comm.rank();
    std::mt19937 rng(2024);  // the same sequence on every rank
    for (int it = 0; it < iterations; ++it) {
      if (rank == 0 && it == iterations / 4) warm_kib = resident_kib();
      const std::size_t n = 1 + rng() % 3000;
      const unsigned kind = rng() % 6, choice = rng();
      try {
        bool right = true;
        switch (kind) {
          case 0: {  // all_reduce sum, algorithm chosen at random
            std::vector<std::int32_t> d(n, rank + it % 7);
            const std::int32_t want = world * (it % 7) + world * (world - 1) / 2;
            switch (choice % 6) {
              case 0: pdcoll::exec::sync_wait(pdcoll::all_reduce<pdcoll::algo::ring>(comm, d)); break;
              case 1: pdcoll::exec::sync_wait(pdcoll::all_reduce<pdcoll::algo::recursive_doubling>(comm, d)); break;
              case 2: pdcoll::exec::sync_wait(pdcoll::all_reduce<pdcoll::algo::rabenseifner>(comm, d)); break;
              case 3: pdcoll::exec::sync_wait(pdcoll::all_reduce<pdcoll::algo::tree>(comm, d)); break;
              case 4: pdcoll::exec::sync_wait(pdcoll::all_reduce<pdcoll::algo::two_shot_chunked<4096, 2>>(comm, d)); break;
              default: pdcoll::exec::sync_wait(pdcoll::all_reduce<pdcoll::algo::direct>(comm, d)); break;
            }
            for (auto v : d) right = right && v == want;
            break;
          }
          case 1: {  // all_reduce max / min / prod on floats
            std::vector<float> d(n, static_cast<float>(rank + 1));
            const unsigned op = choice % 3;
            if (op == 0) pdcoll::exec::sync_wait(pdcoll::all_reduce(comm, d, pdcoll::op::max));
            if (op == 1) pdcoll::exec::sync_wait(pdcoll::all_reduce(comm, d, pdcoll::op::min));
            if (op == 2) pdcoll::exec::sync_wait(pdcoll::all_reduce(comm, d, pdcoll::op::prod));
            const float want = op == 0 ? 4.0f : op == 1 ? 1.0f : 24.0f;
            for (auto v : d) right = right && v == want;
            break;
          }
          case 2: {  // broadcast from a random root
            const int root = static_cast<int>(choice % world);
            std::vector<std::int32_t> d(n, rank == root ? it : -1);
            pdcoll::exec::sync_wait(pdcoll::broadcast(comm, d, root));
            for (auto v : d) right = right && v == it;
            break;
          }
          case 3: {  // all_gather
            std::vector<std::int32_t> in(n, rank), out(n * world, -1);
            pdcoll::exec::sync_wait(pdcoll::all_gather(comm, in, out));
            for (std::size_t i = 0; i < out.size(); ++i) right = right && out[i] == static_cast<int>(i / n);
            break;
          }
          case 4: {  // reduce_scatter
            std::vector<std::int32_t> in(n * world, 1), out(n, 0);
            pdcoll::exec::sync_wait(pdcoll::reduce_scatter(comm, in, out));
            for (auto v : out) right = right && v == world;
            break;
          }
          default: {  // reduce to a random root
            const int root = static_cast<int>(choice % world);
            std::vector<std::int32_t> in(n, 2), out(n, 0);
            pdcoll::exec::sync_wait(pdcoll::reduce(comm, in, out, pdcoll::op::sum, root));
            if (rank == root)
              for (auto v : out) right = right && v == 2 * world;
            break;
          }
        }
        if (!right) ++wrong;
      } catch (const std::system_error&) {
        ++errors;
      }
      if (rank == 0 && it > iterations / 4 && it % 100 == 0) {
        long now = resident_kib();
        if (now > peak_kib) peak_kib = now;
      }
    }
    if (rank == 0) cache_entries = comm.registration_statistics().live_entries;
  }, options);
  const long growth = peak_kib.load() - warm_kib.load();
  MESSAGE("resident memory after warm-up: " << warm_kib.load() << " KiB, peak " << peak_kib.load() << " KiB (+"
                                            << growth << " KiB)");
  CHECK(errors.load() == 0);
  CHECK(wrong.load() == 0);
  CHECK(growth < 24 * 1024);
  CHECK(cache_entries.load() <= 1024);
}
