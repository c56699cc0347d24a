// Emulated device: memfd-backed allocations, counted copies, DMA-BUF-like
// exports and invalidation on free.
#include <doctest/doctest.h>

#include <pdcoll/memory/emulated_device.hpp>
#include <support/outcome.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <system_error>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace mem = pdcoll::memory;
using device_view = pdcoll::view<std::int32_t, mem::emulated_device>;

using pdcoll::testing::error_of;

TEST_CASE("copies to and from the emulated device round-trip and are counted in bytes and calls") {
  mem::emulated_device dev(1 << 20);
  auto buf = dev.allocate<std::int32_t>(1000);
  std::vector<std::int32_t> input(1000);
  std::iota(input.begin(), input.end(), -500);
  dev.copy_from_host(std::span<const std::int32_t>(input), buf.view());
  std::vector<std::int32_t> output(1000, 0);
  dev.copy_to_host(buf.const_view(), std::span<std::int32_t>(output));
  CHECK(output == input);

  std::vector<std::int32_t> part(10, 0);
  dev.copy_to_host(buf.view().subview(990), std::span<std::int32_t>(part));
  CHECK(part.front() == input[990]);
  CHECK(part.back() == input[999]);

  const auto c = dev.counters();
  CHECK(c.host_to_device_bytes == 4000);
  CHECK(c.host_to_device_calls == 1);
  CHECK(c.device_to_host_bytes == 4040);
  CHECK(c.device_to_host_calls == 2);
  dev.reset_counters();
  CHECK(dev.counters() == mem::copy_counters{});
}

TEST_CASE("a copy into a subview leaves the neighbouring device bytes untouched") {
  mem::emulated_device dev(1 << 20);
  auto buf = dev.allocate<std::int32_t>(8);
  const std::vector<std::int32_t> ones(8, 1);
  dev.copy_from_host(std::span<const std::int32_t>(ones), buf.view());
  const std::vector<std::int32_t> sevens(3, 7);
  dev.copy_from_host(std::span<const std::int32_t>(sevens), buf.view().subview(2, 3));
  std::vector<std::int32_t> out(8);
  dev.copy_to_host(buf.view(), std::span<std::int32_t>(out));
  CHECK(out == std::vector<std::int32_t>{1, 1, 7, 7, 7, 1, 1, 1});
}

TEST_CASE("copies into too small a destination fail with buffer_too_small and count nothing") {
  mem::emulated_device dev(1 << 20);
  auto buf = dev.allocate<std::int32_t>(16);
  std::vector<std::int32_t> small(15);
  CHECK(error_of([&] { dev.copy_to_host(buf.view(), std::span<std::int32_t>(small)); }) ==
        pdcoll::errc::buffer_too_small);
  std::vector<std::int32_t> large(17);
  CHECK(error_of([&] { dev.copy_from_host(std::span<const std::int32_t>(large), buf.view()); }) ==
        pdcoll::errc::buffer_too_small);
  CHECK(dev.counters() == mem::copy_counters{});
}

TEST_CASE("views of freed memory or of another device are rejected, not dereferenced") {
  mem::emulated_device dev(1 << 20);
  mem::emulated_device other(1 << 20);
  auto foreign = other.allocate<std::int32_t>(4);
  std::vector<std::int32_t> host(4);
  CHECK(error_of([&] { dev.copy_to_host(foreign.view(), std::span<std::int32_t>(host)); }) ==
        pdcoll::errc::invalid_argument);
  device_view stale;
  {
    auto buf = dev.allocate<std::int32_t>(4);
    stale = buf.view();
  }
  CHECK(error_of([&] { dev.copy_to_host(stale, std::span<std::int32_t>(host)); }) ==
        pdcoll::errc::invalid_argument);
  CHECK(error_of([&] { (void)dev.export_dmabuf(stale); }) == pdcoll::errc::invalid_argument);
  CHECK(dev.counters() == mem::copy_counters{});
}

TEST_CASE("an export names the memfd at the allocation's offset and reads back the copied bytes") {
  mem::emulated_device dev(1 << 20);
  auto first = dev.allocate<std::int32_t>(5000);  // more than a page, so `second` starts further on
  auto second = dev.allocate<std::int32_t>(256);
  const std::vector<std::int32_t> pattern(256, 0x5a5a5a5a);
  dev.copy_from_host(std::span<const std::int32_t>(pattern), second.view());
  const auto exported = dev.export_dmabuf(second.view().subview(128, 64));
  REQUIRE(exported.fd >= 0);
  CHECK(exported.length == 64 * sizeof(std::int32_t));
  CHECK(exported.offset % sizeof(std::int32_t) == 0);
  CHECK(exported.offset >= 5000 * sizeof(std::int32_t));
  // What a DMA-BUF importer would do: read the bytes through the fd at the offset.
  std::int32_t value = 0;
  REQUIRE(::pread(exported.fd, &value, sizeof value, static_cast<off_t>(exported.offset)) == sizeof value);
  CHECK(value == 0x5a5a5a5a);
  CHECK((::fcntl(exported.fd, F_GETFD) & FD_CLOEXEC) != 0);
  CHECK(dev.counters().device_to_host_calls == 0);
}

TEST_CASE("freeing a device buffer runs the invalidation hook with the buffer's region first") {
  mem::emulated_device dev(1 << 20);
  std::vector<pdcoll::transport::memory_region> seen;
  std::size_t in_use_during_hook = 0;
  const auto id = dev.add_invalidation_hook([&](const pdcoll::transport::memory_region& r) {
    seen.push_back(r);
    in_use_during_hook = dev.bytes_in_use();
  });
  auto buf = dev.allocate<double>(1000);
  const auto expected = mem::detail::fabric_region(buf.view());
  buf.reset();
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].address == expected.address);
  CHECK(seen[0].length == 8000);
  CHECK(seen[0].dmabuf_fd == expected.dmabuf_fd);
  CHECK(seen[0].dmabuf_offset == expected.dmabuf_offset);
  CHECK(seen[0].kind == pdcoll::transport::memory_kind::emulated_device);
  CHECK(in_use_during_hook > 0);  // the memory was still allocated while the hook ran
  CHECK(dev.bytes_in_use() == 0);
  dev.remove_invalidation_hook(id);
  { auto other = dev.allocate<double>(10); }
  CHECK(seen.size() == 1);
}

TEST_CASE("freed chunks are reused, merged and come back zeroed") {
  mem::emulated_device dev(16 * mem::detail::page_size());
  const std::size_t page_ints = mem::detail::page_size() / sizeof(std::int32_t);
  std::uint64_t first_address = 0;
  {
    auto a = dev.allocate<std::int32_t>(page_ints * 8);
    auto b = dev.allocate<std::int32_t>(page_ints * 8);
    first_address = a.view().device_address();
    CHECK(dev.bytes_in_use() == dev.capacity());
    CHECK(error_of([&] { (void)dev.allocate<std::int32_t>(1); }) == std::errc::not_enough_memory);
    const std::vector<std::int32_t> ones(page_ints * 8, 1);
    dev.copy_from_host(std::span<const std::int32_t>(ones), a.view());
  }
  CHECK(dev.allocation_count() == 0);
  // Both halves were merged back: the whole arena fits in one allocation again.
  auto whole = dev.allocate<std::int32_t>(page_ints * 16);
  CHECK(whole.view().device_address() == first_address);
  std::vector<std::int32_t> out(page_ints * 16, -1);
  dev.copy_to_host(whole.view(), std::span<std::int32_t>(out));
  CHECK(std::all_of(out.begin(), out.end(), [](auto v) { return v == 0; }));
}

TEST_CASE("allocations round to whole pages and a zero count reserves nothing") {
  mem::emulated_device dev(1 << 20);
  auto tiny = dev.allocate<char>(1);
  CHECK(dev.bytes_in_use() == mem::detail::page_size());
  auto none = dev.allocate<char>(0);
  CHECK(none.empty());
  CHECK(&none.domain() == &dev);
  CHECK(dev.allocation_count() == 1);
  CHECK(error_of([&] { (void)dev.allocate<std::uint64_t>(std::numeric_limits<std::size_t>::max() / 2); }) ==
        pdcoll::errc::count_overflow);
}

TEST_CASE("the emulated device reduces on device and its library-private pointer aliases the export") {
  mem::emulated_device dev(1 << 20);
  CHECK(dev.reduces_on_device());
  auto buf = dev.allocate<float>(4);
  float* p = mem::detail::mapped_pointer(buf.view());
  p[2] = 2.5f;  // the "device compute"
  std::vector<float> out(4);
  dev.copy_to_host(buf.view(), std::span<float>(out));
  CHECK(out[2] == 2.5f);
}

TEST_CASE("copy counters stay exact when several threads copy at once") {
  mem::emulated_device dev(1 << 20);
  auto buf = dev.allocate<std::int32_t>(64);
  constexpr int threads = 4;
  constexpr int rounds = 200;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      std::vector<std::int32_t> host(16, t);
      for (int i = 0; i < rounds; ++i) {
        dev.copy_from_host(std::span<const std::int32_t>(host), buf.view().subview(16 * t, 16));
        dev.copy_to_host(buf.view().subview(16 * t, 16), std::span<std::int32_t>(host));
      }
    });
  for (auto& w : workers) w.join();
  const auto c = dev.counters();
  CHECK(c.host_to_device_calls == threads * rounds);
  CHECK(c.device_to_host_calls == threads * rounds);
  CHECK(c.host_to_device_bytes == threads * rounds * 64);
  CHECK(c.device_to_host_bytes == threads * rounds * 64);
}

TEST_CASE("an emulated device with zero capacity is refused") {
  CHECK(error_of([] { mem::emulated_device dev(0); }) == pdcoll::errc::invalid_argument);
}

// The collectives' idle scratch (up to 256 MiB kept by the domain) must not
// starve the caller's allocations: a full arena frees it and tries again.
TEST_CASE("an allocation that finds the arena full of idle scratch frees the scratch and succeeds") {
  constexpr std::size_t arena = std::size_t{8} << 20;
  mem::emulated_device dev(arena);
  dev.scratch().give(dev.allocate<std::byte>(std::size_t{1} << 20));
  dev.scratch().give(dev.allocate<std::byte>(std::size_t{2} << 20));
  REQUIRE(dev.scratch().held_bytes() == (std::size_t{3} << 20));
  auto whole = dev.allocate<std::byte>(arena);
  CHECK(whole.size() == arena);
  CHECK(dev.scratch().held_bytes() == 0);
  // Past the arena even with no scratch held: still not_enough_memory.
  CHECK(error_of([&] { (void)dev.allocate<std::byte>(1); }) == std::errc::not_enough_memory);
  whole.reset();
  dev.scratch().give(dev.allocate<std::byte>(std::size_t{1} << 20));
  CHECK(error_of([&] { (void)dev.allocate<std::byte>(arena + 1); }) == std::errc::not_enough_memory);
  CHECK(dev.scratch().held_bytes() == 0);  // freed on the way, in vain
}
