// File: memory/domain.hpp — what every memory domain provides (the
// `memory_domain` and `device_domain` concepts) and the small vocabulary the
// domains share: DMA-BUF exports, copy counters, invalidation hooks.
//
// A domain owns a kind of memory (host DRAM, Gaudi HBM, the memfd-backed
// stand-in used in CI). Collectives only ever see typed views of it
// (pdcoll::view<T, Domain>, memory/view.hpp); device views carry no host
// pointer, so the only ways to move device bytes are the domain's counted
// copies and the fabric (DMA-BUF / hmem registration).
#pragma once

#include <pdcoll/error.hpp>
#include <pdcoll/transport/endpoint.hpp>

#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <unistd.h>

namespace pdcoll::memory {

struct host;
class emulated_device;
class gaudi;

/// A device range described the way a DMA-BUF importer wants it: the
/// DMA-BUF `fd`, the byte `offset` of the range inside it and its `length`.
/// The fd belongs to the domain (see each domain's export_dmabuf): do not
/// close it; dup(2) it to keep it past the buffer's lifetime.
struct dmabuf_export {
  int fd = -1;               ///< DMA-BUF file descriptor, owned by the domain
  std::uint64_t offset = 0;  ///< first byte of the range inside the DMA-BUF
  std::size_t length = 0;    ///< bytes
};

/// Device↔host copies made through a domain's copy_to_host / copy_from_host,
/// so tests can prove that the direct (DMA-BUF) path copied nothing.
struct copy_counters {
  std::uint64_t device_to_host_bytes = 0;  ///< bytes copied by copy_to_host
  std::uint64_t device_to_host_calls = 0;  ///< successful copy_to_host calls
  std::uint64_t host_to_device_bytes = 0;  ///< bytes copied by copy_from_host
  std::uint64_t host_to_device_calls = 0;  ///< successful copy_from_host calls

  friend bool operator==(const copy_counters&, const copy_counters&) = default;
};

/// Identifies a registered invalidation hook (for remove_invalidation_hook).
using hook_id = std::uint64_t;

/// Called with the region of an allocation just before its memory is freed,
/// so a registration cache drops registrations that a reused address would
/// otherwise hit. The region is what detail::fabric_region reports for the
/// allocation's full view. A hook must not throw: frees are noexcept, so one
/// that does ends the process (std::terminate), rather than leave a cache
/// holding the registration of memory that is gone.
using invalidation_hook = std::function<void(const transport::memory_region&)>;

/// A hook added to `Domain` (add_invalidation_hook's id), removed when this
/// is destroyed or stop() is called; once either returns, no call of the
/// hook is running. Move-only. Must not outlive the domain. What
/// track_frees (memory/track.hpp) and registration::invalidate_on_free
/// return.
template <class Domain>
class hook_subscription {
 public:
  /// Takes over hook `id` of `domain`.
  hook_subscription(Domain& domain, hook_id id) noexcept : domain_(&domain), id_(id) {}
  /// Takes over the subscription; `o` no longer removes the hook.
  hook_subscription(hook_subscription&& o) noexcept : domain_(std::exchange(o.domain_, nullptr)), id_(o.id_) {}
  /// Removes this subscription's hook, then takes over `o`'s.
  hook_subscription& operator=(hook_subscription&& o) noexcept {
    if (this != &o) {
      stop();
      domain_ = std::exchange(o.domain_, nullptr);
      id_ = o.id_;
    }
    return *this;
  }
  hook_subscription(const hook_subscription&) = delete;
  hook_subscription& operator=(const hook_subscription&) = delete;
  ~hook_subscription() { stop(); }

  /// Removes the hook now (idempotent).
  void stop() noexcept {
    if (domain_) std::exchange(domain_, nullptr)->remove_invalidation_hook(id_);
  }

 private:
  Domain* domain_;
  hook_id id_;
};

/// Whether host memory should be backed by huge pages (fewer TLB misses and
/// fewer, larger NIC registrations).
enum class huge_pages : bool {
  no = false,  ///< ordinary pages
  yes = true,  ///< MAP_HUGETLB if the system has reserved huge pages, else madvise(MADV_HUGEPAGE)
};

}  // namespace pdcoll::memory

namespace pdcoll {
template <class T, class Domain>
class view;
}  // namespace pdcoll

namespace pdcoll::memory::detail {

/// A thread-safe list of invalidation hooks.
///
/// notify() holds the list's mutex while the hooks run, so once
/// remove_invalidation_hook returns no call of that hook is running or will
/// start: the subscriber (a registration cache) may then be destroyed. The
/// price: a hook must not add or remove hooks of the same domain (it would
/// deadlock).
class invalidation_hooks {
 public:
  hook_id add(invalidation_hook hook) {
    std::lock_guard lock(mutex_);
    const hook_id id = ++last_id_;
    hooks_.emplace_back(id, std::move(hook));
    return id;
  }
  void remove(hook_id id) {
    std::lock_guard lock(mutex_);
    std::erase_if(hooks_, [id](const auto& entry) { return entry.first == id; });
  }
  void notify(const transport::memory_region& region) const {
    std::lock_guard lock(mutex_);
    for (const auto& [id, hook] : hooks_) hook(region);
  }
  std::size_t size() const {
    std::lock_guard lock(mutex_);
    return hooks_.size();
  }

 private:
  mutable std::mutex mutex_;
  hook_id last_id_ = 0;
  std::vector<std::pair<hook_id, invalidation_hook>> hooks_;
};

/// A domain's copy counters, counted from any thread (each field on its
/// own, relaxed: a snapshot taken during copies may mix before and after).
class copy_meter {
 public:
  /// Counts one device-to-host copy of `bytes`.
  void count_to_host(std::uint64_t bytes) noexcept {
    to_host_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    to_host_calls_.fetch_add(1, std::memory_order_relaxed);
  }
  /// Counts one host-to-device copy of `bytes`.
  void count_from_host(std::uint64_t bytes) noexcept {
    from_host_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    from_host_calls_.fetch_add(1, std::memory_order_relaxed);
  }
  /// The counts so far.
  copy_counters snapshot() const noexcept {
    return {to_host_bytes_.load(std::memory_order_relaxed), to_host_calls_.load(std::memory_order_relaxed),
            from_host_bytes_.load(std::memory_order_relaxed), from_host_calls_.load(std::memory_order_relaxed)};
  }
  /// Sets every count to zero.
  void reset() noexcept {
    to_host_bytes_.store(0, std::memory_order_relaxed);
    to_host_calls_.store(0, std::memory_order_relaxed);
    from_host_bytes_.store(0, std::memory_order_relaxed);
    from_host_calls_.store(0, std::memory_order_relaxed);
  }

 private:
  std::atomic<std::uint64_t> to_host_bytes_{0};
  std::atomic<std::uint64_t> to_host_calls_{0};
  std::atomic<std::uint64_t> from_host_bytes_{0};
  std::atomic<std::uint64_t> from_host_calls_{0};
};

/// The host's page size; sysconf(3) _SC_PAGESIZE.
inline std::size_t page_size() noexcept {
  static const std::size_t size = [] {
    const long value = ::sysconf(_SC_PAGESIZE);
    return value > 0 ? static_cast<std::size_t>(value) : std::size_t{4096};
  }();
  return size;
}

/// `value` rounded up to a multiple of `alignment` (a power of two, or any
/// positive value); false when that overflows.
inline bool round_up(std::size_t value, std::size_t alignment, std::size_t& out) noexcept {
  const std::size_t remainder = value % alignment;
  if (remainder == 0) {
    out = value;
    return true;
  }
  const std::size_t pad = alignment - remainder;
  if (value > std::numeric_limits<std::size_t>::max() - pad) return false;
  out = value + pad;
  return true;
}

/// count * sizeof(T) in bytes; false when it overflows size_t.
template <class T>
bool checked_bytes(std::size_t count, std::size_t& out) noexcept {
  if (count > std::numeric_limits<std::size_t>::max() / sizeof(T)) return false;
  out = count * sizeof(T);
  return true;
}

/// Throws std::system_error{code, what}: the domains' operations return void
/// or a value (the shape the collectives call), so their failures travel as
/// exceptions carrying a std::error_code.
[[noreturn]] inline void fail(std::error_code code, const std::string& what) {
  throw std::system_error(code, what);
}
[[noreturn]] inline void fail(errc code, const std::string& what) { fail(make_error_code(code), what); }

/// First-fit allocator of aligned chunks inside [base, base + capacity):
/// the emulated device's memfd arena and Gaudi1's physical DRAM (whose
/// driver leaves DRAM allocation to user space). Not thread-safe; its owner
/// locks. Cost: O(free chunks) per allocation, O(log n) per release.
class first_fit_arena {
 public:
  first_fit_arena() = default;
  first_fit_arena(std::uint64_t base, std::size_t capacity) : capacity_(capacity) {
    if (capacity > 0) free_.emplace(base, capacity);
  }
  /// Takes `length` bytes (a multiple of the alignment the owner keeps) from
  /// the first free chunk large enough; false when none is.
  /// Allocates nothing itself (the chunk's node is reused).
  bool allocate(std::size_t length, std::uint64_t& address) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < length) continue;
      address = it->first;
      const std::size_t remaining = it->second - length;
      auto node = free_.extract(it);
      if (remaining > 0) {
        node.key() = address + length;
        node.mapped() = remaining;
        free_.insert(std::move(node));
      }
      in_use_ += length;
      return true;
    }
    return false;
  }
  /// Gives back a chunk taken by allocate, merged with free neighbours so
  /// large requests fit again. Allocates only for a chunk with no free
  /// neighbour (then it may throw std::bad_alloc, and the chunk stays in use).
  void release(std::uint64_t address, std::size_t length) {
    auto next = free_.lower_bound(address);
    const bool joins_next = next != free_.end() && next->first == address + length;
    const auto previous = next == free_.begin() ? free_.end() : std::prev(next);
    if (previous != free_.end() && previous->first + previous->second == address) {
      previous->second += length;
      if (joins_next) {
        previous->second += next->second;
        free_.erase(next);
      }
    } else if (joins_next) {
      auto node = free_.extract(next);
      node.key() = address;
      node.mapped() += length;
      free_.insert(std::move(node));
    } else {
      free_.emplace(address, length);  // the one step that allocates
    }
    in_use_ -= length;
  }
  std::size_t capacity() const noexcept { return capacity_; }
  std::size_t in_use() const noexcept { return in_use_; }

 private:
  std::size_t capacity_ = 0;
  std::size_t in_use_ = 0;
  std::map<std::uint64_t, std::size_t> free_;  // start → length; disjoint, never adjacent
};

/// The one door to views' and domains' internals: device views keep their
/// domain pointer and device address private, and domains keep their
/// bookkeeping private; this type is the friend both grant.
struct domain_access {
  template <class T, class Domain>
  static view<T, Domain> make_view(Domain* domain, std::uint64_t address, std::size_t count) noexcept {
    return view<T, Domain>(domain, address, count);
  }
  template <class T, class Domain>
  static Domain* domain(const view<T, Domain>& v) noexcept { return v.domain_; }
  template <class T, class Domain>
  static std::uint64_t address(const view<T, Domain>& v) noexcept { return v.address_; }
  template <class Domain>
  static transport::memory_region region(const Domain& domain, std::uint64_t address,
                                         std::size_t length) noexcept {
    return domain.region_of(address, length);
  }
  template <class Domain>
  static void release(Domain& domain, std::uint64_t address) noexcept { domain.release(address); }
};

}  // namespace pdcoll::memory::detail

namespace pdcoll::memory {

/// A memory domain: a kind of memory pdcoll can allocate, reduce on and hand
/// to transports.
template <class D>
concept memory_domain = requires(D& d, const D& cd, std::size_t count, invalidation_hook hook, hook_id id) {
  // the memory kind transports dispatch on (path_for, register_region)
  { D::kind } -> std::convertible_to<transport::memory_kind>;
  // true when reductions run in place on this memory, false when operands must be staged to host
  { cd.reduces_on_device() } -> std::same_as<bool>;
  // an owning, move-only allocation of `count` elements; throws std::system_error on failure
  d.template allocate<std::byte>(count);
  // subscribe to "this region is about to be freed" (the registration cache's invalidate)
  { d.add_invalidation_hook(std::move(hook)) } -> std::same_as<hook_id>;
  // unsubscribe; no call of the hook runs after this returns
  d.remove_invalidation_hook(id);
};

/// A device domain: memory the host cannot address directly, reached by the
/// fabric through DMA-BUF and by the host only through counted copies.
template <class D>
concept device_domain =
    memory_domain<D> &&
    requires(D& d, const D& cd, const view<std::byte, D>& v, const view<const std::byte, D>& cv,
             std::span<std::byte> host_out, std::span<const std::byte> host_in) {
      // libfabric's enum fi_hmem_iface value to register this memory with
      { D::hmem_iface } -> std::convertible_to<int>;
      // the DMA-BUF {fd, offset, length} of a view (FI_MR_DMABUF / fi_mr_dmabuf)
      { cd.export_dmabuf(v) } -> std::same_as<dmabuf_export>;
      // counted device→host copy (host-staged path)
      cd.copy_to_host(cv, host_out);
      // counted host→device copy (host-staged path)
      cd.copy_from_host(host_in, v);
      // the copy counters, and resetting them
      { cd.counters() } -> std::same_as<copy_counters>;
      d.reset_counters();
    };

}  // namespace pdcoll::memory
