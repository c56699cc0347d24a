// File: reduce/avx2_kernels.hpp — the reduction loops compiled for AVX2,
// which reduce/kernels.hpp runs for the built-in ops where the CPU has AVX2
// and F16C (reduce/kernel_isa.hpp).
//
// Every element type but float16 runs the baseline loops (reduce/loops.hpp)
// inlined into functions whose target attribute lets the vectoriser use
// 256-bit registers. float16 goes its own way: its baseline loops convert
// in software (about 15 operations each way per element), so here each block
// of 64 elements is widened to float with F16C, combined by the float loop,
// and narrowed back with F16C's round-to-nearest-even. The one difference
// between F16C and the software narrowing is the NaN encoding (F16C keeps
// part of the payload, the software gives the quiet NaN 0x7e00 with the sign
// kept), which is patched here, so both ISAs give the same bits (see
// reduce/kernel_isa.hpp for the one exception, NaN + NaN).
#pragma once

#include "pdcoll/reduce/kernel_isa.hpp"

#if PDCOLL_KERNELS_AVX2

#include <immintrin.h>

#include <cstddef>
#include <cstring>

#include "pdcoll/reduce/loops.hpp"

/// The target of every function in this header.
#define PDCOLL_AVX2_TARGET __attribute__((target("avx2,f16c")))

namespace pdcoll::kernels::detail::avx2 {

/// Whether Op on T has an AVX2 loop: the built-in ops on every element type
/// (user ops stay on the baseline loops, whatever they are made of).
template <class T, class Op>
inline constexpr bool has_loop_v = pdcoll::detail::builtin_op<Op>;

/// dst[0..64) = src[0..64) widened to float (exact).
PDCOLL_AVX2_TARGET inline void widen_block(float* dst, const float16* src) noexcept {
  for (std::size_t i = 0; i < block; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
}

/// dst[0..64) = src[0..64) rounded to float16 (nearest, ties to even; NaN to
/// sign | 0x7e00 like detail::float_to_float16_word).
PDCOLL_AVX2_TARGET inline void narrow_block(float16* dst, const float* src) noexcept {
  const __m128i sign_bit = _mm_set1_epi16(static_cast<short>(0x8000));
  const __m128i quiet_nan = _mm_set1_epi16(0x7e00);
  for (std::size_t i = 0; i < block; i += 8) {
    const __m256 v = _mm256_loadu_ps(src + i);
    __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    const __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extracti128_si256(nan32, 1));
    h = _mm_blendv_epi8(h, _mm_or_si128(_mm_and_si128(h, sign_bit), quiet_nan), nan16);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
}

/// One block of float16: out = op(first, second), through float. `out` may
/// be `first` or `second` (each block is read whole before it is written).
template <class Op>
PDCOLL_AVX2_TARGET inline void combine_half_block(float16* out, const float16* first, const float16* second,
                                                  const Op& op) noexcept {
  alignas(32) float x[block];
  alignas(32) float y[block];
  widen_block(x, first);
  widen_block(y, second);
  detail::combine_into<float, Op>(x, y, block, op);
  narrow_block(out, x);
}

/// out[i] = op(first[i], second[i]) on float16; out may be first or second.
/// The last count % 64 elements go through a zero-padded block.
template <class Op>
PDCOLL_AVX2_TARGET void combine_half(float16* out, const float16* first, const float16* second, std::size_t count,
                                     const Op& op) noexcept {
  std::size_t i = 0;
  for (; i + block <= count; i += block) combine_half_block(out + i, first + i, second + i, op);
  if (const std::size_t tail = count - i; tail > 0) {
    float16 a[block] = {}, b[block] = {}, c[block];
    std::memcpy(a, first + i, tail * sizeof(float16));
    std::memcpy(b, second + i, tail * sizeof(float16));
    combine_half_block(c, a, b, op);
    std::memcpy(out + i, c, tail * sizeof(float16));
  }
}

/// io[i] = op(io[i], in[i]) (detail::combine_into for AVX2).
template <class T, class Op>
PDCOLL_AVX2_TARGET void combine_into(T* __restrict io, const T* __restrict in, std::size_t count, Op op) {
  if constexpr (std::is_same_v<T, float16>)
    combine_half(io, io, in, count, op);
  else
    detail::combine_into<T, Op>(io, in, count, op);
}

/// io[i] = op(in[i], io[i]) (detail::combine_into_reversed for AVX2).
template <class T, class Op>
PDCOLL_AVX2_TARGET void combine_into_reversed(T* __restrict io, const T* __restrict in, std::size_t count, Op op) {
  if constexpr (std::is_same_v<T, float16>)
    combine_half(io, in, io, count, op);
  else
    detail::combine_into_reversed<T, Op>(io, in, count, op);
}

/// out[i] = op(a[i], b[i]) (detail::combine_to for AVX2).
template <class T, class Op>
PDCOLL_AVX2_TARGET void combine_to(T* __restrict out, const T* __restrict a, const T* __restrict b,
                                   std::size_t count, Op op) {
  if constexpr (std::is_same_v<T, float16>)
    combine_half(out, a, b, count, op);
  else
    detail::combine_to<T, Op>(out, a, b, count, op);
}

}  // namespace pdcoll::kernels::detail::avx2

#undef PDCOLL_AVX2_TARGET

#else  // no AVX2 loops in this build: declared for kernels.hpp's discarded branches, never defined

#include <cstddef>

namespace pdcoll::kernels::detail::avx2 {

template <class T, class Op>
inline constexpr bool has_loop_v = false;
template <class T, class Op>
void combine_into(T* io, const T* in, std::size_t count, Op op);
template <class T, class Op>
void combine_into_reversed(T* io, const T* in, std::size_t count, Op op);
template <class T, class Op>
void combine_to(T* out, const T* a, const T* b, std::size_t count, Op op);

}  // namespace pdcoll::kernels::detail::avx2

#endif  // PDCOLL_KERNELS_AVX2
