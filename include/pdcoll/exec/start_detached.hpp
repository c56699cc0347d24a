// File: exec/start_detached.hpp — start_detached(sender): run a sender to
// completion without waiting for it.
#pragma once

#include <type_traits>
#include <utility>

#include "pdcoll/exec/signatures.hpp"
#include "pdcoll/exec/vocabulary.hpp"

namespace pdcoll::exec {
namespace detail {

template <class Op>
struct detached_receiver {
  using receiver_concept = receiver_t;
  Op* op;
  template <class... As>
  void set_value(As&&...) noexcept {
    delete op;
  }
  void set_stopped() noexcept { delete op; }
  empty_env get_env() const noexcept { return {}; }
};

template <class Sender>
struct detached_operation {
  connect_result_t<Sender, detached_receiver<detached_operation>> child_op;
  explicit detached_operation(Sender&& sndr)
      : child_op(exec::connect(std::forward<Sender>(sndr), detached_receiver<detached_operation>{this})) {}
};

}  // namespace detail

/// Allocates the operation state of `sndr` on the heap (one `new`), starts it,
/// and frees it when the sender completes. The sender runs with an empty
/// environment (no stop token). A detached error would have nowhere to go, so
/// senders that can complete with set_error are rejected at compile time:
/// handle errors first (`| upon_error(...)`, `| let_error(...)`). Throws what
/// the allocation or connect throws.
template <class Sender>
  requires sender_in<Sender, empty_env>
void start_detached(Sender&& sndr) {
  static_assert(detail::signature_counts<completion_signatures_of_t<Sender, empty_env>>::errors == 0,
                "start_detached: handle set_error first (upon_error / let_error)");
  auto* op = new detail::detached_operation<Sender>(std::forward<Sender>(sndr));
  exec::start(op->child_op);
}

}  // namespace pdcoll::exec
