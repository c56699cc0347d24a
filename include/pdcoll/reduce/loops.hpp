// File: reduce/loops.hpp — the element-wise loops behind the reduction
// kernels (reduce/kernels.hpp): how a value of each element type is combined
// in its compute type (`element_codec`), and the three loop shapes, written
// once and compiled for each instruction set the kernels dispatch to
// (reduce/avx2_kernels.hpp compiles them again for AVX2).
//
// The loops are always inlined: a copy compiled for the baseline instruction
// set must never be what an AVX2 caller runs, and inlining into the caller is
// what makes the caller's target attribute apply to the loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "pdcoll/reduce/half.hpp"
#include "pdcoll/reduce/ops.hpp"

/// Forces a function into every caller, so that it is compiled for the
/// caller's instruction set (reduce/avx2_kernels.hpp).
#if defined(__GNUC__) || defined(__clang__)
#define PDCOLL_KERNEL_LOOP [[gnu::always_inline]] inline
#else
#define PDCOLL_KERNEL_LOOP inline
#endif

namespace pdcoll::kernels {

namespace detail {

using pdcoll::detail::combine;

/// How elements of T are combined with Op: `load` widens the stored value to
/// the compute type, `store` narrows it back.
template <class T, class Op>
struct element_codec {
  using compute = T;
  static constexpr T load(T v) noexcept { return v; }
  static constexpr T store(T v) noexcept { return v; }
};

// The 16-bit float types compute in float. Besides per-element load/store,
// their codecs convert a 16-bit encoding held in the low half of a 32-bit
// lane (`widen`/`narrow`), which the paired loops below use.
template <class Op>
  requires(pdcoll::detail::builtin_op<Op> || pdcoll::detail::custom_op_on<Op, float>)
struct element_codec<bfloat16, Op> {
  using compute = float;
  static constexpr float load(bfloat16 v) noexcept { return pdcoll::detail::bfloat16_bits_to_float(v.bits); }
  static constexpr bfloat16 store(float v) noexcept {
    return bfloat16::from_bits(pdcoll::detail::float_to_bfloat16_bits(v));
  }
  static constexpr float widen(std::uint32_t h) noexcept { return pdcoll::detail::float_from_bits(h << 16); }
  static constexpr std::uint32_t narrow(float v) noexcept {
    // A user op may build any NaN (e.g. std::nanf("1")); built-in ops only
    // propagate or create NaNs the cheaper rounding handles.
    if constexpr (pdcoll::detail::builtin_op<Op>)
      return pdcoll::detail::float_to_bfloat16_bits_arithmetic(v);
    else
      return pdcoll::detail::float_to_bfloat16_bits(v);
  }
};

template <class Op>
  requires(pdcoll::detail::builtin_op<Op> || pdcoll::detail::custom_op_on<Op, float>)
struct element_codec<float16, Op> {
  using compute = float;
  static constexpr float load(float16 v) noexcept { return pdcoll::detail::float16_bits_to_float(v.bits); }
  static constexpr float16 store(float v) noexcept {
    return float16::from_bits(pdcoll::detail::float_to_float16_bits(v));
  }
  static constexpr float widen(std::uint32_t h) noexcept {
    return pdcoll::detail::float16_bits_to_float(static_cast<std::uint16_t>(h));
  }
  static constexpr std::uint32_t narrow(float v) noexcept { return pdcoll::detail::float_to_float16_word(v); }
};

/// True when T is a 16-bit float type that Op combines in float: those loops
/// run on pairs of elements (below).
template <class T, class Op>
inline constexpr bool paired_v =
    is_half_v<T> && std::is_same_v<typename element_codec<T, Op>::compute, float>;

// Paired loops for float16/bfloat16. Converting 16-bit lanes to 32-bit ones
// and back element by element makes the vectoriser emit long unpack/shuffle
// sequences (SSE2 has no unsigned 32→16 pack), which left bfloat16 sums
// compute-bound at a third of memory bandwidth. Instead two neighbouring
// elements are loaded as one 32-bit word, each half is widened in place
// (mask or shift), both are combined, and the narrowed halves are merged back
// with a shift and an or: every vector operation works on 32-bit lanes. The
// halves map to the same element of every operand, so byte order does not matter.

PDCOLL_KERNEL_LOOP std::uint32_t load_pair(const void* p, std::size_t pair) noexcept {
  std::uint32_t word;
  std::memcpy(&word, static_cast<const unsigned char*>(p) + 4 * pair, sizeof word);
  return word;
}
PDCOLL_KERNEL_LOOP void store_pair(void* p, std::size_t pair, std::uint32_t word) noexcept {
  std::memcpy(static_cast<unsigned char*>(p) + 4 * pair, &word, sizeof word);
}

/// op applied to the two elements packed in x and y (x's on the left).
template <class Codec, class Op>
PDCOLL_KERNEL_LOOP std::uint32_t combine_pair(const Op& op, std::uint32_t x, std::uint32_t y) noexcept(
    noexcept(combine(op, 0.0f, 0.0f))) {
  const float low = combine(op, Codec::widen(x & 0xffffu), Codec::widen(y & 0xffffu));
  const float high = combine(op, Codec::widen(x >> 16), Codec::widen(y >> 16));
  return Codec::narrow(low) | (Codec::narrow(high) << 16);
}

// The three loop shapes. Each pointer pair that is marked restrict really is
// disjoint (apply3 routes aliasing calls to the in-place shapes), which is
// what lets the compiler vectorise without a runtime overlap check.
//
// Why blocks: at -O2, g++ (12+) uses the "very cheap" vectoriser cost model,
// which only vectorises a loop whose trip count is known to be a multiple of
// the vector width. The inner loop of `block` elements is such a loop for
// every type and every vector width up to 512 bits; the scalar tail handles
// the last count % block elements. At -O3 and with clang it costs nothing.
inline constexpr std::size_t block = 64;

/// io[i] = op(io[i], in[i])
template <class T, class Op>
PDCOLL_KERNEL_LOOP void combine_into(T* __restrict io, const T* __restrict in, std::size_t count, Op op) {
  using codec = element_codec<T, Op>;
  std::size_t i = 0;
  if constexpr (paired_v<T, Op>) {
    const std::size_t pairs = count / 2;
    std::size_t p = 0;
    for (; p + block / 2 <= pairs; p += block / 2)
      for (std::size_t j = 0; j < block / 2; ++j)
        store_pair(io, p + j, combine_pair<codec>(op, load_pair(io, p + j), load_pair(in, p + j)));
    for (; p < pairs; ++p) store_pair(io, p, combine_pair<codec>(op, load_pair(io, p), load_pair(in, p)));
    i = 2 * pairs;
  } else {
    for (; i + block <= count; i += block)
      for (std::size_t j = 0; j < block; ++j)
        io[i + j] = codec::store(combine(op, codec::load(io[i + j]), codec::load(in[i + j])));
  }
  for (; i < count; ++i) io[i] = codec::store(combine(op, codec::load(io[i]), codec::load(in[i])));
}

/// io[i] = op(in[i], io[i]) — the operand order matters for user ops.
template <class T, class Op>
PDCOLL_KERNEL_LOOP void combine_into_reversed(T* __restrict io, const T* __restrict in, std::size_t count, Op op) {
  using codec = element_codec<T, Op>;
  std::size_t i = 0;
  if constexpr (paired_v<T, Op>) {
    const std::size_t pairs = count / 2;
    std::size_t p = 0;
    for (; p + block / 2 <= pairs; p += block / 2)
      for (std::size_t j = 0; j < block / 2; ++j)
        store_pair(io, p + j, combine_pair<codec>(op, load_pair(in, p + j), load_pair(io, p + j)));
    for (; p < pairs; ++p) store_pair(io, p, combine_pair<codec>(op, load_pair(in, p), load_pair(io, p)));
    i = 2 * pairs;
  } else {
    for (; i + block <= count; i += block)
      for (std::size_t j = 0; j < block; ++j)
        io[i + j] = codec::store(combine(op, codec::load(in[i + j]), codec::load(io[i + j])));
  }
  for (; i < count; ++i) io[i] = codec::store(combine(op, codec::load(in[i]), codec::load(io[i])));
}

/// out[i] = op(a[i], b[i]); a and b are only read, so they may overlap each other.
template <class T, class Op>
PDCOLL_KERNEL_LOOP void combine_to(T* __restrict out, const T* __restrict a, const T* __restrict b,
                       std::size_t count, Op op) {
  using codec = element_codec<T, Op>;
  std::size_t i = 0;
  if constexpr (paired_v<T, Op>) {
    const std::size_t pairs = count / 2;
    std::size_t p = 0;
    for (; p + block / 2 <= pairs; p += block / 2)
      for (std::size_t j = 0; j < block / 2; ++j)
        store_pair(out, p + j, combine_pair<codec>(op, load_pair(a, p + j), load_pair(b, p + j)));
    for (; p < pairs; ++p) store_pair(out, p, combine_pair<codec>(op, load_pair(a, p), load_pair(b, p)));
    i = 2 * pairs;
  } else {
    for (; i + block <= count; i += block)
      for (std::size_t j = 0; j < block; ++j)
        out[i + j] = codec::store(combine(op, codec::load(a[i + j]), codec::load(b[i + j])));
  }
  for (; i < count; ++i) out[i] = codec::store(combine(op, codec::load(a[i]), codec::load(b[i])));
}

}  // namespace detail

}  // namespace pdcoll::kernels
