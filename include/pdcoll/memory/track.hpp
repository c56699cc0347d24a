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
#pragma once

#include <pdcoll/communicator.hpp>
#include <pdcoll/memory/domain.hpp>

#include <utility>

namespace pdcoll {

/// A subscription of a communicator to a domain's frees; unsubscribes when
/// destroyed (after which no hook call is running). Move-only. Must not
/// outlive the domain or the communicator.
template <memory::memory_domain Domain>
class free_tracking : public memory::hook_subscription<Domain> {
 public:
  /// Subscribes `comm` to `domain`'s frees.
  free_tracking(Domain& domain, communicator& comm)
      : memory::hook_subscription<Domain>(
            domain, domain.add_invalidation_hook(
                        [c = &comm](const transport::memory_region& region) { c->invalidate_registrations(region); })) {}
};

/// Subscribes `comm`'s registration cache to `domain`'s frees: every freed
/// range is invalidated (in-use registrations go at their last release).
/// Keep the result alive as long as both are in use. Cost: one hook call per
/// free. Throws std::bad_alloc only.
template <memory::memory_domain Domain>
[[nodiscard]] free_tracking<Domain> track_frees(Domain& domain, communicator& comm) {
  return free_tracking<Domain>(domain, comm);
}

}  // namespace pdcoll
