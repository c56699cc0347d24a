// File: exec/just.hpp — just(values...), just_error(e), just_stopped(): senders
// that complete at once, in start(), on the starting thread.
#pragma once

#include <tuple>
#include <type_traits>
#include <utility>

#include "pdcoll/exec/vocabulary.hpp"

namespace pdcoll::exec {
namespace detail {

template <class Tag, class Receiver, class... Ts>
struct just_operation {
  using operation_state_concept = operation_state_t;
  Receiver rcvr;
  std::tuple<Ts...> values;

  void start() noexcept {
    std::apply([this](Ts&... vs) { Tag{}(std::move(rcvr), std::move(vs)...); }, values);
  }
};

/// The sender behind just / just_error / just_stopped: stores the results and
/// hands them to the receiver on start. No allocation; connect copies (lvalue
/// sender) or moves (rvalue sender) the stored values.
template <class Tag, class... Ts>
struct just_sender {
  using sender_concept = sender_t;
  using completion_signatures = ::pdcoll::exec::completion_signatures<Tag(Ts...)>;

  template <class Self, class... Env>
  static consteval auto get_completion_signatures() {
    return completion_signatures{};
  }

  std::tuple<Ts...> values;

  template <receiver_of<completion_signatures> Receiver>
  auto connect(Receiver rcvr) && noexcept((std::is_nothrow_move_constructible_v<Ts> && ...) &&
                                          std::is_nothrow_move_constructible_v<Receiver>) {
    return just_operation<Tag, Receiver, Ts...>{std::move(rcvr), std::move(values)};
  }
  template <receiver_of<completion_signatures> Receiver>
    requires(std::is_copy_constructible_v<Ts> && ...)
  auto connect(Receiver rcvr) const& noexcept((std::is_nothrow_copy_constructible_v<Ts> && ...) &&
                                              std::is_nothrow_move_constructible_v<Receiver>) {
    return just_operation<Tag, Receiver, Ts...>{std::move(rcvr), values};
  }
};

}  // namespace detail

/// A sender that completes with `set_value(decay-copies of values...)` as soon
/// as it is started. Cost: the values' copies; no allocation.
///
///     auto [n] = *sync_wait(just(42));
template <class... Ts>
auto just(Ts&&... values) {
  return detail::just_sender<set_value_t, std::decay_t<Ts>...>{
      std::tuple<std::decay_t<Ts>...>{std::forward<Ts>(values)...}};
}

/// A sender that completes with `set_error(error)` as soon as it is started.
template <class E>
auto just_error(E&& error) {
  return detail::just_sender<set_error_t, std::decay_t<E>>{
      std::tuple<std::decay_t<E>>{std::forward<E>(error)}};
}

/// A sender that completes with `set_stopped()` as soon as it is started.
inline auto just_stopped() noexcept { return detail::just_sender<set_stopped_t>{}; }

}  // namespace pdcoll::exec
