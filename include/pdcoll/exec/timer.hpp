// File: exec/timer.hpp — the process-wide timer thread behind with_deadline.
//
// One thread per process, started on first use and joined at exit (by the
// destructor of a function-local static); never detached. Timers are
// intrusive entries in the waiting operation states, so arming and cancelling
// never allocate.
//
// Performance: entries sit in a list sorted by deadline; insertion walks from
// the latest deadline backwards, which is O(1) for the usual case (deadlines
// of equal duration armed in order) and O(pending timers) at worst.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace pdcoll::exec::detail {

/// A timer armed on timer_service: `fire(this)` runs on the timer thread at
/// (or soon after) `deadline`, unless cancelled first.
struct timer_entry {
  std::chrono::steady_clock::time_point deadline{};
  void (*fire)(timer_entry*) noexcept = nullptr;
  void* context = nullptr;
  timer_entry* next = nullptr;
  timer_entry* prev = nullptr;
  bool queued = false;
};

/// The process's timer thread.
class timer_service {
 public:
  /// The one instance; starts the thread on first use. Throws
  /// std::system_error if the thread cannot be created (the next call retries).
  static timer_service& instance() {
    static timer_service service;
    return service;
  }

  timer_service(const timer_service&) = delete;
  timer_service& operator=(const timer_service&) = delete;

  ~timer_service() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      wake_.notify_all();
    }
    thread_.join();
  }

  /// Arms `entry` (its deadline and fire must be set). O(1) typically.
  void schedule(timer_entry* entry) noexcept {
    std::lock_guard lock(mutex_);
    timer_entry* after = tail_;
    while (after != nullptr && after->deadline > entry->deadline) after = after->prev;
    entry->prev = after;
    entry->next = (after != nullptr) ? after->next : head_;
    if (entry->next != nullptr) entry->next->prev = entry;
    else tail_ = entry;
    if (after != nullptr) after->next = entry;
    else head_ = entry;
    entry->queued = true;
    // Only a new earliest deadline changes how long the thread should sleep.
    if (head_ == entry) wake_.notify_one();
  }

  /// Disarms `entry`. True if it was still waiting (it will never fire);
  /// false if it has fired or is firing now (its fire() runs to the end).
  bool cancel(timer_entry* entry) noexcept {
    std::lock_guard lock(mutex_);
    if (!entry->queued) return false;
    unlink(entry);
    return true;
  }

 private:
  timer_service() : thread_([this] { run(); }) {}

  void unlink(timer_entry* entry) noexcept {
    if (entry->prev != nullptr) entry->prev->next = entry->next;
    else head_ = entry->next;
    if (entry->next != nullptr) entry->next->prev = entry->prev;
    else tail_ = entry->prev;
    entry->next = entry->prev = nullptr;
    entry->queued = false;
  }

  void run() noexcept {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      if (head_ == nullptr) {
        wake_.wait(lock);
      } else if (head_->deadline > std::chrono::steady_clock::now()) {
        // Copy: wait_until reads its argument after waking, when the entry may
        // have been cancelled and destroyed.
        const auto next_deadline = head_->deadline;
        wake_.wait_until(lock, next_deadline);
      } else {
        timer_entry* due = head_;
        unlink(due);
        // Fire unlocked: fire() may complete operations that arm or cancel
        // other timers. After fire() returns the entry may be gone.
        lock.unlock();
        due->fire(due);
        lock.lock();
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  timer_entry* head_ = nullptr;
  timer_entry* tail_ = nullptr;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace pdcoll::exec::detail
