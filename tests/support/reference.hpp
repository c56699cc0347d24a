// File: tests/support/reference.hpp — deterministic per-rank test data and a
// straightforward reference for reductions, with the tolerance that follows
// from the order of reduction.
//
// Tolerance. Every algorithm combines the P contributions of an element with
// P-1 operations in T, in some order. For a sum, the classic recursive
// summation bound gives |computed - exact| <= (P-1)·u·Σ|x_i| + O(u²) whatever
// the order (u = unit roundoff of T: 2^-24 float, 2^-53 double, 2^-11 float16,
// 2^-8 bfloat16); avg adds one rounded division (u·|result|). A product has
// relative error <= (P-1)·u. min and max are exact, and integers are exact
// (wrapping modulo 2^bits, as the kernels define it).
#pragma once

#include <pdcoll/reduce/data_type.hpp>
#include <pdcoll/reduce/half.hpp>
#include <pdcoll/reduce/ops.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace pdcoll::testing {

template <class T>
inline constexpr bool is_float_like = std::is_floating_point_v<T> || std::is_same_v<T, float16> ||
                                      std::is_same_v<T, bfloat16>;

/// Unit roundoff of T.
template <class T>
constexpr double unit_roundoff() {
  if constexpr (std::is_same_v<T, float>) return 0x1p-24;
  else if constexpr (std::is_same_v<T, double>) return 0x1p-53;
  else if constexpr (std::is_same_v<T, float16>) return 0x1p-11;
  else if constexpr (std::is_same_v<T, bfloat16>) return 0x1p-8;
  else return 0;
}

template <class T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) return static_cast<double>(static_cast<float>(v));
  else return static_cast<double>(v);
}

/// Element i of rank r's input for test case `salt` (the same on every rank,
/// so any rank can rebuild any other's input).
template <class T>
T input_value(std::uint64_t salt, int rank, std::size_t i, bool for_product) {
  std::uint64_t x = salt * 0x9E3779B97F4A7C15ull ^ (static_cast<std::uint64_t>(rank) << 40) ^ i;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  if constexpr (is_float_like<T>) {
    double u = static_cast<double>(x >> 11) * 0x1p-53;  // [0, 1)
    double v = for_product ? 0.5 + u : 2 * u - 1;       // products stay near 1
    return static_cast<T>(static_cast<float>(v));
  } else {
    return static_cast<T>(x);
  }
}

/// Rank r's whole input.
template <class T>
std::vector<T> make_input(std::uint64_t salt, int rank, std::size_t count, bool for_product) {
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = input_value<T>(salt, rank, i, for_product);
  return v;
}

/// Checks `got` against the reduction with Op of every rank's element i;
/// returns an empty string or a description of the first mismatch.
template <class T, class Op>
std::string check_reduced(const T* got, std::size_t count, std::uint64_t salt, int world, std::size_t offset = 0) {
  constexpr bool prod = std::is_same_v<Op, op::prod_t>;
  for (std::size_t k = 0; k < count; ++k) {
    const std::size_t i = offset + k;
    if constexpr (is_float_like<T>) {
      double exact = to_double(input_value<T>(salt, 0, i, prod)), magnitude = std::fabs(exact);
      for (int r = 1; r < world; ++r) {
        double x = to_double(input_value<T>(salt, r, i, prod));
        if constexpr (std::is_same_v<Op, op::sum_t> || std::is_same_v<Op, op::avg_t>) exact += x;
        else if constexpr (prod) exact *= x;
        else if constexpr (std::is_same_v<Op, op::min_t>) exact = std::min(exact, x);
        else exact = std::max(exact, x);
        magnitude += std::fabs(x);
      }
      if constexpr (std::is_same_v<Op, op::avg_t>) {
        exact /= world;
        magnitude /= world;
      }
      const double u = unit_roundoff<T>();
      double tol = 0;
      if constexpr (std::is_same_v<Op, op::sum_t> || std::is_same_v<Op, op::avg_t>)
        tol = (world - 1) * u * magnitude + u * std::fabs(exact);
      else if constexpr (prod)
        tol = world * u * std::fabs(exact);
      tol = tol * 1.01 + 1e-300;
      const double g = to_double(got[k]);
      if (!(std::fabs(g - exact) <= tol))
        return "element " + std::to_string(i) + ": got " + std::to_string(g) + ", expected " + std::to_string(exact) +
               " ± " + std::to_string(tol);
    } else {
      using U = std::make_unsigned_t<T>;
      U acc = static_cast<U>(input_value<T>(salt, 0, i, prod));
      T mn = input_value<T>(salt, 0, i, prod), mx = mn;
      for (int r = 1; r < world; ++r) {
        T x = input_value<T>(salt, r, i, prod);
        if constexpr (prod) acc = static_cast<U>(static_cast<std::uint64_t>(acc) * static_cast<U>(x));
        else acc = static_cast<U>(acc + static_cast<U>(x));
        mn = std::min(mn, x);
        mx = std::max(mx, x);
      }
      T expected;
      if constexpr (std::is_same_v<Op, op::min_t>) expected = mn;
      else if constexpr (std::is_same_v<Op, op::max_t>) expected = mx;
      else if constexpr (std::is_same_v<Op, op::avg_t>) expected = static_cast<T>(static_cast<T>(acc) / static_cast<T>(world));
      else expected = static_cast<T>(acc);
      if (got[k] != expected)
        return "element " + std::to_string(i) + ": got " + std::to_string(+got[k]) + ", expected " +
               std::to_string(+expected);
    }
  }
  return {};
}

}  // namespace pdcoll::testing
