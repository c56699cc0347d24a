// Host domain: mmap-backed buffers, huge pages reported honestly, and
// invalidation hooks that run before the pages go away.
#include <doctest/doctest.h>

#include <pdcoll/memory/host.hpp>

#include <cstdint>
#include <limits>
#include <system_error>
#include <vector>

namespace mem = pdcoll::memory;

TEST_CASE("a host buffer is zero-filled, page-aligned and writable") {
  auto buf = mem::host::allocate<std::uint32_t>(1000);
  REQUIRE(buf.size() == 1000);
  CHECK(buf.size_bytes() == 4000);
  CHECK(reinterpret_cast<std::uintptr_t>(buf.data()) % mem::detail::page_size() == 0);
  CHECK(buf.mapped_bytes() % mem::detail::page_size() == 0);
  CHECK(buf.backing() == mem::page_backing::regular);
  bool all_zero = true;
  for (auto value : buf.span()) all_zero = all_zero && value == 0;
  CHECK(all_zero);
  buf.span()[999] = 7;
  pdcoll::view<std::uint32_t> v = buf.view();
  CHECK(v.data()[999] == 7);
}

TEST_CASE("a huge-page host buffer reports which backing it got and is huge-page aligned") {
  auto buf = mem::host::allocate<float>(1 << 20, mem::huge_pages::yes);
  REQUIRE(buf.size() == (1u << 20));
  MESSAGE("huge_pages::yes got " << mem::to_string(buf.backing()) << " pages (huge page size "
                                 << mem::detail::huge_page_size() << " bytes)");
  CHECK(buf.mapped_bytes() % mem::detail::huge_page_size() == 0);
  if (buf.backing() != mem::page_backing::regular)
    CHECK(reinterpret_cast<std::uintptr_t>(buf.data()) % mem::detail::huge_page_size() == 0);
  buf.span()[0] = 1.0f;
  buf.span()[buf.size() - 1] = 2.0f;
  CHECK(buf.view().data()[buf.size() - 1] == 2.0f);
}

TEST_CASE("host allocation of an overflowing count fails with count_overflow") {
  try {
    (void)mem::host::allocate<std::uint64_t>(std::numeric_limits<std::size_t>::max() / 4);
    FAIL("expected an error");
  } catch (const std::system_error& e) {
    CHECK(e.code() == pdcoll::errc::count_overflow);
  }
}

TEST_CASE("a zero-count host buffer is empty and frees nothing") {
  std::vector<pdcoll::transport::memory_region> seen;
  const auto id = mem::host::add_invalidation_hook([&](const auto& r) { seen.push_back(r); });
  {
    auto buf = mem::host::allocate<int>(0);
    CHECK(buf.empty());
    CHECK(buf.data() == nullptr);
  }
  mem::host::remove_invalidation_hook(id);
  CHECK(seen.empty());
}

TEST_CASE("host invalidation hooks see the freed buffer's region once, and not after removal") {
  std::vector<pdcoll::transport::memory_region> seen;
  const auto id = mem::host::add_invalidation_hook([&](const auto& r) { seen.push_back(r); });
  void* address = nullptr;
  {
    auto buf = mem::host::allocate<double>(300);
    address = buf.data();
    auto moved = std::move(buf);
    CHECK(buf.empty());
    CHECK(seen.empty());
  }
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].address == address);
  CHECK(seen[0].length == 300 * sizeof(double));
  CHECK(seen[0].kind == pdcoll::transport::memory_kind::host);
  mem::host::remove_invalidation_hook(id);
  { auto other = mem::host::allocate<double>(10); }
  CHECK(seen.size() == 1);
}

TEST_CASE("move-assigning a host buffer frees the one it replaces") {
  int freed = 0;
  const auto id = mem::host::add_invalidation_hook([&](const auto&) { ++freed; });
  auto a = mem::host::allocate<char>(10);
  auto b = mem::host::allocate<char>(20);
  a = std::move(b);
  CHECK(freed == 1);
  CHECK(a.size() == 20);
  a.reset();
  CHECK(freed == 2);
  mem::host::remove_invalidation_hook(id);
}
