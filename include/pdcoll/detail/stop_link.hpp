// File: detail/stop_link.hpp — connects a receiver's stop token to an
// operation on a communicator.
//
// The stop callback only marks the operation (two atomic stores): the thread
// that drives the communicator cancels its transfers. Taking the
// communicator's lock inside the callback could deadlock with a completion
// that destroys this callback on another thread.
#pragma once

#include <pdcoll/communicator.hpp>
#include <pdcoll/exec/vocabulary.hpp>

#include <optional>
#include <utility>

namespace pdcoll::detail {

/// The stop-token side of an operation state for receiver R.
template <class R>
class stop_link {
 public:
  /// Registers the callback on rcvr's token. Returns false, having completed
  /// `rcvr` with set_stopped(), when stop was requested already.
  bool attach(R& rcvr, communicator& comm, operation_base& op) noexcept {
    if (exec::get_stop_token(exec::get_env(rcvr)).stop_requested()) {
      exec::set_stopped(std::move(rcvr));
      return false;
    }
    watch(rcvr, comm, op);
    return true;
  }
  /// Registers the callback without the early completion: a stop requested
  /// already, or from now on, marks `op` (the callback runs at once when the
  /// token is stopped), and the operation honours the mark itself.
  void watch(R& rcvr, communicator& comm, operation_base& op) noexcept {
    auto token = exec::get_stop_token(exec::get_env(rcvr));
    if (token.stop_possible()) callback_.emplace(token, on_stop{&comm, &op});
  }
  /// Deregisters (waits for a callback running on another thread). Call before completing.
  void detach() noexcept { callback_.reset(); }

 private:
  struct on_stop {
    communicator* comm;
    operation_base* op;
    void operator()() noexcept { comm->request_stop(*op); }
  };
  using token_type = exec::stop_token_of_t<exec::env_of_t<R>>;
  std::optional<typename token_type::template callback_type<on_stop>> callback_;
};

}  // namespace pdcoll::detail
