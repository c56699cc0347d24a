// File: registration/policies.hpp — the compile-time policies of
// registration_cache: eviction order (`lru`), capacity (`max_entries<N>`,
// `max_bytes<N>`) and locking (`no_lock`, `mutex_lock`), with one concept per
// role so that a user's own policy type plugs in by having the members.
#pragma once

#include <concepts>
#include <cstddef>
#include <mutex>
#include <type_traits>

namespace pdcoll::registration {

// ---------------------------------------------------------------- eviction

/// Evicts the cached registration whose last release is the oldest.
///
/// Only unpinned entries are in the order: a pinned entry cannot be evicted,
/// so an acquire that pins an entry unlinks it and the release that unpins it
/// links it at the young end. Recency is therefore "time of last release",
/// which for a registration cache is the same as "time of last use".
/// Cost: O(1) per link/unlink/victim, no allocation (intrusive list through
/// each entry's `eviction_hook`).
struct lru {
  /// The per-entry links: put as `typename lru::hook<Entry> eviction_hook;`
  /// in the entry type.
  template <class Entry>
  struct hook {
    Entry* older = nullptr;
    Entry* younger = nullptr;
    bool linked = false;
  };

  /// The order itself, one per cache. Entry must have a member
  /// `eviction_hook` of type `hook<Entry>`.
  template <class Entry>
  class order {
   public:
    /// Makes `e` evictable, as the youngest entry.
    void link(Entry& e) noexcept {
      auto& h = e.eviction_hook;
      h.older = youngest_;
      h.younger = nullptr;
      h.linked = true;
      if (youngest_ != nullptr) youngest_->eviction_hook.younger = &e;
      youngest_ = &e;
      if (oldest_ == nullptr) oldest_ = &e;
    }
    /// Makes `e` unevictable; a no-op when it is not linked.
    void unlink(Entry& e) noexcept {
      auto& h = e.eviction_hook;
      if (!h.linked) return;
      if (h.older != nullptr) h.older->eviction_hook.younger = h.younger; else oldest_ = h.younger;
      if (h.younger != nullptr) h.younger->eviction_hook.older = h.older; else youngest_ = h.older;
      h = {};
    }
    /// The entry to evict next, or nullptr when nothing is evictable.
    Entry* victim() const noexcept { return oldest_; }

   private:
    Entry* oldest_ = nullptr;
    Entry* youngest_ = nullptr;
  };
};

/// An eviction policy: a per-entry `hook<Entry>` and an `order<Entry>` with
/// `link` (now evictable), `unlink` (no longer evictable) and `victim`
/// (next to evict, or nullptr).
template <class P>
concept eviction_policy = requires {
  typename P::template hook<int>;
  typename P::template order<int>;
};

// ---------------------------------------------------------------- capacity

/// Caps the number of cached registrations (pinned ones included) at N.
template <std::size_t N>
struct max_entries {
  static_assert(N > 0, "max_entries<0> would cache nothing; use a smaller cache instead");
  /// Whether `entries` registrations totalling `bytes` fit.
  static constexpr bool admits(std::size_t entries, std::size_t /*bytes*/) noexcept {
    return entries <= N;
  }
  /// The cap, for documentation and tests.
  static constexpr std::size_t limit = N;
};

/// Caps the bytes covered by cached registrations (pinned ones included) at
/// N. A single region larger than N is always registered uncached.
template <std::size_t N>
struct max_bytes {
  static_assert(N > 0, "max_bytes<0> would cache nothing");
  /// Whether `entries` registrations totalling `bytes` fit.
  static constexpr bool admits(std::size_t /*entries*/, std::size_t bytes) noexcept {
    return bytes <= N;
  }
  /// The cap, for documentation and tests.
  static constexpr std::size_t limit = N;
};

/// A capacity policy: `admits(entries, bytes)` says whether a cache holding
/// that many registrations covering that many bytes is within its bounds.
/// Several capacity policies may be given; all of them must admit.
template <class P>
concept capacity_policy = requires(std::size_t n) {
  { P::admits(n, n) } -> std::convertible_to<bool>;
};

// ----------------------------------------------------------------- locking

/// No locking: the cache is used from one thread at a time (e.g. a
/// communicator that serialises its calls). Cost: nothing.
struct no_lock {
  /// A mutex whose lock and unlock do nothing.
  struct mutex_type {
    void lock() noexcept {}
    void unlock() noexcept {}
  };
};

/// A std::mutex around every index operation. Registration and
/// deregistration (kernel calls) run outside it, so threads only contend for
/// the index itself: a hit holds the lock for one O(log n) map lookup.
struct mutex_lock {
  /// The mutex guarding the index.
  using mutex_type = std::mutex;
};

/// A locking policy: a default-constructible `mutex_type` with lock/unlock.
template <class P>
concept locking_policy = requires(typename P::mutex_type& m) {
  m.lock();
  m.unlock();
};

namespace detail {

template <class P>
inline constexpr int policy_roles = int{eviction_policy<P>} + int{capacity_policy<P>} + int{locking_policy<P>};

template <template <class> class Is, class Default, class... Ps>
struct first_of_role {
  using type = Default;
};
template <template <class> class Is, class Default, class P, class... Ps>
struct first_of_role<Is, Default, P, Ps...> {
  using type = std::conditional_t<Is<P>::value, P, typename first_of_role<Is, Default, Ps...>::type>;
};

template <class P> struct is_eviction : std::bool_constant<eviction_policy<P>> {};
template <class P> struct is_locking : std::bool_constant<locking_policy<P>> {};
template <class P> struct is_capacity : std::bool_constant<capacity_policy<P>> {};

/// All capacity policies in the pack, or max_entries<1024> when there is none.
template <class... Ps>
struct capacity_set {
  static constexpr bool any = (capacity_policy<Ps> || ...);
  static constexpr bool admits(std::size_t entries, std::size_t bytes) noexcept {
    if constexpr (any) {
      return ((!capacity_policy<Ps> || admits_one<Ps>(entries, bytes)) && ...);
    } else {
      return max_entries<1024>::admits(entries, bytes);
    }
  }

 private:
  template <class P>
  static constexpr bool admits_one(std::size_t entries, std::size_t bytes) noexcept {
    if constexpr (capacity_policy<P>) return P::admits(entries, bytes); else return true;
  }
};

/// Sorts a policy pack into its roles, filling in the defaults
/// (lru, max_entries<1024>, mutex_lock).
template <class... Ps>
struct policy_set {
  static_assert(((policy_roles<Ps> == 1) && ...),
                "every registration_cache policy must be exactly one of: eviction (lru), "
                "capacity (max_entries<N>, max_bytes<N>), locking (no_lock, mutex_lock)");
  static_assert((int{eviction_policy<Ps>} + ... + 0) <= 1, "give at most one eviction policy");
  static_assert((int{locking_policy<Ps>} + ... + 0) <= 1, "give at most one locking policy");
  using eviction = typename first_of_role<is_eviction, lru, Ps...>::type;
  using locking = typename first_of_role<is_locking, mutex_lock, Ps...>::type;
  using capacity = capacity_set<Ps...>;
};

}  // namespace detail
}  // namespace pdcoll::registration
