// File: point_to_point.hpp — tagged send and receive between two ranks of a
// communicator, as senders.
//
//     std::vector<float> block(1024);
//     if (comm.rank() == 0) pdcoll::exec::sync_wait(pdcoll::send(comm, 1, block, /*tag=*/7));
//     else auto [bytes] = *pdcoll::exec::sync_wait(pdcoll::recv(comm, 0, block, 7));
//
// Point-to-point traffic has its own tag class (detail/tags.hpp), so it never
// matches a collective's messages, and it is not sequenced: a send matches the
// first receive posted by `peer` with the same user tag, and messages with the
// same (peer, tag) arrive in the order they were sent.
//
// Unlike a collective, a stopped send or receive leaves the communicator
// usable: nobody else waits on it. A stop request cancels the transfer; the
// sender then completes with set_stopped() if the cancel won, or normally if
// the transfer had already completed (never both). As with MPI_Cancel, a
// cancel is too late once the message has begun to move (a receive that its
// bytes are arriving into, a send whose first bytes or chunk left): the
// transfer then completes whole and normally, so no message is lost or cut
// and the next receive of that (peer, tag) gets the next message. A deadline that passes is
// a communicator failure like any other: the communicator aborts and the
// operation completes with errc::timeout.
#pragma once

#include <pdcoll/collectives.hpp>
#include <pdcoll/communicator.hpp>
#include <pdcoll/detail/stop_link.hpp>
#include <pdcoll/detail/tags.hpp>
#include <pdcoll/error.hpp>
#include <pdcoll/exec/vocabulary.hpp>
#include <pdcoll/memory/view.hpp>
#include <pdcoll/transport/endpoint.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <system_error>
#include <type_traits>
#include <utility>

namespace pdcoll::detail {

/// One send or receive, fixed when the sender is made.
struct point_to_point_spec {
  bool receive = false;
  int peer = 0;
  std::uint32_t tag = 0;
  user_buffer buffer;
  std::error_code invalid;  ///< set when the arguments were rejected
  std::optional<std::chrono::milliseconds> timeout;
};

/// Checks the arguments of a send or receive and fills the spec.
template <class T, class D>
point_to_point_spec make_point_to_point_spec(const communicator& comm, bool receive, int peer, const view<T, D>& v,
                                             std::uint32_t tag) {
  point_to_point_spec s;
  s.receive = receive;
  s.peer = peer;
  s.tag = tag;
  s.buffer = make_user_buffer(v);
  if (peer < 0 || peer >= comm.world_size()) s.invalid = make_error_code(errc::root_out_of_range);
  else if (!bytes_fit(v.size(), 1, sizeof(T))) s.invalid = make_error_code(errc::count_overflow);
  else if (v.size() != 0 && is_null(s.buffer)) s.invalid = make_error_code(errc::null_buffer);
  return s;
}

/// The receiver-independent part of a send's or receive's operation state.
class point_to_point_op_base : public operation_base {
 public:
  point_to_point_op_base(communicator& comm, point_to_point_spec spec) noexcept
      : comm_(&comm), spec_(std::move(spec)) {
    transfer_.op = this;
    transfer_.on_complete = &on_transfer_complete;
  }
  point_to_point_op_base(const point_to_point_op_base&) = delete;
  point_to_point_op_base& operator=(const point_to_point_op_base&) = delete;

  // operation_base: called by the communicator's driving thread, under its lock.
  void cancel_outstanding() noexcept override {
    if (posted_) comm_->endpoint().cancel(&transfer_);
  }
  std::string describe() const override {
    return std::string(spec_.receive ? "recv from " : "send to ") + std::to_string(spec_.peer) + " (tag " +
           std::to_string(spec_.tag) + ", " + std::to_string(spec_.buffer.region.length) + " B)";
  }

 protected:
  ~point_to_point_op_base() = default;

  /// Posts the transfer; completes through deliver(). Called once from start().
  void launch() noexcept {
    auto& comm = *comm_;
    communicator::completion_turn turn(comm);  // a transfer that ends inside start() completes as it returns
    launch_locked();
    comm.register_driver_if_pending();
  }

  /// Ends the operation with this outcome: its receiver gets it when the
  /// turn ends (communicator::completion_turn). Must be the last thing the
  /// operation does, under the lock.
  virtual void deliver(std::error_code ec, std::size_t bytes, bool stopped) noexcept = 0;

  communicator* comm_;

 private:
  void launch_locked() noexcept {
    if (spec_.invalid) return deliver(spec_.invalid, 0, false);
    if (auto ec = comm_->begin_operation(*this, spec_.timeout.value_or(comm_->options().timeout)))
      return deliver(ec, 0, false);
    void* address = nullptr;
    void* descriptor = nullptr;
    try {
      if (auto ec = prepare_buffer(address, descriptor)) return finish(ec, 0);
    } catch (const std::system_error& e) {
      return finish(e.code(), 0);
    } catch (const std::bad_alloc&) {
      return finish(std::make_error_code(std::errc::not_enough_memory), 0);
    }
    auto& ep = comm_->endpoint();
    const std::uint64_t tag = point_to_point_tag(spec_.tag);
    const std::size_t length = spec_.buffer.region.length;
    std::error_code ec = spec_.receive ? ep.post_recv(spec_.peer, address, length, tag, 0, descriptor, &transfer_)
                                       : ep.post_send(spec_.peer, address, length, tag, descriptor, &transfer_);
    if (ec) return finish(ec, 0);  // nothing was posted: no completion will come
    posted_ = true;
    // A stop request that arrived between start() and begin_operation() was
    // not seen by the communicator's stop service: honour it here.
    if (stop_requested.load(std::memory_order_acquire)) cancel_outstanding();
  }

  struct transfer_context : transport::completion_context {
    point_to_point_op_base* op = nullptr;
  };

  // Where the bytes move from or to: the user's buffer (host memory, or
  // device memory the transport reaches directly), or a host staging buffer
  // (device memory the transport cannot reach; copies counted by the domain).
  std::error_code prepare_buffer(void*& address, void*& descriptor) {
    const auto& b = spec_.buffer;
    auto path = comm_->path_for(b.region.kind);
    if (path == transport::data_path::unreachable) return make_error_code(errc::unreachable_domain);
    transport::memory_region region = b.region;
    if (path == transport::data_path::host_staged) {
      // From the communicator's pool: a block it lets go of loses its cached
      // registrations first, so a later buffer at the same address never
      // hits this one's (a fresh allocation per transfer would).
      staging_ = comm_->take_host_block(b.region.length ? b.region.length : 1);
      if (!spec_.receive && b.region.length)
        b.domain.ops->to_host(b.domain.domain, b.device_address, staging_.bytes.get(), b.region.length);
      region = comm_->host_block_region(staging_, b.region.length);
    }
    auto lease = comm_->acquire_registration(region);
    if (!lease) return lease.error();
    lease_ = std::move(*lease);
    address = region.address;
    descriptor = lease_.descriptor();
    return {};
  }

  static void on_transfer_complete(transport::completion_context* ctx, const transport::completion& c) noexcept {
    auto* op = static_cast<transfer_context*>(ctx)->op;
    op->posted_ = false;
    op->finish(c.error, c.bytes);
  }

  // Runs once, under the communicator's lock, when the transfer has ended (or was never posted).
  void finish(std::error_code ec, std::size_t bytes) noexcept {
    if (!ec && spec_.receive && staging_.bytes && bytes) {
      const auto& b = spec_.buffer;
      try {
        b.domain.ops->from_host(b.domain.domain, b.device_address, staging_.bytes.get(), bytes);
      } catch (const std::system_error& e) {
        ec = e.code();
      }
    }
    lease_.release();
    if (staging_.bytes) comm_->return_host_block(std::exchange(staging_, {}));
    bool stopped = false;
    if (ec) {
      const bool cancelled = ec == std::errc::operation_canceled;
      const bool user_stop = stop_requested.load(std::memory_order_acquire) && !timed_out && !comm_->aborted();
      if (cancelled && user_stop) {
        stopped = true;  // only this rank's transfer ends: the communicator stays usable
      } else {
        ec = comm_->failure_reason(*this, ec);
        // A lost peer fails every operation that involves it, as for collectives.
        if (ec == make_error_code(errc::peer_lost)) comm_->abort_locked(ec, true);
      }
    }
    comm_->end_operation(*this);
    deliver(ec, ec || stopped ? 0 : bytes, stopped);
  }

  point_to_point_spec spec_;
  transfer_context transfer_;
  registration_lease lease_;
  detail::host_block staging_;
  bool posted_ = false;
};

/// The operation state of a send (Receive = false) or receive for receiver R.
template <bool Receive, class R>
class point_to_point_operation final : public point_to_point_op_base {
 public:
  using operation_state_concept = exec::operation_state_t;  ///< marks this type as an operation state

  point_to_point_operation(communicator& comm, point_to_point_spec spec, R rcvr) noexcept(
      std::is_nothrow_move_constructible_v<R>)
      : point_to_point_op_base(comm, std::move(spec)), rcvr_(std::move(rcvr)) {}

  void start() noexcept {
    if (stop_.attach(rcvr_, *comm_, *this)) launch();
  }

 private:
  void deliver(std::error_code ec, std::size_t bytes, bool stopped) noexcept override {
    stop_.detach();
    outcome_ = ec;
    bytes_ = bytes;
    stopped_ = stopped;
    comm_->complete_after_turn(*this);
  }
  void complete_receiver() noexcept override {
    if (stopped_) exec::set_stopped(std::move(rcvr_));
    else if (outcome_) exec::set_error(std::move(rcvr_), std::move(outcome_));
    else if constexpr (Receive) exec::set_value(std::move(rcvr_), std::move(bytes_));
    else exec::set_value(std::move(rcvr_));
  }

  R rcvr_;
  detail::stop_link<R> stop_;
  std::error_code outcome_;
  std::size_t bytes_ = 0;
  bool stopped_ = false;
};

}  // namespace pdcoll::detail

namespace pdcoll {

/// The sender pdcoll::send (Receive = false) and pdcoll::recv return. A send
/// completes with `set_value()`, a receive with `set_value(std::size_t
/// bytes_received)`; both with `set_error(std::error_code)` (category
/// pdcoll::error_category(): bad input, timeout, aborted, peer_lost,
/// collective_mismatch for a message longer than the receive buffer) or
/// `set_stopped()` when the receiver's stop token cancelled the transfer.
/// Lazy: nothing is posted before start.
template <bool Receive>
class point_to_point_sender {
 public:
  using sender_concept = exec::sender_t;  ///< marks this type as a sender
  /// The ways it completes (see the class comment).
  using completion_signatures =
      exec::completion_signatures<std::conditional_t<Receive, exec::set_value_t(std::size_t), exec::set_value_t()>,
                                  exec::set_error_t(std::error_code), exec::set_stopped_t()>;
  /// The same completions in the C++26 static consteval form.
  template <class Self, class... Env>
  static consteval auto get_completion_signatures() {
    return completion_signatures{};
  }

  /// Made by pdcoll::send and pdcoll::recv.
  point_to_point_sender(communicator& comm, detail::point_to_point_spec spec) noexcept
      : comm_(&comm), spec_(std::move(spec)) {}

  /// Connects to a receiver; the operation state must not move afterwards.
  template <class R>
  detail::point_to_point_operation<Receive, R> connect(R rcvr) const {
    return detail::point_to_point_operation<Receive, R>(*comm_, spec_, std::move(rcvr));
  }

  /// Overrides the communicator's deadline for this operation (passing it
  /// aborts the communicator, as every deadline does).
  point_to_point_sender with_timeout(std::chrono::milliseconds timeout) const {
    auto copy = *this;
    copy.spec_.timeout = timeout;
    return copy;
  }
  /// The rejected-argument error, if the call was invalid (also delivered through set_error).
  std::error_code validation_error() const noexcept { return spec_.invalid; }

 private:
  communicator* comm_;
  detail::point_to_point_spec spec_;
};

/// The sender of pdcoll::send.
using send_sender = point_to_point_sender<false>;
/// The sender of pdcoll::recv.
using recv_sender = point_to_point_sender<true>;

/// Sends `data` (a pdcoll::view or a contiguous range) to `peer` with user
/// tag `tag`. Completes with set_value() once the bytes left this rank's
/// buffer (it may be reused). `peer` may be this rank. Errors:
/// root_out_of_range (peer outside [0, world_size)), null_buffer,
/// unreachable_domain, timeout, aborted, peer_lost. Cost: one message; device
/// memory the transport cannot reach is staged through host memory.
template <detail::buffer_argument Data>
send_sender send(communicator& comm, int peer, Data&& data, std::uint32_t tag = 0) {
  auto v = detail::as_view(std::forward<Data>(data));
  return send_sender(comm, detail::make_point_to_point_spec(comm, false, peer, v, tag));
}

/// Receives one message from `peer` with user tag `tag` into `data`.
/// Completes with set_value(bytes_received) (at most data's size in bytes);
/// a longer message completes with errc::collective_mismatch (the buffer's
/// contents are then unspecified). Other errors as for send().
///
///     auto got = pdcoll::exec::sync_wait(pdcoll::recv(comm, 0, buffer, 7));
///     std::size_t bytes = std::get<0>(*got);
template <detail::buffer_argument Data>
recv_sender recv(communicator& comm, int peer, Data&& data, std::uint32_t tag = 0) {
  auto v = detail::as_view(std::forward<Data>(data));
  static_assert(!std::is_const_v<typename decltype(v)::element_type>,
                "recv: the buffer must be writable");
  return recv_sender(comm, detail::make_point_to_point_spec(comm, true, peer, v, tag));
}

}  // namespace pdcoll
