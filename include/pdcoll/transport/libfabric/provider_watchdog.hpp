// File: transport/libfabric/provider_watchdog.hpp — ends a process whose
// thread cannot come back from a libfabric call.
//
// libfabric's shm provider (1.17) guards each rank's shared-memory region with
// a spinlock that every sender to that rank takes. A rank killed while it holds
// one (mid-send) leaves it held for good, and every later fi_tinject, fi_tsend
// or fi_cq_read that needs it spins forever inside the provider (seen with gdb:
// __pthread_spin_lock under fi_tinjectdata). No deadline of pdcoll can reach a
// thread in there, so the survivors would hang until something killed them.
//
// So every fabric endpoint on shm marks the calls it makes into the provider
// (provider_call), and one thread per process (provider_watchdog) looks at the
// marks every 100 ms. A call that has not returned within the limit
// (PDCOLL_PROVIDER_STUCK_MS, default 5000; provider calls on shm never block,
// so a healthy one takes microseconds) cannot return: the watchdog says which
// call, to which rank and for how long on stderr, and ends the process with
// exit status 70 (EX_SOFTWARE), as PyTorch's NCCL watchdog tears down a
// process whose collective hangs. The launcher then sees a rank that failed,
// instead of one that hangs. It ends it with _exit, not abort: libfabric's shm
// provider catches SIGABRT to clean up its regions, and that cleanup can need
// the very lock that is held (a first version that aborted hung there).
//
// Cost on the data path: two relaxed atomic increments and three relaxed
// stores per provider call.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <thread>

#include <pthread.h>
#include <vector>

#include "pdcoll/detail/env.hpp"

namespace pdcoll::transport::libfabric::detail {

/// What one endpoint is doing inside the provider, as the watchdog reads it.
struct provider_call_slot {
  std::atomic<std::uint32_t> depth{0};     ///< provider calls in progress (nested: close inside a drain)
  std::atomic<std::uint64_t> activity{0};  ///< bumped at every call's entry and exit
  std::atomic<const char*> call{""};       ///< the innermost call's name
  std::atomic<int> peer{-1};               ///< the rank it concerns, or -1
  int rank = -1;                           ///< the endpoint's own rank (for the report)
};

/// Marks `slot` as inside the provider call `call` (concerning `peer`) for
/// the guard's lifetime; a null slot marks nothing.
class provider_call {
 public:
  provider_call(provider_call_slot* slot, const char* call, int peer) noexcept : slot_(slot) {
    if (!slot_) return;
    slot_->call.store(call, std::memory_order_relaxed);
    slot_->peer.store(peer, std::memory_order_relaxed);
    slot_->depth.fetch_add(1, std::memory_order_relaxed);
    slot_->activity.fetch_add(1, std::memory_order_relaxed);
  }
  ~provider_call() {
    if (!slot_) return;
    slot_->activity.fetch_add(1, std::memory_order_relaxed);
    slot_->depth.fetch_sub(1, std::memory_order_relaxed);
  }
  provider_call(const provider_call&) = delete;
  provider_call& operator=(const provider_call&) = delete;

 private:
  provider_call_slot* slot_;
};

/// The process's watchdog over the registered slots: a thread that runs
/// while at least one slot is registered and aborts the process when a slot
/// stays inside one provider call (same activity count) for `limit`.
class provider_watchdog {
 public:
  /// The process's instance. A child forked from a process that has one
  /// starts with none running and nothing watched (the parent's thread and
  /// endpoints are not the child's).
  static provider_watchdog& instance() {
    static provider_watchdog watchdog;
    static const int hooked = ::pthread_atfork(nullptr, nullptr, [] { watchdog.forget_after_fork(); });
    (void)hooked;
    return watchdog;
  }

  /// How long a provider call may take: PDCOLL_PROVIDER_STUCK_MS, default 5 s
  /// (0 turns the watchdog off).
  static std::chrono::milliseconds limit_from_environment() noexcept {
    return std::chrono::milliseconds(pdcoll::detail::env_number("PDCOLL_PROVIDER_STUCK_MS", 0).value_or(5000));
  }

  /// Starts watching `slot` (and the thread, with the first slot).
  void watch(provider_call_slot* slot, std::chrono::milliseconds limit) {
    std::lock_guard lock(mutex_);
    watched_.push_back({slot, slot->activity.load(std::memory_order_relaxed), clock::now(), limit});
    if (!thread_.joinable()) {
      stopping_ = false;
      thread_ = std::thread([this] { run(); });
    }
  }

  /// Stops watching `slot`; the last one stops the thread (joined here).
  void unwatch(provider_call_slot* slot) {
    std::thread ending;
    {
      std::lock_guard lock(mutex_);
      std::erase_if(watched_, [slot](const entry& e) { return e.slot == slot; });
      if (!watched_.empty() || !thread_.joinable()) return;
      stopping_ = true;
      ending = std::move(thread_);
    }
    wake_.notify_all();
    ending.join();
  }

  provider_watchdog() = default;
  provider_watchdog(const provider_watchdog&) = delete;
  provider_watchdog& operator=(const provider_watchdog&) = delete;
  ~provider_watchdog() {
    std::thread ending;
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      ending = std::move(thread_);
    }
    wake_.notify_all();
    if (ending.joinable()) ending.join();
  }

  /// How often the slots are looked at.
  static constexpr std::chrono::milliseconds period{100};
  /// The exit status of a process the watchdog ends (EX_SOFTWARE).
  static constexpr int exit_status = 70;

 private:
  using clock = std::chrono::steady_clock;
  struct entry {
    provider_call_slot* slot;
    std::uint64_t activity;   // as last seen
    clock::time_point since;  // when it was last seen to change (or the slot to be outside)
    std::chrono::milliseconds limit;
  };

  // In a forked child: the mutex may have been held by the parent's watchdog
  // thread, which the child does not have, so the synchronisation objects
  // are made afresh and the thread handle forgotten.
  void forget_after_fork() noexcept {
    new (&mutex_) std::mutex();
    new (&wake_) std::condition_variable();
    new (&thread_) std::thread();
    watched_.clear();
    stopping_ = false;
  }

  void run() {
    std::unique_lock lock(mutex_);
    while (!wake_.wait_for(lock, period, [this] { return stopping_; })) {
      const auto now = clock::now();
      for (auto& e : watched_) {
        const auto activity = e.slot->activity.load(std::memory_order_relaxed);
        if (activity != e.activity || e.slot->depth.load(std::memory_order_relaxed) == 0) {
          e.activity = activity;
          e.since = now;
        } else if (now - e.since >= e.limit) {
          give_up(*e.slot, now - e.since);
        }
      }
    }
  }

  [[noreturn]] static void give_up(const provider_call_slot& slot, clock::duration stuck) noexcept {
    const double seconds = std::chrono::duration<double>(stuck).count();
    std::fprintf(stderr,
                 "pdcoll: rank %d has been inside libfabric's %s (peer %d) for %.1f s and cannot come back: "
                 "a peer that died inside the shm provider leaves its lock held for good; ending this process "
                 "(exit status %d; PDCOLL_PROVIDER_STUCK_MS)\n",
                 slot.rank, slot.call.load(std::memory_order_relaxed), slot.peer.load(std::memory_order_relaxed),
                 seconds, exit_status);
    std::fflush(stderr);
    std::_Exit(exit_status);
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<entry> watched_;
  std::thread thread_;
  bool stopping_ = false;
};

}  // namespace pdcoll::transport::libfabric::detail
