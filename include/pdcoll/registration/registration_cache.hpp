// File: registration/registration_cache.hpp — `registration_cache<Registrar,
// Policies...>`: caches memory registrations so that a buffer used by many
// collectives is registered with the NIC once (DESIGN.md §5).
//
// What it guarantees:
//  * a request inside a cached range is a hit (O(log n) lookup: cached ranges
//    of one address space never overlap, so the only candidate is the entry
//    with the greatest start not above the request's start);
//  * a hit or miss hands back a pinned_registration; a pinned entry is never
//    evicted or deregistered; evicted, invalidated or merged entries that are
//    still pinned are deregistered at their last release;
//  * invalidate(region) drops every overlapping entry, so memory freed and
//    reused at the same address is registered anew;
//  * a full cache (everything pinned) registers uncached instead of failing;
//  * the registrar is never called with the lock held.
//
// Overlapping requests merge: a miss whose range overlaps cached entries
// registers the union and replaces them (they are deregistered once unpinned).
// Two buffers used alternately with overlapping ranges then stop missing after
// the first merge instead of evicting each other forever. Requests never merge
// across a gap, so a merged range never covers bytes nobody asked for.
//
// Performance: a hit is one lock plus one std::map lookup (~log2(n)
// comparisons); a miss allocates an entry and a map node and calls the
// registrar twice at most (register; deregister of an evicted entry).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <system_error>
#include <utility>

#include "pdcoll/error.hpp"
#include "pdcoll/memory/domain.hpp"
#include "pdcoll/registration/detail/region_key.hpp"
#include "pdcoll/registration/policies.hpp"
#include "pdcoll/registration/registrar.hpp"
#include "pdcoll/result.hpp"
#include "pdcoll/transport/endpoint.hpp"

namespace pdcoll::registration {

/// Counters of a registration cache, read together under its lock.
struct cache_statistics {
  std::uint64_t hits = 0;                    ///< acquires served by a cached entry
  std::uint64_t misses = 0;                  ///< acquires that had to register
  std::uint64_t evictions = 0;               ///< entries dropped to make room
  std::uint64_t invalidations = 0;           ///< entries dropped by invalidate()
  std::uint64_t merges = 0;                  ///< entries replaced by a miss covering their range
  std::uint64_t lost_races = 0;              ///< misses whose registration lost to another thread's
  std::uint64_t uncached_registrations = 0;  ///< registrations handed out without caching
  std::uint64_t registrations = 0;           ///< successful registrar.register_region calls
  std::uint64_t failed_registrations = 0;    ///< failed registrar.register_region calls
  std::uint64_t deregistrations = 0;         ///< registrar.deregister calls (made or queued)
  std::size_t live_entries = 0;              ///< cached entries, pinned or not
  std::size_t live_bytes = 0;                ///< bytes covered by cached entries
  std::size_t pinned_entries = 0;            ///< cached entries pinned now
  std::size_t retired_in_use = 0;            ///< uncached or dropped registrations still pinned
};

/// Caches registrations made by `Registrar`, keyed by address range (host
/// memory) or DMA-BUF identity plus offset range (device memory).
///
/// Policies, in any order, each at most once per role (policies.hpp):
///  * eviction: `lru` (default);
///  * capacity: `max_entries<N>` and/or `max_bytes<N>` (default
///    `max_entries<1024>`: a collective library touches few distinct buffers,
///    and providers cap live registrations at a few thousand);
///  * locking: `mutex_lock` (default) or `no_lock` (one thread at a time).
///
/// The registrar is held by reference and must outlive the cache. With
/// mutex_lock, several threads may be inside the registrar at once (it is
/// called outside the lock), so it must be thread-safe; with no_lock it is
/// called from the one thread using the cache.
///
/// ```cpp
/// registration_cache<endpoint_registrar> cache{registrar};      // lru, 1024, mutex
/// registration_cache<my_registrar, max_bytes<1 << 30>, no_lock> big{mine};
/// auto pinned = cache.acquire(region);          // result<pinned_registration>
/// if (!pinned) return pinned.error();
/// ep.post_send(peer, buf, len, tag, pinned->handle().descriptor, ctx);
/// // keep `pinned` alive until the send completes
/// ```
template <registrar Registrar, class... Policies>
class registration_cache {
  using policies = detail::policy_set<Policies...>;

 public:
  /// The registrar's handle (for endpoint_registrar: transport::registration_handle).
  using handle_type = registrar_handle_t<Registrar>;
  /// The eviction policy in use.
  using eviction_policy_type = typename policies::eviction;
  /// The locking policy in use.
  using locking_policy_type = typename policies::locking;

 private:
  struct entry {
    entry(const detail::region_key& k, handle_type&& h) noexcept : key(k), handle(std::move(h)) {}
    detail::region_key key;
    handle_type handle;
    std::size_t pins = 0;
    bool indexed = false;   // in index_, counted in live_entries
    bool orphaned = false;  // written only by ~registration_cache, see pinned_registration::release
    entry* next_retired = nullptr;
    entry* outside_prev = nullptr;  // list of pinned entries not in the index
    entry* outside_next = nullptr;
    typename eviction_policy_type::template hook<entry> eviction_hook;
  };

 public:
  /// A registration pinned for as long as this object lives: neither eviction
  /// nor invalidation deregisters it underneath its user. Move-only; the
  /// destructor (or release()) unpins. Release it once the operation that
  /// uses the handle has completed.
  class pinned_registration {
   public:
    /// An empty pin (what a moved-from one is).
    pinned_registration() noexcept = default;
    pinned_registration(pinned_registration&& other) noexcept
        : cache_(std::exchange(other.cache_, nullptr)),
          entry_(std::exchange(other.entry_, nullptr)),
          cached_(other.cached_) {}
    pinned_registration& operator=(pinned_registration&& other) noexcept {
      if (this != &other) {
        release();
        cache_ = std::exchange(other.cache_, nullptr);
        entry_ = std::exchange(other.entry_, nullptr);
        cached_ = other.cached_;
      }
      return *this;
    }
    pinned_registration(const pinned_registration&) = delete;
    pinned_registration& operator=(const pinned_registration&) = delete;
    ~pinned_registration() { release(); }

    /// The registrar's handle (gives the descriptor to pass with transfers).
    /// Precondition: not empty.
    const handle_type& handle() const noexcept { return entry_->handle; }
    /// Whether this pin holds a registration.
    explicit operator bool() const noexcept { return entry_ != nullptr; }
    /// Whether the registration was cached when acquired (false: registered
    /// for this pin alone because the cache was full, and deregistered at
    /// its release).
    bool cached() const noexcept { return cached_; }

    /// Unpins now; the pin becomes empty. Cost: one lock, plus a
    /// deregistration (outside the lock) when this was the last pin of an
    /// uncached, evicted or invalidated registration.
    void release() noexcept {
      if (entry_ != nullptr) release_pin();  // the empty case inline: leases of unbound buffers are common
    }

   private:
    friend class registration_cache;
    void release_pin() noexcept {
      entry* e = std::exchange(entry_, nullptr);
      // The cache was destroyed while this pin lived (a programming error):
      // its destructor already deregistered the handle and left the entry to
      // its pins. Releasing orphans from several threads at once races.
      if (e->orphaned) {
        if (--e->pins == 0) delete e;
        return;
      }
      cache_->release(e);
    }
    pinned_registration(registration_cache* cache, entry* e, bool cached) noexcept
        : cache_(cache), entry_(e), cached_(cached) {}
    registration_cache* cache_ = nullptr;
    entry* entry_ = nullptr;
    bool cached_ = false;
  };

  /// A cache over `registrar`, which must outlive it.
  explicit registration_cache(Registrar& registrar) noexcept : registrar_(&registrar) {}
  registration_cache(const registration_cache&) = delete;
  registration_cache& operator=(const registration_cache&) = delete;

  /// Deregisters every registration. Pins still alive at this point are a
  /// programming error: their handles are deregistered too (the registrar
  /// may not outlive the cache), an operation still using one sees the
  /// provider's error for a closed registration, and the pin's later release
  /// only frees its bookkeeping — no crash, no double deregistration.
  ~registration_cache() {
    retired_list retired{*registrar_};
    std::unique_lock lock(mutex_);
    while (!index_.empty()) detach(index_.begin(), retired);
    for (entry* e = outside_; e != nullptr;) {
      entry* next = e->outside_next;
      // The handle goes now; the entry stays for its pins to free.
      registrar_->deregister(e->handle);
      e->orphaned = true;
      e = next;
    }
    outside_ = nullptr;
  }

  /// Returns a pinned registration covering `region`: a cached one when a
  /// cached range contains it (hit), else a new registration (miss), cached
  /// unless the capacity is taken by pinned entries.
  /// Cost: hit O(log n) under the lock; miss adds a registrar call outside it.
  /// Errors: errc::invalid_argument (empty region, bad DMA-BUF fd, range
  /// wraps), errc::null_buffer (host region at address 0), or whatever the
  /// registrar returned. Throws what the registrar or allocation throws.
  result<pinned_registration> acquire(const transport::memory_region& region) {
    auto key = detail::key_of(region);
    if (!key) return key.error();

    retired_list retired{*registrar_};  // before the lock: runs after it is released
    std::unique_lock lock(mutex_);
    if (entry* e = find_containing(*key)) {
      pin(*e);
      ++stats_.hits;
      return pinned_registration{this, e, true};
    }
    ++stats_.misses;
    detail::region_key wanted = *key;
    for_each_overlapping(*key, [&](auto it) {
      wanted.start = std::min(wanted.start, it->second->key.start);
      wanted.end = std::max(wanted.end, it->second->key.end);
    });
    // When pinned entries fill the capacity, register the request alone and
    // hand it out uncached: a merged range would cover bytes the caller does
    // not vouch for, in a registration nobody else can find.
    const bool uncached_from_start = !admissible(wanted);
    if (uncached_from_start) wanted = *key;
    pending_miss pending{wanted};
    link_pending(pending);
    lock.unlock();

    // Registration runs outside the lock, and that is the subtle part.
    //
    // Registering is a kernel call (pinning pages, programming the NIC's
    // translation tables) that takes microseconds to milliseconds; holding
    // the lock across it would stall every hit on every other thread behind
    // one miss. So a miss drops the lock, registers, and retakes it. While it
    // was away, three things may have happened, and each is settled here,
    // under the lock, before anything is published:
    //
    //  1. Another thread missed on the same range, registered too and
    //     inserted first. We look the request up again; if a cached entry now
    //     contains it, the other thread won: we pin its entry and deregister
    //     our own registration (after unlocking). We do not keep ours as an
    //     uncached registration: the winner's entry serves this pin and all
    //     later ones, and a second registration of the same pages would only
    //     use up the provider's registration limit. The loser pays one extra
    //     register/deregister pair, once, counted as `lost_races`.
    //
    //  2. Memory overlapping what we registered was invalidated (freed), so
    //     our registration may describe pages that are gone or reused. Each
    //     miss in flight sits in pending_ and invalidate() marks the
    //     overlapping ones stale. A stale registration is never cached. If it
    //     covers exactly the request, it is handed to the caller uncached:
    //     the caller's own memory raced its free, and without a cache it
    //     would have got the same registration. If it covers more (a merge
    //     with cached neighbours), the extra bytes are not the caller's to
    //     vouch for: we deregister it and register the request alone,
    //     uncached.
    //
    //  3. Other entries were inserted, evicted or invalidated. Ranges that
    //     now overlap ours are replaced by ours (merged) exactly as at lookup
    //     time; capacity is checked against the index as it is now.
    //
    // Deregistrations (losers, evictions, merges) are queued while locked and
    // run after unlocking, by retired_list's destructor, declared before the
    // lock so that it runs after the lock is released, exceptions included.
    std::unique_ptr<entry> fresh;
    std::error_code failure;
    try {
      failure = register_entry(wanted, *key, region, fresh);
    } catch (...) {
      lock.lock();
      unlink_pending(pending);
      throw;
    }
    lock.lock();
    unlink_pending(pending);
    if (failure) {
      ++stats_.failed_registrations;
      return failure;
    }
    ++stats_.registrations;

    if (pending.stale) return hand_out_alone(std::move(fresh), *key, region, lock, retired);
    if (entry* winner = find_containing(*key)) {
      ++stats_.lost_races;
      retire(fresh.release(), retired);
      pin(*winner);
      return pinned_registration{this, winner, true};
    }
    if (uncached_from_start || !admissible(wanted)) return hand_out_alone(std::move(fresh), *key, region, lock, retired);
    for_each_overlapping(wanted, [&](auto it) {
      ++stats_.merges;
      detach(it, retired);
    });
    const std::size_t bytes = static_cast<std::size_t>(wanted.bytes());
    while (!policies::capacity::admits(stats_.live_entries + 1, stats_.live_bytes + bytes)) {
      entry* victim = order_.victim();
      // Only a capacity policy that is not monotone can get here with nothing
      // evictable; the request is still served.
      if (victim == nullptr) return hand_out_alone(std::move(fresh), *key, region, lock, retired);
      ++stats_.evictions;
      detach(index_.find(index_key{victim->key.space, victim->key.start}), retired);
    }
    entry* e = fresh.get();
    try {
      index_.emplace(index_key{e->key.space, e->key.start}, e);
    } catch (...) {
      retire(fresh.release(), retired);  // deregistered once the lock is released
      throw;
    }
    fresh.release();
    e->indexed = true;
    ++stats_.live_entries;
    stats_.live_bytes += bytes;
    pin(*e);
    return pinned_registration{this, e, true};
  }

  /// Which entries invalidate() drops, named while the region's DMA-BUF fd is
  /// still open: a DMA-BUF range is keyed by the buffer's identity, which is
  /// read through the fd, and once the fd is closed its number may name
  /// another buffer. A caller that has to put an invalidation off until after
  /// the fd is closed (communicator::invalidate_registrations, when its lock
  /// is busy) names it first with name_invalidation() and passes the name to
  /// invalidate() later.
  struct invalidation {
    result<detail::region_key> key;  ///< the range, or why it has none
    bool dmabuf = false;             ///< the region named a DMA-BUF fd
  };

  /// The name of `region`'s invalidation (see invalidation). Cost: one
  /// fstat(2) for a DMA-BUF region.
  static invalidation name_invalidation(const transport::memory_region& region) noexcept {
    return {detail::key_of(region), region.dmabuf_fd >= 0};
  }

  /// Drops every cached entry overlapping `region` (call it when the memory
  /// is freed or remapped, before a DMA-BUF fd is closed). Unpinned entries
  /// are deregistered now (outside the lock), pinned ones at their last
  /// release; a later acquire of the same addresses registers anew.
  /// Cost: O(log n + k) for k dropped entries, plus k deregistrations.
  /// Errors: errc::invalid_argument when the region is empty or its DMA-BUF
  /// fd cannot be identified; then every DMA-BUF entry is dropped, since the
  /// freed one cannot be told apart (correct, only slower).
  std::error_code invalidate(const transport::memory_region& region) { return invalidate(name_invalidation(region)); }

  /// Drops the entries `what` names (see name_invalidation); as above.
  std::error_code invalidate(const invalidation& what) {
    retired_list retired{*registrar_};
    std::unique_lock lock(mutex_);
    if (!what.key) {
      if (what.dmabuf) {
        for (auto it = index_.begin(); it != index_.end();) {
          auto next = std::next(it);
          if (it->first.space.by_identity) {
            ++stats_.invalidations;
            detach(it, retired);
          }
          it = next;
        }
        for (pending_miss* p = pending_; p != nullptr; p = p->next)
          if (p->key.space.by_identity) p->stale = true;
      }
      return what.key.error();
    }
    const detail::region_key& key = *what.key;
    for_each_overlapping(key, [&](auto it) {
      ++stats_.invalidations;
      detach(it, retired);
    });
    for (pending_miss* p = pending_; p != nullptr; p = p->next)
      if (p->key.overlaps(key)) p->stale = true;
    return {};
  }

  /// Drops every cached entry: unpinned ones are deregistered now (outside
  /// the lock), pinned ones at their last release. Counted in no statistic
  /// but deregistrations. Cost: O(n) plus the deregistrations.
  void clear() {
    retired_list retired{*registrar_};
    std::unique_lock lock(mutex_);
    while (!index_.empty()) detach(index_.begin(), retired);
  }

  /// A snapshot of the counters. Cost: one lock.
  cache_statistics statistics() const {
    std::unique_lock lock(mutex_);
    return stats_;
  }

 private:
  struct index_key {
    detail::address_space space;
    std::uint64_t start = 0;
    friend bool operator<(const index_key& a, const index_key& b) noexcept {
      if (a.space == b.space) return a.start < b.start;
      return a.space < b.space;
    }
  };
  using index_type = std::map<index_key, entry*>;
  using index_iterator = typename index_type::iterator;

  // A miss between dropping and retaking the lock (see acquire).
  struct pending_miss {
    explicit pending_miss(const detail::region_key& k) noexcept : key(k) {}
    detail::region_key key;
    bool stale = false;
    pending_miss* prev = nullptr;
    pending_miss* next = nullptr;
  };

  // Entries whose handles are to be deregistered once the lock is released;
  // destroyed after the unique_lock declared below it.
  class retired_list {
   public:
    explicit retired_list(Registrar& r) noexcept : registrar_(&r) {}
    retired_list(const retired_list&) = delete;
    retired_list& operator=(const retired_list&) = delete;
    ~retired_list() {
      while (head_ != nullptr) {
        entry* e = std::exchange(head_, head_->next_retired);
        registrar_->deregister(e->handle);
        delete e;
      }
    }
    void push(entry* e) noexcept {
      e->next_retired = head_;
      head_ = e;
    }

   private:
    Registrar* registrar_;
    entry* head_ = nullptr;
  };

  entry* find_containing(const detail::region_key& key) {
    auto it = index_.upper_bound(index_key{key.space, key.start});
    if (it == index_.begin()) return nullptr;
    entry* e = std::prev(it)->second;
    return e->key.contains(key) ? e : nullptr;
  }

  // Calls f(iterator) for every entry overlapping `key`, in address order;
  // f may erase the entry it is given.
  template <class F>
  void for_each_overlapping(const detail::region_key& key, F&& f) {
    auto it = index_.upper_bound(index_key{key.space, key.start});
    if (it != index_.begin() && std::prev(it)->second->key.overlaps(key)) --it;
    while (it != index_.end() && it->second->key.overlaps(key)) {
      auto next = std::next(it);
      f(it);
      it = next;
    }
  }

  // Registers `key` (called without the lock) into `out`; returns why not.
  std::error_code register_entry(const detail::region_key& key, const detail::region_key& requested,
                                 const transport::memory_region& request, std::unique_ptr<entry>& out) {
    auto registered = registrar_->register_region(detail::region_for(key, requested, request));
    if (!registered) {
      std::error_code ec = registered.error();
      return ec ? ec : std::error_code{errc::registration_failed};
    }
    try {
      out = std::make_unique<entry>(key, std::move(*registered));
    } catch (...) {
      registrar_->deregister(*registered);
      throw;
    }
    return {};
  }

  // Whether `key` fits once every unpinned entry and every entry it would
  // replace are gone: if not, caching it would mean evicting a pinned entry.
  bool admissible(const detail::region_key& key) {
    std::size_t entries = stats_.pinned_entries + 1;
    std::size_t bytes = pinned_bytes_ + static_cast<std::size_t>(key.bytes());
    for_each_overlapping(key, [&](auto it) {
      if (it->second->pins > 0) {
        --entries;
        bytes -= static_cast<std::size_t>(it->second->key.bytes());
      }
    });
    return policies::capacity::admits(entries, bytes);
  }

  void pin(entry& e) noexcept {
    if (e.pins++ == 0 && e.indexed) {
      order_.unlink(e);
      ++stats_.pinned_entries;
      pinned_bytes_ += static_cast<std::size_t>(e.key.bytes());
    }
  }

  // Hands the request `key` out alone, uncached. `fresh` serves when it
  // covers exactly `key`; a merged one covers bytes the caller does not
  // vouch for, in a registration invalidate() cannot reach, so it is retired
  // and `key` registered by itself (the lock dropped around the registrar).
  template <class Lock>
  result<pinned_registration> hand_out_alone(std::unique_ptr<entry> fresh, const detail::region_key& key,
                                             const transport::memory_region& region, Lock& lock,
                                             retired_list& retired) {
    if (fresh->key.start != key.start || fresh->key.end != key.end) {
      retire(fresh.release(), retired);
      lock.unlock();
      const std::error_code failure = register_entry(key, key, region, fresh);
      lock.lock();
      if (failure) {
        ++stats_.failed_registrations;
        return failure;
      }
      ++stats_.registrations;
    }
    return hand_out_uncached(std::move(fresh));
  }

  pinned_registration hand_out_uncached(std::unique_ptr<entry> fresh) noexcept {
    entry* e = fresh.release();
    ++stats_.uncached_registrations;
    e->pins = 1;
    link_outside(*e);
    return pinned_registration{this, e, false};
  }

  // Removes an entry from the index: deregistered with `retired` when
  // unpinned, else at its last release.
  void detach(index_iterator it, retired_list& retired) noexcept {
    entry* e = it->second;
    index_.erase(it);
    e->indexed = false;
    --stats_.live_entries;
    stats_.live_bytes -= static_cast<std::size_t>(e->key.bytes());
    if (e->pins == 0) {
      order_.unlink(*e);
      retire(e, retired);
    } else {
      --stats_.pinned_entries;
      pinned_bytes_ -= static_cast<std::size_t>(e->key.bytes());
      link_outside(*e);
    }
  }

  void retire(entry* e, retired_list& retired) noexcept {
    ++stats_.deregistrations;
    retired.push(e);
  }

  void release(entry* e) noexcept {
    retired_list retired{*registrar_};
    std::unique_lock lock(mutex_);
    if (--e->pins > 0) return;
    if (e->indexed) {
      --stats_.pinned_entries;
      pinned_bytes_ -= static_cast<std::size_t>(e->key.bytes());
      order_.link(*e);
      return;
    }
    unlink_outside(*e);
    retire(e, retired);
  }

  void link_outside(entry& e) noexcept {
    e.outside_prev = nullptr;
    e.outside_next = outside_;
    if (outside_ != nullptr) outside_->outside_prev = &e;
    outside_ = &e;
    ++stats_.retired_in_use;
  }
  void unlink_outside(entry& e) noexcept {
    if (e.outside_prev != nullptr) e.outside_prev->outside_next = e.outside_next; else outside_ = e.outside_next;
    if (e.outside_next != nullptr) e.outside_next->outside_prev = e.outside_prev;
    --stats_.retired_in_use;
  }

  void link_pending(pending_miss& p) noexcept {
    p.next = pending_;
    if (pending_ != nullptr) pending_->prev = &p;
    pending_ = &p;
  }
  void unlink_pending(pending_miss& p) noexcept {
    if (p.prev != nullptr) p.prev->next = p.next; else pending_ = p.next;
    if (p.next != nullptr) p.next->prev = p.prev;
  }

  Registrar* registrar_;
  mutable typename locking_policy_type::mutex_type mutex_;
  index_type index_;
  typename eviction_policy_type::template order<entry> order_;
  entry* outside_ = nullptr;        // pinned, not indexed: uncached or dropped
  pending_miss* pending_ = nullptr; // misses registering right now
  std::size_t pinned_bytes_ = 0;    // bytes of indexed entries with pins
  cache_statistics stats_;
};

/// Subscribes `cache` to `domain`'s frees: every region the domain frees (or
/// remaps) is invalidated in the cache, until the returned subscription is
/// destroyed (keep it no longer than the cache). An invalidation whose
/// DMA-BUF fd cannot be identified drops every DMA-BUF entry (see
/// invalidate), so no error is lost to correctness.
template <class Domain, class Cache>
  requires requires(Domain& d, Cache& c, const transport::memory_region& r, memory::hook_id id) {
    { d.add_invalidation_hook(std::function<void(const transport::memory_region&)>{}) } -> std::same_as<memory::hook_id>;
    d.remove_invalidation_hook(id);
    c.invalidate(r);
  }
[[nodiscard]] memory::hook_subscription<Domain> invalidate_on_free(Domain& domain, Cache& cache) {
  return {domain, domain.add_invalidation_hook(std::function<void(const transport::memory_region&)>{
                      [&cache](const transport::memory_region& region) { (void)cache.invalidate(region); }})};
}

}  // namespace pdcoll::registration
