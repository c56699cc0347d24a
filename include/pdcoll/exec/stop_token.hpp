// File: exec/stop_token.hpp — inplace_stop_source / inplace_stop_token /
// inplace_stop_callback: allocation-free cancellation ([stopsource.inplace],
// C++26 [thread.stoptoken]).
//
// The source owns an intrusive list of callbacks guarded by a one-byte spin
// lock; registering, deregistering and requesting stop never allocate. The
// semantics follow the standard:
//  - a callback registered after stop was requested runs at once, in its
//    constructor, on the registering thread;
//  - request_stop() runs every registered callback on the requesting thread,
//    exactly once, and only the first request does so;
//  - destroying a callback that another thread is running blocks until that
//    run returns; destroying it from inside its own run (same thread) returns
//    at once, so a callback may deregister itself.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <utility>

#include "pdcoll/detail/cpu_relax.hpp"
#include "pdcoll/exec/vocabulary.hpp"

namespace pdcoll::exec {

class inplace_stop_source;
class inplace_stop_token;
template <class Callback>
class inplace_stop_callback;

namespace detail {

/// Spins briefly, then yields: the critical sections it waits for are a few
/// pointer updates (or one callback run), so sleeping would cost more.
inline void spin_pause(unsigned& spins) noexcept {
  if (++spins < 64) {
    pdcoll::detail::cpu_relax();
  } else {
    std::this_thread::yield();
  }
}

/// The type-erased part of inplace_stop_callback that the source links into
/// its list.
class inplace_stop_callback_base {
 public:
  inplace_stop_callback_base(const inplace_stop_callback_base&) = delete;
  inplace_stop_callback_base& operator=(const inplace_stop_callback_base&) = delete;

 protected:
  using execute_fn = void(inplace_stop_callback_base*) noexcept;
  inplace_stop_callback_base(const inplace_stop_source* source, execute_fn* execute) noexcept
      : source_(source), execute_(execute) {}
  ~inplace_stop_callback_base() = default;

  /// Links into the source's list, or runs at once if stop was already requested.
  void register_callback() noexcept;

 private:
  friend class pdcoll::exec::inplace_stop_source;

  const inplace_stop_source* source_;
  execute_fn* execute_;
  inplace_stop_callback_base* next_ = nullptr;
  inplace_stop_callback_base** prev_ptr_ = nullptr;
  // Points at a flag on request_stop()'s stack while this callback runs, so a
  // callback that destroys itself can tell request_stop() not to touch it again.
  bool* removed_during_callback_ = nullptr;
  std::atomic<bool> callback_completed_{false};

 protected:
  void deregister_callback() noexcept;
};

}  // namespace detail

/// A stop source that lives in place (no shared state, no allocation): the
/// operation that owns it must outlive every token and callback taken from it.
/// Not copyable or movable. Cost: request_stop() is O(callbacks); the rest O(1).
class inplace_stop_source {
 public:
  inplace_stop_source() noexcept = default;
  inplace_stop_source(const inplace_stop_source&) = delete;
  inplace_stop_source& operator=(const inplace_stop_source&) = delete;
  ~inplace_stop_source() = default;

  /// A token observing this source.
  inplace_stop_token get_token() const noexcept;

  /// Always true: an inplace source always has a stop state.
  static constexpr bool stop_possible() noexcept { return true; }

  /// Whether stop has been requested (acquire: what the requester wrote before
  /// requesting is visible).
  bool stop_requested() const noexcept {
    return (state_.load(std::memory_order_acquire) & stop_requested_flag) != 0;
  }

  /// Requests stop and runs the registered callbacks on this thread. Returns
  /// true for the request that made the change, false if stop was already
  /// requested (callbacks then have run or are running elsewhere).
  bool request_stop() noexcept {
    if (!try_lock_unless_stop_requested(true)) return false;
    notifying_thread_ = std::this_thread::get_id();
    while (callbacks_ != nullptr) {
      detail::inplace_stop_callback_base* cb = callbacks_;
      cb->prev_ptr_ = nullptr;  // marks "taken for execution" for deregister
      callbacks_ = cb->next_;
      if (callbacks_ != nullptr) callbacks_->prev_ptr_ = &callbacks_;
      unlock(stop_requested_flag);

      bool removed = false;
      cb->removed_during_callback_ = &removed;
      cb->execute_(cb);
      if (!removed) {
        cb->removed_during_callback_ = nullptr;
        cb->callback_completed_.store(true, std::memory_order_release);
      }
      lock();
    }
    unlock(stop_requested_flag);
    return true;
  }

 private:
  friend class detail::inplace_stop_callback_base;
  static constexpr std::uint8_t stop_requested_flag = 1;
  static constexpr std::uint8_t locked_flag = 2;

  std::uint8_t lock() const noexcept {
    unsigned spins = 0;
    std::uint8_t old = state_.load(std::memory_order_relaxed);
    for (;;) {
      while ((old & locked_flag) != 0) {
        detail::spin_pause(spins);
        old = state_.load(std::memory_order_relaxed);
      }
      if (state_.compare_exchange_weak(old, old | locked_flag, std::memory_order_acquire,
                                       std::memory_order_relaxed)) {
        return old;
      }
    }
  }
  void unlock(std::uint8_t old_state) const noexcept {
    state_.store(old_state, std::memory_order_release);
  }
  bool try_lock_unless_stop_requested(bool set_stop_requested) const noexcept {
    unsigned spins = 0;
    std::uint8_t old = state_.load(std::memory_order_relaxed);
    for (;;) {
      if ((old & stop_requested_flag) != 0) return false;
      if (old != 0) {
        detail::spin_pause(spins);
        old = state_.load(std::memory_order_relaxed);
        continue;
      }
      const std::uint8_t next =
          set_stop_requested ? (locked_flag | stop_requested_flag) : locked_flag;
      if (state_.compare_exchange_weak(old, next, std::memory_order_acq_rel,
                                       std::memory_order_relaxed)) {
        return true;
      }
    }
  }
  bool try_add_callback(detail::inplace_stop_callback_base* cb) const noexcept {
    if (!try_lock_unless_stop_requested(false)) return false;
    cb->next_ = callbacks_;
    cb->prev_ptr_ = &callbacks_;
    if (callbacks_ != nullptr) callbacks_->prev_ptr_ = &cb->next_;
    callbacks_ = cb;
    unlock(0);
    return true;
  }
  void remove_callback(detail::inplace_stop_callback_base* cb) const noexcept {
    const std::uint8_t old = lock();
    if (cb->prev_ptr_ != nullptr) {
      // Still queued: unlink; it will never run.
      *cb->prev_ptr_ = cb->next_;
      if (cb->next_ != nullptr) cb->next_->prev_ptr_ = cb->prev_ptr_;
      unlock(old);
      return;
    }
    // Taken by request_stop(): it is running or has run.
    const std::thread::id notifier = notifying_thread_;
    unlock(old);
    if (notifier == std::this_thread::get_id()) {
      // Deregistering from inside its own run (or after it, on the same
      // thread): tell request_stop() not to touch *cb after execute returns.
      if (cb->removed_during_callback_ != nullptr) *cb->removed_during_callback_ = true;
    } else {
      unsigned spins = 0;
      while (!cb->callback_completed_.load(std::memory_order_acquire)) detail::spin_pause(spins);
    }
  }

  mutable std::atomic<std::uint8_t> state_{0};
  mutable detail::inplace_stop_callback_base* callbacks_ = nullptr;
  std::thread::id notifying_thread_{};
};

/// A cheap handle (one pointer) observing an inplace_stop_source. A
/// default-constructed token has no source: stop_possible() is false.
class inplace_stop_token {
 public:
  /// The callback type registered against this token (C++26 stop_callback_for_t).
  template <class Callback>
  using callback_type = inplace_stop_callback<Callback>;  ///< the stop callback type for this token

  inplace_stop_token() noexcept = default;
  /// Whether stop was requested on the source.
  bool stop_requested() const noexcept { return source_ != nullptr && source_->stop_requested(); }
  /// Whether a stop request can ever be observed through this token.
  bool stop_possible() const noexcept { return source_ != nullptr; }
  /// Exchanges the sources two tokens observe.
  void swap(inplace_stop_token& other) noexcept { std::swap(source_, other.source_); }
  /// Equal when both observe the same source (or none).
  friend bool operator==(const inplace_stop_token&, const inplace_stop_token&) noexcept = default;

 private:
  friend class inplace_stop_source;
  template <class>
  friend class inplace_stop_callback;
  explicit inplace_stop_token(const inplace_stop_source* source) noexcept : source_(source) {}
  const inplace_stop_source* source_ = nullptr;
};

inline inplace_stop_token inplace_stop_source::get_token() const noexcept {
  return inplace_stop_token{this};
}

/// Runs `Callback` once when stop is requested on the token's source, for as
/// long as this object lives. Constructing it after stop was requested runs
/// the callback in the constructor. The destructor deregisters; if another
/// thread is running the callback at that moment it waits for the run to
/// return. Not copyable or movable (the source links to it). No allocation.
///
///     inplace_stop_callback cb{token, [&] { fi_cancel(&ep, &ctx); }};
template <class Callback>
class inplace_stop_callback : private detail::inplace_stop_callback_base {
 public:
  using callback_type = Callback;  ///< the callback type (the standard's stoppable-token protocol)

  template <class Init>
    requires std::is_constructible_v<Callback, Init>
  explicit inplace_stop_callback(inplace_stop_token token, Init&& init) noexcept(
      std::is_nothrow_constructible_v<Callback, Init>)
      : detail::inplace_stop_callback_base(token.source_, &execute_impl),
        callback_(std::forward<Init>(init)) {
    register_callback();
  }
  inplace_stop_callback(inplace_stop_callback&&) = delete;
  ~inplace_stop_callback() { deregister_callback(); }

 private:
  static void execute_impl(detail::inplace_stop_callback_base* base) noexcept {
    // As in the standard, an exception escaping a stop callback ends in
    // std::terminate (this function is noexcept): make callbacks noexcept.
    std::move(static_cast<inplace_stop_callback*>(base)->callback_)();
  }
  Callback callback_;
};

template <class Callback>
inplace_stop_callback(inplace_stop_token, Callback) -> inplace_stop_callback<Callback>;

namespace detail {
inline void inplace_stop_callback_base::register_callback() noexcept {
  if (source_ == nullptr) return;
  if (!source_->try_add_callback(this)) {
    source_ = nullptr;  // ran inline: nothing to deregister
    execute_(this);
  }
}
inline void inplace_stop_callback_base::deregister_callback() noexcept {
  if (source_ != nullptr) source_->remove_callback(this);
}

/// The callback type to register on a token of type Token (C++26 stop_callback_for_t).
template <class Token, class Callback>
using stop_callback_for_t = typename Token::template callback_type<Callback>;

/// Whether stop can never be requested through tokens of this type.
template <class Token>
inline constexpr bool unstoppable_token = std::is_same_v<Token, never_stop_token>;
}  // namespace detail

}  // namespace pdcoll::exec
