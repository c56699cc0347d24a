// File: tests/support/variable_blocks.hpp — deterministic block layouts for
// the v forms (all_to_allv, all_gatherv) and their reference results.
//
// Every rank can rebuild every other rank's layout from the salt, so each
// rank checks its own output against what its peers sent. Counts include
// zeros; an unpacked layout puts the blocks in reverse rank order with gaps
// between them, and the reference keeps the gaps' fill, so a collective that
// writes outside its receive blocks fails.
#pragma once

#include <support/reference.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace pdcoll::testing {

/// Counts and displacements (elements) of one rank's side of a v form.
struct block_layout {
  std::vector<std::size_t> send_counts, send_displs, recv_counts, recv_displs;
  std::size_t input_elems = 0;   ///< the input's extent
  std::size_t output_elems = 0;  ///< the output's extent, gaps included
};

/// Elements rank `from` sends rank `to` in case `salt`: 0 to max_count,
/// about one pair in four empty.
inline std::size_t pair_count(std::uint64_t salt, int from, int to, std::size_t max_count) {
  std::uint64_t x = (salt + 1) * 0x9E3779B97F4A7C15ull ^ (static_cast<std::uint64_t>(from) << 20) ^
                    static_cast<std::uint64_t>(to);
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  if (x % 4 == 0) return 0;
  return static_cast<std::size_t>((x >> 8) % (max_count + 1));
}

/// Displacements for `counts`: packed in rank order, or in reverse rank
/// order with a gap of 1 to 3 elements before each block.
inline std::vector<std::size_t> place_blocks(const std::vector<std::size_t>& counts, bool packed,
                                             std::size_t& extent) {
  std::vector<std::size_t> displs(counts.size());
  std::size_t at = 0;
  for (std::size_t k = 0; k < counts.size(); ++k) {
    const std::size_t p = packed ? k : counts.size() - 1 - k;
    if (!packed) at += 1 + p % 3;
    displs[p] = at;
    at += counts[p];
  }
  extent = at;
  return displs;
}

/// Rank `rank`'s all_to_allv layout in a world of P for case `salt`.
inline block_layout all_to_allv_layout(std::uint64_t salt, int P, int rank, std::size_t max_count, bool packed) {
  block_layout l;
  for (int p = 0; p < P; ++p) {
    l.send_counts.push_back(pair_count(salt, rank, p, max_count));
    l.recv_counts.push_back(pair_count(salt, p, rank, max_count));
  }
  l.send_displs = place_blocks(l.send_counts, packed, l.input_elems);
  l.recv_displs = place_blocks(l.recv_counts, packed, l.output_elems);
  return l;
}

/// The all_gatherv layout of case `salt` (the same on every rank; the
/// send side is the caller's input, so only the receive side is filled).
inline block_layout all_gatherv_layout(std::uint64_t salt, int P, std::size_t max_count, bool packed) {
  block_layout l;
  for (int p = 0; p < P; ++p) l.recv_counts.push_back(pair_count(salt, p, p, max_count));
  l.recv_displs = place_blocks(l.recv_counts, packed, l.output_elems);
  return l;
}

/// The fill of the output's gaps before the collective (and after it).
template <class T>
T gap_fill() {
  return static_cast<T>(7);
}

/// What rank `rank`'s all_to_allv output must hold: block p is the block
/// rank p's input (make_input(salt, p, ...)) holds for `rank`; gaps keep
/// gap_fill().
template <class T>
std::vector<T> expected_all_to_allv(std::uint64_t salt, int P, int rank, std::size_t max_count, bool packed) {
  const auto mine = all_to_allv_layout(salt, P, rank, max_count, packed);
  std::vector<T> out(mine.output_elems, gap_fill<T>());
  for (int p = 0; p < P; ++p) {
    const auto theirs = all_to_allv_layout(salt, P, p, max_count, packed);
    const auto in = make_input<T>(salt, p, theirs.input_elems, false);
    const auto from = in.begin() + static_cast<std::ptrdiff_t>(theirs.send_displs[static_cast<std::size_t>(rank)]);
    std::copy(from, from + static_cast<std::ptrdiff_t>(mine.recv_counts[static_cast<std::size_t>(p)]),
              out.begin() + static_cast<std::ptrdiff_t>(mine.recv_displs[static_cast<std::size_t>(p)]));
  }
  return out;
}

/// What every rank's all_gatherv output must hold: block p is the first
/// recv_counts[p] elements of rank p's input; gaps keep gap_fill().
template <class T>
std::vector<T> expected_all_gatherv(std::uint64_t salt, int P, std::size_t max_count, bool packed) {
  const auto l = all_gatherv_layout(salt, P, max_count, packed);
  std::vector<T> out(l.output_elems, gap_fill<T>());
  for (int p = 0; p < P; ++p) {
    const auto in = make_input<T>(salt, p, l.recv_counts[static_cast<std::size_t>(p)], false);
    std::copy(in.begin(), in.end(), out.begin() + static_cast<std::ptrdiff_t>(l.recv_displs[static_cast<std::size_t>(p)]));
  }
  return out;
}

}  // namespace pdcoll::testing
