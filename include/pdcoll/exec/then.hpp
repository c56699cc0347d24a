// File: exec/then.hpp — then(f): transform a sender's value with a function.
// Also the shared machinery of upon_error and upon_stopped (same shape, other
// channel).
#pragma once

#include <exception>
#include <functional>
#include <type_traits>
#include <utility>

#include "pdcoll/exec/pipe.hpp"
#include "pdcoll/exec/signatures.hpp"
#include "pdcoll/exec/vocabulary.hpp"

namespace pdcoll::exec {
namespace detail {

template <class R>
struct value_signature_of {
  using type = completion_signatures<set_value_t(R)>;
};
template <>
struct value_signature_of<void> {
  using type = completion_signatures<set_value_t()>;
};
/// `set_value_t(R)`, or `set_value_t()` for void, in a one-element list.
template <class R>
using value_signature_for = typename value_signature_of<R>::type;

// How one child signature maps when `f` handles channel Tag: the matching
// channel becomes set_value(f(args...)); others pass through.
template <class Tag, class F, class Sig>
struct then_map {
  using type = completion_signatures<Sig>;
  static constexpr bool nothrow = true;
};
template <class F, class... As>
struct then_map<set_value_t, F, set_value_t(As...)> {
  using type = value_signature_for<std::invoke_result_t<F, As...>>;
  static constexpr bool nothrow = std::is_nothrow_invocable_v<F, As...>;
};
template <class F, class E>
struct then_map<set_error_t, F, set_error_t(E)> {
  using type = value_signature_for<std::invoke_result_t<F, E>>;
  static constexpr bool nothrow = std::is_nothrow_invocable_v<F, E>;
};
template <class F>
struct then_map<set_stopped_t, F, set_stopped_t()> {
  using type = value_signature_for<std::invoke_result_t<F>>;
  static constexpr bool nothrow = std::is_nothrow_invocable_v<F>;
};

template <class Tag, class F, class ChildSigs>
struct then_signatures;
template <class Tag, class F, class... Sigs>
struct then_signatures<Tag, F, completion_signatures<Sigs...>> {
  static constexpr bool nothrow = (then_map<Tag, F, Sigs>::nothrow && ...);
  using type = concat_signatures_t<typename then_map<Tag, F, Sigs>::type...,
                                   exception_signature_if<!nothrow>>;
};

/// Receives the child's completion; calls `f` on channel Tag and forwards the
/// others unchanged. Lives inside the child's operation state (no allocation).
template <class Tag, class Receiver, class F>
struct then_receiver {
  using receiver_concept = receiver_t;
  Receiver rcvr;
  F fn;

  template <class... As>
  void set_value(As&&... as) noexcept {
    if constexpr (std::is_same_v<Tag, set_value_t>) {
      invoke_and_complete(std::forward<As>(as)...);
    } else {
      exec::set_value(std::move(rcvr), std::forward<As>(as)...);
    }
  }
  template <class E>
  void set_error(E&& e) noexcept {
    if constexpr (std::is_same_v<Tag, set_error_t>) {
      invoke_and_complete(std::forward<E>(e));
    } else {
      exec::set_error(std::move(rcvr), std::forward<E>(e));
    }
  }
  void set_stopped() noexcept {
    if constexpr (std::is_same_v<Tag, set_stopped_t>) {
      invoke_and_complete();
    } else {
      exec::set_stopped(std::move(rcvr));
    }
  }
  decltype(auto) get_env() const noexcept { return exec::get_env(rcvr); }

 private:
  template <class... As>
  void deliver(As&&... as) {
    if constexpr (std::is_void_v<std::invoke_result_t<F, As...>>) {
      std::invoke(std::move(fn), std::forward<As>(as)...);
      exec::set_value(std::move(rcvr));
    } else {
      exec::set_value(std::move(rcvr), std::invoke(std::move(fn), std::forward<As>(as)...));
    }
  }
  template <class... As>
  void invoke_and_complete(As&&... as) noexcept {
    if constexpr (std::is_nothrow_invocable_v<F, As...>) {
      deliver(std::forward<As>(as)...);
    } else {
      try {
        deliver(std::forward<As>(as)...);
      } catch (...) {
        exec::set_error(std::move(rcvr), std::current_exception());
      }
    }
  }
};

/// The sender of then / upon_error / upon_stopped.
template <class Tag, class Child, class F>
struct then_sender {
  using sender_concept = sender_t;
  template <class Env>
  using signatures_in =
      typename then_signatures<Tag, F, completion_signatures_of_t<Child, Env>>::type;
  using completion_signatures = signatures_in<empty_env>;

  template <class Self, class... Env>
  static consteval auto get_completion_signatures() {
    return signatures_in<first_env_t<Env...>>{};
  }

  Child child;
  F fn;

  template <class Receiver>
    requires receiver_of<Receiver, signatures_in<env_of_t<Receiver>>>
  auto connect(Receiver rcvr) && {
    return exec::connect(std::move(child),
                         then_receiver<Tag, Receiver, F>{std::move(rcvr), std::move(fn)});
  }
  template <class Receiver>
    requires receiver_of<Receiver, signatures_in<env_of_t<Receiver>>> &&
             std::is_copy_constructible_v<Child> && std::is_copy_constructible_v<F>
  auto connect(Receiver rcvr) const& {
    return exec::connect(child, then_receiver<Tag, Receiver, F>{std::move(rcvr), fn});
  }
};

/// The algorithm object behind then / upon_error / upon_stopped.
template <class Tag>
struct then_like_t {
  template <class Sender, class F>
    requires sender<Sender>
  auto operator()(Sender&& sndr, F&& fn) const {
    return then_sender<Tag, std::remove_cvref_t<Sender>, std::decay_t<F>>{
        std::forward<Sender>(sndr), std::forward<F>(fn)};
  }
  template <class F>
  auto operator()(F&& fn) const {
    return make_closure<then_like_t>(std::forward<F>(fn));
  }
};

}  // namespace detail

/// The type of `then`.
using then_t = detail::then_like_t<set_value_t>;

/// `then(sndr, f)` / `sndr | then(f)`: completes with `f(values...)` (or with
/// no value when f returns void) when sndr completes with values; errors and
/// stopped pass through. If f throws, completes with
/// `set_error(std::exception_ptr)` (declared unless f is noexcept). No
/// allocation; f runs on the thread that completed sndr.
///
///     auto s = just(20) | then([](int x) { return x + 22; });  // -> 42
inline constexpr then_t then{};

}  // namespace pdcoll::exec
