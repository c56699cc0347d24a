// File: model/cost_model.hpp — the alpha–beta–gamma cost model of pdcoll's
// all-reduce algorithms: predicted time for (algorithm, world size, bytes),
// the crossover sizes between algorithms, and the choice algo::automatic
// makes from them.
//
// A message of m bytes costs alpha + m·beta on the wire; reducing m bytes
// costs m·gamma (Thakur, Rabenseifner & Gropp, "Optimization of Collective
// Communication Operations in MPICH", IJHPCA 2005). With P ranks, n bytes,
// p = the largest power of two ≤ P and e = P - p folded ranks:
//
//   ring                (2(P-1) + k - 1)·alpha + max(2(P-1)/P·n·beta, (P-1)/P·n·gamma) + c·gamma
//                       k = chunks per segment, c = one chunk: the pipeline
//                       reduces a chunk while the next one is on the wire
//   recursive_doubling  log2 p·(alpha + n·beta + n·gamma)  [+ fold]
//   rabenseifner        2·log2 p·alpha + 2(p-1)/p·n·beta + (p-1)/p·n·gamma  [+ fold]
//   tree                (2d + k - 1)·(alpha + 2c·beta + 2c·gamma), d = depth of
//                       the binary tree, c = chunk, k = n / c chunks
//   direct              alpha + (P-1)·n·beta + (P-1)·n·gamma
//   fold (P not 2^k)    2·(alpha + n·beta) + n·gamma
//
// The parameters of the reference machine (2 cores, float32 sum) were
// fitted on libfabric 1.17 shm with CMA (reference_shm, from
// bench/allreduce_sweep) and on TCP loopback (reference_tcp, to the
// crossovers pdcoll-bench measured; algo::automatic's thresholds follow
// it). On other machines, fit your own: alpha from 8-byte
// recursive_doubling at 2 ranks (one exchange), beta from the ring at
// ≥ 64 MiB on 2 ranks (t ≈ n·beta + n/2·gamma), gamma from the reduction
// kernels' bench (reduce/kernels.hpp); then check the crossovers against
// pdcoll-bench --algo.
//
//     auto t = pdcoll::model::predict(pdcoll::model::algorithm::ring, 1024, 64 << 20,
//                                     pdcoll::model::reference_shm);
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace pdcoll::model {

/// Machine parameters of the alpha–beta–gamma model (seconds).
struct parameters {
  double alpha = 0;  ///< latency of one message
  double beta = 0;   ///< wire time per byte
  double gamma = 0;  ///< reduction time per byte reduced
};

/// Fitted on the reference machine over libfabric shm (2 and 4 ranks, float32
/// sum, bench/allreduce_sweep): alpha 12 us, beta 0.11 ns/B (≈ 9 GB/s per
/// rank through CMA), gamma 0.08 ns/B (≈ 12.5 GB/s reduced).
inline constexpr parameters reference_shm{12e-6, 0.11e-9, 0.08e-9};
/// The reference machine over TCP loopback (io_uring and libfabric tcp, 2
/// and 4 ranks), where algo::automatic runs its message algorithms: alpha
/// 40 us, beta 0.45 ns/B, gamma 0.07 ns/B. These reproduce the crossovers
/// measured there (design-notes item 29): recursive doubling to Rabenseifner
/// between 128 and 256 KiB on 4 ranks and between 1 and 2 MiB on 2,
/// Rabenseifner to the ring between 2 and 4 MiB on 4 ranks. A least-squares
/// fit to the times themselves gives alpha 20 us, beta 0.5 ns/B and gamma
/// 0.24 ns/B, whose crossover to the ring (512 KiB) the measurements
/// contradict: the model lets the ring hide its reduction behind the wire,
/// and on loopback the wire is the same CPU; what the ring gains above
/// 4 MiB is cache (its 1 MiB chunks stay in L2, Rabenseifner's first
/// exchange of n/2 does not), which the model has no term for.
inline constexpr parameters reference_tcp{40e-6, 0.45e-9, 0.07e-9};

/// The all-reduce algorithms the model knows (algo::<name>).
enum class algorithm : std::uint8_t { ring, recursive_doubling, rabenseifner, tree, direct };

/// Every algorithm, in enum order.
inline constexpr std::array<algorithm, 5> all_algorithms{algorithm::ring, algorithm::recursive_doubling,
                                                        algorithm::rabenseifner, algorithm::tree, algorithm::direct};

/// The algorithm's name as algo::<name>::name spells it.
constexpr std::string_view to_string(algorithm a) noexcept {
  switch (a) {
    case algorithm::ring: return "ring";
    case algorithm::recursive_doubling: return "recursive_doubling";
    case algorithm::rabenseifner: return "rabenseifner";
    case algorithm::tree: return "tree";
    case algorithm::direct: return "direct";
  }
  return "?";
}

/// Chunk size the model assumes for algo::tree's pipeline.
inline constexpr double pipeline_chunk_bytes = 256.0 * 1024;
/// Chunk size the model assumes for algo::ring's pipeline.
inline constexpr double ring_chunk_bytes = 1024.0 * 1024;

namespace detail {
constexpr int floor_pow2(int n) noexcept {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}
constexpr int log2_floor(int n) noexcept {
  int l = 0;
  while ((2 << l) <= n) ++l;
  return l;
}
constexpr double ceil_div(double a, double b) noexcept {
  const double q = a / b;
  const auto i = static_cast<double>(static_cast<std::int64_t>(q));
  return i < q ? i + 1 : i;
}
}  // namespace detail

/// Predicted seconds of an all-reduce of `bytes` over `world_size` ranks with
/// `a`, under machine parameters `m`. Zero for one rank or no bytes;
/// non-decreasing in bytes for every algorithm.
constexpr double predict(algorithm a, int world_size, double bytes, const parameters& m) noexcept {
  const int P = world_size;
  if (P <= 1 || bytes <= 0) return 0;
  const double n = bytes, Pd = P;
  const int p = detail::floor_pow2(P), lg = detail::log2_floor(p);
  const double fold = P == p ? 0 : 2 * (m.alpha + n * m.beta) + n * m.gamma;
  switch (a) {
    case algorithm::ring: {
      const double chunks = detail::ceil_div(n / Pd, ring_chunk_bytes);
      // The pipeline reduces chunk c while chunk c+1 is on the wire: the
      // slower of the two streams sets the pace, plus one chunk of the other.
      const double wire = 2 * (Pd - 1) / Pd * n * m.beta, reduce = (Pd - 1) / Pd * n * m.gamma;
      const double chunk = n / Pd < ring_chunk_bytes ? n / Pd : ring_chunk_bytes;
      return (2 * (Pd - 1) + chunks - 1) * m.alpha + (wire > reduce ? wire : reduce) + chunk * m.gamma;
    }
    case algorithm::recursive_doubling: return lg * (m.alpha + n * m.beta + n * m.gamma) + fold;
    case algorithm::rabenseifner: {
      const double pd = p;
      return 2 * lg * m.alpha + 2 * (pd - 1) / pd * n * m.beta + (pd - 1) / pd * n * m.gamma + fold;
    }
    case algorithm::tree: {
      const double depth = detail::log2_floor(P);
      const double c = n < pipeline_chunk_bytes ? n : pipeline_chunk_bytes;
      const double k = detail::ceil_div(n, c);
      return (2 * depth + k - 1) * (m.alpha + 2 * c * m.beta + 2 * c * m.gamma);
    }
    case algorithm::direct: return m.alpha + (Pd - 1) * n * (m.beta + m.gamma);
  }
  return 0;
}

/// Bus bandwidth (bytes/s, nccl-tests' definition algbw·2(P-1)/P) the model predicts.
constexpr double predicted_bus_bandwidth(algorithm a, int world_size, double bytes, const parameters& m) noexcept {
  const double t = predict(a, world_size, bytes, m);
  return t > 0 ? bytes / t * 2.0 * (world_size - 1) / world_size : 0;
}

/// The candidates algo::automatic chooses among, smallest messages first.
inline constexpr std::array<algorithm, 3> automatic_candidates{algorithm::recursive_doubling,
                                                              algorithm::rabenseifner, algorithm::ring};

/// The fastest of algo::automatic's candidates for (world_size, bytes); the
/// earlier candidate wins ties.
constexpr algorithm choose(int world_size, double bytes, const parameters& m) noexcept {
  algorithm best = automatic_candidates[0];
  double best_t = predict(best, world_size, bytes, m);
  for (auto a : automatic_candidates) {
    const double t = predict(a, world_size, bytes, m);
    if (t < best_t) best = a, best_t = t;
  }
  return best;
}

/// The smallest power-of-two byte count in [1, 2^40] at which `b` is
/// predicted faster than `a` on `world_size` ranks, or 0 if it never is.
constexpr std::size_t crossover(algorithm a, algorithm b, int world_size, const parameters& m) noexcept {
  for (std::size_t bytes = 1; bytes <= (std::size_t{1} << 40); bytes *= 2)
    if (predict(b, world_size, static_cast<double>(bytes), m) < predict(a, world_size, static_cast<double>(bytes), m))
      return bytes;
  return 0;
}

}  // namespace pdcoll::model
