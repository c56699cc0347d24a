// Views: host views behave like tagged spans; device views expose no host
// pointer and report what the fabric registers.
#include <doctest/doctest.h>

#include <pdcoll/memory/emulated_device.hpp>
#include <pdcoll/memory/host.hpp>
#include <pdcoll/memory/view.hpp>

#include <array>
#include <cstdint>
#include <span>
#include <system_error>
#include <type_traits>
#include <vector>

namespace mem = pdcoll::memory;

// The point of device views: no way to get at a host pointer through the public API.
template <class V>
concept has_data = requires(const V& v) { v.data(); };
template <class V>
concept has_span = requires(const V& v) { v.span(); };
template <class V>
concept has_region = requires(const V& v) { v.region(); };
static_assert(!has_data<pdcoll::view<int, mem::emulated_device>>);
static_assert(!has_data<pdcoll::view<const float, mem::emulated_device>>);
static_assert(!has_span<pdcoll::view<int, mem::emulated_device>>);
static_assert(!has_region<pdcoll::view<int, mem::emulated_device>>);
static_assert(!std::is_convertible_v<pdcoll::view<int, mem::emulated_device>, std::span<int>>);
static_assert(!std::is_convertible_v<pdcoll::view<int, mem::emulated_device>, int*>);
static_assert(!std::is_constructible_v<pdcoll::view<int, mem::emulated_device>, int*, std::size_t>);
static_assert(!has_data<mem::device_buffer<int, mem::emulated_device>>);
static_assert(has_data<pdcoll::view<int>>);

// Host views: defaults, conversions and the tag.
static_assert(std::is_same_v<pdcoll::view<int>, pdcoll::view<int, mem::host>>);
static_assert(std::is_convertible_v<std::span<int>, pdcoll::view<int>>);
static_assert(std::is_convertible_v<std::vector<int>&, pdcoll::view<int>>);
static_assert(std::is_convertible_v<const std::vector<int>&, pdcoll::view<const int>>);
static_assert(!std::is_convertible_v<const std::vector<int>&, pdcoll::view<int>>);
static_assert(!std::is_convertible_v<std::vector<int>&&, pdcoll::view<int>>, "a temporary would dangle");
static_assert(std::is_convertible_v<pdcoll::view<int>, pdcoll::view<const int>>);
static_assert(!std::is_convertible_v<pdcoll::view<const int>, pdcoll::view<int>>);
static_assert(std::is_convertible_v<pdcoll::view<int, mem::emulated_device>,
                                    pdcoll::view<const int, mem::emulated_device>>);
static_assert(!std::is_convertible_v<pdcoll::view<const int, mem::emulated_device>,
                                     pdcoll::view<int, mem::emulated_device>>);
static_assert(pdcoll::view<int>::kind == pdcoll::transport::memory_kind::host);
static_assert(pdcoll::view<int, mem::emulated_device>::kind == pdcoll::transport::memory_kind::emulated_device);
static_assert(mem::memory_domain<mem::host>);
static_assert(!mem::device_domain<mem::host>);
static_assert(mem::device_domain<mem::emulated_device>);

TEST_CASE("a host view made from a span sees the same elements and sizes") {
  std::vector<std::uint32_t> values{1, 2, 3, 4, 5};
  pdcoll::view<std::uint32_t> v = std::span<std::uint32_t>(values);
  CHECK(v.data() == values.data());
  CHECK(v.size() == 5);
  CHECK(v.size_bytes() == 5 * sizeof(std::uint32_t));
  CHECK_FALSE(v.empty());
  pdcoll::view<std::uint32_t> from_vector = values;
  CHECK(from_vector.data() == values.data());
  pdcoll::view<std::uint32_t> from_pointer(values.data() + 1, 3);
  CHECK(from_pointer.span()[0] == 2);
  std::span<std::uint32_t> back = from_pointer;
  CHECK(back.size() == 3);
}

TEST_CASE("a host subview points into its parent and rejects ranges past the end") {
  std::array<int, 8> values{0, 1, 2, 3, 4, 5, 6, 7};
  pdcoll::view<int> v = values;
  auto middle = v.subview(2, 3);
  CHECK(middle.data() == values.data() + 2);
  CHECK(middle.size() == 3);
  CHECK(v.subview(8).empty());
  CHECK(v.subview(5).size() == 3);
  CHECK_THROWS_AS((void)v.subview(7, 2), std::system_error);
  CHECK_THROWS_AS((void)v.subview(9), std::system_error);
  try {
    (void)v.subview(std::size_t(-1), 2);
    FAIL("an offset near SIZE_MAX must not wrap around");
  } catch (const std::system_error& e) {
    CHECK(e.code() == pdcoll::errc::invalid_argument);
  }
}

TEST_CASE("fabric_region of a host view is the bytes themselves with the system iface") {
  std::vector<double> values(16);
  pdcoll::view<const double> v = values;
  const auto region = mem::detail::fabric_region(v.subview(4, 8));
  CHECK(region.address == values.data() + 4);
  CHECK(region.length == 8 * sizeof(double));
  CHECK(region.kind == pdcoll::transport::memory_kind::host);
  CHECK(region.dmabuf_fd == -1);
  CHECK(region.hmem_iface == 0);
}

TEST_CASE("a device subview shifts the device address and keeps the domain") {
  mem::emulated_device dev(1 << 20);
  auto buf = dev.allocate<std::uint64_t>(100);
  auto v = buf.view();
  auto sub = v.subview(10, 20);
  CHECK(&sub.domain() == &dev);
  CHECK(sub.size() == 20);
  CHECK(sub.size_bytes() == 160);
  CHECK(sub.device_address() == v.device_address() + 80);
  pdcoll::view<const std::uint64_t, mem::emulated_device> read_only = sub;
  CHECK(read_only.device_address() == sub.device_address());
  CHECK_THROWS_AS((void)v.subview(90, 11), std::system_error);
  CHECK(v.subview(100).empty());
}

TEST_CASE("fabric_region of an emulated-device view names the memfd, offset and private mapping") {
  mem::emulated_device dev(1 << 20);
  auto buf = dev.allocate<float>(2048);
  auto whole = mem::detail::fabric_region(buf.view());
  auto part = mem::detail::fabric_region(buf.view().subview(256, 512));
  CHECK(whole.kind == pdcoll::transport::memory_kind::emulated_device);
  CHECK(whole.hmem_iface == 0);
  CHECK(whole.dmabuf_fd >= 0);
  CHECK(whole.length == 2048 * sizeof(float));
  CHECK(part.dmabuf_fd == whole.dmabuf_fd);
  CHECK(part.dmabuf_offset == whole.dmabuf_offset + 256 * sizeof(float));
  CHECK(static_cast<char*>(part.address) == static_cast<char*>(whole.address) + 256 * sizeof(float));
  CHECK(part.length == 512 * sizeof(float));
  const auto exported = dev.export_dmabuf(buf.view().subview(256, 512));
  CHECK(exported.fd == part.dmabuf_fd);
  CHECK(exported.offset == part.dmabuf_offset);
  CHECK(exported.length == part.length);
}

TEST_CASE("a default-constructed device view is empty and reports an empty region") {
  pdcoll::view<int, mem::emulated_device> v;
  CHECK(v.empty());
  CHECK(v.size_bytes() == 0);
  const auto region = mem::detail::fabric_region(v);
  CHECK(region.address == nullptr);
  CHECK(region.length == 0);
  CHECK(region.kind == pdcoll::transport::memory_kind::emulated_device);
}
