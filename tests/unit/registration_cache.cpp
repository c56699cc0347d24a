// Unit tests of registration_cache, one group per policy and per guarantee.
#include <doctest/doctest.h>

#include <pdcoll/communicator.hpp>
#include <pdcoll/memory/emulated_device.hpp>
#include <pdcoll/memory/track.hpp>
#include <pdcoll/exec/sync_wait.hpp>
#include <pdcoll/point_to_point.hpp>
#include <pdcoll/registration/registration_cache.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "unit/registration_counting_registrar.hpp"

namespace reg = pdcoll::registration;
using reg::testing::counting_registrar;
using reg::testing::host_region;
using pdcoll::errc;
using pdcoll::transport::memory_region;

namespace {

constexpr std::uintptr_t base = 0x10000000;

template <class Cache>
std::uint64_t id_of(const typename Cache::pinned_registration& p) {
  return p.handle().id;
}

// Acquires [base+50, base+150), which overlaps a cached [base, base+100),
// and checks that it came back uncached, registered alone (not merged).
template <class Cache>
typename Cache::pinned_registration acquire_alone(Cache& cache, const counting_registrar& r) {
  auto p = cache.acquire(host_region(base + 50, 100));
  REQUIRE(p);
  CHECK_FALSE(p->cached());
  const auto rec = r.info(p->handle().id).region;
  CHECK(rec.address == reinterpret_cast<void*>(base + 50));
  CHECK(rec.length == 100);
  return std::move(*p);
}

// A memfd standing in for a DMA-BUF: a real fd with its own inode.
struct memfd {
  memfd() : fd(::memfd_create("pdcoll-registration-test", 0)) {}
  ~memfd() {
    if (fd >= 0) ::close(fd);
  }
  memfd(const memfd&) = delete;
  memfd& operator=(const memfd&) = delete;
  int fd;
};

memory_region dmabuf_region(int fd, std::uint64_t offset, std::size_t length) {
  memory_region r;
  r.kind = pdcoll::transport::memory_kind::emulated_device;
  r.dmabuf_fd = fd;
  r.dmabuf_offset = offset;
  r.length = length;
  return r;
}

// An endpoint that only registers, counting registrations; `fail` makes
// them fail. Sends and receives are refused.
struct counting_endpoint final : pdcoll::transport::endpoint {
  int registered = 0;
  int deregistered = 0;
  bool fail = false;
  pdcoll::transport::data_path path = pdcoll::transport::data_path::host;
  int rank() const noexcept override { return 0; }
  int world_size() const noexcept override { return 1; }
  std::string name() const override { return "counting"; }
  std::error_code post_send(int, const void*, std::size_t, std::uint64_t, void*,
                            pdcoll::transport::completion_context*) noexcept override {
    return errc::transport;
  }
  std::error_code post_recv(int, void*, std::size_t, std::uint64_t, std::uint64_t, void*,
                            pdcoll::transport::completion_context*) noexcept override {
    return errc::transport;
  }
  void cancel(pdcoll::transport::completion_context*) noexcept override {}
  std::size_t progress() noexcept override { return 0; }
  void wait(std::chrono::steady_clock::time_point) noexcept override {}
  pdcoll::transport::data_path path_for(pdcoll::transport::memory_kind) const noexcept override { return path; }
  bool needs_registration(pdcoll::transport::memory_kind) const noexcept override { return true; }
  std::error_code register_region(const memory_region& region,
                                  pdcoll::transport::registration_handle& out) noexcept override {
    if (fail) return errc::registration_failed;
    ++registered;
    out.descriptor = region.address;
    out.key = 42;
    return {};
  }
  void deregister(pdcoll::transport::registration_handle& handle) noexcept override {
    ++deregistered;
    handle = {};
  }
};

// A communicator over a counting_endpoint that takes `path` for every kind
// of memory and registers everything, with the communicator's registration
// cache in front of it (as on a provider with FI_MR_LOCAL or FI_MR_HMEM).
struct caching_communicator {
  explicit caching_communicator(pdcoll::transport::data_path path)
      : caching_communicator(std::make_unique<counting_endpoint>(), path) {}

  const counting_endpoint* ep;
  pdcoll::communicator comm;

 private:
  caching_communicator(std::unique_ptr<counting_endpoint> owned, pdcoll::transport::data_path path)
      : ep((owned->path = path, owned.get())), comm{std::move(owned), caching()} {}
  static pdcoll::communicator_options caching() {
    pdcoll::communicator_options options;
    options.cache_registrations = true;
    return options;
  }
};

}  // namespace

static_assert(!std::is_copy_constructible_v<reg::registration_cache<counting_registrar>::pinned_registration>);
static_assert(std::is_nothrow_move_constructible_v<reg::registration_cache<counting_registrar>::pinned_registration>);
static_assert(std::is_same_v<reg::registration_cache<counting_registrar>::eviction_policy_type, reg::lru>);
static_assert(std::is_same_v<reg::registration_cache<counting_registrar>::locking_policy_type, reg::mutex_lock>);
static_assert(std::is_same_v<reg::registration_cache<counting_registrar, reg::no_lock, reg::max_bytes<64>>::locking_policy_type,
                             reg::no_lock>);

TEST_SUITE("registration cache") {

TEST_CASE_TEMPLATE("a request inside a cached range is a hit with the same handle", Lock, reg::no_lock,
                   reg::mutex_lock) {
  counting_registrar r;
  reg::registration_cache<counting_registrar, Lock> cache{r};
  std::uint64_t first = 0;
  {
    auto p = cache.acquire(host_region(base, 4096));
    REQUIRE(p);
    CHECK(p->cached());
    first = p->handle().id;
  }
  auto inner = cache.acquire(host_region(base + 100, 1000));
  REQUIRE(inner);
  CHECK(inner->handle().id == first);
  auto exact = cache.acquire(host_region(base, 4096));
  REQUIRE(exact);
  CHECK(exact->handle().id == first);
  const auto s = cache.statistics();
  CHECK(s.hits == 2);
  CHECK(s.misses == 1);
  CHECK(s.live_entries == 1);
  CHECK(s.live_bytes == 4096);
  CHECK(s.pinned_entries == 1);
  CHECK(r.registrations() == 1);
}

TEST_CASE("a request that straddles a cached range registers the union and retires the old entry") {
  counting_registrar r;
  reg::registration_cache<counting_registrar, reg::no_lock> cache{r};
  auto a = cache.acquire(host_region(base, 100));
  REQUIRE(a);
  auto b = cache.acquire(host_region(base + 50, 100));
  REQUIRE(b);
  CHECK(b->handle().id != a->handle().id);
  const auto merged = r.info(b->handle().id);
  CHECK(merged.region.address == reinterpret_cast<void*>(base));
  CHECK(merged.region.length == 150);
  // The old entry is pinned by `a`, so it lives until a's release.
  CHECK(r.deregistrations(a->handle().id) == 0);
  const auto old_id = a->handle().id;
  a->release();
  CHECK(r.deregistrations(old_id) == 1);
  auto c = cache.acquire(host_region(base + 10, 20));
  REQUIRE(c);
  CHECK(c->handle().id == b->handle().id);
  const auto s = cache.statistics();
  CHECK(s.merges == 1);
  CHECK(s.live_entries == 1);
  CHECK(s.live_bytes == 150);
}

TEST_CASE("adjacent ranges stay separate entries and each hits") {
  counting_registrar r;
  reg::registration_cache<counting_registrar, reg::no_lock> cache{r};
  { auto a = cache.acquire(host_region(base, 64)); REQUIRE(a); }
  { auto b = cache.acquire(host_region(base + 64, 64)); REQUIRE(b); }
  CHECK(cache.statistics().live_entries == 2);
  CHECK(cache.statistics().merges == 0);
  // A request spanning both is not inside either: it merges them.
  auto both = cache.acquire(host_region(base + 32, 64));
  REQUIRE(both);
  CHECK(r.info(both->handle().id).region.length == 128);
  CHECK(cache.statistics().live_entries == 1);
}

TEST_CASE("the same address in different hmem ifaces or devices does not alias") {
  counting_registrar r;
  reg::registration_cache<counting_registrar, reg::no_lock> cache{r};
  auto host = cache.acquire(host_region(base, 64));
  auto dev = host_region(base, 64);
  dev.hmem_iface = 4;
  auto on_iface = cache.acquire(dev);
  dev.device_id = 1;
  auto on_other_device = cache.acquire(dev);
  REQUIRE(host);
  REQUIRE(on_iface);
  REQUIRE(on_other_device);
  CHECK(cache.statistics().misses == 3);
  CHECK(cache.statistics().live_entries == 3);
}

TEST_CASE("DMA-BUF regions are keyed by the buffer's identity, not by the fd number") {
  counting_registrar r;
  reg::registration_cache<counting_registrar, reg::no_lock> cache{r};
  memfd buffer;
  REQUIRE(buffer.fd >= 0);
  const int other_fd = ::dup(buffer.fd);
  REQUIRE(other_fd >= 0);
  std::uint64_t id = 0;
  {
    auto p = cache.acquire(dmabuf_region(buffer.fd, 4096, 8192));
    REQUIRE(p);
    id = p->handle().id;
    CHECK(r.info(id).region.dmabuf_offset == 4096);
  }
  {
    // Another fd for the same buffer, a range inside: a hit.
    auto p = cache.acquire(dmabuf_region(other_fd, 5000, 100));
    REQUIRE(p);
    CHECK(p->handle().id == id);
  }
  ::close(other_fd);
  // A new buffer that may well get the closed fd's number: never a hit.
  memfd reused;
  REQUIRE(reused.fd >= 0);
  auto p = cache.acquire(dmabuf_region(reused.fd, 4096, 8192));
  REQUIRE(p);
  CHECK(p->handle().id != id);
  // Host memory at an address equal to the offset is another space too.
  auto h = cache.acquire(host_region(4096, 8192));
  REQUIRE(h);
  CHECK(h->handle().id != id);
  CHECK(cache.statistics().misses == 3);
}

TEST_CASE("a DMA-BUF merge registers the union's offset and keeps the request's fd") {
  counting_registrar r;
  reg::registration_cache<counting_registrar, reg::no_lock> cache{r};
  memfd buffer;
  REQUIRE(buffer.fd >= 0);
  auto a = cache.acquire(dmabuf_region(buffer.fd, 100, 100));
  auto req = dmabuf_region(buffer.fd, 150, 100);
  req.address = reinterpret_cast<void*>(base + 150);
  auto b = cache.acquire(req);
  REQUIRE(a);
  REQUIRE(b);
  const auto rec = r.info(b->handle().id).region;
  CHECK(rec.dmabuf_fd == buffer.fd);
  CHECK(rec.dmabuf_offset == 100);
  CHECK(rec.length == 150);
  CHECK(rec.address == reinterpret_cast<void*>(base + 100));
}

TEST_CASE("bad regions are rejected before anything is registered") {
  counting_registrar r;
  reg::registration_cache<counting_registrar, reg::no_lock> cache{r};
  CHECK(cache.acquire(host_region(base, 0)).error() == errc::invalid_argument);
  CHECK(cache.acquire(host_region(0, 64)).error() == errc::null_buffer);
  CHECK(cache.acquire(host_region(~std::uintptr_t{0} - 10, 64)).error() == errc::invalid_argument);
  int closed = -1;
  {
    memfd gone;
    closed = gone.fd;
  }
  CHECK(cache.acquire(dmabuf_region(closed, 0, 64)).error() == errc::invalid_argument);
  CHECK(r.registrations() == 0);
  CHECK(cache.statistics().misses == 0);
}

TEST_CASE("a failed registration returns the registrar's error and caches nothing") {
  counting_registrar r;
  reg::registration_cache<counting_registrar, reg::no_lock> cache{r};
  r.fail_with(errc::registration_failed);
  auto p = cache.acquire(host_region(base, 64));
  CHECK(p.error() == errc::registration_failed);
  r.fail_with({});
  auto q = cache.acquire(host_region(base, 64));
  REQUIRE(q);
  const auto s = cache.statistics();
  CHECK(s.failed_registrations == 1);
  CHECK(s.misses == 2);
  CHECK(s.live_entries == 1);
}

TEST_CASE("lru evicts the entry released longest ago") {
  counting_registrar r;
  reg::registration_cache<counting_registrar, reg::lru, reg::max_entries<2>, reg::no_lock> cache{r};
  std::uint64_t a_id = 0;
  std::uint64_t b_id = 0;
  { auto a = cache.acquire(host_region(base, 64)); REQUIRE(a); a_id = a->handle().id; }
  { auto b = cache.acquire(host_region(base + 1000, 64)); REQUIRE(b); b_id = b->handle().id; }
  { auto a = cache.acquire(host_region(base, 64)); REQUIRE(a); }  // a is now the younger
  { auto c = cache.acquire(host_region(base + 2000, 64)); REQUIRE(c); CHECK(c->cached()); }
  CHECK(r.deregistrations(b_id) == 1);
  CHECK(r.deregistrations(a_id) == 0);
  auto a = cache.acquire(host_region(base, 64));
  REQUIRE(a);
  CHECK(a->handle().id == a_id);
  const auto s = cache.statistics();
  CHECK(s.evictions == 1);
  CHECK(s.live_entries == 2);
}

TEST_CASE("max_entries never evicts a pinned entry and registers uncached when all are pinned") {
  counting_registrar r;
  reg::registration_cache<counting_registrar, reg::max_entries<2>, reg::no_lock> cache{r};
  auto a = cache.acquire(host_region(base, 64));
  auto b = cache.acquire(host_region(base + 1000, 64));
  REQUIRE(a);
  REQUIRE(b);
  auto c = cache.acquire(host_region(base + 2000, 64));
  REQUIRE(c);
  CHECK_FALSE(c->cached());
  CHECK(r.deregistrations(a->handle().id) == 0);
  CHECK(r.deregistrations(b->handle().id) == 0);
  const auto c_id = c->handle().id;
  c->release();
  CHECK(r.deregistrations(c_id) == 1);
  auto s = cache.statistics();
  CHECK(s.uncached_registrations == 1);
  CHECK(s.evictions == 0);
  CHECK(s.live_entries == 2);
  CHECK(s.retired_in_use == 0);
  // Once one is unpinned there is room again.
  b->release();
  auto d = cache.acquire(host_region(base + 3000, 64));
  REQUIRE(d);
  CHECK(d->cached());
  CHECK(cache.statistics().evictions == 1);
}

TEST_CASE("max_bytes evicts until the new range fits and keeps oversized regions uncached") {
  counting_registrar r;
  reg::registration_cache<counting_registrar, reg::max_bytes<1000>, reg::no_lock> cache{r};
  { auto a = cache.acquire(host_region(base, 400)); REQUIRE(a); }
  { auto b = cache.acquire(host_region(base + 1000, 400)); REQUIRE(b); }
  { auto c = cache.acquire(host_region(base + 2000, 500)); REQUIRE(c); CHECK(c->cached()); }
  auto s = cache.statistics();
  CHECK(s.evictions == 1);
  CHECK(s.live_bytes == 900);
  // Larger than the whole budget: uncached, and nothing is flushed for it.
  { auto huge = cache.acquire(host_region(base + 10000, 1001)); REQUIRE(huge); CHECK_FALSE(huge->cached()); }
  s = cache.statistics();
  CHECK(s.evictions == 1);
  CHECK(s.live_entries == 2);
  CHECK(s.uncached_registrations == 1);
  CHECK(r.live() == 2);
}

TEST_CASE("when pinned entries fill the capacity an overlapping request is registered alone, not merged") {
  counting_registrar r;
  reg::registration_cache<counting_registrar, reg::max_bytes<150>, reg::no_lock> cache{r};
  auto a = cache.acquire(host_region(base, 100));
  auto b = cache.acquire(host_region(base + 5000, 50));
  REQUIRE(a);
  REQUIRE(b);
  auto c = acquire_alone(cache, r);
  const auto s = cache.statistics();
  CHECK(s.merges == 0);
  CHECK(s.live_entries == 2);
  CHECK(r.deregistrations(a->handle().id) == 0);
}

TEST_CASE("a merge that pins fill while it registers is handed out as the request alone") {
  counting_registrar r;
  using cache_type = reg::registration_cache<counting_registrar, reg::max_entries<2>, reg::mutex_lock>;
  cache_type cache{r};
  { auto e = cache.acquire(host_region(base, 100)); REQUIRE(e); }
  // While [base+50, base+150) registers as the union [base, base+150),
  // another thread pins two disjoint ranges: the capacity is full of pins.
  std::optional<cache_type::pinned_registration> x, y;
  bool armed = true;
  r.on_register = [&](const memory_region&) {
    if (!std::exchange(armed, false)) return;
    auto px = cache.acquire(host_region(base + 5000, 50));
    auto py = cache.acquire(host_region(base + 6000, 50));
    REQUIRE(px);
    REQUIRE(py);
    x.emplace(std::move(*px));
    y.emplace(std::move(*py));
  };
  auto p = acquire_alone(cache, r);
  CHECK(r.registrations() == 5);  // E, the union, X, Y, then the request alone
  p.release();
  x.reset();
  y.reset();
  cache.clear();
  CHECK(r.live() == 0);
}

TEST_CASE("max_entries and max_bytes together both bound the cache") {
  counting_registrar r;
  reg::registration_cache<counting_registrar, reg::max_entries<3>, reg::max_bytes<300>, reg::no_lock> cache{r};
  for (int i = 0; i < 3; ++i) { auto p = cache.acquire(host_region(base + 1000 * i, 10)); REQUIRE(p); }
  CHECK(cache.statistics().live_entries == 3);
  { auto p = cache.acquire(host_region(base + 5000, 10)); REQUIRE(p); }  // entry bound
  CHECK(cache.statistics().live_entries == 3);
  { auto p = cache.acquire(host_region(base + 6000, 290)); REQUIRE(p); }  // byte bound
  const auto s = cache.statistics();
  CHECK(s.live_bytes <= 300);
  CHECK(s.live_entries <= 3);
  CHECK(s.evictions == 3);
}

TEST_CASE("invalidate deregisters unpinned overlaps now and pinned ones at their last release") {
  counting_registrar r;
  reg::registration_cache<counting_registrar, reg::no_lock> cache{r};
  std::uint64_t free_id = 0;
  { auto p = cache.acquire(host_region(base, 100)); REQUIRE(p); free_id = p->handle().id; }
  auto pinned = cache.acquire(host_region(base + 200, 100));
  auto pinned_twice = cache.acquire(host_region(base + 220, 10));
  auto untouched = cache.acquire(host_region(base + 1000, 100));
  REQUIRE(pinned);
  REQUIRE(pinned_twice);
  REQUIRE(untouched);
  const auto pinned_id = pinned->handle().id;
  CHECK_FALSE(cache.invalidate(host_region(base + 50, 200)));
  CHECK(r.deregistrations(free_id) == 1);
  CHECK(r.deregistrations(pinned_id) == 0);
  auto s = cache.statistics();
  CHECK(s.invalidations == 2);
  CHECK(s.live_entries == 1);
  CHECK(s.retired_in_use == 1);
  // The same addresses register anew while the old pins live.
  auto again = cache.acquire(host_region(base + 200, 100));
  REQUIRE(again);
  CHECK(again->handle().id != pinned_id);
  pinned->release();
  CHECK(r.deregistrations(pinned_id) == 0);
  pinned_twice->release();
  CHECK(r.deregistrations(pinned_id) == 1);
  CHECK(r.deregistrations(untouched->handle().id) == 0);
  CHECK(cache.statistics().retired_in_use == 0);
}

TEST_CASE("invalidate of a DMA-BUF range drops only that buffer's overlapping entries") {
  counting_registrar r;
  reg::registration_cache<counting_registrar, reg::no_lock> cache{r};
  memfd one;
  memfd two;
  { auto p = cache.acquire(dmabuf_region(one.fd, 0, 100)); REQUIRE(p); }
  { auto p = cache.acquire(dmabuf_region(two.fd, 0, 100)); REQUIRE(p); }
  CHECK_FALSE(cache.invalidate(dmabuf_region(one.fd, 50, 10)));
  CHECK(cache.statistics().live_entries == 1);
  { auto p = cache.acquire(dmabuf_region(two.fd, 0, 100)); REQUIRE(p); }
  CHECK(cache.statistics().hits == 1);
}

TEST_CASE("invalidate with an unidentifiable DMA-BUF fd drops every DMA-BUF entry and says so") {
  counting_registrar r;
  reg::registration_cache<counting_registrar, reg::no_lock> cache{r};
  memfd one;
  { auto p = cache.acquire(dmabuf_region(one.fd, 0, 100)); REQUIRE(p); }
  { auto p = cache.acquire(host_region(base, 100)); REQUIRE(p); }
  int closed = -1;
  {
    memfd gone;
    closed = gone.fd;
  }
  CHECK(cache.invalidate(dmabuf_region(closed, 0, 100)) == errc::invalid_argument);
  const auto s = cache.statistics();
  CHECK(s.live_entries == 1);
  CHECK(s.invalidations == 1);
}

TEST_CASE("an invalidation named before its DMA-BUF fd is closed drops that buffer after the number is reused") {
  counting_registrar r;
  reg::registration_cache<counting_registrar, reg::no_lock> cache{r};
  auto freed = std::make_unique<memfd>();
  const memory_region region = dmabuf_region(freed->fd, 0, 4096);
  { auto p = cache.acquire(region); REQUIRE(p); }
  const auto name = cache.name_invalidation(region);  // the domain's hook, fd still open
  freed.reset();                                       // the domain closes the DMA-BUF
  memfd next;                                          // the next export gets the lowest free number
  REQUIRE(next.fd == region.dmabuf_fd);
  CHECK_FALSE(cache.invalidate(name));
  CHECK(cache.statistics().live_entries == 0);
  CHECK(r.live() == 0);
}

TEST_CASE("clear deregisters unpinned entries now and pinned ones at release") {
  counting_registrar r;
  reg::registration_cache<counting_registrar, reg::no_lock> cache{r};
  { auto p = cache.acquire(host_region(base, 100)); REQUIRE(p); }
  auto pinned = cache.acquire(host_region(base + 1000, 100));
  REQUIRE(pinned);
  cache.clear();
  CHECK(r.live() == 1);
  CHECK(cache.statistics().live_entries == 0);
  pinned->release();
  CHECK(r.live() == 0);
  CHECK(r.all_deregistered_once());
}

TEST_CASE("the destructor deregisters everything, pins that outlive it included, exactly once") {
  counting_registrar r;
  std::optional<reg::registration_cache<counting_registrar, reg::max_entries<1>, reg::no_lock>::pinned_registration>
      survivor;
  std::optional<reg::registration_cache<counting_registrar, reg::max_entries<1>, reg::no_lock>::pinned_registration>
      uncached_survivor;
  std::optional<reg::registration_cache<counting_registrar, reg::max_entries<1>, reg::no_lock>::pinned_registration>
      second_pin;
  {
    reg::registration_cache<counting_registrar, reg::max_entries<1>, reg::no_lock> cache{r};
    { auto p = cache.acquire(host_region(base + 5000, 100)); REQUIRE(p); }
    survivor.emplace(std::move(cache.acquire(host_region(base, 100)).value()));
    second_pin.emplace(std::move(cache.acquire(host_region(base, 10)).value()));
    uncached_survivor.emplace(std::move(cache.acquire(host_region(base + 1000, 100)).value()));
    CHECK_FALSE(uncached_survivor->cached());
  }
  CHECK(r.live() == 0);
  survivor.reset();
  second_pin.reset();
  uncached_survivor.reset();
  CHECK(r.all_deregistered_once());
}

TEST_CASE("a moved pin releases once and move assignment releases the overwritten pin") {
  counting_registrar r;
  reg::registration_cache<counting_registrar, reg::max_entries<1>, reg::no_lock> cache{r};
  auto a = cache.acquire(host_region(base, 64)).value();
  auto moved = std::move(a);
  CHECK_FALSE(a);  // NOLINT: checking the moved-from state on purpose
  CHECK(moved);
  CHECK(cache.statistics().pinned_entries == 1);
  auto b = cache.acquire(host_region(base + 1000, 64)).value();  // uncached: a's entry is pinned
  CHECK_FALSE(b.cached());
  const auto b_id = b.handle().id;
  b = std::move(moved);
  CHECK(r.deregistrations(b_id) == 1);
  CHECK(cache.statistics().pinned_entries == 1);
  b.release();
  b.release();
  CHECK(cache.statistics().pinned_entries == 0);
}

TEST_CASE("registration runs outside the lock: an invalidation during a miss keeps it out of the cache") {
  counting_registrar r;
  reg::registration_cache<counting_registrar, reg::mutex_lock> cache{r};
  bool armed = true;
  r.on_register = [&](const memory_region&) {
    // With the cache's mutex held this would deadlock.
    if (std::exchange(armed, false)) CHECK_FALSE(cache.invalidate(host_region(base, 64)));
  };
  auto p = cache.acquire(host_region(base, 64));
  REQUIRE(p);
  CHECK_FALSE(p->cached());
  auto s = cache.statistics();
  CHECK(s.live_entries == 0);
  CHECK(s.uncached_registrations == 1);
  const auto id = p->handle().id;
  p->release();
  CHECK(r.deregistrations(id) == 1);
  auto q = cache.acquire(host_region(base, 64));
  REQUIRE(q);
  CHECK(q->cached());
}

TEST_CASE("a merged miss raced by an invalidation registers only the request, uncached") {
  counting_registrar r;
  reg::registration_cache<counting_registrar, reg::no_lock> cache{r};
  { auto a = cache.acquire(host_region(base, 100)); REQUIRE(a); }
  bool armed = true;
  r.on_register = [&](const memory_region&) {
    if (std::exchange(armed, false)) CHECK_FALSE(cache.invalidate(host_region(base, 10)));
  };
  auto p = acquire_alone(cache, r);
  CHECK(r.registrations() == 3);  // [0,100), the union [0,150), then [50,150)
  CHECK(r.live() == 1);
  p.release();
  CHECK(r.live() == 0);
}

TEST_CASE("two threads missing on the same range: one entry wins, the loser's registration is deregistered") {
  counting_registrar r;
  reg::registration_cache<counting_registrar, reg::mutex_lock> cache{r};
  std::mutex m;
  std::condition_variable cv;
  int in_flight = 0;
  r.on_register = [&](const memory_region&) {
    // Hold both registrations until both threads have missed (bounded wait).
    std::unique_lock lock(m);
    ++in_flight;
    cv.notify_all();
    cv.wait_for(lock, std::chrono::seconds(5), [&] { return in_flight >= 2; });
  };
  std::uint64_t ids[2] = {};
  bool ok[2] = {};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      auto p = cache.acquire(host_region(base + 8 * t, 64));
      ok[t] = static_cast<bool>(p);
      if (p) ids[t] = p->handle().id;
      // Keep the pin until both threads have one, so no release interleaves.
      std::unique_lock lock(m);
      ++in_flight;
      cv.notify_all();
      cv.wait_for(lock, std::chrono::seconds(5), [&] { return in_flight >= 4; });
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(ok[0]);
  REQUIRE(ok[1]);
  const auto s = cache.statistics();
  CHECK(s.misses == 2);
  CHECK(r.registrations() == 2);
  // Thread 1's range [base+8, base+72) overlaps thread 0's [base, base+64):
  // whichever inserted second either found a containing entry (lost race)
  // or merged; either way one entry is left and nothing leaked.
  CHECK(s.lost_races + s.merges == 1);
  CHECK(s.live_entries == 1);
  CHECK(r.live() == 1);
  CHECK_FALSE(r.double_deregistration());
}

TEST_CASE("two threads missing on the identical range share the winner's entry") {
  counting_registrar r;
  reg::registration_cache<counting_registrar> cache{r};
  std::mutex m;
  std::condition_variable cv;
  int in_flight = 0;
  r.on_register = [&](const memory_region&) {
    std::unique_lock lock(m);
    ++in_flight;
    cv.notify_all();
    cv.wait_for(lock, std::chrono::seconds(5), [&] { return in_flight >= 2; });
  };
  std::uint64_t ids[2] = {};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      auto p = cache.acquire(host_region(base, 64));
      if (p) ids[t] = p->handle().id;
    });
  for (auto& t : threads) t.join();
  CHECK(ids[0] != 0);
  CHECK(ids[0] == ids[1]);
  const auto s = cache.statistics();
  CHECK(s.lost_races == 1);
  CHECK(r.registrations() == 2);
  CHECK(r.live() == 1);
}

TEST_CASE("invalidate_on_free subscribes a cache to a domain's frees until the subscription goes") {
  struct fake_domain {
    std::vector<std::pair<pdcoll::memory::hook_id, std::function<void(const memory_region&)>>> hooks;
    pdcoll::memory::hook_id last = 0;
    pdcoll::memory::hook_id add_invalidation_hook(std::function<void(const memory_region&)> hook) {
      hooks.emplace_back(++last, std::move(hook));
      return last;
    }
    void remove_invalidation_hook(pdcoll::memory::hook_id id) {
      std::erase_if(hooks, [id](const auto& h) { return h.first == id; });
    }
    void free(const memory_region& region) {
      for (auto& h : hooks) h.second(region);
    }
  };
  counting_registrar r;
  fake_domain domain;
  {
    reg::registration_cache<counting_registrar, reg::no_lock> cache{r};
    auto subscription = reg::invalidate_on_free(domain, cache);
    { auto p = cache.acquire(host_region(base, 64)); REQUIRE(p); }
    domain.free(host_region(base, 64));
    CHECK(cache.statistics().invalidations == 1);
    CHECK(r.live() == 0);
    // Moved, it still unsubscribes once: the cache is gone before the next free.
    auto moved = std::move(subscription);
    CHECK(domain.hooks.size() == 1);
  }
  CHECK(domain.hooks.empty());
  domain.free(host_region(base, 64));  // reaches no destroyed cache (ASan would say)
}

TEST_CASE("endpoint_registrar forwards to the endpoint and reports its errors") {
  counting_endpoint ep;
  reg::endpoint_registrar adapter{ep};
  {
    reg::registration_cache<reg::endpoint_registrar> cache{adapter};
    auto p = cache.acquire(host_region(base, 64));
    REQUIRE(p);
    CHECK(p->handle().key == 42);
    CHECK(p->handle().descriptor == reinterpret_cast<void*>(base));
    ep.fail = true;
    CHECK(cache.acquire(host_region(base + 1000, 64)).error() == errc::registration_failed);
  }
  CHECK(ep.registered == 1);
  CHECK(ep.deregistered == 1);
}

TEST_CASE("a free that meets the communicator's lock busy still drops its buffer when the fd number is reused") {
  caching_communicator world{pdcoll::transport::data_path::dmabuf};
  auto& comm = world.comm;
  const counting_endpoint& ep = *world.ep;
  auto freed = std::make_unique<memfd>();
  memory_region region = dmabuf_region(freed->fd, 0, 4096);
  char device_bytes[16];
  region.address = device_bytes;
  const int domain_hooks = 0;  // stands for the domain's hooks, which announce its frees
  region.free_notice = &domain_hooks;
  comm.hear_frees_from(&domain_hooks);
  {
    std::lock_guard lock(comm.mutex());
    auto lease = comm.acquire_registration(region);
    REQUIRE(lease);
  }
  REQUIRE(comm.registration_statistics().live_entries == 1);

  // Another thread is inside the communicator when the domain frees the
  // buffer: its hook may not wait for the lock, so the invalidation queues.
  std::promise<void> locked, done;
  std::thread holder([&] {
    std::lock_guard lock(comm.mutex());
    locked.set_value();
    done.get_future().wait();
  });
  locked.get_future().wait();
  comm.invalidate_registrations(region);  // memory/track.hpp's hook, fd still open
  done.set_value();
  holder.join();
  freed.reset();  // the domain closes the DMA-BUF after its hooks
  memfd next;     // and the next allocation's export takes the same number
  REQUIRE(next.fd == region.dmabuf_fd);

  {
    std::lock_guard lock(comm.mutex());
    memory_region other = dmabuf_region(next.fd, 0, 4096);
    other.address = device_bytes;
    other.free_notice = &domain_hooks;
    auto lease = comm.acquire_registration(other);  // drains the queue first
    REQUIRE(lease);
  }
  const auto stats = comm.registration_statistics();
  CHECK(stats.invalidations == 1);
  CHECK(stats.live_entries == 1);  // the new buffer's only
  CHECK(ep.registered - ep.deregistered == 1);
}

TEST_CASE("a staged transfer's host buffer is the pool's, so its cached registration never outlives the memory") {
  caching_communicator world{pdcoll::transport::data_path::host_staged};
  auto& comm = world.comm;
  const counting_endpoint& ep = *world.ep;
  pdcoll::memory::emulated_device dev;
  auto grads = dev.allocate<float>(1024);
  // counting_endpoint refuses every send: each fails after its staging
  // buffer was registered. A staging buffer freed after its transfer would
  // leave its registration cached for whatever memory takes the address
  // next; from the pool, the second transfer gets the same live block.
  for (int i = 0; i < 2; ++i)
    CHECK_THROWS_AS(pdcoll::exec::sync_wait(pdcoll::send(comm, 0, grads.view())), std::system_error);
  auto stats = comm.registration_statistics();
  CHECK(stats.misses == 1);
  CHECK(stats.hits == 1);
  CHECK(stats.live_entries == 1);
  CHECK(comm.pooled_host_bytes() >= grads.view().size_bytes());

  // A block the pool lets go of (larger than its bound) loses its
  // registrations before it is freed.
  auto big = comm.take_host_block(std::size_t{65} << 20);
  const memory_region region = comm.host_block_region(big, 4096);
  {
    std::lock_guard lock(comm.mutex());
    REQUIRE(comm.acquire_registration(region));
  }
  CHECK(comm.registration_statistics().live_entries == 2);
  comm.return_host_block(std::move(big));
  stats = comm.registration_statistics();
  CHECK(stats.live_entries == 1);
  CHECK(stats.invalidations == 1);
  CHECK(ep.registered - ep.deregistered == 1);
}

TEST_CASE("memory whose free the communicator does not hear of is registered per operation, never cached") {
  // A caller's vector: freed and reallocated at the same address (large
  // blocks are unmapped and mapped again), a cached registration would pin
  // the old pages and the NIC would move the wrong bytes.
  caching_communicator world{pdcoll::transport::data_path::host};
  auto& comm = world.comm;
  const counting_endpoint& ep = *world.ep;
  std::vector<float> user(1024);
  memory_region region;
  region.address = user.data();
  region.length = user.size() * sizeof(float);
  for (int i = 0; i < 3; ++i) {
    std::lock_guard lock(comm.mutex());
    auto lease = comm.acquire_registration(region);
    REQUIRE(lease);
    CHECK(lease->descriptor() == user.data());
  }
  CHECK(ep.registered == 3);
  CHECK(ep.deregistered == 3);  // each at its operation's end
  CHECK(comm.uncached_registrations() == 3);
  const auto stats = comm.registration_statistics();
  CHECK(stats.misses == 0);
  CHECK(stats.hits == 0);
  CHECK(stats.live_entries == 0);
}

TEST_CASE("a tracked domain's memory is cached while the tracking lives, and dropped when it ends") {
  caching_communicator world{pdcoll::transport::data_path::dmabuf};
  auto& comm = world.comm;
  const counting_endpoint& ep = *world.ep;
  pdcoll::memory::emulated_device dev;
  auto grads = dev.allocate<float>(1024);
  const memory_region region = pdcoll::memory::detail::fabric_region(grads.view());
  REQUIRE(region.free_notice == dev.free_notice());
  auto acquire_twice = [&] {
    for (int i = 0; i < 2; ++i) {
      std::lock_guard lock(comm.mutex());
      REQUIRE(comm.acquire_registration(region));
    }
  };
  acquire_twice();  // untracked: the domain's frees would go unheard
  CHECK(ep.registered == 2);
  CHECK(comm.registration_statistics().live_entries == 0);
  {
    auto tracking = pdcoll::track_frees(dev, comm);
    auto moved = std::move(tracking);  // the subscription moves with it
    acquire_twice();
    const auto stats = comm.registration_statistics();
    CHECK(stats.misses == 1);
    CHECK(stats.hits == 1);
    CHECK(stats.live_entries == 1);
    CHECK(ep.registered == 3);
  }
  // Tracking over: nothing of the domain's stays cached, and its memory is
  // registered per operation again.
  CHECK(comm.registration_statistics().live_entries == 0);
  CHECK(ep.registered == ep.deregistered);
  acquire_twice();
  CHECK(ep.registered == 5);
  CHECK(comm.uncached_registrations() == 4);
}

TEST_CASE("a caller's buffer declared with register_buffer is cached until its handle goes") {
  caching_communicator world{pdcoll::transport::data_path::host};
  auto& comm = world.comm;
  const counting_endpoint& ep = *world.ep;
  std::vector<float> grads(4096);
  auto whole = [&](std::size_t first, std::size_t count) {
    memory_region region;
    region.address = grads.data() + first;
    region.length = count * sizeof(float);
    return region;
  };
  auto acquire = [&](const memory_region& region) {
    std::lock_guard lock(comm.mutex());
    REQUIRE(comm.acquire_registration(region));
  };
  {
    auto pinned = pdcoll::register_buffer(comm, grads);
    acquire(whole(0, 4096));
    acquire(whole(0, 4096));
    acquire(whole(100, 1000));  // inside the declared buffer: a hit
    auto stats = comm.registration_statistics();
    CHECK(stats.misses == 1);
    CHECK(stats.hits == 2);
    CHECK(ep.registered == 1);
    // Reaching past the declared buffer: not this handle's to vouch for.
    std::vector<float> other(16);
    memory_region outside;
    outside.address = other.data();
    outside.length = other.size() * sizeof(float);
    acquire(outside);
    CHECK(comm.uncached_registrations() == 1);
    auto moved = std::move(pinned);
    CHECK(comm.registration_statistics().live_entries == 1);
  }
  // The handle is gone: the caller may free the buffer, nothing of it stays registered.
  CHECK(comm.registration_statistics().live_entries == 0);
  CHECK(ep.registered == ep.deregistered);
  acquire(whole(0, 4096));
  CHECK(comm.uncached_registrations() == 2);
}

}  // TEST_SUITE
