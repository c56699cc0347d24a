// File: transport/node_memory.hpp — shared memory that every rank of a job
// maps, for transports whose ranks all live on one host (libfabric shm).
//
// Each rank owns one region of region_bytes(): it writes only its own and
// reads everyone's. What goes into the regions is the business of the
// algorithms that use them (algorithm/shared_memory.hpp); the transport only
// creates, maps and removes them, and lets a rank that has written to its
// region wake peers sleeping in their endpoint's wait(). A transport offers
// node memory only when every rank mapped every region, so all ranks agree
// on whether it exists.
#pragma once

#include <cstddef>

namespace pdcoll::transport {

/// Transports offer no node memory with regions smaller than this (the
/// flags, two mailboxes of 32 KiB and two slots of a page:
/// detail/node_layout.hpp).
inline constexpr std::size_t min_node_memory_bytes = std::size_t{96} << 10;

/// Regions of shared memory, one per rank, mapped by every rank of the job.
class node_memory {
 public:
  node_memory() = default;
  node_memory(const node_memory&) = delete;
  node_memory& operator=(const node_memory&) = delete;

  /// Rank `rank`'s region (zero-filled when created), mapped in this process.
  virtual std::byte* region(int rank) const noexcept = 0;
  /// Size of every region in bytes.
  virtual std::size_t region_bytes() const noexcept = 0;
  /// Wakes `rank` if it sleeps in its endpoint's wait(); call after writing
  /// to this rank's region something `rank` may be waiting for.
  virtual void wake(int rank) noexcept = 0;
  /// Whether bulk transfers between these ranks cost less through node
  /// memory (two copies in user space, through slots that stay in cache)
  /// than as messages (one copy by the kernel), which depends on the
  /// machine: algo::automatic takes the slots at every size where this is
  /// true, and messages for large blocks on few ranks where it is false.
  /// The same on every rank. The shm transport measures it at setup
  /// (libfabric/copy_probe.hpp); false unless the transport says otherwise.
  virtual bool bulk_through_slots() const noexcept { return false; }

 protected:
  ~node_memory() = default;
};

/// Something besides the transport's own completions that ends a wait():
/// wait() returns as soon as `ready(arg)` is true (checked while it polls and
/// again just before it sleeps; a peer's wake() ends the sleep).
struct wait_condition {
  bool (*ready)(void* arg) noexcept = nullptr;  ///< nullptr: none
  void* arg = nullptr;                          ///< passed to ready
};

}  // namespace pdcoll::transport
