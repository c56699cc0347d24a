// File: reduce/half.hpp — the 16-bit floating-point storage types `bfloat16`
// and `float16` (IEEE 754 binary16), and their conversions to and from float.
//
// Both are storage types: two bytes, trivially copyable, no arithmetic of
// their own. Reductions widen to float, compute, and round back once per
// combine (see reduce/kernels.hpp). Conversions are branch-free integer and
// float operations so that the kernels' loops vectorise with baseline SSE2;
// they rely on the default floating-point environment (round to nearest even,
// no flush-to-zero), which is what C and C++ programs start with.
#pragma once

#include <bit>
#include <compare>
#include <cstdint>
#include <type_traits>

namespace pdcoll {

namespace detail {

constexpr std::uint32_t float_bits(float f) noexcept { return std::bit_cast<std::uint32_t>(f); }
constexpr float float_from_bits(std::uint32_t u) noexcept { return std::bit_cast<float>(u); }

/// `condition ? if_true : if_false` as mask arithmetic. A plain `?:` lets the
/// compiler sink the float operations feeding one side into a branch, and
/// with -ftrapping-math (the default) it will not if-convert such a branch
/// back, so the loop around it would not vectorise.
constexpr std::uint32_t select_bits(bool condition, std::uint32_t if_true, std::uint32_t if_false) noexcept {
  const std::uint32_t mask = 0u - static_cast<std::uint32_t>(condition);
  return (if_true & mask) | (if_false & ~mask);
}

/// bfloat16 is the top half of a float, so widening is a shift.
constexpr float bfloat16_bits_to_float(std::uint16_t h) noexcept {
  return float_from_bits(static_cast<std::uint32_t>(h) << 16);
}

/// Rounds to nearest, ties to even, by adding 0x7fff plus the lowest kept bit
/// before truncating; a carry out of the mantissa correctly bumps the exponent
/// (up to infinity). NaNs would be rounded into infinity that way, so they are
/// truncated instead with the quiet bit forced on: NaN stays NaN, sign kept.
constexpr std::uint16_t float_to_bfloat16_bits(float f) noexcept {
  const std::uint32_t u = float_bits(f);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t quiet_nan = (u >> 16) | 0x0040u;
  const bool is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  return static_cast<std::uint16_t>(is_nan ? quiet_nan : rounded);
}

/// float_to_bfloat16_bits without the NaN guard, for the reduction kernels'
/// built-in ops. Rounding adds at most 0x8000 to the low half, so it is exact
/// for every float except NaNs with non-zero low 16 bits, which it could turn
/// into Inf or -0. Float arithmetic never produces those from bfloat16
/// operands: a NaN result is either an operand's payload (low half zero,
/// having come from a bfloat16) or the default NaN 0x?fc00000.
constexpr std::uint16_t float_to_bfloat16_bits_arithmetic(float f) noexcept {
  const std::uint32_t u = float_bits(f);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/// binary16 → float, exact for every input. Normal numbers are rebiased by a
/// multiplication (exponent bias 15 → 127, which also carries Inf/NaN through
/// because 2^-112 * Inf = Inf); subnormals are assembled as 0.5 + m * 2^-24
/// in the [0.5, 1) binade and the 0.5 subtracted. The technique is Marat
/// Dukhan's (FP16 library, MIT licence), chosen because it has no branches.
constexpr float float16_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t w = static_cast<std::uint32_t>(h) << 16;
  const std::uint32_t sign = w & 0x80000000u;
  const std::uint32_t two_w = w + w;  // drops the sign bit
  const float normalized = float_from_bits((two_w >> 4) + (0xe0u << 23)) * 0x1.0p-112f;
  const float denormalized = float_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
  // two_w < 2^27 (exponent field zero), compared as signed 31-bit values:
  // SSE2 has a signed 32-bit compare but no unsigned one.
  const bool subnormal = static_cast<std::int32_t>(two_w >> 1) < static_cast<std::int32_t>(1u << 26);
  const std::uint32_t magnitude = select_bits(subnormal, float_bits(denormalized), float_bits(normalized));
  return float_from_bits(sign | magnitude);
}

/// float → binary16, round to nearest even, overflow to ±Inf, gradual
/// underflow to subnormals and ±0, NaN to the quiet NaN 0x7e00 with the sign
/// kept. The float hardware does the rounding: adding a power of two chosen
/// from the input's exponent aligns the binary16 ulp with the float ulp so
/// that the addition itself rounds to nearest even (Dukhan, FP16). Overflow
/// and NaN are decided on the bits, not by float arithmetic: a user's
/// -ffast-math folds Dukhan's 2^112-then-2^-110 scaling (which made
/// overflowing values Inf) into one ×4 and assumes no NaN, and this header
/// is compiled with the user's flags.
///
/// Returns the encoding in the low half of a 32-bit word: the kernels merge
/// two of these into one word, and keeping the arithmetic 32-bit stops the
/// vectoriser from narrowing it into 16-bit lanes (and shuffling) midway.
constexpr std::uint32_t float_to_float16_word(float f) noexcept {
  // Magnitudes and exponent fields are compared as signed 32-bit values
  // (all are below 2^31): SSE2 has a signed 32-bit compare but no unsigned one.
  const std::uint32_t w = float_bits(f);
  const std::uint32_t sign = w & 0x80000000u;
  const std::uint32_t magnitude = w & 0x7fffffffu;
  // 65520 (0x477ff000) lies halfway between binary16's largest finite value
  // 65504 and 2^16; the tie rounds to even, 2^16, which is Inf.
  const bool overflows = static_cast<std::int32_t>(magnitude) >= 0x477ff000;
  float base = float_from_bits(magnitude) * 0x1.0p+2f;
  const std::uint32_t exponent = w & 0x7f800000u;
  const bool below_normal = static_cast<std::int32_t>(exponent) < 0x38800000;  // < 2^-14: subnormal alignment
  const std::uint32_t bias = select_bits(below_normal, 0x38800000u, exponent);
  base = float_from_bits(bias + 0x07800000u) + base;
  const std::uint32_t bits = float_bits(base);
  const std::uint32_t exp_bits = (bits >> 13) & 0x00007c00u;
  const std::uint32_t mantissa_bits = bits & 0x00000fffu;
  const std::uint32_t nonsign = exp_bits + mantissa_bits;
  const bool is_nan = static_cast<std::int32_t>(magnitude) > 0x7f800000;
  return (sign >> 16) | select_bits(is_nan, 0x7e00u, select_bits(overflows, 0x7c00u, nonsign));
}

/// float → binary16 encoding (see float_to_float16_word).
constexpr std::uint16_t float_to_float16_bits(float f) noexcept {
  return static_cast<std::uint16_t>(float_to_float16_word(f));
}

}  // namespace detail

/// Brain floating point: 1 sign, 8 exponent, 7 mantissa bits (the top half of
/// an IEEE float). Construction from float rounds to nearest even; NaN stays
/// NaN (quietened), ±Inf and overflow give ±Inf. Two bytes, trivially
/// copyable; the default constructor leaves the value uninitialised like a float.
///
///     pdcoll::bfloat16 g{0.1f};
///     float back = static_cast<float>(g);   // 0.10009765625f
struct bfloat16 {
  std::uint16_t bits;  ///< the raw encoding, public so buffers can be built bitwise

  bfloat16() = default;
  /// Rounds `value` to the nearest bfloat16 (ties to even). Cost: a few integer ops.
  constexpr explicit bfloat16(float value) noexcept : bits(detail::float_to_bfloat16_bits(value)) {}
  /// The exact float value (widening is lossless).
  constexpr explicit operator float() const noexcept { return detail::bfloat16_bits_to_float(bits); }
  /// A bfloat16 with the given encoding.
  static constexpr bfloat16 from_bits(std::uint16_t raw) noexcept {
    bfloat16 b;
    b.bits = raw;
    return b;
  }
  /// Compares as floats: NaN is unequal to everything, +0 == -0.
  friend constexpr bool operator==(bfloat16 a, bfloat16 b) noexcept {
    return static_cast<float>(a) == static_cast<float>(b);
  }
  /// Orders as floats (a partial order because of NaN).
  friend constexpr auto operator<=>(bfloat16 a, bfloat16 b) noexcept {
    return static_cast<float>(a) <=> static_cast<float>(b);
  }
};

/// IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits, with subnormals.
/// Construction from float rounds to nearest even, overflows to ±Inf (the
/// largest finite value is 65504), underflows gradually; NaN becomes the quiet
/// NaN 0x7e00 (payload dropped, sign kept). Widening to float is exact.
///
///     pdcoll::float16 h{65520.0f};          // rounds up to +Inf
///     float tiny = static_cast<float>(pdcoll::float16::from_bits(0x0001));  // 2^-24
struct float16 {
  std::uint16_t bits;  ///< the raw encoding

  float16() = default;
  /// Rounds `value` to the nearest binary16 (ties to even). Cost: ~15 integer/float ops, no branches.
  constexpr explicit float16(float value) noexcept : bits(detail::float_to_float16_bits(value)) {}
  /// The exact float value.
  constexpr explicit operator float() const noexcept { return detail::float16_bits_to_float(bits); }
  /// A float16 with the given encoding.
  static constexpr float16 from_bits(std::uint16_t raw) noexcept {
    float16 h;
    h.bits = raw;
    return h;
  }
  /// Compares as floats: NaN is unequal to everything, +0 == -0.
  friend constexpr bool operator==(float16 a, float16 b) noexcept {
    return static_cast<float>(a) == static_cast<float>(b);
  }
  /// Orders as floats (a partial order because of NaN).
  friend constexpr auto operator<=>(float16 a, float16 b) noexcept {
    return static_cast<float>(a) <=> static_cast<float>(b);
  }
};

static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16> &&
              std::is_standard_layout_v<bfloat16>);
static_assert(sizeof(float16) == 2 && std::is_trivially_copyable_v<float16> &&
              std::is_standard_layout_v<float16>);

/// True for the 16-bit floating-point storage types, which reduce in float.
template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

}  // namespace pdcoll
