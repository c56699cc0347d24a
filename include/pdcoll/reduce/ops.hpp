// File: reduce/ops.hpp — reduction operations: the built-in ops
// (`pdcoll::op::sum`, `prod`, `min`, `max`, `avg`), user-defined ops, the
// runtime descriptor `enum reduction`, and the compile-time check
// `reduction_op<Op, T>` / `is_supported<T, Op>` that collectives use to reject
// unsupported (type, op) pairs before anything is posted.
//
// Semantics shared by every kernel (reduce/kernels.hpp):
// - integers wrap modulo 2^bits on overflow for sum, prod and avg (signed
//   values are combined in the unsigned type, so overflow is defined and
//   identical on every rank);
// - float and double combine in their own type; float16 and bfloat16 are
//   widened to float, combined, and rounded back (to nearest even) once per
//   combine, so a reduction over N ranks rounds N-1 times, as NCCL does;
// - min and max propagate NaN: if either operand is NaN the result is NaN, so
//   the result does not depend on the order in which ranks are combined.
//   (Between +0 and -0 either may be returned.)
// - avg combines as sum; the collective then divides by the world size once
//   (kernels::finalize_avg). Integer avg truncates toward zero, after the sum
//   has wrapped if it overflowed.
#pragma once

#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "pdcoll/reduce/data_type.hpp"
#include "pdcoll/reduce/half.hpp"

namespace pdcoll {

/// The runtime descriptor of a reduction. Values are stable (sent between
/// ranks in collective signatures), so only append.
enum class reduction : std::uint8_t {
  sum = 0,
  prod = 1,
  min = 2,
  max = 3,
  avg = 4,
  custom = 5,  ///< a user-defined op; every rank must pass the same one
};

/// Number of reduction values; every value below it is valid.
inline constexpr std::size_t reduction_count = 6;

/// True when `r` is a known reduction value (use on descriptors received from peers).
constexpr bool is_valid(reduction r) noexcept { return static_cast<std::size_t>(r) < reduction_count; }

/// The stable name of `r`: "sum", "prod", "min", "max", "avg", "custom";
/// "unknown" for values outside the enumeration.
constexpr std::string_view to_string(reduction r) noexcept {
  switch (r) {
    case reduction::sum: return "sum";
    case reduction::prod: return "prod";
    case reduction::min: return "min";
    case reduction::max: return "max";
    case reduction::avg: return "avg";
    case reduction::custom: return "custom";
  }
  return "unknown";
}

/// The built-in reduction ops. Each is an empty tag type (`sum_t`, …) with an
/// object of the op's name to pass as a value:
///
///     auto work = pdcoll::all_reduce(comm, grads, pdcoll::op::sum);
///     pdcoll::kernels::apply(acc, incoming, n, pdcoll::op::max);
namespace op {

/// Element-wise addition (integers wrap).
struct sum_t {};
/// Element-wise multiplication (integers wrap).
struct prod_t {};
/// Element-wise minimum; NaN if either operand is NaN.
struct min_t {};
/// Element-wise maximum; NaN if either operand is NaN.
struct max_t {};
/// Element-wise mean over the ranks: sum, then one division by the world
/// size at the end (integers: truncating division).
struct avg_t {};

inline constexpr sum_t sum{};    ///< element-wise sum (integers wrap)
inline constexpr prod_t prod{};  ///< element-wise product (integers wrap)
inline constexpr min_t min{};    ///< element-wise minimum (NaN wins)
inline constexpr max_t max{};    ///< element-wise maximum (NaN wins)
inline constexpr avg_t avg{};    ///< element-wise mean: sum, then one division by the world size

}  // namespace op

namespace detail {

template <class Op>
struct builtin_reduction {};
template <> struct builtin_reduction<op::sum_t> : std::integral_constant<reduction, reduction::sum> {};
template <> struct builtin_reduction<op::prod_t> : std::integral_constant<reduction, reduction::prod> {};
template <> struct builtin_reduction<op::min_t> : std::integral_constant<reduction, reduction::min> {};
template <> struct builtin_reduction<op::max_t> : std::integral_constant<reduction, reduction::max> {};
template <> struct builtin_reduction<op::avg_t> : std::integral_constant<reduction, reduction::avg> {};

template <class Op>
concept builtin_op = requires { builtin_reduction<Op>::value; };

/// The type a kernel combines T in: float for the 16-bit float types.
template <class T>
using compute_type_t = std::conditional_t<is_half_v<T>, float, T>;

/// A user op F combines values of type A when F is stateless (its behaviour
/// is fixed at compile time, hence the same on every rank), can be
/// default-constructed by the kernels, and maps (A, A) to exactly A.
template <class F, class A>
concept custom_op_on = std::is_class_v<F> && std::is_empty_v<F> && std::default_initializable<F> &&
                       std::copy_constructible<F> && std::is_invocable_v<const F&, A, A> &&
                       std::same_as<std::invoke_result_t<const F&, A, A>, A>;

/// For float16/bfloat16 a user op may be written on float (preferred: one
/// rounding per combine) or on the storage type itself.
template <class F, class T>
concept custom_op_for =
    !builtin_op<F> && (custom_op_on<F, T> || (is_half_v<T> && custom_op_on<F, float>));

}  // namespace detail

/// `is_supported<T, Op>::value` is true when collectives can reduce elements
/// of type T with Op. Every built-in op supports every element_type; a
/// user-defined op F is supported when it is an empty (stateless),
/// default-constructible class whose `operator()(T, T) const` returns T. For
/// float16/bfloat16, `float operator()(float, float) const` is accepted too and
/// is the one used when both exist. Function pointers and capturing lambdas
/// are rejected because their behaviour is only known at run time and could
/// differ between ranks. cv/ref qualifiers on Op are ignored.
///
///     struct absmax { float operator()(float a, float b) const { return std::fabs(a) < std::fabs(b) ? b : a; } };
///     static_assert(pdcoll::reduction_op<absmax, pdcoll::bfloat16>);
template <class T, class Op>
struct is_supported
    : std::bool_constant<element_type<T> &&
                         (detail::builtin_op<std::remove_cvref_t<Op>> ||
                          detail::custom_op_for<std::remove_cvref_t<Op>, T>)> {};

/// Shorthand for is_supported<T, Op>::value.
template <class T, class Op>
inline constexpr bool is_supported_v = is_supported<T, Op>::value;

/// Op reduces elements of type T (see is_supported).
template <class Op, class T>
concept reduction_op = is_supported_v<T, Op>;

/// The runtime descriptor of op type Op: its built-in reduction, or
/// reduction::custom for a user-defined op. cv/ref qualifiers are ignored.
template <class Op>
inline constexpr reduction reduction_of = [] {
  if constexpr (detail::builtin_op<std::remove_cvref_t<Op>>)
    return detail::builtin_reduction<std::remove_cvref_t<Op>>::value;
  else
    return reduction::custom;
}();

namespace detail {

/// The integer type in which T's sum and product wrap without undefined
/// behaviour: T's unsigned counterpart, but at least unsigned int so that
/// promotion of 8-bit operands does not bring back signed arithmetic.
template <class T>
using wrapping_t = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

// One combine in compute type C. Written as plain expressions (selects, not
// branches) so that the kernels' loops vectorise.
template <class C>
constexpr C combine(op::sum_t, C a, C b) noexcept {
  if constexpr (std::is_integral_v<C>)
    return static_cast<C>(static_cast<wrapping_t<C>>(a) + static_cast<wrapping_t<C>>(b));
  else
    return a + b;
}
template <class C>
constexpr C combine(op::avg_t, C a, C b) noexcept {
  return combine(op::sum_t{}, a, b);
}
template <class C>
constexpr C combine(op::prod_t, C a, C b) noexcept {
  if constexpr (std::is_integral_v<C>)
    return static_cast<C>(static_cast<wrapping_t<C>>(a) * static_cast<wrapping_t<C>>(b));
  else
    return a * b;
}
/// Whether `x` is a NaN, read from its bits: `x != x` and std::isnan fold
/// to false under the -ffinite-math-only of a user's -ffast-math (this
/// header is compiled with the user's flags), which would stop min and max
/// from propagating NaN.
template <class C>
constexpr bool is_nan_bits(C x) noexcept {
  if constexpr (std::is_same_v<C, float>) {
    return (std::bit_cast<std::uint32_t>(x) & 0x7fffffffu) > 0x7f800000u;
  } else if constexpr (std::is_same_v<C, double>) {
    return (std::bit_cast<std::uint64_t>(x) & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
  } else {
    return x != x;
  }
}
template <class C>
constexpr C combine(op::min_t, C a, C b) noexcept {
  if constexpr (std::is_integral_v<C>)
    return b < a ? b : a;
  else
    return ((a < b) | is_nan_bits(a)) ? a : b;  // `|` not `||`: no branch. NaN a wins; NaN b falls through
}
template <class C>
constexpr C combine(op::max_t, C a, C b) noexcept {
  if constexpr (std::is_integral_v<C>)
    return a < b ? b : a;
  else
    return ((b < a) | is_nan_bits(a)) ? a : b;
}
template <class C, class F>
  requires(!builtin_op<F>)
constexpr C combine(const F& f, C a, C b) noexcept(noexcept(f(a, b))) {
  return f(a, b);
}

}  // namespace detail

}  // namespace pdcoll
