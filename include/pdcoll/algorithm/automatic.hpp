// File: algorithm/automatic.hpp — the default all-reduce choice.
//
// `automatic` is a by_size composition whose thresholds come from the cost
// model (model/cost_model.hpp) calibrated with measurements on the reference
// machine (see README "Algorithms"). PDCOLL_ALGO=<name> forces one of the
// algorithms compiled in (ring, recursive_doubling, rabenseifner, tree,
// direct) for experiments; every rank must set the same value.
#pragma once

#include <pdcoll/algorithm/by_size.hpp>
#include <pdcoll/algorithm/direct.hpp>
#include <pdcoll/algorithm/rabenseifner.hpp>
#include <pdcoll/algorithm/recursive_doubling.hpp>
#include <pdcoll/algorithm/ring.hpp>
#include <pdcoll/algorithm/tree.hpp>

#include <cstdlib>
#include <cstring>

namespace pdcoll::algo {

/// Small messages by recursive doubling (latency: log2 P steps), mid sizes
/// by Rabenseifner (ring bandwidth in log-many steps), large by the ring.
using automatic_by_size = by_size<recursive_doubling, 16 * 1024, rabenseifner, 512 * 1024, ring>;

/// The default all-reduce algorithm (see the file comment).
struct automatic {
  /// Name for diagnostics.
  static constexpr const char* name = "automatic";

  /// The algorithm PDCOLL_ALGO names, or nullptr to choose by size.
  static pdcoll::detail::algorithm_fn forced() noexcept {
    static const pdcoll::detail::algorithm_fn choice = [] () -> pdcoll::detail::algorithm_fn {
      const char* v = std::getenv("PDCOLL_ALGO");
      if (!v || !*v) return nullptr;
      if (!std::strcmp(v, ring::name)) return &ring::all_reduce;
      if (!std::strcmp(v, recursive_doubling::name)) return &recursive_doubling::all_reduce;
      if (!std::strcmp(v, rabenseifner::name)) return &rabenseifner::all_reduce;
      if (!std::strcmp(v, tree::name)) return &tree::all_reduce;
      if (!std::strcmp(v, direct::name)) return &direct::all_reduce;
      return nullptr;
    }();
    return choice;
  }

  /// Runs the forced algorithm, or the one for ctx's size.
  static pdcoll::detail::collective_task all_reduce(pdcoll::detail::collective_context& ctx) {
    if (auto f = forced()) return f(ctx);
    return automatic_by_size::all_reduce(ctx);
  }
};

}  // namespace pdcoll::algo
