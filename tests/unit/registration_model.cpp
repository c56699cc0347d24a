// Randomised model check of registration_cache: long runs of allocate,
// acquire, release, free (invalidate), reuse and partial invalidation against
// a reference model of memory, asserting the cache's guarantees after every
// step. The "threads" suite runs the same model from several threads on one
// mutex_lock cache (it is what build-cache-tsan runs under ThreadSanitizer).
#include <doctest/doctest.h>

#include <pdcoll/registration/registration_cache.hpp>

#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "unit/registration_counting_registrar.hpp"

namespace reg = pdcoll::registration;
using reg::testing::counting_registrar;
using reg::testing::host_region;
using pdcoll::transport::memory_region;

namespace {

// The reference model of memory: one epoch per 64-byte granule of a made-up
// address space, bumped whenever the granule is freed or remapped. A
// registration records the epochs of its range when it is made; it covers
// invalidated memory exactly when one of them has changed since. Requests and
// invalidations are granule-aligned, so the model is exact.
struct model_memory {
  static constexpr std::uintptr_t base = 0x40000000;
  static constexpr std::size_t granule = 64;
  static constexpr std::size_t slot_stride = 4096;     // gaps keep slots from merging
  static constexpr std::size_t slot_granules = 16;     // up to 1 KiB per allocation
  explicit model_memory(std::size_t slots) : epochs(slots * slot_stride / granule, 0) {}

  static std::uintptr_t slot_start(std::size_t slot) { return base + slot * slot_stride; }
  std::vector<std::uint32_t> snapshot(std::uintptr_t start, std::size_t length) const {
    const std::size_t first = (start - base) / granule;
    const std::size_t last = (start + length - base + granule - 1) / granule;
    return {epochs.begin() + static_cast<std::ptrdiff_t>(first), epochs.begin() + static_cast<std::ptrdiff_t>(last)};
  }
  void bump(std::uintptr_t start, std::size_t length) {
    for (std::size_t g = (start - base) / granule; g < (start + length - base) / granule; ++g) ++epochs[g];
  }
  std::vector<std::uint32_t> epochs;  // each thread writes only its own slots' granules
};

struct model_limits {
  std::size_t max_entries;
  std::size_t max_bytes;
  bool exact_accounting;  // only when one thread drives the cache
};

// Runs `operations` random steps on `own_slots` (allocated, freed, reused,
// invalidated by this caller only) and `shared_slots` (allocated for good,
// never invalidated, acquired by everyone). Returns the first violated
// guarantee, or an empty string.
template <class Cache>
std::string run_model(Cache& cache, counting_registrar& registrar, model_memory& memory,
                      const std::vector<std::size_t>& own_slots, const std::vector<std::size_t>& shared_slots,
                      std::uint64_t seed, int operations, model_limits limits) {
  using pin = typename Cache::pinned_registration;
  struct slot_state {
    std::uintptr_t start;
    std::size_t length = 0;
    bool alive = false;
  };
  struct held {
    pin registration;
    std::uintptr_t start;
    std::uintptr_t end;
  };
  std::mt19937_64 rng(seed);
  auto uniform = [&](std::size_t lo, std::size_t hi) {  // inclusive
    return std::uniform_int_distribution<std::size_t>(lo, hi)(rng);
  };
  std::vector<slot_state> own(own_slots.size());
  for (std::size_t i = 0; i < own.size(); ++i) own[i].start = model_memory::slot_start(own_slots[i]);
  std::vector<held> pins;
  constexpr std::size_t max_pins = 24;
  std::ostringstream why;

  auto fail = [&](int step, const std::string& what) {
    why << "seed " << seed << ", step " << step << ": " << what;
    return why.str();
  };
  // A granule-aligned sub-range of [start, start + length).
  auto sub_range = [&](std::uintptr_t start, std::size_t length) {
    const std::size_t granules = length / model_memory::granule;
    const std::size_t first = uniform(0, granules - 1);
    const std::size_t count = uniform(1, granules - first);
    return std::pair{start + first * model_memory::granule, count * model_memory::granule};
  };

  for (int step = 0; step < operations; ++step) {
    const std::size_t op = uniform(0, 99);
    std::vector<std::size_t> alive;
    std::vector<std::size_t> dead;
    for (std::size_t i = 0; i < own.size(); ++i) (own[i].alive ? alive : dead).push_back(i);

    if (op < 45 || (op < 75 && pins.empty()) || op >= 98) {
      if (pins.size() >= max_pins) {
        pins.erase(pins.begin() + static_cast<std::ptrdiff_t>(uniform(0, pins.size() - 1)));
        continue;
      }
      std::uintptr_t start = 0;
      std::size_t length = 0;
      if (!shared_slots.empty() && (alive.empty() || uniform(0, 4) == 0)) {
        const auto s = shared_slots[uniform(0, shared_slots.size() - 1)];
        std::tie(start, length) = sub_range(model_memory::slot_start(s), model_memory::slot_granules * model_memory::granule);
      } else if (!alive.empty()) {
        const auto& s = own[alive[uniform(0, alive.size() - 1)]];
        std::tie(start, length) = sub_range(s.start, s.length);
      } else {
        continue;
      }
      auto acquired = cache.acquire(host_region(start, length));
      if (!acquired) return fail(step, "acquire failed: " + acquired.error().message());
      const auto record = registrar.info(acquired->handle().id);
      const auto at = reinterpret_cast<std::uintptr_t>(record.region.address);
      if (at > start || at + record.region.length < start + length)
        return fail(step, "the registration does not cover the request");
      if (record.deregistrations != 0) return fail(step, "acquire returned a deregistered registration");
      if (record.snapshot != memory.snapshot(at, record.region.length))
        return fail(step, "acquire returned a registration covering invalidated memory");
      pins.push_back(held{std::move(*acquired), start, start + length});
    } else if (op < 75) {
      pins.erase(pins.begin() + static_cast<std::ptrdiff_t>(uniform(0, pins.size() - 1)));
    } else if (op < 82) {
      if (alive.empty()) continue;
      auto& s = own[alive[uniform(0, alive.size() - 1)]];
      memory.bump(s.start, s.length);
      if (cache.invalidate(host_region(s.start, s.length))) return fail(step, "invalidate failed");
      s.alive = false;
    } else if (op < 89) {
      if (dead.empty()) continue;
      auto& s = own[dead[uniform(0, dead.size() - 1)]];
      s.length = uniform(1, model_memory::slot_granules) * model_memory::granule;
      s.alive = true;
    } else if (op < 97) {
      if (alive.empty()) continue;
      const auto& s = own[alive[uniform(0, alive.size() - 1)]];
      const auto [start, length] = sub_range(s.start, s.length);
      memory.bump(start, length);
      if (cache.invalidate(host_region(start, length))) return fail(step, "invalidate failed");
    } else {
      cache.clear();
    }

    // The guarantees, after every step.
    for (const auto& h : pins)
      if (registrar.deregistrations(h.registration.handle().id) != 0)
        return fail(step, "a pinned registration was deregistered");
    const auto stats = cache.statistics();
    if (stats.live_entries > limits.max_entries || stats.live_bytes > limits.max_bytes)
      return fail(step, "cached entries exceed the capacity");
    if (limits.exact_accounting) {
      if (registrar.live() != stats.live_entries + stats.retired_in_use)
        return fail(step, "a registration is neither cached nor pinned (leak)");
      if (stats.retired_in_use > pins.size()) return fail(step, "more retired registrations than pins");
    }
  }
  pins.clear();
  return {};
}

constexpr int model_operations = 100'000;

}  // namespace

TEST_SUITE("registration model") {

TEST_CASE("registration_cache with no_lock, max_entries<8> and max_bytes<4096> keeps every guarantee over 100,000 random operations") {
  counting_registrar registrar;
  model_memory memory(8);
  registrar.take_snapshot = [&](const memory_region& r) {
    return memory.snapshot(reinterpret_cast<std::uintptr_t>(r.address), r.length);
  };
  {
    reg::registration_cache<counting_registrar, reg::max_entries<8>, reg::max_bytes<4096>, reg::no_lock> cache{registrar};
    const auto failure = run_model(cache, registrar, memory, {0, 1, 2, 3, 4, 5, 6}, {7}, 0x5eed'0001, model_operations,
                                   {8, 4096, true});
    CHECK_MESSAGE(failure.empty(), failure);
    const auto s = cache.statistics();
    MESSAGE("hits " << s.hits << ", misses " << s.misses << ", evictions " << s.evictions << ", invalidations "
                    << s.invalidations << ", merges " << s.merges << ", uncached " << s.uncached_registrations);
    // The run must have exercised every path it claims to test.
    CHECK(s.hits > 1000);
    CHECK(s.evictions > 100);
    CHECK(s.invalidations > 100);
    CHECK(s.merges > 100);
    CHECK(s.uncached_registrations > 0);
    cache.clear();
    CHECK(registrar.live() == 0);
  }
  CHECK(registrar.all_deregistered_once());
}

TEST_CASE("registration_cache with the default policies and a roomy cache keeps every guarantee over 100,000 random operations") {
  counting_registrar registrar;
  model_memory memory(8);
  registrar.take_snapshot = [&](const memory_region& r) {
    return memory.snapshot(reinterpret_cast<std::uintptr_t>(r.address), r.length);
  };
  {
    reg::registration_cache<counting_registrar> cache{registrar};
    const auto failure = run_model(cache, registrar, memory, {0, 1, 2, 3, 4, 5}, {6, 7}, 0x5eed'0002, model_operations,
                                   {1024, ~std::size_t{0}, true});
    CHECK_MESSAGE(failure.empty(), failure);
    CHECK(cache.statistics().hits > 10'000);
  }
  CHECK(registrar.all_deregistered_once());
}

}  // TEST_SUITE

TEST_SUITE("registration model threads") {

TEST_CASE("registration_cache with mutex_lock keeps every guarantee over 100,000 random operations from 4 threads") {
  constexpr int threads = 4;
  constexpr std::size_t own_per_thread = 6;
  constexpr std::size_t shared = 3;
  counting_registrar registrar;
  model_memory memory(threads * own_per_thread + shared);
  registrar.take_snapshot = [&](const memory_region& r) {
    return memory.snapshot(reinterpret_cast<std::uintptr_t>(r.address), r.length);
  };
  std::vector<std::size_t> shared_slots;
  for (std::size_t i = 0; i < shared; ++i) shared_slots.push_back(threads * own_per_thread + i);
  std::vector<std::string> failures(threads);
  {
    reg::registration_cache<counting_registrar, reg::mutex_lock, reg::max_entries<16>, reg::max_bytes<8192>> cache{
        registrar};
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        std::vector<std::size_t> own;
        for (std::size_t i = 0; i < own_per_thread; ++i) own.push_back(t * own_per_thread + i);
        failures[t] = run_model(cache, registrar, memory, own, shared_slots, 0x7eed'0000 + t,
                                model_operations / threads, {16, 8192, false});
      });
    }
    for (auto& w : workers) w.join();
    for (const auto& f : failures) CHECK_MESSAGE(f.empty(), f);
    const auto s = cache.statistics();
    MESSAGE("hits " << s.hits << ", misses " << s.misses << ", lost races " << s.lost_races << ", merges "
                    << s.merges << ", evictions " << s.evictions);
    CHECK(registrar.live() == s.live_entries);
    CHECK(s.retired_in_use == 0);
    CHECK(s.pinned_entries == 0);
  }
  CHECK(registrar.all_deregistered_once());
}

}  // TEST_SUITE
