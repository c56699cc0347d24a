// File: exec/sync_wait.hpp — sync_wait(sender): start a sender and block the
// calling thread, running a run_loop (and so the progress drivers) on it,
// until the sender completes.
#pragma once

#include <exception>
#include <optional>
#include <system_error>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>

#include "pdcoll/exec/run_loop.hpp"
#include "pdcoll/exec/signatures.hpp"
#include "pdcoll/exec/stop_token.hpp"
#include "pdcoll/exec/vocabulary.hpp"

namespace pdcoll::exec {
namespace detail {

/// The environment sync_wait gives its sender: the loop's scheduler and a
/// stop token (unstoppable unless the caller passed one).
struct sync_wait_env {
  run_loop* loop;
  inplace_stop_token token;
  run_loop::scheduler query(get_scheduler_t) const noexcept { return loop->get_scheduler(); }
  inplace_stop_token query(get_stop_token_t) const noexcept { return token; }
};

struct sync_wait_stopped {};

template <class Values>
struct sync_wait_state {
  run_loop loop;
  std::variant<std::monostate, Values, std::error_code, std::exception_ptr, sync_wait_stopped> result;
  std::thread::id owner = std::this_thread::get_id();  ///< the thread in sync_wait
  bool running = false;           ///< the owner entered loop.run() (written and read by the owner only)
  bool completed_inline = false;  ///< completed on the owner inside start(): run() is skipped

  /// Called once the result is in: makes run() return, or, when the sender
  /// completed inside start() on the owner (a peer was there first), marks
  /// it so that sync_wait skips the loop and its locks altogether. The
  /// thread id is compared first: only the owner reads `running`.
  void done() noexcept {
    if (std::this_thread::get_id() == owner && !running) {
      completed_inline = true;
      return;
    }
    loop.finish();
  }
};

template <class Values>
struct sync_wait_receiver {
  using receiver_concept = receiver_t;
  sync_wait_state<Values>* state;
  inplace_stop_token token;

  template <class... As>
  void set_value(As&&... as) noexcept {
    try {
      state->result.template emplace<1>(std::forward<As>(as)...);
    } catch (...) {
      state->result.template emplace<3>(std::current_exception());
    }
    state->done();
  }
  template <class E>
  void set_error(E&& e) noexcept {
    using error_type = std::decay_t<E>;
    if constexpr (std::is_same_v<error_type, std::error_code>) {
      state->result.template emplace<2>(e);
    } else if constexpr (std::is_same_v<error_type, std::exception_ptr>) {
      state->result.template emplace<3>(std::forward<E>(e));
    } else {
      state->result.template emplace<3>(std::make_exception_ptr(std::forward<E>(e)));
    }
    state->done();
  }
  void set_stopped() noexcept {
    state->result.template emplace<4>();
    state->done();
  }
  sync_wait_env get_env() const noexcept { return {&state->loop, token}; }
};

template <class Sigs>
struct sync_wait_values {
  using list = typename value_types<Sigs, decayed_tuple>::type;
  static_assert(signature_counts<Sigs>::values <= 1,
                "sync_wait needs a sender with at most one set_value signature");
  template <class L>
  struct first {
    using type = std::tuple<>;
  };
  template <class T>
  struct first<type_list<T>> {
    using type = T;
  };
  using type = typename first<list>::type;
};

}  // namespace detail

/// The environment type sync_wait connects senders with.
using sync_wait_env = detail::sync_wait_env;

/// The result of `sync_wait(S)`: the decayed values of S's one value
/// signature (an empty tuple if it has none), or nothing when S was stopped.
template <class Sender>
using sync_wait_result_t = std::optional<
    typename detail::sync_wait_values<completion_signatures_of_t<Sender, sync_wait_env>>::type>;

/// Connects `sndr`, starts it and runs a run_loop on the calling thread until
/// it completes; the sender's environment answers get_scheduler with that
/// loop's scheduler and get_stop_token with `token` (unstoppable by default).
/// While the loop is idle the registered progress drivers run on this thread,
/// so a collective completes without extra threads.
///
/// Returns the values in an optional tuple; an empty optional when the sender
/// was stopped. Throws std::system_error for `set_error(std::error_code)`,
/// rethrows `set_error(std::exception_ptr)`, throws any other error value.
/// Cost: the operation state lives on this stack; no allocation. A sender
/// that completes inside start() on this thread (a collective whose peers
/// were there first) returns without entering the loop: no lock is taken,
/// unless it queued work on the loop, which then runs before the return.
///
///     auto [sum] = sync_wait(just(1) | then([](int x) { return x + 1; })).value();
template <class Sender>
  requires sender_in<Sender, sync_wait_env>
sync_wait_result_t<Sender> sync_wait(Sender&& sndr, inplace_stop_token token = {}) {
  using values = typename sync_wait_result_t<Sender>::value_type;
  detail::sync_wait_state<values> state;
  auto op = exec::connect(std::forward<Sender>(sndr), detail::sync_wait_receiver<values>{&state, token});
  exec::start(op);
  if (!state.completed_inline) {
    state.running = true;
    state.loop.run();
  } else if (state.loop.ever_queued()) {
    // Completed inside start(), having queued work on the loop on the way
    // (a continuation that started detached work on get_scheduler): run it
    // before the loop goes, as stdexec's sync_wait does.
    state.loop.finish();
    state.loop.run();
  }
  switch (state.result.index()) {
    case 1: return sync_wait_result_t<Sender>{std::move(std::get<1>(state.result))};
    case 2: throw std::system_error(std::get<2>(state.result));
    case 3: std::rethrow_exception(std::get<3>(state.result));
    default: return std::nullopt;
  }
}

}  // namespace pdcoll::exec
