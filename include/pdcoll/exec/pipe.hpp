// File: exec/pipe.hpp — pipe syntax for sender adaptors:
// `just(1) | then(f) | with_deadline(5s)`.
#pragma once

#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "pdcoll/exec/vocabulary.hpp"

namespace pdcoll::exec::detail {

/// The partially applied adaptor returned by `then(f)` and friends: the
/// arguments are stored by value, and `sndr | closure` calls
/// `Algorithm{}(sndr, args...)`. Cost: one move of each argument.
template <class Algorithm, class... Args>
struct sender_adaptor_closure {
  std::tuple<Args...> args;

  template <class Sender>
    requires sender<Sender> && std::is_invocable_v<Algorithm, Sender, Args...>
  friend auto operator|(Sender&& sndr, sender_adaptor_closure&& self) {
    return std::apply(
        [&](Args&... as) { return Algorithm{}(std::forward<Sender>(sndr), std::move(as)...); },
        self.args);
  }

  template <class Sender>
    requires sender<Sender> && std::is_invocable_v<Algorithm, Sender, const Args&...>
  friend auto operator|(Sender&& sndr, const sender_adaptor_closure& self) {
    return std::apply(
        [&](const Args&... as) { return Algorithm{}(std::forward<Sender>(sndr), as...); },
        self.args);
  }
};

/// Builds a closure that decay-copies its arguments.
template <class Algorithm, class... Args>
auto make_closure(Args&&... args) {
  return sender_adaptor_closure<Algorithm, std::decay_t<Args>...>{
      std::tuple<std::decay_t<Args>...>{std::forward<Args>(args)...}};
}

}  // namespace pdcoll::exec::detail
