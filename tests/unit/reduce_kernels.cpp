// The kernels against a scalar reference: every (type, op) pair on random
// data, counts that leave vector tails, aliasing forms of apply3, user ops,
// avg finalisation and the type-erased entry points.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>  // doctest prints std::error_code through operator<<
#include <random>
#include <type_traits>
#include <vector>

#include "pdcoll/reduce/kernels.hpp"

namespace {

using pdcoll::bfloat16;
using pdcoll::float16;
namespace op = pdcoll::op;
namespace kernels = pdcoll::kernels;

template <class T>
double as_double(T x) {
  return static_cast<double>(static_cast<float>(x));
}
template <>
double as_double(double x) {
  return x;
}

// Counts around the kernels' 64-element block and vector widths, including 0.
constexpr std::size_t counts[] = {0, 1, 3, 15, 17, 63, 64, 65, 129, 1001};

template <class T>
std::vector<T> random_values(std::size_t n, std::mt19937_64& rng) {
  std::vector<T> v(n);
  for (auto& x : v) {
    if constexpr (std::is_integral_v<T>) {
      x = static_cast<T>(rng());  // the full range, so sums and products wrap
    } else {
      std::uniform_real_distribution<float> d(-100.0f, 100.0f);
      x = T(d(rng));
    }
  }
  return v;
}

// Scalar reference semantics written independently of the kernels: integers
// combine modulo 2^64 then truncate; floating values combine in float (the
// 16-bit types) or their own type; min/max return NaN if either side is NaN.
template <class T>
T reference(pdcoll::reduction r, T a, T b) {
  using pdcoll::reduction;
  if constexpr (std::is_integral_v<T>) {
    const auto ua = static_cast<std::uint64_t>(a), ub = static_cast<std::uint64_t>(b);
    switch (r) {
      case reduction::sum:
      case reduction::avg: return static_cast<T>(ua + ub);
      case reduction::prod: return static_cast<T>(ua * ub);
      case reduction::min: return std::min(a, b);
      case reduction::max: return std::max(a, b);
      default: break;
    }
    return T{};
  } else {
    using C = std::conditional_t<pdcoll::is_half_v<T>, float, T>;
    const C x = static_cast<C>(a), y = static_cast<C>(b);
    const C nan = std::numeric_limits<C>::quiet_NaN();
    C z{};
    switch (r) {
      case reduction::sum:
      case reduction::avg: z = x + y; break;
      case reduction::prod: z = x * y; break;
      case reduction::min: z = std::isnan(x) || std::isnan(y) ? nan : std::min(x, y); break;
      case reduction::max: z = std::isnan(x) || std::isnan(y) ? nan : std::max(x, y); break;
      default: break;
    }
    return T(z);
  }
}

template <class T>
bool same_value(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return a == b;
  } else {
    const float x = static_cast<float>(a), y = static_cast<float>(b);
    if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y);
    if constexpr (pdcoll::is_half_v<T>)
      return a.bits == b.bits;
    else
      return std::memcmp(&a, &b, sizeof a) == 0;
  }
}

template <class T, class Op>
void check_op_against_reference(Op o) {
  constexpr pdcoll::reduction r = pdcoll::reduction_of<Op>;
  std::mt19937_64 rng(0x5eed + static_cast<unsigned>(r) * 31 + sizeof(T));
  for (const std::size_t n : counts) {
    CAPTURE(n);
    const auto a = random_values<T>(n, rng);
    const auto b = random_values<T>(n, rng);
    std::vector<T> expected(n);
    for (std::size_t i = 0; i < n; ++i) expected[i] = reference(r, a[i], b[i]);
    auto check_all = [&](const std::vector<T>& got, const char* form) {
      CAPTURE(form);
      for (std::size_t i = 0; i < n; ++i) {
        CAPTURE(i);
        REQUIRE(same_value(got[i], expected[i]));
      }
    };

    auto inout = a;
    kernels::apply(inout.data(), b.data(), n, o);
    check_all(inout, "apply");

    std::vector<T> out(n);
    kernels::apply3(out.data(), a.data(), b.data(), n, o);
    check_all(out, "apply3 out of place");

    auto aliased_a = a;
    kernels::apply3(aliased_a.data(), aliased_a.data(), b.data(), n, o);
    check_all(aliased_a, "apply3 out == a");

    auto aliased_b = b;
    kernels::apply3(aliased_b.data(), a.data(), aliased_b.data(), n, o);
    check_all(aliased_b, "apply3 out == b");

    auto erased = a;
    REQUIRE_FALSE(kernels::apply(pdcoll::data_type_of<T>, r, erased.data(), b.data(), n));
    check_all(erased, "type-erased apply");
  }
}

}  // namespace

TEST_SUITE("reduce.kernels") {

TEST_CASE_TEMPLATE("every op on every element type matches the scalar reference, tails included", T, float,
                   double, float16, bfloat16, std::int8_t, std::uint8_t, std::int32_t, std::uint32_t,
                   std::int64_t, std::uint64_t) {
  SUBCASE("sum") { check_op_against_reference<T>(op::sum); }
  SUBCASE("prod") { check_op_against_reference<T>(op::prod); }
  SUBCASE("min") { check_op_against_reference<T>(op::min); }
  SUBCASE("max") { check_op_against_reference<T>(op::max); }
  SUBCASE("avg combines as sum") { check_op_against_reference<T>(op::avg); }
}

TEST_CASE("integer sum and product wrap modulo 2^bits instead of overflowing") {
  std::int32_t a[] = {std::numeric_limits<std::int32_t>::max(), std::numeric_limits<std::int32_t>::min()};
  const std::int32_t b[] = {1, -1};
  kernels::apply(a, b, 2, op::sum);
  CHECK(a[0] == std::numeric_limits<std::int32_t>::min());
  CHECK(a[1] == std::numeric_limits<std::int32_t>::max());
  std::int8_t c[] = {64, -128};
  const std::int8_t d[] = {2, -1};
  kernels::apply(c, d, 2, op::prod);
  CHECK(c[0] == -128);
  CHECK(c[1] == -128);
}

TEST_CASE_TEMPLATE("min and max return NaN when either operand is NaN, whatever the order", T, float, double,
                   bfloat16, float16) {
  const T nan = T(std::numeric_limits<float>::quiet_NaN());
  std::vector<T> x(70, T(1.0f)), y(70, T(2.0f));
  x[3] = nan;   // NaN on the left
  y[5] = nan;   // NaN on the right
  x[66] = nan;  // in the tail
  y[67] = nan;
  for (int which = 0; which < 2; ++which) {
    std::vector<T> out(x.size());
    if (which == 0)
      kernels::apply3(out.data(), x.data(), y.data(), out.size(), op::min);
    else
      kernels::apply3(out.data(), x.data(), y.data(), out.size(), op::max);
    for (std::size_t i = 0; i < out.size(); ++i) {
      const bool nan_expected = i == 3 || i == 5 || i == 66 || i == 67;
      CAPTURE(i);
      CHECK(std::isnan(as_double(out[i])) == nan_expected);
      if (!nan_expected) CHECK(as_double(out[i]) == (which == 0 ? 1.0 : 2.0));
    }
  }
}

TEST_CASE("a user-defined absmax reduces float and bfloat16 buffers through float") {
  struct absmax {
    float operator()(float a, float b) const { return std::fabs(a) < std::fabs(b) ? b : a; }
  };
  float f[] = {1.0f, -5.0f, 3.0f, -0.5f, 2.0f};
  const float g[] = {-2.0f, 4.0f, -3.5f, 0.25f, -2.0f};
  kernels::apply(f, g, 5, absmax{});
  CHECK(f[0] == -2.0f);
  CHECK(f[1] == -5.0f);
  CHECK(f[2] == -3.5f);
  CHECK(f[3] == -0.5f);
  CHECK(f[4] == 2.0f);  // ties keep the left operand

  std::vector<bfloat16> a(131), b(131);
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = bfloat16(static_cast<float>(i) * ((i % 2) ? -1.0f : 1.0f));
    b[i] = bfloat16(static_cast<float>(a.size() - i));
  }
  auto out = a;
  kernels::apply(out.data(), b.data(), out.size(), absmax{});
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    CHECK(static_cast<float>(out[i]) == absmax{}(static_cast<float>(a[i]), static_cast<float>(b[i])));
  }
}

TEST_CASE("apply3 keeps the operand order of a non-commutative user op when out aliases either input") {
  struct left_minus_twice_right {
    std::int32_t operator()(std::int32_t a, std::int32_t b) const { return a - 2 * b; }
  };
  std::vector<std::int32_t> a(100), b(100);
  for (int i = 0; i < 100; ++i) {
    a[static_cast<std::size_t>(i)] = 3 * i;
    b[static_cast<std::size_t>(i)] = i + 1;
  }
  auto expected = [&](std::size_t i) { return a[i] - 2 * b[i]; };
  auto out_a = a;
  kernels::apply3(out_a.data(), out_a.data(), b.data(), 100, left_minus_twice_right{});
  auto out_b = b;
  kernels::apply3(out_b.data(), a.data(), out_b.data(), 100, left_minus_twice_right{});
  auto self = a;
  kernels::apply3(self.data(), self.data(), self.data(), 100, left_minus_twice_right{});
  for (std::size_t i = 0; i < 100; ++i) {
    CAPTURE(i);
    CHECK(out_a[i] == expected(i));
    CHECK(out_b[i] == expected(i));
    CHECK(self[i] == -a[i]);
  }
}

TEST_CASE("a user op written on the storage type runs on bfloat16 without going through float") {
  struct keep_bits_max {
    bfloat16 operator()(bfloat16 a, bfloat16 b) const { return a.bits < b.bits ? b : a; }
  };
  const bfloat16 nan_payload = bfloat16::from_bits(0x7f81);  // a NaN float conversion would quieten
  std::vector<bfloat16> a(67, bfloat16::from_bits(0x0001)), b(67, nan_payload);
  kernels::apply(a.data(), b.data(), a.size(), keep_bits_max{});
  for (const auto& x : a) CHECK(x.bits == 0x7f81);
}

TEST_CASE_TEMPLATE("avg finalisation divides floating sums by the world size", T, float, double, bfloat16,
                   float16) {
  // Three ranks each hold (i, 2i, 3i): the sum is 6i, the mean 2i.
  const int world = 3;
  std::vector<T> acc(77), contribution(77);
  for (std::size_t i = 0; i < acc.size(); ++i) acc[i] = T(static_cast<float>(i));
  for (int rank = 2; rank <= world; ++rank) {
    for (std::size_t i = 0; i < acc.size(); ++i)
      contribution[i] = T(static_cast<float>(rank * static_cast<int>(i)));
    kernels::apply(acc.data(), contribution.data(), acc.size(), op::avg);
  }
  REQUIRE_FALSE(kernels::finalize_avg(acc.data(), acc.size(), world));
  for (std::size_t i = 0; i < acc.size(); ++i) {
    CAPTURE(i);
    // Every partial sum (at most 6 * 76) fits bfloat16's 8 significant bits,
    // so the mean is exact in every type.
    CHECK(as_double(acc[i]) == 2.0 * static_cast<double>(i));
  }
  std::vector<T> one(5, T(7.0f));
  REQUIRE_FALSE(kernels::finalize_avg(one.data(), one.size(), 1));
  for (const auto& x : one) CHECK(as_double(x) == 7.0);
}

TEST_CASE("integer avg finalisation truncates toward zero") {
  std::int32_t s[] = {7, -7, 6, -1, std::numeric_limits<std::int32_t>::min()};
  REQUIRE_FALSE(kernels::finalize_avg(s, 5, 2));
  CHECK(s[0] == 3);
  CHECK(s[1] == -3);
  CHECK(s[2] == 3);
  CHECK(s[3] == 0);
  CHECK(s[4] == std::numeric_limits<std::int32_t>::min() / 2);
  std::uint8_t u[] = {255, 4, 5};
  REQUIRE_FALSE(kernels::finalize_avg(u, 3, 4));
  CHECK(u[0] == 63);
  CHECK(u[1] == 1);
  CHECK(u[2] == 1);
  std::int64_t big[] = {std::numeric_limits<std::int64_t>::min(), -9};
  REQUIRE_FALSE(kernels::finalize_avg(big, 2, 8));
  CHECK(big[0] == std::numeric_limits<std::int64_t>::min() / 8);
  CHECK(big[1] == -1);
}

TEST_CASE("avg finalisation rejects a world size below one and leaves the data untouched") {
  float f[] = {4.0f, 8.0f};
  for (const int bad : {0, -1, std::numeric_limits<int>::min()}) {
    const std::error_code ec = kernels::finalize_avg(f, 2, bad);
    CHECK(ec == pdcoll::errc::invalid_argument);
    CHECK(&ec.category() == &pdcoll::error_category());
  }
  CHECK(f[0] == 4.0f);
  CHECK(f[1] == 8.0f);
  CHECK(kernels::finalize_avg(pdcoll::data_type::int32, f, 2, 0) == pdcoll::errc::invalid_argument);
}

TEST_CASE("type-erased entry points reject custom and unknown descriptors") {
  float a[] = {1.0f}, b[] = {2.0f};
  CHECK(kernels::apply(pdcoll::data_type::float32, pdcoll::reduction::custom, a, b, 1) ==
        pdcoll::errc::unsupported_op);
  CHECK(kernels::apply(pdcoll::data_type::float32, static_cast<pdcoll::reduction>(42), a, b, 1) ==
        pdcoll::errc::unsupported_op);
  CHECK(kernels::apply(static_cast<pdcoll::data_type>(42), pdcoll::reduction::sum, a, b, 1) ==
        pdcoll::errc::invalid_argument);
  CHECK(a[0] == 1.0f);
  std::int64_t sums[] = {10, -10};
  REQUIRE_FALSE(kernels::finalize_avg(pdcoll::data_type::int64, sums, 2, 4));
  CHECK(sums[0] == 2);
  CHECK(sums[1] == -2);
}

}  // TEST_SUITE
