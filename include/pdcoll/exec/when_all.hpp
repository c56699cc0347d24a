// File: exec/when_all.hpp — when_all(senders...): run senders concurrently and
// complete when all have; the first failure cancels the rest.
#pragma once

#include <atomic>
#include <cstddef>
#include <exception>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>

#include "pdcoll/exec/env.hpp"
#include "pdcoll/exec/signatures.hpp"
#include "pdcoll/exec/stop_token.hpp"
#include "pdcoll/exec/vocabulary.hpp"

namespace pdcoll::exec {
namespace detail {

template <class Sigs>
struct single_value_tuple {
  static_assert(signature_counts<Sigs>::values <= 1,
                "when_all: each child must have at most one set_value signature");
  template <class L>
  struct first {
    using type = void;  // the child never completes with values
  };
  template <class T>
  struct first<type_list<T>> {
    using type = T;
  };
  using type = typename first<typename value_types<Sigs, decayed_tuple>::type>::type;
};

template <class... Tuples>
struct concat_value_signature {
  using type = completion_signatures<>;  // some child has no value completion
};
template <class... Tuples>
  requires(!std::is_void_v<Tuples> && ...)
struct concat_value_signature<Tuples...> {
  template <class T>
  struct to_signature;
  template <class... Ts>
  struct to_signature<std::tuple<Ts...>> {
    using type = completion_signatures<set_value_t(Ts...)>;
  };
  using type = typename to_signature<decltype(std::tuple_cat(std::declval<Tuples>()...))>::type;
};

template <class Sig>
struct decayed_error_signature {
  using type = completion_signatures<>;
};
template <class E>
struct decayed_error_signature<set_error_t(E)> {
  using type = completion_signatures<set_error_t(std::decay_t<E>)>;
};
template <class Sigs>
struct decayed_errors;
template <class... Sigs>
struct decayed_errors<completion_signatures<Sigs...>> {
  using type = concat_signatures_t<typename decayed_error_signature<Sigs>::type...>;
};

template <class... ChildSigs>
struct when_all_signatures {
  static constexpr bool nothrow = (nothrow_decay_copyable_results<ChildSigs> && ...);
  using type = concat_signatures_t<
      typename concat_value_signature<typename single_value_tuple<ChildSigs>::type...>::type,
      typename decayed_errors<ChildSigs>::type..., exception_signature_if<!nothrow>,
      completion_signatures<set_stopped_t()>>;
  template <class L>
  struct decay_list;
  template <class... Es>
  struct decay_list<type_list<Es...>> {
    using type = type_list<std::decay_t<Es>...>;
  };
  using error_storage = storage_variant_t<unique_list_t<typename join_type_lists<
      typename decay_list<typename error_types<ChildSigs>::type>::type...,
      std::conditional_t<nothrow, type_list<>, type_list<std::exception_ptr>>>::type>>;
};

// Parameterised on Env so that its signature is known while Op is incomplete.
template <class Op, std::size_t I, class Env>
struct when_all_receiver {
  using receiver_concept = receiver_t;
  Op* op;
  template <class... As>
  void set_value(As&&... as) noexcept {
    op->template child_value<I>(std::forward<As>(as)...);
  }
  template <class E>
  void set_error(E&& e) noexcept {
    op->child_error(std::forward<E>(e));
  }
  void set_stopped() noexcept { op->child_stopped(); }
  Env get_env() const noexcept { return op->make_child_env(); }
};

// One child's operation state, built in place from connect's return value.
template <std::size_t I, class Op, class Env, class CvChild>
struct when_all_child {
  connect_result_t<CvChild, when_all_receiver<Op, I, Env>> op_state;
  when_all_child(Op* op, CvChild&& child)
      : op_state(exec::connect(std::forward<CvChild>(child), when_all_receiver<Op, I, Env>{op})) {}
};

template <class Op, class Env, class Indices, class... CvChildren>
struct when_all_children;
template <class Op, class Env, std::size_t... Is, class... CvChildren>
struct when_all_children<Op, Env, std::index_sequence<Is...>, CvChildren...>
    : when_all_child<Is, Op, Env, CvChildren>... {
  template <class Tuple>
  when_all_children(Op* op, Tuple&& children)
      : when_all_child<Is, Op, Env, CvChildren>(op, std::get<Is>(std::forward<Tuple>(children)))... {}
  void start_all() noexcept {
    (exec::start(this->when_all_child<Is, Op, Env, CvChildren>::op_state), ...);
  }
};

template <class Receiver, class... CvChildren>
struct when_all_operation {
  using operation_state_concept = operation_state_t;
  using outer_env = env_of_t<Receiver>;
  using child_env = stop_token_env<outer_env>;
  using signatures = when_all_signatures<completion_signatures_of_t<CvChildren, child_env>...>;
  using outer_token = stop_token_of_t<outer_env>;
  static constexpr bool has_values =
      (!std::is_void_v<typename single_value_tuple<completion_signatures_of_t<CvChildren, child_env>>::type> &&
       ...);
  template <class CvChild>
  using value_slot = std::optional<std::conditional_t<
      std::is_void_v<typename single_value_tuple<completion_signatures_of_t<CvChild, child_env>>::type>,
      std::tuple<>,
      typename single_value_tuple<completion_signatures_of_t<CvChild, child_env>>::type>>;

  template <class Tuple>
  when_all_operation(Tuple&& children, Receiver rcvr)
      : rcvr_(std::move(rcvr)), children_(this, std::forward<Tuple>(children)) {}
  when_all_operation(when_all_operation&&) = delete;

  void start() noexcept {
    // Slots: "every child arrived" and the stop forwarder's (see stop_forwarder).
    pending_.store(2, std::memory_order_relaxed);
    children_left_.store(sizeof...(CvChildren), std::memory_order_relaxed);
    forwarder_.arm(get_stop_token(exec::get_env(rcvr_)), &source_, &release_slot, this);
    if (source_.stop_requested()) {
      // Stopped before anything started: start nothing.
      state_.store(stopped, std::memory_order_relaxed);
      children_done();
      return;
    }
    children_.start_all();
  }

  child_env make_child_env() const noexcept {
    return child_env{source_.get_token(), exec::get_env(rcvr_)};
  }

  template <std::size_t I, class... As>
  void child_value(As&&... as) noexcept {
    if constexpr (has_values) {
      auto& slot = std::get<I>(values_);
      if constexpr (signatures::nothrow) {
        slot.emplace(std::forward<As>(as)...);
      } else {
        try {
          slot.emplace(std::forward<As>(as)...);
        } catch (...) {
          child_error(std::current_exception());
          return;
        }
      }
    }
    child_arrived();
  }

  template <class E>
  void child_error(E&& e) noexcept {
    // The first error wins, also over an earlier "stopped".
    if (state_.exchange(error, std::memory_order_acq_rel) != error) {
      if constexpr (signatures::nothrow) {
        errors_.template emplace<std::decay_t<E>>(std::forward<E>(e));
      } else {
        try {
          errors_.template emplace<std::decay_t<E>>(std::forward<E>(e));
        } catch (...) {
          errors_.template emplace<std::exception_ptr>(std::current_exception());
        }
      }
      source_.request_stop();
    }
    child_arrived();
  }

  void child_stopped() noexcept {
    int expected = running;
    if (state_.compare_exchange_strong(expected, stopped, std::memory_order_acq_rel)) {
      source_.request_stop();
    }
    child_arrived();
  }

 private:
  static constexpr int running = 0;
  static constexpr int error = 1;
  static constexpr int stopped = 2;

  static void release_slot(void* self) noexcept { static_cast<when_all_operation*>(self)->arrive(); }

  void child_arrived() noexcept {
    if (children_left_.fetch_sub(1, std::memory_order_acq_rel) == 1) children_done();
  }
  void children_done() noexcept {
    if (forwarder_.disarm()) arrive();
    arrive();
  }
  void arrive() noexcept {
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) complete();
  }

  void complete() noexcept {
    forwarder_.reset();
    switch (state_.load(std::memory_order_relaxed)) {
      case running:
        if constexpr (has_values) {
          std::apply(
              [this](auto&... values) {
                std::apply([this](auto&&... vs) { exec::set_value(std::move(rcvr_), std::move(vs)...); },
                           std::tuple_cat(std::move(*values)...));
              },
              values_);
        }
        break;
      case error:
        std::visit(
            [this](auto& e) {
              if constexpr (!std::is_same_v<std::decay_t<decltype(e)>, std::monostate>) {
                exec::set_error(std::move(rcvr_), std::move(e));
              }
            },
            errors_);
        break;
      default:
        exec::set_stopped(std::move(rcvr_));
        break;
    }
  }

  Receiver rcvr_;
  inplace_stop_source source_;
  std::atomic<int> state_{running};
  std::atomic<std::size_t> children_left_{0};
  std::atomic<int> pending_{0};
  stop_forwarder<outer_token> forwarder_;
  typename signatures::error_storage errors_;
  std::tuple<value_slot<CvChildren>...> values_;
  when_all_children<when_all_operation, child_env, std::index_sequence_for<CvChildren...>, CvChildren...>
      children_;
};

template <class... Children>
struct when_all_sender {
  using sender_concept = sender_t;
  template <class Env>
  using signatures_in =
      typename when_all_signatures<completion_signatures_of_t<Children, stop_token_env<Env>>...>::type;
  using completion_signatures = signatures_in<empty_env>;

  template <class Self, class... Env>
  static consteval auto get_completion_signatures() {
    return signatures_in<first_env_t<Env...>>{};
  }

  std::tuple<Children...> children;

  template <class Receiver>
    requires receiver_of<Receiver, signatures_in<env_of_t<Receiver>>>
  auto connect(Receiver rcvr) && {
    return when_all_operation<Receiver, Children...>{std::move(children), std::move(rcvr)};
  }
  template <class Receiver>
    requires receiver_of<Receiver, signatures_in<env_of_t<Receiver>>> &&
             (std::is_copy_constructible_v<Children> && ...)
  auto connect(Receiver rcvr) const& {
    return when_all_operation<Receiver, const Children&...>{children, std::move(rcvr)};
  }
};

}  // namespace detail

/// The type of `when_all`.
struct when_all_t {
  template <class... Senders>
    requires(sizeof...(Senders) > 0 && (sender<Senders> && ...))
  auto operator()(Senders&&... sndrs) const {
    return detail::when_all_sender<std::remove_cvref_t<Senders>...>{
        std::tuple<std::remove_cvref_t<Senders>...>{std::forward<Senders>(sndrs)...}};
  }
};

/// Starts every sender (in argument order, on the starting thread) and
/// completes when all have: with `set_value` of all their values
/// concatenated in argument order (decay-copied) if all succeeded; otherwise
/// with the first error (an error wins over stopped), or set_stopped. The
/// first error or stop of one child requests stop of the others through the
/// children's stop token (an inplace_stop_source in the operation state);
/// a stop request on the receiver's token is forwarded the same way. Each
/// child must have at most one set_value signature. No allocation.
///
///     auto [a, b] = *sync_wait(when_all(just(1), just(2.0)));
inline constexpr when_all_t when_all{};

}  // namespace pdcoll::exec
