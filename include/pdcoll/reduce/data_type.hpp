// File: reduce/data_type.hpp — the element types collectives accept, as a
// compile-time trait (`data_type_of<T>`) and as a runtime descriptor
// (`enum data_type`) that travels in collective signatures between ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "pdcoll/reduce/half.hpp"

namespace pdcoll {

/// The element types pdcoll reduces and moves. Values are stable: they are
/// sent between ranks to detect mismatched collectives, so only append.
enum class data_type : std::uint8_t {
  float32 = 0,
  float64 = 1,
  float16 = 2,
  bfloat16 = 3,
  int8 = 4,
  uint8 = 5,
  int32 = 6,
  uint32 = 7,
  int64 = 8,
  uint64 = 9,
};

/// Number of data_type values; every value below it is valid.
inline constexpr std::size_t data_type_count = 10;

namespace detail {

template <class T>
struct data_type_traits {};  // no `value`: T is not an element type

template <> struct data_type_traits<float> : std::integral_constant<data_type, data_type::float32> {};
template <> struct data_type_traits<double> : std::integral_constant<data_type, data_type::float64> {};
template <> struct data_type_traits<pdcoll::float16> : std::integral_constant<data_type, data_type::float16> {};
template <> struct data_type_traits<pdcoll::bfloat16> : std::integral_constant<data_type, data_type::bfloat16> {};

// Integers are mapped by width and signedness rather than by name, so that
// `long long` and `long` (both 64-bit on LP64, but distinct types) are both
// int64. Character types and bool are not numbers to reduce; 16-bit integers
// are not in the supported set.
template <class T>
inline constexpr bool is_reducible_integer_v =
    std::is_integral_v<T> && std::is_same_v<T, std::remove_cv_t<T>> && !std::is_same_v<T, bool> &&
    !std::is_same_v<T, char> && !std::is_same_v<T, wchar_t> && !std::is_same_v<T, char8_t> &&
    !std::is_same_v<T, char16_t> && !std::is_same_v<T, char32_t> &&
    (sizeof(T) == 1 || sizeof(T) == 4 || sizeof(T) == 8);

template <class T>
  requires is_reducible_integer_v<T>
struct data_type_traits<T>
    : std::integral_constant<data_type,
                             sizeof(T) == 1   ? (std::is_signed_v<T> ? data_type::int8 : data_type::uint8)
                             : sizeof(T) == 4 ? (std::is_signed_v<T> ? data_type::int32 : data_type::uint32)
                                              : (std::is_signed_v<T> ? data_type::int64 : data_type::uint64)> {};

}  // namespace detail

/// True when T is one of the supported element types: float, double,
/// float16, bfloat16, and the 8/32/64-bit signed and unsigned integers
/// (cv-qualified types are not: buffers name the element type itself).
template <class T>
concept element_type = requires { detail::data_type_traits<T>::value; };

/// The runtime descriptor of element type T; ill-formed for other types.
template <element_type T>
inline constexpr data_type data_type_of = detail::data_type_traits<T>::value;

/// True when `t` is a known data_type value (use on descriptors received from peers).
constexpr bool is_valid(data_type t) noexcept {
  return static_cast<std::size_t>(t) < data_type_count;
}

/// Bytes per element of `t`; 0 for an unknown value.
constexpr std::size_t element_size(data_type t) noexcept {
  switch (t) {
    case data_type::int8:
    case data_type::uint8: return 1;
    case data_type::float16:
    case data_type::bfloat16: return 2;
    case data_type::float32:
    case data_type::int32:
    case data_type::uint32: return 4;
    case data_type::float64:
    case data_type::int64:
    case data_type::uint64: return 8;
  }
  return 0;
}

/// The stable name of `t` ("float32", "bfloat16", "int8", …); "unknown" for
/// values outside the enumeration.
constexpr std::string_view to_string(data_type t) noexcept {
  switch (t) {
    case data_type::float32: return "float32";
    case data_type::float64: return "float64";
    case data_type::float16: return "float16";
    case data_type::bfloat16: return "bfloat16";
    case data_type::int8: return "int8";
    case data_type::uint8: return "uint8";
    case data_type::int32: return "int32";
    case data_type::uint32: return "uint32";
    case data_type::int64: return "int64";
    case data_type::uint64: return "uint64";
  }
  return "unknown";
}

}  // namespace pdcoll
