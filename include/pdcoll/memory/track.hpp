// File: memory/track.hpp — `pdcoll::track_frees(domain, comm)`: keeps a
// communicator's registration cache in step with a memory domain's frees, so
// memory freed and reallocated at the same address is registered anew
// instead of hitting a stale registration.
//
//     pdcoll::memory::emulated_device dev;
//     auto tracking = pdcoll::track_frees(dev, comm);   // until `tracking` goes
//     auto grads = dev.allocate<float>(n);
//     pdcoll::exec::sync_wait(pdcoll::all_reduce(comm, grads.view()));
//
// The domain calls the hook before a freed range can be reused; the hook
// calls communicator::invalidate_registrations, which never blocks on the
// communicator's lock (a busy lock queues the range until the next lookup).
//
// A communicator caches only registrations whose memory's free it hears of:
// its own host blocks, and the memory of domains it tracks. Untracked device
// memory, and host memory the caller owns (vectors, spans: no free of theirs
// is announced), are registered for each operation on transports that
// register them (FI_MR_LOCAL providers such as verbs and efa; DMA-BUF).
// `pdcoll::register_buffer(comm, grads)` declares a caller's host buffer to
// stay allocated while its handle lives, and so gives it the cache back.
#pragma once

#include <pdcoll/communicator.hpp>
#include <pdcoll/memory/domain.hpp>

#include <cstddef>
#include <cstdint>
#include <ranges>
#include <type_traits>
#include <utility>

namespace pdcoll {

/// A subscription of a communicator to a domain's frees; unsubscribes when
/// destroyed (after which no hook call is running). While it lives the
/// communicator caches registrations of the domain's memory
/// (communicator::hear_frees_from); when it ends they are dropped. Move-only.
/// Must not outlive the domain or the communicator.
template <memory::memory_domain Domain>
class free_tracking : public memory::hook_subscription<Domain> {
 public:
  /// Subscribes `comm` to `domain`'s frees.
  free_tracking(Domain& domain, communicator& comm)
      : memory::hook_subscription<Domain>(
            domain, domain.add_invalidation_hook(
                        [c = &comm](const transport::memory_region& region) { c->invalidate_registrations(region); })),
        comm_(&comm),
        notice_(notice_of(domain)) {
    comm.hear_frees_from(notice_);
  }
  /// Takes over `o`'s subscription.
  free_tracking(free_tracking&& o) noexcept
      : memory::hook_subscription<Domain>(std::move(o)), comm_(std::exchange(o.comm_, nullptr)), notice_(o.notice_) {}
  /// Ends this subscription, then takes over `o`'s.
  free_tracking& operator=(free_tracking&& o) noexcept {
    if (this != &o) {
      stop_hearing();
      memory::hook_subscription<Domain>::operator=(std::move(o));
      comm_ = std::exchange(o.comm_, nullptr);
      notice_ = o.notice_;
    }
    return *this;
  }
  // The communicator stops caching this domain's memory before the hook goes,
  // so no registration is cached while a free could go unheard.
  ~free_tracking() { stop_hearing(); }
  /// Ends the subscription now (idempotent): the communicator drops its
  /// cached registrations, then the hook is removed.
  void stop() noexcept {
    stop_hearing();
    memory::hook_subscription<Domain>::stop();
  }

 private:
  static const void* notice_of(const Domain& domain) noexcept {
    if constexpr (requires { domain.free_notice(); }) return domain.free_notice();
    else return nullptr;  // the host domain: a host view's region names no notice, nothing of it is cached
  }
  void stop_hearing() noexcept {
    if (auto* comm = std::exchange(comm_, nullptr)) {
      try {
        comm->stop_hearing_frees_from(notice_);
      } catch (...) {
        // std::bad_alloc while dropping entries: they stay until the cache
        // is destroyed, and stay correct because the hook is still there
        // until the base destructor; nothing else to do in a destructor.
      }
    }
  }

  communicator* comm_;
  const void* notice_;
};

/// Subscribes `comm`'s registration cache to `domain`'s frees: every freed
/// range is invalidated (in-use registrations go at their last release), and
/// so the communicator caches registrations of the domain's memory at all;
/// untracked device memory is registered per operation on transports that
/// register it.
/// Keep the result alive as long as both are in use. Cost: one hook call per
/// free. Throws std::bad_alloc only.
template <memory::memory_domain Domain>
[[nodiscard]] free_tracking<Domain> track_frees(Domain& domain, communicator& comm) {
  return free_tracking<Domain>(domain, comm);
}

/// Host memory the caller owns, declared to stay allocated while this
/// lives, so that the communicator caches its registrations (NCCL's
/// ncclCommRegister / ncclCommDeregister). Without one, a caller's host
/// buffers are registered per operation on providers that register host
/// memory (verbs, efa): nobody announces their free. Destroy it (or call
/// release()) before freeing the memory: that drops the cached
/// registrations. Move-only; must not outlive the communicator.
class registered_buffer {
 public:
  /// Declares [address, address + length) on `comm`.
  registered_buffer(communicator& comm, const void* address, std::size_t length)
      : comm_(&comm), id_(comm.note_caller_buffer(address, length)) {}
  /// Takes over `o`'s declaration.
  registered_buffer(registered_buffer&& o) noexcept : comm_(std::exchange(o.comm_, nullptr)), id_(o.id_) {}
  /// Ends this declaration, then takes over `o`'s.
  registered_buffer& operator=(registered_buffer&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, nullptr);
      id_ = o.id_;
    }
    return *this;
  }
  registered_buffer(const registered_buffer&) = delete;
  registered_buffer& operator=(const registered_buffer&) = delete;
  ~registered_buffer() { release(); }

  /// Ends the declaration now (idempotent): the cached registrations of the
  /// memory go (in-use ones when their operation ends).
  void release() noexcept {
    if (auto* comm = std::exchange(comm_, nullptr)) {
      try {
        comm->forget_caller_buffer(id_);
      } catch (...) {
        // std::bad_alloc while dropping entries: nothing more a destructor can do.
      }
    }
  }

 private:
  communicator* comm_;
  std::uint64_t id_ = 0;
};

/// Declares `buffer` (a contiguous range of host memory the caller owns) to
/// stay allocated while the result lives, so `comm` caches its
/// registrations:
///
///     std::vector<float> grads(n);
///     auto pinned = pdcoll::register_buffer(comm, grads);  // before the training loop
///     for (...) pdcoll::exec::sync_wait(pdcoll::all_reduce(comm, grads));
///
/// Cost: a lock and a vector append; each registration-needing acquire then
/// scans the declared buffers. Throws std::bad_alloc only.
template <class Range>
  requires std::ranges::contiguous_range<Range> && std::ranges::sized_range<Range> &&
           std::is_lvalue_reference_v<Range>
[[nodiscard]] registered_buffer register_buffer(communicator& comm, Range&& buffer) {
  return registered_buffer(comm, std::ranges::data(buffer),
                           std::ranges::size(buffer) * sizeof(std::ranges::range_value_t<Range>));
}

}  // namespace pdcoll
