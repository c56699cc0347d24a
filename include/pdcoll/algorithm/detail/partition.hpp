// File: algorithm/detail/partition.hpp — how algorithms cut a buffer into
// per-rank segments and chunks, the power-of-two folding that lets the
// recursive algorithms run on any world size, and the Gray-code placement of
// ranks on the hypercube that recursive doubling walks.
#pragma once

#include <cstddef>

namespace pdcoll::algo::detail {

/// First element of segment `i` when `count` elements are split into `parts`
/// segments whose sizes differ by at most one (the first count % parts are larger).
constexpr std::size_t segment_begin(std::size_t count, std::size_t parts, std::size_t i) noexcept {
  std::size_t base = count / parts, extra = count % parts;
  return i * base + (i < extra ? i : extra);
}

/// Elements in segment `i` (see segment_begin).
constexpr std::size_t segment_size(std::size_t count, std::size_t parts, std::size_t i) noexcept {
  return segment_begin(count, parts, i + 1) - segment_begin(count, parts, i);
}

/// Largest power of two not above n (n >= 1).
constexpr int floor_pow2(int n) noexcept {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

/// Folding of a world of `size` ranks onto `pow2 = floor_pow2(size)` active
/// ranks: among the first 2*(size-pow2) ranks, each even rank hands its data
/// to the odd rank above it and sits out; the rest are renumbered densely.
struct fold {
  int size;
  int pow2;
  int extra;  ///< size - pow2: number of folded pairs

  constexpr explicit fold(int world) noexcept : size(world), pow2(floor_pow2(world)), extra(world - floor_pow2(world)) {}
  /// True when `rank` sits out the power-of-two phase.
  constexpr bool sits_out(int rank) const noexcept { return rank < 2 * extra && rank % 2 == 0; }
  /// Rank in the power-of-two phase (or -1 when it sits out).
  constexpr int active_rank(int rank) const noexcept {
    if (rank < 2 * extra) return rank % 2 ? rank / 2 : -1;
    return rank - extra;
  }
  /// Real rank of active rank `a`.
  constexpr int real_rank(int a) const noexcept { return a < extra ? 2 * a + 1 : a + extra; }
  /// The first real rank whose data active rank `a` carries (its folded partner, if any).
  constexpr int first_carried(int a) const noexcept { return a < extra ? 2 * a : a + extra; }
};

/// The Gray code of `i`: consecutive values differ in exactly one bit, and so
/// do the first and the last of 0 .. 2^k - 1.
constexpr int gray_code(int i) noexcept { return i ^ (i >> 1); }

/// The `i` whose Gray code is `code` (the inverse of gray_code).
constexpr int gray_decode(int code) noexcept {
  int i = code;
  for (int shift = 1; shift < 32; shift <<= 1) i ^= i >> shift;
  return i;
}

/// The partner of `rank` across bit `mask` of a hypercube of `pow2` ranks
/// (a power of two) on which rank r sits at corner gray_code(r). Over the
/// rounds mask = 1, 2, .. pow2/2 every rank meets rank + 1 and rank - 1
/// (mod pow2), its neighbours on the ring the signature check runs along
/// (collective_operation.hpp), so each check can travel beside a data message
/// instead of alone. Each round is still a perfect matching: partner(partner(r)) == r.
constexpr int hypercube_partner(int rank, int mask) noexcept { return gray_decode(gray_code(rank) ^ mask); }

}  // namespace pdcoll::algo::detail
