// File: algorithm/by_size.hpp — compile-time composition of all-reduce
// algorithms by message size, and the concept every all-reduce algorithm models.
//
//     using tuned = pdcoll::algo::by_size<
//         pdcoll::algo::recursive_doubling, 64 * 1024,
//         pdcoll::algo::rabenseifner,       8 << 20,
//         pdcoll::algo::ring>;
//     auto work = pdcoll::all_reduce<tuned>(comm, grads, pdcoll::op::sum);
//
// The choice costs one comparison per call; every rank makes the same choice
// because every rank passes the same count.
#pragma once

#include <pdcoll/detail/collective_operation.hpp>

#include <concepts>
#include <cstddef>

namespace pdcoll::algo {

/// An all-reduce algorithm: a type with a static `all_reduce(collective_context&)`
/// coroutine and a name.
template <class A>
concept allreduce_algorithm = requires(pdcoll::detail::collective_context& ctx) {
  { A::all_reduce(ctx) } -> std::same_as<pdcoll::detail::collective_task>;
  { A::name } -> std::convertible_to<const char*>;
};

/// Chooses A below N1 bytes, B below N2 bytes (when C is given), and the
/// last algorithm above. Up to four algorithms.
template <allreduce_algorithm A, std::size_t N1, allreduce_algorithm B, std::size_t N2 = 0, class C = void,
          std::size_t N3 = 0, class D = void>
struct by_size {
  /// Name for diagnostics.
  static constexpr const char* name = "by_size";

  /// The algorithm used for a message of `bytes`, by name.
  static constexpr const char* name_for(std::size_t bytes) noexcept {
    if (bytes < N1) return A::name;
    if constexpr (std::is_void_v<C>) {
      return B::name;
    } else {
      if (bytes < N2) return B::name;
      if constexpr (std::is_void_v<D>) return C::name;
      else return bytes < N3 ? C::name : D::name;
    }
  }

  /// Dispatches to the algorithm for ctx's message size.
  static pdcoll::detail::collective_task all_reduce(pdcoll::detail::collective_context& ctx) {
    const std::size_t bytes = ctx.bytes(ctx.count);
    if (bytes < N1) return A::all_reduce(ctx);
    if constexpr (std::is_void_v<C>) {
      return B::all_reduce(ctx);
    } else {
      static_assert(N2 > N1, "by_size thresholds must increase");
      if (bytes < N2) return B::all_reduce(ctx);
      if constexpr (std::is_void_v<D>) {
        return C::all_reduce(ctx);
      } else {
        static_assert(N3 > N2, "by_size thresholds must increase");
        return bytes < N3 ? C::all_reduce(ctx) : D::all_reduce(ctx);
      }
    }
  }
};

}  // namespace pdcoll::algo
