// File: exec/vocabulary.hpp — the sender/receiver vocabulary (P2300 / C++26
// std::execution shape): tags, customisation point objects, completion
// signatures, queries and concepts.
//
// Everything pdcoll's senders and receivers agree on lives in this one header
// so that a build with PDCOLL_USE_STDEXEC can alias stdexec's vocabulary
// instead of ours. Customisation is by member functions, as in current
// stdexec and the C++26 wording: `sndr.connect(rcvr)`, `op.start()`,
// `rcvr.set_value(args...)`, `env.query(tag)`, `sndr.get_env()`.
#pragma once

#include <concepts>
#include <exception>
#include <memory>
#include <type_traits>
#include <utility>

#if defined(PDCOLL_USE_STDEXEC)
#include <stdexec/execution.hpp>
#endif

namespace pdcoll::exec {

#if defined(PDCOLL_USE_STDEXEC)
/// With PDCOLL_USE_STDEXEC, pdcoll's vocabulary *is* stdexec's (these
/// using-declarations): our senders are stdexec senders and the reverse.
using stdexec::completion_signatures;
using stdexec::connect;
using stdexec::connect_t;
using stdexec::get_allocator;
using stdexec::get_allocator_t;
using stdexec::get_env;
using stdexec::get_env_t;
using stdexec::get_scheduler;
using stdexec::get_scheduler_t;
using stdexec::get_stop_token;
using stdexec::get_stop_token_t;
using stdexec::operation_state_t;
using stdexec::receiver_t;
using stdexec::schedule;
using stdexec::schedule_t;
using stdexec::sender_t;
using stdexec::set_error;
using stdexec::set_error_t;
using stdexec::set_stopped;
using stdexec::set_stopped_t;
using stdexec::set_value;
using stdexec::set_value_t;
using stdexec::start;
using stdexec::start_t;
using empty_env = stdexec::env<>;
template <class S, class Env = empty_env>
using completion_signatures_of_t = stdexec::completion_signatures_of_t<S, Env>;
using stdexec::operation_state;
using stdexec::receiver;
using stdexec::receiver_of;
using stdexec::scheduler;
using stdexec::sender;
using stdexec::sender_in;
using stdexec::never_stop_token;
using stdexec::stop_token_of_t;
template <class Env>
using env_of_t = stdexec::env_of_t<Env>;
#else

/// Tag a sender type with `using sender_concept = sender_t;`.
struct sender_t {};
/// Tag a receiver type with `using receiver_concept = receiver_t;`.
struct receiver_t {};
/// Tag an operation state with `using operation_state_concept = operation_state_t;`.
struct operation_state_t {};

/// The completion channels. Receivers implement noexcept members of these names.
struct set_value_t {
  /// Calls `r.set_value(as...)`.
  template <class R, class... As>
    requires requires(R&& r, As&&... as) { std::forward<R>(r).set_value(std::forward<As>(as)...); }
  constexpr void operator()(R&& r, As&&... as) const noexcept {
    static_assert(noexcept(std::forward<R>(r).set_value(std::forward<As>(as)...)),
                  "receiver's set_value must be noexcept");
    std::forward<R>(r).set_value(std::forward<As>(as)...);
  }
};
/// Completes a receiver with an error.
struct set_error_t {
  /// Calls `r.set_error(e)`.
  template <class R, class E>
    requires requires(R&& r, E&& e) { std::forward<R>(r).set_error(std::forward<E>(e)); }
  constexpr void operator()(R&& r, E&& e) const noexcept {
    static_assert(noexcept(std::forward<R>(r).set_error(std::forward<E>(e))),
                  "receiver's set_error must be noexcept");
    std::forward<R>(r).set_error(std::forward<E>(e));
  }
};
/// Completes a receiver as stopped (cancelled).
struct set_stopped_t {
  /// Calls `r.set_stopped()`.
  template <class R>
    requires requires(R&& r) { std::forward<R>(r).set_stopped(); }
  constexpr void operator()(R&& r) const noexcept {
    static_assert(noexcept(std::forward<R>(r).set_stopped()),
                  "receiver's set_stopped must be noexcept");
    std::forward<R>(r).set_stopped();
  }
};
inline constexpr set_value_t set_value{};      ///< CPO: value completion
inline constexpr set_error_t set_error{};      ///< CPO: error completion
inline constexpr set_stopped_t set_stopped{};  ///< CPO: stopped completion

/// An environment that answers no query.
struct empty_env {};

/// CPO: the environment of a receiver or the attributes of a sender;
/// `empty_env` when the object has no `get_env()` member.
struct get_env_t {
  /// `t.get_env()`, or empty_env.
  template <class T>
  constexpr decltype(auto) operator()(const T& t) const noexcept {
    if constexpr (requires { t.get_env(); }) {
      static_assert(noexcept(t.get_env()), "get_env must be noexcept");
      return t.get_env();
    } else {
      return empty_env{};
    }
  }
};
inline constexpr get_env_t get_env{};

/// The environment type of T.
template <class T>
using env_of_t = std::remove_cvref_t<decltype(get_env(std::declval<const T&>()))>;

/// CPO: connect a sender to a receiver, producing an operation state.
struct connect_t {
  /// Calls `s.connect(r)`.
  template <class S, class R>
    requires requires(S&& s, R&& r) { std::forward<S>(s).connect(std::forward<R>(r)); }
  constexpr auto operator()(S&& s, R&& r) const
      noexcept(noexcept(std::forward<S>(s).connect(std::forward<R>(r)))) {
    return std::forward<S>(s).connect(std::forward<R>(r));
  }
};
inline constexpr connect_t connect{};

/// CPO: start an operation state. Must not throw.
struct start_t {
  /// Calls `o.start()`.
  template <class O>
    requires requires(O& o) { o.start(); }
  constexpr void operator()(O& o) const noexcept {
    static_assert(noexcept(o.start()), "start must be noexcept");
    o.start();
  }
};
inline constexpr start_t start{};

/// CPO: a scheduler's sender that completes on the scheduler's context.
struct schedule_t {
  /// Calls `s.schedule()`.
  template <class Sch>
    requires requires(Sch&& s) { std::forward<Sch>(s).schedule(); }
  constexpr auto operator()(Sch&& s) const noexcept(noexcept(std::forward<Sch>(s).schedule())) {
    return std::forward<Sch>(s).schedule();
  }
};
inline constexpr schedule_t schedule{};

/// A stop token whose stop is never requested (the default when the
/// environment names none).
struct never_stop_token {
  template <class F>
  struct callback_type {
    explicit callback_type(never_stop_token, F&&) noexcept {}
  };
  static constexpr bool stop_requested() noexcept { return false; }
  static constexpr bool stop_possible() noexcept { return false; }
  friend constexpr bool operator==(never_stop_token, never_stop_token) noexcept { return true; }
};

/// Query: the stop token of an environment (`never_stop_token` if none).
struct get_stop_token_t {
  /// `env.query(get_stop_token)`, or never_stop_token.
  template <class Env>
  constexpr auto operator()(const Env& env) const noexcept {
    if constexpr (requires { env.query(std::declval<const get_stop_token_t&>()); }) {
      return env.query(*this);
    } else {
      return never_stop_token{};
    }
  }
};
inline constexpr get_stop_token_t get_stop_token{};

/// Query: the scheduler an environment's operations should complete on.
struct get_scheduler_t {
  /// `env.query(get_scheduler)`.
  template <class Env>
    requires requires(const Env& env) { env.query(std::declval<const get_scheduler_t&>()); }
  constexpr auto operator()(const Env& env) const noexcept {
    return env.query(*this);
  }
};
inline constexpr get_scheduler_t get_scheduler{};

/// Query: the allocator for an operation's allocations (`std::allocator<void>` if none).
struct get_allocator_t {
  /// `env.query(get_allocator)`, or std::allocator<void>.
  template <class Env>
  constexpr auto operator()(const Env& env) const noexcept {
    if constexpr (requires { env.query(std::declval<const get_allocator_t&>()); }) {
      return env.query(*this);
    } else {
      return std::allocator<void>{};
    }
  }
};
inline constexpr get_allocator_t get_allocator{};

/// The stop token type an environment provides.
template <class Env>
using stop_token_of_t = std::remove_cvref_t<decltype(get_stop_token(std::declval<const Env&>()))>;

/// The list of ways a sender may complete, e.g.
/// `completion_signatures<set_value_t(int), set_error_t(std::error_code), set_stopped_t()>`.
template <class... Sigs>
struct completion_signatures {};

namespace detail {
template <class S, class Env>
consteval auto completions_of() {
  using Sndr = std::remove_cvref_t<S>;
  if constexpr (requires { Sndr::template get_completion_signatures<Sndr, Env>(); }) {
    return Sndr::template get_completion_signatures<Sndr, Env>();
  } else if constexpr (requires { typename Sndr::completion_signatures; }) {
    return typename Sndr::completion_signatures{};
  } else if constexpr (requires(const Env& e) { std::declval<Sndr>().get_completion_signatures(e); }) {
    return decltype(std::declval<Sndr>().get_completion_signatures(std::declval<const Env&>())){};
  }
}
}  // namespace detail

/// The completion signatures of sender S in environment Env. Read from, in
/// order: the `static consteval get_completion_signatures<Self, Env...>()`
/// template form, the `completion_signatures` member alias, or the member
/// function `get_completion_signatures(env)`.
template <class S, class Env = empty_env>
  requires(!std::is_void_v<decltype(detail::completions_of<S, Env>())>)
using completion_signatures_of_t = decltype(detail::completions_of<S, Env>());

/// A sender: tagged with `sender_concept` and movable.
template <class S>
concept sender = std::derived_from<typename std::remove_cvref_t<S>::sender_concept, sender_t> &&
                 std::move_constructible<std::remove_cvref_t<S>>;

/// A sender whose completions are known in environment Env.
template <class S, class Env = empty_env>
concept sender_in = sender<S> && requires { typename completion_signatures_of_t<S, Env>; };

/// A receiver: tagged with `receiver_concept`, movable, with an environment.
template <class R>
concept receiver = std::derived_from<typename std::remove_cvref_t<R>::receiver_concept, receiver_t> &&
                   std::move_constructible<std::remove_cvref_t<R>> &&
                   requires(const std::remove_cvref_t<R>& r) { get_env(r); };

namespace detail {
template <class R, class Sig>
inline constexpr bool accepts = false;
template <class R, class... As>
inline constexpr bool accepts<R, set_value_t(As...)> = requires(R&& r, As&&... as) {
  { set_value(std::move(r), std::forward<As>(as)...) };
};
template <class R, class E>
inline constexpr bool accepts<R, set_error_t(E)> = requires(R&& r, E&& e) {
  { set_error(std::move(r), std::forward<E>(e)) };
};
template <class R>
inline constexpr bool accepts<R, set_stopped_t()> = requires(R&& r) {
  { set_stopped(std::move(r)) };
};
template <class R, class Sigs>
inline constexpr bool accepts_all = false;
template <class R, class... Sigs>
inline constexpr bool accepts_all<R, completion_signatures<Sigs...>> = (accepts<R, Sigs> && ...);
}  // namespace detail

/// A receiver that accepts every completion in the signature list Sigs.
template <class R, class Sigs>
concept receiver_of = receiver<R> && detail::accepts_all<std::remove_cvref_t<R>, Sigs>;

/// An operation state: started once, never moved after connect.
template <class O>
concept operation_state = std::is_object_v<O> && requires(O& o) {
  { o.start() } noexcept;
};

/// A scheduler: a copyable handle whose schedule() returns a sender.
template <class S>
concept scheduler = std::copy_constructible<std::remove_cvref_t<S>> &&
                    std::equality_comparable<std::remove_cvref_t<S>> && requires(S&& s) {
                      { schedule(std::forward<S>(s)) } -> sender;
                    };
#endif  // PDCOLL_USE_STDEXEC

}  // namespace pdcoll::exec
