// The host block pool behind collectives' scratch and staging buffers:
// reuse, the size rule, the bound on idle bytes, and that collectives give
// their scratch back.
#include <doctest/doctest.h>

#include <pdcoll/detail/host_block_pool.hpp>
#include <pdcoll/pdcoll.hpp>
#include <support/inproc_world.hpp>

#include <vector>

using pdcoll::detail::host_block;
using pdcoll::detail::host_block_pool;

TEST_CASE("a block given back is handed out again for a request it fits") {
  host_block_pool pool;
  auto a = pool.take(10000);
  CHECK(a.size == 12288);  // rounded up to 4 KiB
  std::byte* address = a.bytes.get();
  CHECK(pool.give(std::move(a)).empty());
  CHECK(pool.held_bytes() == 12288);
  auto b = pool.take(8000);
  CHECK(b.bytes.get() == address);
  CHECK(pool.reused() == 1);
  CHECK(pool.held_bytes() == 0);
}

TEST_CASE("a block more than twice the request is not reused; the smallest fit is") {
  host_block_pool pool;
  auto big = pool.take(1 << 20), mid = pool.take(300 << 10);
  std::byte* mid_address = mid.bytes.get();
  (void)pool.give(std::move(big));
  (void)pool.give(std::move(mid));
  auto small = pool.take(4096);
  CHECK(small.bytes.get() != mid_address);
  CHECK(pool.reused() == 0);
  auto fit = pool.take(260 << 10);
  CHECK(fit.bytes.get() == mid_address);
  CHECK(pool.held_bytes() == (1u << 20));
}

TEST_CASE("the pool holds at most its bound and drops its largest idle blocks first") {
  host_block_pool pool(64 << 10);
  auto a = pool.take(16 << 10), b = pool.take(32 << 10), c = pool.take(32 << 10), huge = pool.take(128 << 10);
  std::byte* b_address = b.bytes.get();
  CHECK(pool.give(std::move(a)).empty());
  CHECK(pool.give(std::move(b)).empty());
  auto dropped = pool.give(std::move(c));  // 16 + 32 + 32 > 64: the 32 KiB idle block goes
  REQUIRE(dropped.size() == 1);
  CHECK(dropped[0].bytes.get() == b_address);
  CHECK(pool.held_bytes() == (48u << 10));
  auto too_big = pool.give(std::move(huge));  // larger than the bound on its own
  REQUIRE(too_big.size() == 1);
  CHECK(too_big[0].size == (128u << 10));
  CHECK(pool.held_bytes() == (48u << 10));
}

TEST_CASE("a ring all-reduce gives its scratch back to the communicator's pool and reuses it") {
  pdcoll::testing::run_inproc(2, [](pdcoll::communicator& comm) {
    std::vector<float> data(1 << 18, 1.0f);  // 1 MiB: the ring's chunk slots are scratch
    CHECK(comm.pooled_host_bytes() == 0);
    pdcoll::exec::sync_wait(pdcoll::all_reduce<pdcoll::algo::ring>(comm, data));
    const auto held = comm.pooled_host_bytes();
    CHECK(held > 0);
    pdcoll::exec::sync_wait(pdcoll::all_reduce<pdcoll::algo::ring>(comm, data));
    CHECK(comm.pooled_host_bytes() == held);  // the same block went out and came back
    CHECK(data[12345] == 4.0f);
  });
}

TEST_CASE("tiny requests share one 4 KiB block, and at most max_idle_blocks are kept") {
  host_block_pool pool;
  auto a = pool.take(8);
  std::byte* address = a.bytes.get();
  (void)pool.give(std::move(a));
  auto b = pool.take(16);
  CHECK(b.bytes.get() == address);
  std::vector<host_block> many;
  for (std::size_t i = 0; i < host_block_pool::max_idle_blocks + 10; ++i) many.push_back(pool.take(4096));
  std::size_t dropped = 0;
  for (auto& block : many) dropped += pool.give(std::move(block)).size();
  CHECK(dropped == 10);
  CHECK(pool.held_bytes() == host_block_pool::max_idle_blocks * 4096);
}
