// File: reduce/kernels.hpp — the element-wise reduction kernels the
// collectives run on host memory: `apply` (inout = op(inout, in)), `apply3`
// (out = op(a, b)), `finalize_avg`, and a type-erased `apply` for callers
// that only hold a (data_type, reduction) descriptor.
//
// Performance: the loops (reduce/loops.hpp) are written for the
// auto-vectoriser (restrict pointers, unit stride, fixed-size inner blocks, no
// branches in the body) and vectorise with g++ and clang at -O2/-O3 for
// baseline x86-64 (SSE2). Where the CPU has AVX2 and F16C, the built-in ops
// run the same loops compiled for AVX2, and float16 converts with F16C
// (reduce/avx2_kernels.hpp, chosen once per process: reduce/kernel_isa.hpp);
// user ops always run the baseline loops. Exceptions to vectorisation under
// SSE2: int64/uint64 prod, min and max, and integer avg finalisation.
// Measured with bench/reduce_kernels_bench (read+write traffic, g++ -O2
// Release, shared 2-core AMD EPYC VM, baseline → AVX2): float sum 169 → 238
// GB/s in cache (256 KiB), 60 → 62 from memory (64 MiB; memcpy 213 and 41);
// bfloat16 sum 40 → 79 and 38 → 56; float16 sum 5.4 → 57 and 5.2 → 52 (its
// baseline software conversions are compute-bound, F16C's are not).
//
// Semantics of each op are in reduce/ops.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <system_error>
#include <type_traits>

#include "pdcoll/error.hpp"
#include "pdcoll/reduce/avx2_kernels.hpp"
#include "pdcoll/reduce/data_type.hpp"
#include "pdcoll/reduce/half.hpp"
#include "pdcoll/reduce/kernel_isa.hpp"
#include "pdcoll/reduce/loops.hpp"
#include "pdcoll/reduce/ops.hpp"

namespace pdcoll::kernels {

namespace detail {

using pdcoll::detail::combine;

// The three loop shapes as apply and apply3 run them: the AVX2 copy where
// there is one and it is in use (reduce/kernel_isa.hpp), else the baseline.
// Below one block both loops are the same scalar tail, and the baseline one
// is inlined here: an 8-byte all-reduce's reduction stays a few instructions.
template <class T, class Op>
inline void run_into(T* io, const T* in, std::size_t count, const Op& op) {
  if constexpr (avx2::has_loop_v<T, Op>) {
    if (count >= block && kernel_isa_in_use() == kernel_isa::avx2) return avx2::combine_into<T, Op>(io, in, count, op);
  }
  combine_into<T, Op>(io, in, count, op);
}
template <class T, class Op>
inline void run_into_reversed(T* io, const T* in, std::size_t count, const Op& op) {
  if constexpr (avx2::has_loop_v<T, Op>) {
    if (count >= block && kernel_isa_in_use() == kernel_isa::avx2) return avx2::combine_into_reversed<T, Op>(io, in, count, op);
  }
  combine_into_reversed<T, Op>(io, in, count, op);
}
template <class T, class Op>
inline void run_to(T* out, const T* a, const T* b, std::size_t count, const Op& op) {
  if constexpr (avx2::has_loop_v<T, Op>) {
    if (count >= block && kernel_isa_in_use() == kernel_isa::avx2) return avx2::combine_to<T, Op>(out, a, b, count, op);
  }
  combine_to<T, Op>(out, a, b, count, op);
}

/// data[i] /= world_size, in float for the 16-bit types.
template <class T>
inline void divide(T* __restrict data, std::size_t count, int world_size) noexcept {
  if constexpr (std::is_floating_point_v<T> || is_half_v<T>) {
    // Division rather than multiplication by 1/n: exact whenever the mean is
    // representable (1/3 is not), at a cost that does not matter next to
    // the network. Blocked for the vectoriser like the combine loops. A
    // user's -ffast-math (its -freciprocal-math) lets the compiler multiply
    // by 1/n all the same: the mean may then be an ulp off, alike on every
    // rank of one build.
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
  detail::run_into<T, std::remove_cvref_t<Op>>(inout, in, count, op);
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
      detail::run_into<T, O>(out + done, copy, n, op);
    }
  } else if (out == a) {
    detail::run_into<T, O>(out, b, count, op);
  } else if (out == b) {
    detail::run_into_reversed<T, O>(out, a, count, op);
  } else {
    detail::run_to<T, O>(out, a, b, count, op);
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
