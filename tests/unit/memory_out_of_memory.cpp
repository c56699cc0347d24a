// File: tests/unit/memory_out_of_memory.cpp — memory domains when the host
// runs out of memory part-way through an allocation: each allocation the
// domain makes fails in turn, and every failure must leave nothing taken.
#include <doctest/doctest.h>

#include <pdcoll/memory/domain.hpp>
#include <pdcoll/memory/emulated_device.hpp>
#include <unit/allocation_counter.hpp>

#include <cstdint>
#include <new>

TEST_CASE("an emulated-device allocation that runs out of host memory gives its chunk back") {
  pdcoll::memory::emulated_device dev(std::size_t{1} << 20);
  auto keep = dev.allocate<float>(1000);  // the arena has a used chunk and a free one
  const std::size_t before = dev.bytes_in_use();
  bool allocated = false;
  for (long n = 1; n <= 64 && !allocated; ++n) {
    CAPTURE(n);
    try {
      // The buffer outlives the failing scope: its free must not fail.
      auto buffer = [&] {
        failing_allocation fail(n);
        return dev.allocate<float>(16);
      }();
      allocated = true;
    } catch (const std::bad_alloc&) {
      CHECK(dev.bytes_in_use() == before);  // the map insert failed after the arena gave a chunk
    }
  }
  CHECK(allocated);
  CHECK(dev.bytes_in_use() == before);
  // Every chunk is still there: the whole remainder can be taken at once.
  auto rest = dev.allocate<std::byte>(dev.capacity() - before);
  CHECK(dev.bytes_in_use() == dev.capacity());
}

TEST_CASE("the first-fit arena splits and merges chunks without allocating, but for a chunk with no free neighbour") {
  pdcoll::memory::detail::first_fit_arena arena(4096, 4 * 4096);
  std::uint64_t a = 0, b = 0, c = 0;
  {
    allocation_counter counter;
    REQUIRE(arena.allocate(4096, a));
    REQUIRE(arena.allocate(4096, b));
    REQUIRE(arena.allocate(4096, c));
    CHECK(counter.count() == 0);
  }
  CHECK(a == 4096);
  CHECK(b == 2 * 4096);
  CHECK(c == 3 * 4096);
  {
    allocation_counter counter;
    arena.release(c, 4096);  // joins the free tail: node reused
    CHECK(counter.count() == 0);
    arena.release(a, 4096);  // no free neighbour: one node
    CHECK(counter.count() == 1);
    arena.release(b, 4096);  // joins both
    CHECK(counter.count() == 1);
  }
  CHECK(arena.in_use() == 0);
  std::uint64_t whole = 0;
  CHECK(arena.allocate(4 * 4096, whole));
  CHECK(whole == 4096);
}
