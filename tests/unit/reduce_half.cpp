// Conversions of pdcoll::bfloat16 and pdcoll::float16 against independent
// references written with double arithmetic (and, where the CPU has F16C,
// against the hardware's own float → binary16 conversion).
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "pdcoll/reduce/half.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define PDCOLL_TEST_F16C 1
#endif

namespace {

using pdcoll::bfloat16;
using pdcoll::float16;

std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }
float float_of(std::uint32_t u) { return std::bit_cast<float>(u); }

// Decodes binary16 from its definition: (-1)^s * 2^(e-15) * 1.m, or
// 2^-14 * 0.m for subnormals.
double reference_f16_value(std::uint16_t h) {
  const int sign = h >> 15;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  double magnitude;
  if (exponent == 0x1f)
    magnitude = mantissa ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (exponent == 0)
    magnitude = std::ldexp(mantissa, -24);
  else
    magnitude = std::ldexp(1024 + mantissa, exponent - 25);
  return sign ? -magnitude : magnitude;
}

// Encodes a float as a 16-bit float with `mantissa_bits` fraction bits and
// exponent range [min_exponent, max_exponent], rounding to nearest even with
// std::nearbyint (default rounding mode) on exact double values.
std::uint16_t reference_encode(float x, int mantissa_bits, int min_exponent, int max_exponent,
                               int exponent_bias, std::uint16_t quiet_nan) {
  const std::uint16_t sign = std::signbit(x) ? static_cast<std::uint16_t>(0x8000) : std::uint16_t{0};
  if (std::isnan(x)) return static_cast<std::uint16_t>(sign | quiet_nan);
  const std::uint16_t infinity =
      static_cast<std::uint16_t>(((max_exponent + exponent_bias + 1) << mantissa_bits));
  const double a = std::fabs(static_cast<double>(x));
  if (std::isinf(a)) return static_cast<std::uint16_t>(sign | infinity);
  int e = std::ilogb(a == 0 ? 1.0 : a);
  if (a == 0 || e < min_exponent) e = min_exponent;  // subnormal range: fixed quantum
  const double quantum = std::ldexp(1.0, e - mantissa_bits);
  double q = std::nearbyint(a / quantum);  // a / quantum is exact (power-of-two scaling)
  if (q >= std::ldexp(1.0, mantissa_bits + 1)) {  // rounded up into the next binade
    q /= 2;
    ++e;
  }
  if (e > max_exponent) return static_cast<std::uint16_t>(sign | infinity);
  const bool normal = q >= std::ldexp(1.0, mantissa_bits);
  const auto fraction = static_cast<std::uint32_t>(q) & ((1u << mantissa_bits) - 1);
  const std::uint32_t biased = normal ? static_cast<std::uint32_t>(e + exponent_bias) : 0u;
  return static_cast<std::uint16_t>(sign | (biased << mantissa_bits) | fraction);
}

std::uint16_t reference_f16_bits(float x) { return reference_encode(x, 10, -14, 15, 15, 0x7e00); }

// bfloat16 NaNs keep their payload (truncated) with the quiet bit set.
std::uint16_t reference_bf16_bits(float x) {
  if (std::isnan(x)) return static_cast<std::uint16_t>((bits_of(x) >> 16) | 0x0040);
  return reference_encode(x, 7, -126, 127, 127, 0);
}

#if PDCOLL_TEST_F16C
// clang 14's __builtin_cpu_supports does not know "f16c"; ask CPUID (leaf 1, ECX bit 29).
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}

__attribute__((target("f16c"))) std::uint16_t hardware_f16_bits(float x) {
  return static_cast<std::uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#endif

}  // namespace

TEST_SUITE("reduce.half") {

TEST_CASE("bfloat16 and float16 are two-byte trivially copyable types usable in constant expressions") {
  static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2);
  static_assert(sizeof(float16) == 2 && alignof(float16) == 2);
  static_assert(std::is_trivially_copyable_v<bfloat16> && std::is_trivially_copyable_v<float16>);
  static_assert(static_cast<float>(bfloat16{1.0f}) == 1.0f);
  static_assert(float16{1.0f}.bits == 0x3c00);
  static_assert(bfloat16{-2.0f}.bits == 0xc000);
  CHECK(bfloat16{0.5f} == bfloat16{0.5f});
  CHECK(float16{1.0f} < float16{2.0f});
  CHECK(float16::from_bits(0x0000) == float16::from_bits(0x8000));  // +0 == -0
  CHECK_FALSE(float16::from_bits(0x7e00) == float16::from_bits(0x7e00));  // NaN != NaN
}

TEST_CASE("every bfloat16 bit pattern widens exactly and narrows back to itself, NaNs staying NaN") {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const auto h = bfloat16::from_bits(static_cast<std::uint16_t>(b));
    const float f = static_cast<float>(h);
    REQUIRE(bits_of(f) == (b << 16));
    const bfloat16 back{f};
    if (std::isnan(f)) {
      REQUIRE(std::isnan(static_cast<float>(back)));
      REQUIRE((back.bits & 0x8000) == (b & 0x8000));
      REQUIRE(back.bits == (b | 0x0040));  // payload kept, quietened
    } else {
      REQUIRE(back.bits == b);
    }
  }
}

TEST_CASE("every float16 bit pattern widens to its exact value and narrows back to itself") {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const auto h = float16::from_bits(static_cast<std::uint16_t>(b));
    const float f = static_cast<float>(h);
    const double expected = reference_f16_value(static_cast<std::uint16_t>(b));
    const float16 back{f};
    if (std::isnan(expected)) {
      REQUIRE(std::isnan(f));
      REQUIRE(back.bits == ((b & 0x8000) | 0x7e00));
    } else {
      REQUIRE(static_cast<double>(f) == expected);
      REQUIRE(std::signbit(f) == ((b & 0x8000) != 0));
      REQUIRE(back.bits == b);
    }
  }
}

TEST_CASE("float to float16 rounds every midpoint to even and its neighbours to nearest") {
  // Consecutive non-negative finite binary16 values h, h+1 (the last pair is
  // 65504 and the overflow point 65536); their midpoint needs 12 significant
  // bits, so it is exact in float.
  for (std::uint32_t b = 0; b < 0x7c00; ++b) {
    const double lo = reference_f16_value(static_cast<std::uint16_t>(b));
    const double hi = b + 1 == 0x7c00 ? 65536.0 : reference_f16_value(static_cast<std::uint16_t>(b + 1));
    const float mid = static_cast<float>((lo + hi) / 2);
    REQUIRE(static_cast<double>(mid) == (lo + hi) / 2);
    const std::uint16_t even = (b & 1) ? static_cast<std::uint16_t>(b + 1) : static_cast<std::uint16_t>(b);
    REQUIRE(float16{mid}.bits == even);
    REQUIRE(float16{-mid}.bits == (even | 0x8000));
    REQUIRE(float16{std::nextafter(mid, 0.0f)}.bits == b);
    REQUIRE(float16{std::nextafter(mid, 1e9f)}.bits == b + 1);
  }
  CHECK(float16{65504.0f}.bits == 0x7bff);
  CHECK(float16{65519.996f}.bits == 0x7bff);
  CHECK(float16{65520.0f}.bits == 0x7c00);  // tie between 65504 (odd) and 2^16: to +Inf
  CHECK(float16{std::numeric_limits<float>::max()}.bits == 0x7c00);
  CHECK(float16{-std::numeric_limits<float>::infinity()}.bits == 0xfc00);
  CHECK(float16{0x1.0p-25f}.bits == 0x0000);  // half the smallest subnormal ties to even: zero
  CHECK(float16{0x1.000002p-25f}.bits == 0x0001);
  CHECK(float16{0x1.8p-24f}.bits == 0x0002);  // 1.5 quanta ties to 2
  CHECK(float16{-0.0f}.bits == 0x8000);
  CHECK(float16{std::numeric_limits<float>::denorm_min()}.bits == 0x0000);
}

TEST_CASE("float to bfloat16 rounds ties to even, overflows to infinity and keeps NaN") {
  CHECK(bfloat16{float_of(0x3f808000)}.bits == 0x3f80);  // tie, even stays
  CHECK(bfloat16{float_of(0x3f818000)}.bits == 0x3f82);  // tie, odd rounds up
  CHECK(bfloat16{float_of(0x3f808001)}.bits == 0x3f81);
  CHECK(bfloat16{float_of(0x3f807fff)}.bits == 0x3f80);
  CHECK(bfloat16{std::numeric_limits<float>::max()}.bits == 0x7f80);
  CHECK(bfloat16{float_of(0x7f7f7fff)}.bits == 0x7f7f);  // largest finite bfloat16 survives
  CHECK(bfloat16{float_of(0x80000001)}.bits == 0x8000);  // tiny negative subnormal to -0
  CHECK(bfloat16{float_of(0x7f800001)}.bits == 0x7fc0);  // signalling NaN near Inf stays NaN
  CHECK(bfloat16{float_of(0xffffffff)}.bits == 0xffff);
  CHECK(std::isinf(static_cast<float>(bfloat16{std::numeric_limits<float>::infinity()})));
}

TEST_CASE("float to bfloat16 and float16 match the double-arithmetic reference across the float range") {
  // Every 4099th float pattern (a prime stride reaches every exponent and a
  // spread of mantissas) plus random patterns.
  std::mt19937 rng(12345);
  auto check = [](std::uint32_t u) {
    const float x = float_of(u);
    REQUIRE(bfloat16{x}.bits == reference_bf16_bits(x));
    REQUIRE(float16{x}.bits == reference_f16_bits(x));
  };
  for (std::uint64_t u = 0; u <= 0xffffffffu; u += 4099) check(static_cast<std::uint32_t>(u));
  for (int i = 0; i < 200000; ++i) check(static_cast<std::uint32_t>(rng()));
}

#if PDCOLL_TEST_F16C
TEST_CASE("float to float16 agrees with the F16C instruction where the CPU has it") {
  if (!cpu_has_f16c()) return;
  std::mt19937 rng(777);
  for (int i = 0; i < 300000; ++i) {
    // Bias towards the binary16 range, where the rounding is interesting.
    const std::uint32_t u = (i & 1) ? static_cast<std::uint32_t>(rng())
                                    : (static_cast<std::uint32_t>(rng()) & 0x87ffffffu) | 0x30000000u;
    const float x = float_of(u);
    const std::uint16_t hw = hardware_f16_bits(x);
    if (std::isnan(x)) {
      REQUIRE((float16{x}.bits & 0x7c00) == 0x7c00);
      REQUIRE((hw & 0x8000) == (float16{x}.bits & 0x8000));
    } else {
      REQUIRE(float16{x}.bits == hw);
    }
  }
}
#endif

}  // TEST_SUITE
