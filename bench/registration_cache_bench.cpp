// registration_cache micro-benchmarks.
//
//   hit/<entries>           acquire + release of a cached range, cache of 16,
//                           1,024 or 65,536 entries, requests in random order
//   hit_no_lock/<entries>   the same with the no_lock policy
//   miss_evict              a miss on a full 1,024-entry cache: lookup, free
//                           registrar call, LRU eviction, insertion
//   fi_mr_reg_close/<bytes> the real cost: fi_mr_reg + fi_close on
//                           libfabric's tcp provider (RDM, tcp;ofi_rxm)
//   fi_cached_hit/<bytes>   cached acquire + release with that registrar
//   fi_cached_thrash/<bytes> 64 buffers cycled through a 16-entry cache
//                           (every acquire misses and evicts): the worst case
//
// libfabric's own MR cache is switched off (FI_MR_CACHE_MAX_COUNT=0) so the
// fi_* rows measure one registration each, as the cache will use them.
#include <benchmark/benchmark.h>

#include <pdcoll/registration/registration_cache.hpp>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

namespace reg = pdcoll::registration;
using pdcoll::result;
using pdcoll::transport::memory_region;
using pdcoll::transport::registration_handle;

namespace {

// Registers nothing: isolates the cache's own cost.
struct null_registrar {
  result<registration_handle> register_region(const memory_region& r) {
    return registration_handle{r.address, 0, nullptr};
  }
  void deregister(registration_handle&) noexcept {}
};

memory_region host(std::uintptr_t address, std::size_t length) {
  memory_region r;
  r.address = reinterpret_cast<void*>(address);
  r.length = length;
  return r;
}

constexpr std::uintptr_t fake_base = 0x100000000;
constexpr std::size_t entry_bytes = 4096;
constexpr std::size_t entry_stride = 8192;

template <class Cache>
void run_hits(benchmark::State& state) {
  const auto entries = static_cast<std::size_t>(state.range(0));
  null_registrar registrar;
  Cache cache{registrar};
  for (std::size_t i = 0; i < entries; ++i) (void)cache.acquire(host(fake_base + i * entry_stride, entry_bytes));
  std::vector<memory_region> requests;
  std::mt19937_64 rng(1);
  for (int i = 0; i < 4096; ++i) {
    const auto e = std::uniform_int_distribution<std::size_t>(0, entries - 1)(rng);
    requests.push_back(host(fake_base + e * entry_stride + 64, 1024));
  }
  std::size_t next = 0;
  for (auto _ : state) {
    auto pinned = cache.acquire(requests[next]);
    benchmark::DoNotOptimize(pinned->handle().descriptor);
    next = (next + 1) & 4095;
  }
  if (cache.statistics().misses != entries) state.SkipWithError("unexpected misses");
}

void hit(benchmark::State& state) {
  run_hits<reg::registration_cache<null_registrar, reg::max_entries<65536>, reg::mutex_lock>>(state);
}
void hit_no_lock(benchmark::State& state) {
  run_hits<reg::registration_cache<null_registrar, reg::max_entries<65536>, reg::no_lock>>(state);
}

void miss_evict(benchmark::State& state) {
  null_registrar registrar;
  reg::registration_cache<null_registrar, reg::max_entries<1024>> cache{registrar};
  std::uintptr_t next = fake_base;
  for (int i = 0; i < 1024; ++i, next += entry_stride) (void)cache.acquire(host(next, entry_bytes));
  for (auto _ : state) {
    auto pinned = cache.acquire(host(next, entry_bytes));
    benchmark::DoNotOptimize(pinned->handle().descriptor);
    next += entry_stride;
  }
  const auto s = cache.statistics();
  state.counters["evictions"] = static_cast<double>(s.evictions);
  if (s.hits != 0) state.SkipWithError("unexpected hits");
}

// ------------------------------------------------------------ libfabric tcp

struct fabric_session {
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  int error = 0;

  fabric_session() {
    ::setenv("FI_MR_CACHE_MAX_COUNT", "0", 1);
    fi_info* hints = fi_allocinfo();
    hints->fabric_attr->prov_name = ::strdup("tcp");
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_MSG | FI_TAGGED;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    error = fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &info);
    fi_freeinfo(hints);
    if (error == 0) error = fi_fabric(info->fabric_attr, &fabric, nullptr);
    if (error == 0) error = fi_domain(fabric, info, &domain, nullptr);
  }
  ~fabric_session() {
    if (domain != nullptr) fi_close(&domain->fid);
    if (fabric != nullptr) fi_close(&fabric->fid);
    if (info != nullptr) fi_freeinfo(info);
  }
  static fabric_session& get() {
    static fabric_session session;
    return session;
  }
};

// The registrar the libfabric transport provides, reduced to its two calls.
struct fi_registrar {
  fid_domain* domain;
  std::uint64_t next_key = 1;
  result<registration_handle> register_region(const memory_region& r) {
    fid_mr* mr = nullptr;
    const int rc = fi_mr_reg(domain, r.address, r.length, FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ |
                             FI_REMOTE_WRITE, 0, next_key++, 0, &mr, nullptr);
    if (rc != 0) return std::error_code{pdcoll::errc::registration_failed};
    return registration_handle{fi_mr_desc(mr), fi_mr_key(mr), mr};
  }
  void deregister(registration_handle& h) noexcept { fi_close(&static_cast<fid_mr*>(h.provider)->fid); }
};

struct page_buffer {
  explicit page_buffer(std::size_t bytes)
      : bytes(bytes), data(static_cast<unsigned char*>(std::aligned_alloc(4096, bytes)), &std::free) {
    if (data) std::memset(data.get(), 1, bytes);
  }
  std::size_t bytes;
  std::unique_ptr<unsigned char, decltype(&std::free)> data;
};

bool have_fabric(benchmark::State& state) {
  auto& s = fabric_session::get();
  if (s.error != 0) {
    state.SkipWithError(fi_strerror(-s.error));
    return false;
  }
  return true;
}

void fi_mr_reg_close(benchmark::State& state) {
  if (!have_fabric(state)) return;
  page_buffer buffer(static_cast<std::size_t>(state.range(0)));
  fi_registrar registrar{fabric_session::get().domain};
  memory_region region = host(reinterpret_cast<std::uintptr_t>(buffer.data.get()), buffer.bytes);
  for (auto _ : state) {
    auto h = registrar.register_region(region);
    if (!h) {
      state.SkipWithError("fi_mr_reg failed");
      break;
    }
    registrar.deregister(*h);
  }
}

void fi_cached_hit(benchmark::State& state) {
  if (!have_fabric(state)) return;
  page_buffer buffer(static_cast<std::size_t>(state.range(0)));
  fi_registrar registrar{fabric_session::get().domain};
  reg::registration_cache<fi_registrar> cache{registrar};
  memory_region region = host(reinterpret_cast<std::uintptr_t>(buffer.data.get()), buffer.bytes);
  for (auto _ : state) {
    auto pinned = cache.acquire(region);
    benchmark::DoNotOptimize(pinned->handle().descriptor);
  }
}

void fi_cached_thrash(benchmark::State& state) {
  if (!have_fabric(state)) return;
  std::vector<page_buffer> buffers;
  for (int i = 0; i < 64; ++i) buffers.emplace_back(static_cast<std::size_t>(state.range(0)));
  fi_registrar registrar{fabric_session::get().domain};
  reg::registration_cache<fi_registrar, reg::max_entries<16>> cache{registrar};
  std::size_t next = 0;
  for (auto _ : state) {
    auto& b = buffers[next];
    auto pinned = cache.acquire(host(reinterpret_cast<std::uintptr_t>(b.data.get()), b.bytes));
    benchmark::DoNotOptimize(pinned->handle().descriptor);
    next = (next + 1) % buffers.size();
  }
}

}  // namespace

BENCHMARK(hit)->Arg(16)->Arg(1024)->Arg(65536);
BENCHMARK(hit_no_lock)->Arg(16)->Arg(1024)->Arg(65536);
BENCHMARK(miss_evict);
BENCHMARK(fi_mr_reg_close)->Arg(4096)->Arg(1 << 20)->Arg(64 << 20);
BENCHMARK(fi_cached_hit)->Arg(4096)->Arg(1 << 20)->Arg(64 << 20);
BENCHMARK(fi_cached_thrash)->Arg(4096)->Arg(1 << 20);

BENCHMARK_MAIN();
