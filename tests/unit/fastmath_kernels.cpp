// The reduction kernels compiled with -ffast-math (tests/CMakeLists.txt sets
// it on this file alone, in its own binary): pdcoll is header-only, so its
// kernels take the user's flags, and ML runtimes often build with -Ofast.
// float16 narrowing must still overflow to Inf, and min and max must still
// propagate NaN, whichever operand holds it and whether the element falls
// in a vector body or a tail.
#include <doctest/doctest.h>

#include <pdcoll/reduce/kernels.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using pdcoll::float16;

#if !defined(__FAST_MATH__)
#error "fastmath_kernels.cpp must be compiled with -ffast-math (tests/CMakeLists.txt)"
#endif

// A float the optimiser cannot see through.
float opaque(float value) {
  volatile float v = value;
  return v;
}

bool is_nan(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return (u & 0x7fffffffu) > 0x7f800000u;
}

}  // namespace

TEST_SUITE("reduce.fastmath") {

TEST_CASE("float16 narrowing overflows to Inf under -ffast-math") {
  CHECK(float16(opaque(65504.0f)).bits == 0x7bff);   // the largest finite value
  CHECK(float16(opaque(65519.0f)).bits == 0x7bff);   // below the halfway point
  CHECK(float16(opaque(65520.0f)).bits == 0x7c00);   // the tie rounds to even: Inf
  CHECK(float16(opaque(1e5f)).bits == 0x7c00);
  CHECK(float16(opaque(-3e38f)).bits == 0xfc00);
  CHECK(float16(opaque(1.0f)).bits == 0x3c00);
  CHECK(float16(opaque(5.9604645e-8f)).bits == 0x0001);  // the smallest subnormal
  // A sum over the kernels, long enough for the vector body and a tail.
  for (const std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{37}}) {
    std::vector<float16> a(n, float16(opaque(60001.0f))), b(n, float16(opaque(60001.0f)));
    pdcoll::kernels::apply(a.data(), b.data(), n, pdcoll::op::sum);
    for (const auto& x : a) REQUIRE(x.bits == 0x7c00);
  }
}

TEST_CASE("min and max propagate NaN under -ffast-math, from either operand, in body and tail") {
  const float nan = opaque(std::numeric_limits<float>::quiet_NaN());
  for (const std::size_t n : {std::size_t{1}, std::size_t{5}, std::size_t{33}}) {
    for (std::size_t at = 0; at < n; at += (n > 8 ? 7 : 1)) {
      for (const bool nan_in_inout : {true, false}) {
        std::vector<float> lo(n, opaque(1.0f)), hi(n, opaque(2.0f));
        (nan_in_inout ? lo : hi)[at] = nan;
        auto min_out = lo;
        pdcoll::kernels::apply(min_out.data(), hi.data(), n, pdcoll::op::min);
        auto max_out = hi;
        pdcoll::kernels::apply(max_out.data(), lo.data(), n, pdcoll::op::max);
        for (std::size_t i = 0; i < n; ++i) {
          REQUIRE(is_nan(min_out[i]) == (i == at));
          REQUIRE(is_nan(max_out[i]) == (i == at));
        }
      }
    }
  }
  std::vector<double> d(9, 1.0), e(9, 2.0);
  e[8] = static_cast<double>(nan);
  pdcoll::kernels::apply(d.data(), e.data(), d.size(), pdcoll::op::min);
  std::uint64_t bits;
  std::memcpy(&bits, &d[8], sizeof bits);
  CHECK((bits & 0x7fffffffffffffffull) > 0x7ff0000000000000ull);
  CHECK(d[0] == 1.0);
}

}  // TEST_SUITE
