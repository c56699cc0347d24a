// File: reduce/kernels.hpp — the element-wise reduction kernels the
// collectives run on host memory: `apply` (inout = op(inout, in)), `apply3`
// (out = op(a, b)), `finalize_avg`, and a type-erased `apply` for callers
// that only hold a (data_type, reduction) descriptor.
//
// Performance: the loops are written for the auto-vectoriser (restrict
// pointers, unit stride, fixed-size inner blocks, no branches in the body) and
// vectorise with g++ and clang at -O2/-O3 for baseline x86-64 (SSE2);
// compiling the caller with -mavx2 (or -march=...) widens them. Exceptions:
// int64/uint64 prod, min and max stay scalar under SSE2 (no 64-bit multiply
// or compare instructions), and integer avg finalisation divides element by
// element. Measured with bench/reduce_kernels_bench (read+write traffic,
// g++ -O3, shared 2-core VM): float sum 131 GB/s in cache (256 KiB) and
// 33 GB/s from memory (64 MiB; memcpy: 93 and 17 GB/s); bfloat16 sum 31 and
// 25 GB/s (58 and 25 with -mavx2); float16 sum 4.7 and 4.3 GB/s (9.2 and 7.0
// with -mavx2): its branch-free software conversions are compute-bound.
//
// Semantics of each op are in reduce/ops.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <system_error>
#include <type_traits>

#include "pdcoll/error.hpp"
#include "pdcoll/reduce/data_type.hpp"
#include "pdcoll/reduce/half.hpp"
#include "pdcoll/reduce/ops.hpp"

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

inline std::uint32_t load_pair(const void* p, std::size_t pair) noexcept {
  std::uint32_t word;
  std::memcpy(&word, static_cast<const unsigned char*>(p) + 4 * pair, sizeof word);
  return word;
}
inline void store_pair(void* p, std::size_t pair, std::uint32_t word) noexcept {
  std::memcpy(static_cast<unsigned char*>(p) + 4 * pair, &word, sizeof word);
}

/// op applied to the two elements packed in x and y (x's on the left).
template <class Codec, class Op>
inline std::uint32_t combine_pair(const Op& op, std::uint32_t x, std::uint32_t y) noexcept(
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
inline void combine_into(T* __restrict io, const T* __restrict in, std::size_t count, Op op) {
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
inline void combine_into_reversed(T* __restrict io, const T* __restrict in, std::size_t count, Op op) {
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
inline void combine_to(T* __restrict out, const T* __restrict a, const T* __restrict b,
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

/// data[i] /= world_size, in float for the 16-bit types.
template <class T>
inline void divide(T* __restrict data, std::size_t count, int world_size) noexcept {
  if constexpr (std::is_floating_point_v<T> || is_half_v<T>) {
    // Division rather than multiplication by 1/n: exact whenever the mean is
    // representable (1/3 is not), at a cost that does not matter next to
    // the network. Blocked for the vectoriser like the combine loops.
    using codec = element_codec<T, op::sum_t>;
    using C = typename codec::compute;
    const C n = static_cast<C>(world_size);
    std::size_t i = 0;
    for (; i + block <= count; i += block)
      for (std::size_t j = 0; j < block; ++j) data[i + j] = codec::store(codec::load(data[i + j]) / n);
    for (; i < count; ++i) data[i] = codec::store(codec::load(data[i]) / n);
  } else if constexpr (std::is_signed_v<T>) {
    // In int64_t so that INT32_MIN / n cannot overflow; int64 / n cannot
    // either, because n >= 2 here.
    const std::int64_t n = world_size;
    for (std::size_t i = 0; i < count; ++i) data[i] = static_cast<T>(static_cast<std::int64_t>(data[i]) / n);
  } else {
    const std::uint64_t n = static_cast<std::uint64_t>(world_size);
    for (std::size_t i = 0; i < count; ++i) data[i] = static_cast<T>(static_cast<std::uint64_t>(data[i]) / n);
  }
}

template <class T, class Op>
inline constexpr bool nothrow_op =
    pdcoll::detail::builtin_op<Op> ||
    noexcept(combine(std::declval<const Op&>(), std::declval<typename element_codec<T, Op>::compute>(),
                     std::declval<typename element_codec<T, Op>::compute>()));

}  // namespace detail

/// inout[i] = op(inout[i], in[i]) for i in [0, count). `inout` and `in` must
/// not overlap. Cost: one pass reading 2*count and writing count elements,
/// vectorised (see the file comment). Cannot fail; a user op that throws
/// leaves `inout` partly combined.
///
///     pdcoll::kernels::apply(acc, chunk, n, pdcoll::op::sum);
///     pdcoll::kernels::apply<float, pdcoll::op::max_t>(acc, chunk, n);
template <class T, class Op>
  requires reduction_op<Op, T>
inline void apply(T* inout, const T* in, std::size_t count,
                  Op op = Op{}) noexcept(detail::nothrow_op<T, std::remove_cvref_t<Op>>) {
  detail::combine_into<T, std::remove_cvref_t<Op>>(inout, in, count, op);
}

/// out[i] = op(a[i], b[i]) for i in [0, count). `out` may be `a` or `b`
/// (in-place reduction) but must not otherwise overlap them; `a` and `b` may
/// overlap each other. Cost as apply.
template <class T, class Op>
  requires reduction_op<Op, T>
inline void apply3(T* out, const T* a, const T* b, std::size_t count,
                   Op op = Op{}) noexcept(detail::nothrow_op<T, std::remove_cvref_t<Op>>) {
  using O = std::remove_cvref_t<Op>;
  if (out == a && out == b) {
    // op(x, x): no disjoint pair exists, so copy one operand row by row
    // through a small block to keep the restrict promises.
    constexpr std::size_t block = 256;
    T copy[block];
    for (std::size_t done = 0; done < count; done += block) {
      const std::size_t n = count - done < block ? count - done : block;
      for (std::size_t i = 0; i < n; ++i) copy[i] = out[done + i];
      detail::combine_into<T, O>(out + done, copy, n, op);
    }
  } else if (out == a) {
    detail::combine_into<T, O>(out, b, count, op);
  } else if (out == b) {
    detail::combine_into_reversed<T, O>(out, a, count, op);
  } else {
    detail::combine_to<T, O>(out, a, b, count, op);
  }
}

/// Turns the sums left by op::avg into means: data[i] /= world_size.
/// Floating types divide (float16/bfloat16 in float, rounding once);
/// integers divide truncating toward zero, as C++ `/` does.
/// Errors: errc::invalid_argument when world_size < 1 (data untouched).
/// Cost: one pass; vectorised for floating types, scalar division for integers.
template <element_type T>
[[nodiscard]] inline std::error_code finalize_avg(T* data, std::size_t count, int world_size) noexcept {
  if (world_size < 1) return make_error_code(errc::invalid_argument);
  if (world_size > 1) detail::divide(data, count, world_size);
  return {};
}

namespace detail {

template <class Fn>
inline std::error_code visit(data_type type, Fn&& fn) {
  switch (type) {
    case data_type::float32: return fn(static_cast<float*>(nullptr));
    case data_type::float64: return fn(static_cast<double*>(nullptr));
    case data_type::float16: return fn(static_cast<float16*>(nullptr));
    case data_type::bfloat16: return fn(static_cast<bfloat16*>(nullptr));
    case data_type::int8: return fn(static_cast<std::int8_t*>(nullptr));
    case data_type::uint8: return fn(static_cast<std::uint8_t*>(nullptr));
    case data_type::int32: return fn(static_cast<std::int32_t*>(nullptr));
    case data_type::uint32: return fn(static_cast<std::uint32_t*>(nullptr));
    case data_type::int64: return fn(static_cast<std::int64_t*>(nullptr));
    case data_type::uint64: return fn(static_cast<std::uint64_t*>(nullptr));
  }
  return make_error_code(errc::invalid_argument);
}

}  // namespace detail

/// Type-erased apply for callers that hold only descriptors (e.g. a memory
/// domain reducing received bytes): `inout` and `in` point to `count`
/// elements of `type`, suitably aligned. Errors: errc::unsupported_op for
/// reduction::custom (user ops exist only as types) or an unknown reduction;
/// errc::invalid_argument for an unknown data_type. avg combines as sum.
[[nodiscard]] inline std::error_code apply(data_type type, reduction r, void* inout, const void* in,
                                           std::size_t count) noexcept {
  return detail::visit(type, [&](auto* tag) -> std::error_code {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* io = static_cast<T*>(inout);
    const T* src = static_cast<const T*>(in);
    switch (r) {
      case reduction::sum:
      case reduction::avg: apply(io, src, count, op::sum); return {};
      case reduction::prod: apply(io, src, count, op::prod); return {};
      case reduction::min: apply(io, src, count, op::min); return {};
      case reduction::max: apply(io, src, count, op::max); return {};
      case reduction::custom: break;
    }
    return make_error_code(errc::unsupported_op);
  });
}

/// Type-erased finalize_avg. Errors: errc::invalid_argument for an unknown
/// data_type or world_size < 1.
[[nodiscard]] inline std::error_code finalize_avg(data_type type, void* data, std::size_t count,
                                                  int world_size) noexcept {
  return detail::visit(type, [&](auto* tag) -> std::error_code {
    using T = std::remove_pointer_t<decltype(tag)>;
    return finalize_avg(static_cast<T*>(data), count, world_size);
  });
}

}  // namespace pdcoll::kernels
