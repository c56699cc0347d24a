// File: exec/with_deadline.hpp — with_deadline(sender, duration): request stop
// of a sender when a duration has passed, and report that as errc::timeout.
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>

#include "pdcoll/detail/deadline.hpp"
#include "pdcoll/error.hpp"
#include "pdcoll/exec/env.hpp"
#include "pdcoll/exec/pipe.hpp"
#include "pdcoll/exec/signatures.hpp"
#include "pdcoll/exec/stop_token.hpp"
#include "pdcoll/exec/timer.hpp"
#include "pdcoll/exec/vocabulary.hpp"

namespace pdcoll::exec {
namespace detail {

// A child completion as it is stored until with_deadline completes:
// the channel tag followed by the decayed arguments.
template <class Sig>
struct stored_completion;
template <class Tag, class... As>
struct stored_completion<Tag(As...)> {
  using type = std::tuple<Tag, std::decay_t<As>...>;
};
template <class Sig>
struct decayed_signature;
template <class Tag, class... As>
struct decayed_signature<Tag(As...)> {
  using type = completion_signatures<Tag(std::decay_t<As>...)>;
};

template <class ChildSigs>
struct deadline_signatures;
template <class... Sigs>
struct deadline_signatures<completion_signatures<Sigs...>> {
  static constexpr bool nothrow = nothrow_decay_copyable_results<completion_signatures<Sigs...>>;
  using type = concat_signatures_t<typename decayed_signature<Sigs>::type...,
                                   completion_signatures<set_error_t(std::error_code)>,
                                   exception_signature_if<!nothrow>>;
  // Only the child's completions, and an exception slot where storing one
  // may throw: a stopped slot the child never uses would make complete()
  // call set_stopped on a receiver that need not accept it.
  using exception_slot = std::conditional_t<nothrow, type_list<>, type_list<std::tuple<set_error_t, std::exception_ptr>>>;
  using storage = storage_variant_t<unique_list_t<
      typename join_type_lists<type_list<typename stored_completion<Sigs>::type...>, exception_slot>::type>>;
};

template <class CvChild, class Receiver>
struct deadline_operation {
  using operation_state_concept = operation_state_t;
  using outer_env = env_of_t<Receiver>;
  using child_env = stop_token_env<outer_env>;
  using signatures = deadline_signatures<completion_signatures_of_t<CvChild, child_env>>;
  using outer_token = stop_token_of_t<outer_env>;

  struct child_receiver {
    using receiver_concept = receiver_t;
    deadline_operation* op;
    template <class... As>
    void set_value(As&&... as) noexcept {
      op->child_completed(set_value_t{}, std::forward<As>(as)...);
    }
    template <class E>
    void set_error(E&& e) noexcept {
      op->child_completed(set_error_t{}, std::forward<E>(e));
    }
    void set_stopped() noexcept { op->child_completed(set_stopped_t{}); }
    child_env get_env() const noexcept {
      return child_env{op->source_.get_token(), exec::get_env(op->rcvr_)};
    }
  };

  deadline_operation(CvChild&& child, Receiver rcvr, std::chrono::steady_clock::duration timeout)
      : rcvr_(std::move(rcvr)),
        timeout_(timeout),
        timers_(&timer_service::instance()),
        child_op_(exec::connect(std::forward<CvChild>(child), child_receiver{this})) {}
  deadline_operation(deadline_operation&&) = delete;

  void start() noexcept {
    // Slots: the child, the timer, the stop forwarder (see stop_forwarder).
    pending_.store(3, std::memory_order_relaxed);
    timer_.fire = &on_deadline;
    timer_.context = this;
    const auto now = std::chrono::steady_clock::now();
    // Saturated: a timeout past the clock's end (duration::max(), "no
    // deadline") never fires instead of wrapping round to the past.
    timer_.deadline = pdcoll::detail::deadline_after(now, timeout_);
    forwarder_.arm(get_stop_token(exec::get_env(rcvr_)), &source_, &release_slot, this);
    timers_->schedule(&timer_);
    exec::start(child_op_);
  }

  template <class Tag, class... As>
  void child_completed(Tag, As&&... as) noexcept {
    if constexpr (signatures::nothrow) {
      result_.template emplace<std::tuple<Tag, std::decay_t<As>...>>(Tag{}, std::forward<As>(as)...);
    } else {
      try {
        result_.template emplace<std::tuple<Tag, std::decay_t<As>...>>(Tag{}, std::forward<As>(as)...);
      } catch (...) {
        result_.template emplace<std::tuple<set_error_t, std::exception_ptr>>(set_error_t{},
                                                                              std::current_exception());
      }
    }
    if (timers_->cancel(&timer_)) arrive();
    if (forwarder_.disarm()) arrive();
    arrive();
  }

 private:
  static void on_deadline(timer_entry* entry) noexcept {
    auto* self = static_cast<deadline_operation*>(entry->context);
    // A timeout only when the deadline's request is the one that stops the
    // child: a receiver's stop forwarded first stays a stop, however long
    // the child takes to honour it.
    if (self->source_.request_stop()) self->deadline_hit_.store(true, std::memory_order_relaxed);
    self->arrive();
  }
  static void release_slot(void* self) noexcept { static_cast<deadline_operation*>(self)->arrive(); }

  void arrive() noexcept {
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) complete();
  }

  void complete() noexcept {
    forwarder_.reset();
    std::visit(
        [this](auto& stored) {
          using stored_type = std::decay_t<decltype(stored)>;
          if constexpr (!std::is_same_v<stored_type, std::monostate>) {
            using tag = std::tuple_element_t<0, stored_type>;
            if constexpr (std::is_same_v<tag, set_stopped_t>) {
              if (deadline_hit_.load(std::memory_order_relaxed)) {
                exec::set_error(std::move(rcvr_), std::error_code{pdcoll::errc::timeout});
                return;
              }
            }
            std::apply([this](auto, auto&... args) { tag{}(std::move(rcvr_), std::move(args)...); },
                       stored);
          }
        },
        result_);
  }

  Receiver rcvr_;
  std::chrono::steady_clock::duration timeout_;
  timer_service* timers_;
  inplace_stop_source source_;
  timer_entry timer_;
  std::atomic<bool> deadline_hit_{false};
  std::atomic<int> pending_{0};
  stop_forwarder<outer_token> forwarder_;
  typename signatures::storage result_;
  connect_result_t<CvChild, child_receiver> child_op_;
};

template <class Child>
struct deadline_sender {
  using sender_concept = sender_t;
  template <class Env>
  using signatures_in =
      typename deadline_signatures<completion_signatures_of_t<Child, stop_token_env<Env>>>::type;
  using completion_signatures = signatures_in<empty_env>;

  template <class Self, class... Env>
  static consteval auto get_completion_signatures() {
    return signatures_in<first_env_t<Env...>>{};
  }

  Child child;
  std::chrono::steady_clock::duration timeout;

  template <class Receiver>
    requires receiver_of<Receiver, signatures_in<env_of_t<Receiver>>>
  auto connect(Receiver rcvr) && {
    return deadline_operation<Child, Receiver>{std::move(child), std::move(rcvr), timeout};
  }
  template <class Receiver>
    requires receiver_of<Receiver, signatures_in<env_of_t<Receiver>>> &&
             std::is_copy_constructible_v<Child>
  auto connect(Receiver rcvr) const& {
    return deadline_operation<const Child&, Receiver>{child, std::move(rcvr), timeout};
  }
};

}  // namespace detail

/// The type of `with_deadline`.
struct with_deadline_t {
  template <class Sender, class Rep, class Period>
    requires sender<Sender>
  auto operator()(Sender&& sndr, std::chrono::duration<Rep, Period> timeout) const {
    return detail::deadline_sender<std::remove_cvref_t<Sender>>{
        std::forward<Sender>(sndr),
        ticks(timeout)};
  }
  template <class Rep, class Period>
  auto operator()(std::chrono::duration<Rep, Period> timeout) const {
    return detail::make_closure<with_deadline_t>(timeout);
  }

  /// `timeout` in steady_clock ticks, saturated at the type's limits (a
  /// plain duration_cast of hours::max() overflows).
  template <class Rep, class Period>
  static constexpr std::chrono::steady_clock::duration ticks(std::chrono::duration<Rep, Period> timeout) noexcept {
    using ticks_type = std::chrono::steady_clock::duration;
    using seconds = std::chrono::duration<long double>;
    if (seconds(timeout) >= seconds(ticks_type::max())) return ticks_type::max();
    if (seconds(timeout) <= seconds(ticks_type::min())) return ticks_type::min();
    return std::chrono::duration_cast<ticks_type>(timeout);
  }
};

/// `sndr | with_deadline(d)`: runs sndr with a stop token of its own; when `d`
/// has passed since start (measured on steady_clock) it requests stop of sndr.
/// If sndr then completes with set_stopped, completes with
/// `set_error(std::error_code{errc::timeout})`; otherwise with sndr's own
/// completion (values and errors decay-copied), whichever way the race
/// between deadline and completion went. A stop request from the receiver's
/// token is forwarded to sndr too (and reported as stopped).
///
/// Requires a cancellable sndr: one that ignores stop requests completes late.
/// Cost: the timer is an entry in the operation state, fired by the process's
/// one timer thread (started at the first connect, which throws
/// std::system_error if it cannot be); no allocation. The deadline's stop
/// request is made on that thread: a child whose stop callback completes it
/// at once runs the rest of the chain there, and no other deadline fires
/// until that returns. pdcoll's collectives and transfers do not (their
/// callbacks only mark the operation; the driving thread completes it). A
/// timeout past the clock's range (duration::max(), hours::max()) never
/// fires.
///
///     auto r = sync_wait(recv(comm, buf, peer) | with_deadline(std::chrono::seconds(5)));
inline constexpr with_deadline_t with_deadline{};

}  // namespace pdcoll::exec
