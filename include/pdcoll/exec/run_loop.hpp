// File: exec/run_loop.hpp — run_loop (an execution context driven by the
// thread that calls run()) and the process-wide progress-driver registry that
// lets that thread drive network progress while it has nothing else to run.
//
// How progress reaches a single-threaded `sync_wait(all_reduce(...))`:
// a communicator with pending operations and no progress thread registers a
// `progress_driver`. Whenever a run_loop finds its queue empty it calls
// `drive(until)` on every registered driver instead of sleeping; the driver
// polls its completion queue (fi_cq_read, io_uring_peek_cqe), blocking on its
// wait object at most until `until`, and completes operations on the calling
// thread. Work pushed to the loop from another thread is picked up as soon as
// the drivers return (at most one horizon, 1 ms by default, later; a
// communicator that is the only driver returns when one of its operations
// ends, not after every completion).
// Code that waits without a run_loop calls `drive_progress_once(until)`.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "pdcoll/exec/vocabulary.hpp"

namespace pdcoll::exec {

/// Something that completes operations when polled: a transport's completion
/// queue, typically registered by a communicator while it has pending
/// operations and no progress thread of its own.
///
/// `drive(until)` makes progress and returns true if it completed or advanced
/// any work. It may block on its own wait object, but must return by `until`
/// (about; the caller is waiting for other work too). It runs on whatever
/// thread is idle in a run_loop or in drive_progress_once(), never on two
/// threads at once (but nested on one: see drive_once), and may register or
/// unregister drivers (itself included).
struct progress_driver {
  virtual bool drive(std::chrono::steady_clock::time_point until) noexcept = 0;

 protected:
  ~progress_driver() = default;
};

/// The process-wide registry of progress drivers. Thread-safe. Polling it
/// never allocates; registering may (the list grows).
class progress_drivers {
 public:
  /// Makes room for one more driver, so that registering it never
  /// allocates (for a driver that registers where it cannot throw, such as
  /// a communicator as an operation starts). Pair with release_slot().
  /// Throws std::bad_alloc.
  static void reserve_slot() {
    registry& r = instance();
    std::lock_guard lock(r.mutex);
    r.drivers.reserve(r.reserved + 1);
    ++r.reserved;
  }
  /// Gives back a reserve_slot() (the room stays, for the next one).
  static void release_slot() noexcept {
    registry& r = instance();
    std::lock_guard lock(r.mutex);
    --r.reserved;
  }
  /// A reserve_slot() held for an object's lifetime (a member of the driver).
  class slot {
   public:
    slot() { reserve_slot(); }
    ~slot() { release_slot(); }
    slot(const slot&) = delete;
    slot& operator=(const slot&) = delete;
  };

  /// Adds `driver` (ignored if already registered). Allocates nothing while
  /// no more drivers are registered than slots reserved; otherwise throws
  /// std::bad_alloc when memory runs out.
  static void register_driver(progress_driver* driver) {
    registry& r = instance();
    std::lock_guard lock(r.mutex);
    if (std::find(r.drivers.begin(), r.drivers.end(), driver) != r.drivers.end()) return;
    r.drivers.push_back(driver);
    r.count.store(r.drivers.size(), std::memory_order_release);
  }

  /// Removes `driver` without waiting for calls of it in flight on other
  /// threads (they may still be inside its drive(), or running the
  /// completions it delivered). For a driver that leaves while it stays
  /// alive, from inside its own drive() or under its own lock: waiting there
  /// for a thread whose completion needs that lock would never end.
  static void leave(progress_driver* driver) noexcept {
    registry& r = instance();
    std::lock_guard lock(r.mutex);
    r.drivers.erase(std::remove(r.drivers.begin(), r.drivers.end(), driver), r.drivers.end());
    r.count.store(r.drivers.size(), std::memory_order_release);
  }

  /// Removes `driver`. On return no thread will call it again and no other
  /// thread is inside its drive(), so the caller may destroy it. Called from
  /// inside a drive() on this thread (its own or another driver's), it does not
  /// wait for that call.
  static void unregister_driver(progress_driver* driver) noexcept {
    registry& r = instance();
    std::unique_lock lock(r.mutex);
    r.drivers.erase(std::remove(r.drivers.begin(), r.drivers.end(), driver), r.drivers.end());
    r.count.store(r.drivers.size(), std::memory_order_release);
    const auto me = std::this_thread::get_id();
    auto running_elsewhere = [&] {
      for (const call_record* c = r.calls; c != nullptr; c = c->next) {
        if (c->driver == driver && c->thread != me) return true;
      }
      return false;
    };
    while (running_elsewhere()) {
      ++r.waiters;
      r.call_finished.wait(lock);
      --r.waiters;
    }
  }

  /// How many drivers are registered (a relaxed snapshot).
  static std::size_t size() noexcept { return instance().count.load(std::memory_order_acquire); }

  /// Calls drive(until) on every registered driver that another thread is
  /// not already driving. Returns true if any did work. Cost: one mutex
  /// round trip per driver.
  ///
  /// A driver further up this thread's stack is driven again: a completion
  /// it delivered may wait (sync_wait) for another of its operations, which
  /// only it can complete; skipping it hung that wait past every deadline.
  /// A driver must therefore allow nested drive() calls on its own thread
  /// (a communicator runs completions outside its lock and nests turns).
  static bool drive_once(std::chrono::steady_clock::time_point until) noexcept {
    registry& r = instance();
    if (r.count.load(std::memory_order_acquire) == 0) return false;
    bool did_work = false;
    std::unique_lock lock(r.mutex);
    // Index-based: the list may change while a driver runs unlocked, and a
    // driver may leave it from inside drive() (an idle communicator
    // unregisters itself), or leave and join again at the end. Each round
    // calls at most as many drivers as were registered when it began, so
    // drivers that hand over to one another cannot keep it going.
    std::size_t calls_left = r.drivers.size();
    for (std::size_t i = 0; i < r.drivers.size() && calls_left != 0;) {
      progress_driver* driver = r.drivers[i];
      const auto me = std::this_thread::get_id();
      bool busy = false;
      for (const call_record* c = r.calls; c != nullptr; c = c->next) busy |= (c->driver == driver && c->thread != me);
      if (busy) {
        ++i;
        continue;
      }
      --calls_left;
      call_record record{driver, std::this_thread::get_id(), r.calls, nullptr};
      if (r.calls != nullptr) r.calls->prev = &record;
      r.calls = &record;
      lock.unlock();
      did_work |= driver->drive(until);
      lock.lock();
      if (record.prev != nullptr) record.prev->next = record.next;
      else r.calls = record.next;
      if (record.next != nullptr) record.next->prev = record.prev;
      if (r.waiters != 0) r.call_finished.notify_all();
      // Step past the driver only where it still is. Where it left, the one
      // after it has moved into its slot: skipping that one made the round's
      // caller sleep with its work undone (about 1 ms per collective for a
      // runtime alternating two communicators).
      if (i < r.drivers.size() && r.drivers[i] == driver) ++i;
    }
    return did_work;
  }

 private:
  // One per drive() in flight, on the stack of the thread making the call.
  struct call_record {
    progress_driver* driver;
    std::thread::id thread;
    call_record* next;
    call_record* prev;
  };
  struct registry {
    std::mutex mutex;
    std::condition_variable call_finished;
    std::vector<progress_driver*> drivers;
    call_record* calls = nullptr;
    std::size_t waiters = 0;
    std::size_t reserved = 0;  // reserve_slot() calls outstanding
    std::atomic<std::size_t> count{0};
  };
  // Never destroyed: communicators with static storage duration unregister
  // from their destructors, which may run after a function-local static
  // registry would have been destroyed.
  static registry& instance() noexcept {
    static registry* r = new registry;
    return *r;
  }
};

/// Polls every registered progress driver once, each for at most until
/// `until`. For code that waits for a completion without a run_loop. Returns
/// true if any driver did work; false at once when none is registered.
inline bool drive_progress_once(std::chrono::steady_clock::time_point until) noexcept {
  return progress_drivers::drive_once(until);
}

class run_loop;

namespace detail {

/// A unit of work queued on a run_loop (intrusive: the operation state is the
/// queue node, so scheduling never allocates).
struct run_loop_task {
  run_loop_task* next = nullptr;
  void (*execute)(run_loop_task*) noexcept = nullptr;
};

template <class Receiver>
struct schedule_operation : run_loop_task {
  using operation_state_concept = operation_state_t;
  schedule_operation(run_loop* loop, Receiver rcvr) : loop_(loop), rcvr_(std::move(rcvr)) {
    this->execute = &execute_impl;
  }
  schedule_operation(schedule_operation&&) = delete;
  void start() noexcept;

 private:
  static void execute_impl(run_loop_task* task) noexcept {
    auto* self = static_cast<schedule_operation*>(task);
    if (get_stop_token(exec::get_env(self->rcvr_)).stop_requested()) {
      exec::set_stopped(std::move(self->rcvr_));
    } else {
      exec::set_value(std::move(self->rcvr_));
    }
  }
  run_loop* loop_;
  Receiver rcvr_;
};

}  // namespace detail

/// An execution context run by whichever thread calls run(): schedule()
/// queues work, run() executes it in FIFO order until finish() is called and
/// the queue is empty. While the queue is empty and progress drivers are
/// registered, run() drives them instead of sleeping (see the file comment).
///
/// Performance: schedule/start is one mutex round trip and never allocates.
/// With drivers registered, an idle run() calls them round after round; a
/// round in which no driver did work and that ended before the horizon is
/// followed by a sleep until the horizon (woken at once by pushed work). So a
/// driver should wait on its wait object (or poll) until `until` rather than
/// return early. With no drivers, run() sleeps on a condition variable,
/// re-checking for newly registered drivers every 10 ms.
class run_loop {
 public:
  /// The sender of `schedule()`: completes with set_value() on the loop's
  /// thread, or set_stopped() if the receiver's stop token was triggered
  /// by the time the task runs.
  struct schedule_sender {
    using sender_concept = sender_t;
    using completion_signatures =
        ::pdcoll::exec::completion_signatures<set_value_t(), set_stopped_t()>;
    template <class Self, class... Env>
    static consteval auto get_completion_signatures() {
      return completion_signatures{};
    }
    run_loop* loop;
    template <receiver_of<completion_signatures> Receiver>
    detail::schedule_operation<Receiver> connect(Receiver rcvr) const
        noexcept(std::is_nothrow_move_constructible_v<Receiver>) {
      return {loop, std::move(rcvr)};
    }
  };

  /// A copyable handle to the loop; equal when it refers to the same loop.
  class scheduler {
   public:
    explicit scheduler(run_loop* loop) noexcept : loop_(loop) {}
    /// A sender that completes on the loop's thread.
    schedule_sender schedule() const noexcept { return schedule_sender{loop_}; }
    friend bool operator==(const scheduler&, const scheduler&) noexcept = default;

   private:
    run_loop* loop_;
  };

  /// How long run() lets the progress drivers block per idle round.
  explicit run_loop(std::chrono::microseconds progress_horizon = std::chrono::milliseconds(1)) noexcept
      : horizon_(progress_horizon) {}
  run_loop(const run_loop&) = delete;
  run_loop& operator=(const run_loop&) = delete;

  /// A scheduler for this loop.
  scheduler get_scheduler() noexcept { return scheduler{this}; }

  /// Runs queued tasks on the calling thread until finish() has been called
  /// and the queue is empty.
  void run() noexcept {
    while (detail::run_loop_task* task = pop_front()) task->execute(task);
  }

  /// Makes run() return once the queue is empty. Thread-safe.
  void finish() noexcept {
    std::lock_guard lock(mutex_);
    finishing_ = true;
    // Notify under the lock: the waiting thread may destroy the loop as soon
    // as it can observe finishing_.
    if (wake_) wake_->notify_all();
  }

  /// Queues a task (used by schedule operations). Thread-safe.
  void push_back(detail::run_loop_task* task) noexcept {
    std::lock_guard lock(mutex_);
    task->next = nullptr;
    if (tail_ != nullptr) tail_->next = task;
    else head_ = task;
    tail_ = task;
    ever_queued_.store(true, std::memory_order_release);
    if (wake_) wake_->notify_one();
  }

  /// True once any task has been queued. Lets a caller that completed its
  /// work without entering run() (sync_wait's inline path) skip the lock
  /// when nothing waits on the loop: one load.
  bool ever_queued() const noexcept { return ever_queued_.load(std::memory_order_acquire); }

 private:
  detail::run_loop_task* pop_front() noexcept {
    std::unique_lock lock(mutex_);
    for (;;) {
      if (head_ != nullptr) {
        detail::run_loop_task* task = head_;
        head_ = task->next;
        if (head_ == nullptr) tail_ = nullptr;
        return task;
      }
      if (finishing_) return nullptr;
      if (progress_drivers::size() != 0) {
        const auto until = std::chrono::steady_clock::now() + horizon_;
        lock.unlock();
        const bool did_work = drive_progress_once(until);
        lock.lock();
        // Drivers that returned early without work (or were busy on another
        // thread): sleep until the horizon rather than spin.
        if (!did_work && head_ == nullptr && !finishing_) condition().wait_until(lock, until);
      } else {
        condition().wait_for(lock, std::chrono::milliseconds(10));
      }
    }
  }

  // The condition variable, made by the first wait (under the lock, as
  // every notify looks at it): a sync_wait whose operation completes inside
  // start() never waits, and making and destroying one was about 30
  // instructions of an 8-byte all-reduce's 900 on node memory.
  std::condition_variable& condition() {
    if (!wake_) wake_.emplace();
    return *wake_;
  }

  std::mutex mutex_;
  std::optional<std::condition_variable> wake_;  // nobody waits while empty: notifies skip it
  detail::run_loop_task* head_ = nullptr;
  detail::run_loop_task* tail_ = nullptr;
  bool finishing_ = false;
  std::atomic<bool> ever_queued_{false};
  std::chrono::microseconds horizon_;
};

template <class Receiver>
void detail::schedule_operation<Receiver>::start() noexcept {
  loop_->push_back(this);
}

}  // namespace pdcoll::exec
