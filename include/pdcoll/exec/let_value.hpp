// File: exec/let_value.hpp — let_value(f): continue with the sender that f
// returns for the child's values. Also the shared machinery of let_error.
#pragma once

#include <exception>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>

#include "pdcoll/exec/pipe.hpp"
#include "pdcoll/exec/signatures.hpp"
#include "pdcoll/exec/vocabulary.hpp"

namespace pdcoll::exec {
namespace detail {

// How one child signature maps when f handles channel Tag: the matching
// channel becomes the completions of the sender f returns; others pass through.
template <class Tag, class F, class Env, class Sig>
struct let_map {
  using type = completion_signatures<Sig>;
  using stored = type_list<>;
  static constexpr bool nothrow = true;
};
template <class Tag, class F, class Env, class... Args>
struct let_map_matching {
  using result_sender = std::invoke_result_t<F, std::decay_t<Args>&...>;
  static_assert(sender<result_sender>, "the function given to let_value/let_error must return a sender");
  using type = completion_signatures_of_t<result_sender, Env>;
  using stored = type_list<decayed_tuple<Args...>>;
  static constexpr bool nothrow = std::is_nothrow_invocable_v<F, std::decay_t<Args>&...> &&
                                  nothrow_decay_copyable<Args...> &&
                                  nothrow_connect<result_sender, probe_receiver<Env>>;
};
template <class F, class Env, class... As>
struct let_map<set_value_t, F, Env, set_value_t(As...)> : let_map_matching<set_value_t, F, Env, As...> {};
template <class F, class Env, class E>
struct let_map<set_error_t, F, Env, set_error_t(E)> : let_map_matching<set_error_t, F, Env, E> {};

template <class Tag, class F, class Env, class ChildSigs>
struct let_signatures;
template <class Tag, class F, class Env, class... Sigs>
struct let_signatures<Tag, F, Env, completion_signatures<Sigs...>> {
  static constexpr bool nothrow = (let_map<Tag, F, Env, Sigs>::nothrow && ...);
  using type = concat_signatures_t<typename let_map<Tag, F, Env, Sigs>::type...,
                                   exception_signature_if<!nothrow>>;
  /// The distinct tuples of decayed arguments f may be called with.
  using stored = unique_list_t<typename join_type_lists<typename let_map<Tag, F, Env, Sigs>::stored...>::type>;
};

/// Receiver for the sender f returned: forwards everything to the outer receiver.
template <class Receiver>
struct let_inner_receiver {
  using receiver_concept = receiver_t;
  Receiver* rcvr;
  template <class... As>
  void set_value(As&&... as) noexcept {
    exec::set_value(std::move(*rcvr), std::forward<As>(as)...);
  }
  template <class E>
  void set_error(E&& e) noexcept {
    exec::set_error(std::move(*rcvr), std::forward<E>(e));
  }
  void set_stopped() noexcept { exec::set_stopped(std::move(*rcvr)); }
  decltype(auto) get_env() const noexcept { return exec::get_env(*rcvr); }
};

template <class Tag, class Receiver, class Op>
struct let_child_receiver;

/// The operation state: the child's operation, the stored arguments and (after
/// the child completes on Tag) the operation of the sender f returned, all in
/// place. Immovable.
template <class Tag, class CvChild, class Receiver, class F>
struct let_operation {
  using operation_state_concept = operation_state_t;
  using env_type = env_of_t<Receiver>;
  using signatures = let_signatures<Tag, F, env_type, completion_signatures_of_t<CvChild, env_type>>;
  using stored_variant = storage_variant_t<typename signatures::stored>;
  using inner_receiver = let_inner_receiver<Receiver>;
  template <class Tuple>
  struct inner_op;
  template <class... Ts>
  struct inner_op<std::tuple<Ts...>> {
    using type = connect_result_t<std::invoke_result_t<F, Ts&...>, inner_receiver>;
  };
  using inner_variant = storage_variant_t<
      unique_list_t<typename map_list<typename signatures::stored, inner_op>::type>>;
  using child_op_type = connect_result_t<CvChild, let_child_receiver<Tag, Receiver, let_operation>>;

  Receiver rcvr;
  F fn;
  stored_variant stored;
  inner_variant inner;
  child_op_type child_op;

  let_operation(CvChild&& child, Receiver r, F f)
      : rcvr(std::move(r)),
        fn(std::move(f)),
        child_op(exec::connect(std::forward<CvChild>(child), let_child_receiver<Tag, Receiver, let_operation>{this})) {}
  let_operation(let_operation&&) = delete;

  void start() noexcept { exec::start(child_op); }

  template <class... As>
  void continue_with(As&&... as) noexcept {
    if constexpr (signatures::nothrow) {
      launch(std::forward<As>(as)...);
    } else {
      try {
        launch(std::forward<As>(as)...);
      } catch (...) {
        exec::set_error(std::move(rcvr), std::current_exception());
      }
    }
  }

 private:
  template <class... As>
  void launch(As&&... as) {
    using tuple_type = decayed_tuple<As...>;
    auto& args = stored.template emplace<tuple_type>(std::forward<As>(as)...);
    using op_type = typename inner_op<tuple_type>::type;
    auto& op = inner.template emplace<op_type>(emplace_from{[&] {
      return exec::connect(std::apply(std::move(fn), args), inner_receiver{&rcvr});
    }});
    exec::start(op);
  }
};

// Parameterised on Tag and Receiver so that its signature (get_env's type)
// is known while Op is still incomplete.
template <class Tag, class Receiver, class Op>
struct let_child_receiver {
  using receiver_concept = receiver_t;
  Op* op;
  template <class... As>
  void set_value(As&&... as) noexcept {
    if constexpr (std::is_same_v<Tag, set_value_t>) {
      op->continue_with(std::forward<As>(as)...);
    } else {
      exec::set_value(std::move(op->rcvr), std::forward<As>(as)...);
    }
  }
  template <class E>
  void set_error(E&& e) noexcept {
    if constexpr (std::is_same_v<Tag, set_error_t>) {
      op->continue_with(std::forward<E>(e));
    } else {
      exec::set_error(std::move(op->rcvr), std::forward<E>(e));
    }
  }
  void set_stopped() noexcept { exec::set_stopped(std::move(op->rcvr)); }
  env_of_t<Receiver> get_env() const noexcept { return exec::get_env(op->rcvr); }
};

/// The sender of let_value / let_error.
template <class Tag, class Child, class F>
struct let_sender {
  using sender_concept = sender_t;
  template <class Env>
  using signatures_in =
      typename let_signatures<Tag, F, Env, completion_signatures_of_t<Child, Env>>::type;
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
    return let_operation<Tag, Child, Receiver, F>{std::move(child), std::move(rcvr), std::move(fn)};
  }
  template <class Receiver>
    requires receiver_of<Receiver, signatures_in<env_of_t<Receiver>>> &&
             std::is_copy_constructible_v<Child> && std::is_copy_constructible_v<F>
  auto connect(Receiver rcvr) const& {
    return let_operation<Tag, const Child&, Receiver, F>{child, std::move(rcvr), fn};
  }
};

/// The algorithm object behind let_value / let_error.
template <class Tag>
struct let_like_t {
  template <class Sender, class F>
    requires sender<Sender>
  auto operator()(Sender&& sndr, F&& fn) const {
    return let_sender<Tag, std::remove_cvref_t<Sender>, std::decay_t<F>>{
        std::forward<Sender>(sndr), std::forward<F>(fn)};
  }
  template <class F>
  auto operator()(F&& fn) const {
    return make_closure<let_like_t>(std::forward<F>(fn));
  }
};

}  // namespace detail

/// The type of `let_value`.
using let_value_t = detail::let_like_t<set_value_t>;

/// `sndr | let_value(f)`: when sndr completes with values, stores them in the
/// operation state, calls `f(stored...)` (lvalue references that stay valid
/// until the whole operation completes) and runs the sender f returns in
/// place, completing as it does. Errors and stopped of sndr pass through;
/// the receiver's environment (stop token included) reaches both senders. If
/// f or the connect throws, completes with `set_error(std::exception_ptr)`
/// (declared unless f and the connect are noexcept). No allocation.
///
///     auto s = just(4) | let_value([](int& n) { return just(n * 2); });
inline constexpr let_value_t let_value{};

}  // namespace pdcoll::exec
