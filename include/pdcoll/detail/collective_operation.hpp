// File: detail/collective_operation.hpp — the sender every collective returns
// and the operation state that runs an algorithm's coroutine on a
// communicator.
//
// The sender is type-erased over the algorithm and element type (a function
// pointer and a `reduction` table), so that one operation-state template per
// receiver serves every collective: compile times stay low while algorithms,
// types and ops are still chosen at compile time by the caller.
#pragma once

#include <pdcoll/communicator.hpp>
#include <pdcoll/detail/collective_task.hpp>
#include <pdcoll/detail/tags.hpp>
#include <pdcoll/error.hpp>
#include <pdcoll/exec/vocabulary.hpp>
#include <pdcoll/transport/endpoint.hpp>

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <system_error>
#include <vector>

namespace pdcoll {

/// The collectives pdcoll runs (values travel in signatures: only append).
enum class collective_kind : std::uint8_t {
  all_reduce = 1,
  broadcast = 2,
  reduce = 3,
  all_gather = 4,
  reduce_scatter = 5,
  all_to_all = 6,
  barrier = 7,
};

namespace detail {

/// A reduction with its element type erased: what algorithms call to combine.
struct reduction_table {
  std::size_t element_size = 1;
  std::uint32_t type_id = 0;  ///< reduce::data_type value (signature)
  std::uint32_t op_id = 0;    ///< reduce::reduction value (signature)
  /// inout[i] = op(inout[i], in[i]) for i < count.
  void (*apply)(void* inout, const void* in, std::size_t count) noexcept = nullptr;
  /// Post-processing after the last combine (avg divides by the world size).
  void (*finalize)(void* data, std::size_t count, int world_size) noexcept = nullptr;
};

/// A memory domain as the engine sees it: scratch allocation and the
/// host copies of the staged path. A null `allocate` means host memory.
struct domain_access {
  transport::memory_kind kind = transport::memory_kind::host;
  void* domain = nullptr;
  /// Allocates `bytes` in the domain; fills `region`; returns an opaque handle.
  void* (*allocate)(void* domain, std::size_t bytes, transport::memory_region& region) = nullptr;
  void (*deallocate)(void* domain, void* handle) noexcept = nullptr;
  /// Device → host copy of `bytes` at device address `address` (counted by the domain).
  void (*to_host)(void* domain, std::uint64_t address, void* dst, std::size_t bytes) = nullptr;
  /// Host → device copy (counted by the domain).
  void (*from_host)(void* domain, std::uint64_t address, const void* src, std::size_t bytes) = nullptr;
};

/// A user buffer: its fabric region and its domain.
struct user_buffer {
  transport::memory_region region;
  std::uint64_t device_address = 0;  ///< the domain's address of the first byte
  domain_access domain;
};

class collective_context;
/// An algorithm entry point: plans and runs one collective.
using algorithm_fn = collective_task (*)(collective_context&);

/// Everything that defines one collective call, fixed when the sender is made.
struct collective_spec {
  collective_kind kind = collective_kind::barrier;
  std::size_t count = 0;  ///< elements: per rank (all_gather, reduce_scatter: per block; all_to_all: per peer)
  int root = 0;
  reduction_table red;
  user_buffer input;
  user_buffer output;
  algorithm_fn algorithm = nullptr;
  std::error_code invalid;  ///< set when the arguments were rejected
  std::optional<std::chrono::milliseconds> timeout;
  const char* algorithm_name = "";
};

/// What an algorithm sees: its rank, the buffers, scratch, local reduce and
/// copy, and batches of transfers (see collective_task.hpp).
class collective_context : public batch_owner {
 public:
  int rank = 0;
  int world_size = 1;
  std::size_t count = 0;
  std::size_t element_size = 1;
  int root = 0;
  buffer_desc input;
  buffer_desc output;
  const reduction_table* red = nullptr;

  /// Bytes of `n` elements.
  std::size_t bytes(std::size_t n) const noexcept { return n * element_size; }
  /// dst[dst_off..] = op(dst, src[src_off..]) over `n` elements; offsets in bytes.
  void reduce(const buffer_desc& dst, std::size_t dst_off, const buffer_desc& src, std::size_t src_off,
              std::size_t n) const noexcept {
    if (n) red->apply(dst.address + dst_off, src.address + src_off, n);
  }
  /// Local copy of `nbytes` (both buffers in the working domain; not a host staging copy).
  static void copy(const buffer_desc& dst, std::size_t dst_off, const buffer_desc& src, std::size_t src_off,
                   std::size_t nbytes) noexcept {
    if (nbytes && dst.address + dst_off != src.address + src_off)
      std::memmove(dst.address + dst_off, src.address + src_off, nbytes);
  }
  /// Scratch of `nbytes` in the working domain, registered, freed with the operation.
  virtual buffer_desc scratch(std::size_t nbytes) = 0;

 protected:
  ~collective_context() = default;
};

}  // namespace detail
}  // namespace pdcoll

namespace pdcoll::detail {

/// The receiver-independent part of a collective's operation state.
class collective_op_base : public collective_context, public operation_base {
 public:
  collective_op_base(communicator& comm, collective_spec spec) noexcept : comm_(&comm), spec_(std::move(spec)) {}
  collective_op_base(const collective_op_base&) = delete;
  collective_op_base& operator=(const collective_op_base&) = delete;

  // batch_owner
  transport::endpoint& endpoint() noexcept override { return comm_->endpoint(); }
  std::uint64_t tag_for(std::uint32_t index) const noexcept override { return collective_tag(seq_, signature_, index); }
  std::uint64_t receive_ignore_bits() const noexcept override { return tag_signature_bits; }
  std::error_code check_received(const transport::completion& c, std::size_t expected) const noexcept override {
    if (tag_signature(c.tag) != signature_ || c.bytes != expected) return make_error_code(errc::collective_mismatch);
    return {};
  }
  void batch_posted(transfer_batch& b) noexcept override {
    b.prev_outstanding = nullptr;
    b.next_outstanding = outstanding_;
    if (outstanding_) outstanding_->prev_outstanding = &b;
    outstanding_ = &b;
  }
  void batch_finished(transfer_batch& b) noexcept override {
    if (b.prev_outstanding) b.prev_outstanding->next_outstanding = b.next_outstanding;
    else outstanding_ = b.next_outstanding;
    if (b.next_outstanding) b.next_outstanding->prev_outstanding = b.prev_outstanding;
    b.prev_outstanding = b.next_outstanding = nullptr;
  }

  // operation_base
  void cancel_outstanding() noexcept override {
    cancelled_ = true;
    for (auto* b = outstanding_; b;) {
      auto* next = b->next_outstanding;  // cancel() may complete and unlink b
      b->cancel();
      b = next;
    }
  }

  // collective_context
  buffer_desc scratch(std::size_t nbytes) override {
    auto& block = scratch_.emplace_back();
    block.domain = working_domain_;
    if (nbytes == 0) return {};
    if (working_domain_.allocate) {
      block.handle = working_domain_.allocate(working_domain_.domain, nbytes, block.region);
    } else {
      block.host.reset(new std::byte[nbytes]);
      block.region.address = block.host.get();
      block.region.length = nbytes;
    }
    auto lease = comm_->acquire_registration(block.region);
    if (!lease) throw std::system_error(lease.error());
    block.lease = std::move(*lease);
    return {static_cast<std::byte*>(block.region.address), nbytes, block.lease.descriptor()};
  }

 protected:
  ~collective_op_base() = default;

  /// Starts the collective; completes through deliver(). Called once from start().
  void launch() noexcept {
    std::lock_guard lock(comm_->mutex());
    if (spec_.invalid) return deliver(spec_.invalid, false);
    if (auto ec = comm_->begin_operation(*this, spec_.timeout.value_or(comm_->options().timeout)))
      return deliver(ec, false);
    seq_ = comm_->next_sequence();
    signature_ = collective_signature(static_cast<std::uint32_t>(spec_.kind), spec_.count, spec_.red.type_id,
                                      spec_.red.op_id, spec_.root);
    rank = comm_->rank();
    world_size = comm_->world_size();
    count = spec_.count;
    element_size = spec_.red.element_size;
    root = spec_.root;
    red = &spec_.red;
    try {
      if (auto ec = prepare_buffers()) return finish(ec);
      task_ = spec_.algorithm(*this);
    } catch (const std::system_error& e) {
      return finish(e.code());
    } catch (const std::bad_alloc&) {
      return finish(std::make_error_code(std::errc::not_enough_memory));
    }
    task_.start(&on_task_done, this);
  }

  /// Hands the outcome to the receiver. Must be the last thing the operation does.
  virtual void deliver(std::error_code ec, bool stopped) noexcept = 0;

  communicator* comm_;

 private:
  struct scratch_block {
    domain_access domain;
    void* handle = nullptr;
    std::unique_ptr<std::byte[]> host;
    transport::memory_region region;
    registration_lease lease;
    scratch_block() = default;
    scratch_block(scratch_block&&) noexcept = default;
    ~scratch_block() {
      lease.release();
      if (handle && domain.deallocate) domain.deallocate(domain.domain, handle);
    }
  };

  // Works out where the algorithm's bytes live: in the user's buffers (host
  // memory, or device memory the transport reaches directly) or in host
  // staging buffers (device memory the transport cannot reach).
  std::error_code prepare_buffers() {
    auto kind = spec_.input.region.kind;
    auto path = comm_->path_for(kind);
    if (path == transport::data_path::unreachable) return make_error_code(errc::unreachable_domain);
    staged_ = path == transport::data_path::host_staged;
    if (!staged_) {
      working_domain_ = spec_.input.domain;
      input = bind(spec_.input.region, input_lease_);
      if (spec_.output.region.address == spec_.input.region.address) {
        output = input;
      } else {
        output = bind(spec_.output.region, output_lease_);
      }
      return {};
    }
    // Host staging: the "before Peer Direct" picture. Copies are counted by the domain.
    working_domain_ = {};
    const auto& in = spec_.input;
    input = scratch(in.region.length);
    if (in.region.length) in.domain.to_host(in.domain.domain, in.device_address, input.address, in.region.length);
    if (spec_.output.region.address == in.region.address) {
      output = input;
    } else {
      output = scratch(spec_.output.region.length);
      // The output's current contents matter to collectives that keep part of it (broadcast at non-roots
      // overwrite it fully; reduce at non-roots leaves it untouched), so stage it in as well.
      if (spec_.output.region.length)
        spec_.output.domain.to_host(spec_.output.domain.domain, spec_.output.device_address, output.address,
                                    spec_.output.region.length);
    }
    return {};
  }

  buffer_desc bind(const transport::memory_region& region, registration_lease& lease) {
    auto got = comm_->acquire_registration(region);
    if (!got) throw std::system_error(make_error_code(errc::registration_failed));
    lease = std::move(*got);
    return {static_cast<std::byte*>(region.address), region.length, lease.descriptor()};
  }

  static void on_task_done(void* self) noexcept {
    auto* op = static_cast<collective_op_base*>(self);
    op->finish(op->task_.result());
  }

  // Runs once, when the algorithm's coroutine has finished (or never started).
  void finish(std::error_code ec) noexcept {
    task_.reset();  // the frame is suspended at its final point (or absent)
    if (!ec && staged_ && spec_.output.region.length) {
      try {
        spec_.output.domain.from_host(spec_.output.domain.domain, spec_.output.device_address, output.address,
                                      spec_.output.region.length);
      } catch (const std::system_error& e) {
        ec = e.code();
      }
    }
    scratch_.clear();
    input_lease_.release();
    output_lease_.release();
    bool stopped = false;
    if (ec) {
      bool user_stop = stop_requested.load(std::memory_order_acquire) && !timed_out && !comm_->aborted();
      if (user_stop) {
        // Peers are mid-collective and would wait for this rank until their
        // deadline: a stopped collective aborts the communicator (as
        // ncclCommAbort does) so they fail fast instead.
        stopped = true;
        comm_->abort_locked(make_error_code(errc::aborted), true);
      } else {
        ec = comm_->failure_reason(*this, ec);
        if (ec == make_error_code(errc::collective_mismatch) || ec == make_error_code(errc::peer_lost))
          comm_->abort_locked(ec, true);
      }
    }
    comm_->end_operation(*this);
    deliver(ec, stopped);
  }

  collective_spec spec_;
  std::uint64_t seq_ = 0;
  std::uint16_t signature_ = 0;
  collective_task task_;
  transfer_batch* outstanding_ = nullptr;
  bool staged_ = false;
  bool cancelled_ = false;
  domain_access working_domain_;
  registration_lease input_lease_;
  registration_lease output_lease_;
  std::vector<scratch_block> scratch_;
};

/// The operation state of a collective for receiver R.
template <class R>
class collective_operation final : public collective_op_base {
 public:
  using operation_state_concept = exec::operation_state_t;

  collective_operation(communicator& comm, collective_spec spec, R rcvr) noexcept(
      std::is_nothrow_move_constructible_v<R>)
      : collective_op_base(comm, std::move(spec)), rcvr_(std::move(rcvr)) {}

  void start() noexcept {
    auto token = exec::get_stop_token(exec::get_env(rcvr_));
    if (token.stop_requested()) {
      exec::set_stopped(std::move(rcvr_));
      return;
    }
    if (token.stop_possible()) stop_callback_.emplace(token, on_stop{this});
    launch();
  }

 private:
  struct on_stop {
    collective_operation* self;
    void operator()() noexcept { self->comm_->request_stop(*self); }
  };
  using stop_token_type = exec::stop_token_of_t<exec::env_of_t<R>>;
  using stop_callback_type = typename stop_token_type::template callback_type<on_stop>;

  void deliver(std::error_code ec, bool stopped) noexcept override {
    stop_callback_.reset();
    if (stopped) exec::set_stopped(std::move(rcvr_));
    else if (ec) exec::set_error(std::move(rcvr_), ec);
    else exec::set_value(std::move(rcvr_));
  }

  R rcvr_;
  std::optional<stop_callback_type> stop_callback_;
};

}  // namespace pdcoll::detail

namespace pdcoll {

/// The sender every collective returns. Completes with `set_value()` when
/// this rank's part is done, `set_error(std::error_code)` (category
/// pdcoll::error_category(): timeout, peer_lost, collective_mismatch,
/// aborted, invalid input …) or `set_stopped()` when its receiver's stop
/// token was triggered (which aborts the communicator: peers are mid-collective).
/// Lazy: nothing is posted before start; ranks must start collectives in the same order.
class collective_sender {
 public:
  using sender_concept = exec::sender_t;
  using completion_signatures = exec::completion_signatures<exec::set_value_t(), exec::set_error_t(std::error_code),
                                                            exec::set_stopped_t()>;
  template <class Self, class... Env>
  static consteval auto get_completion_signatures() {
    return completion_signatures{};
  }

  /// Made by the collective functions in collectives.hpp.
  collective_sender(communicator& comm, detail::collective_spec spec) noexcept : comm_(&comm), spec_(std::move(spec)) {}

  /// Connects to a receiver; the operation state must not move afterwards.
  template <class R>
  detail::collective_operation<R> connect(R rcvr) const {
    return detail::collective_operation<R>(*comm_, spec_, std::move(rcvr));
  }

  /// Overrides the communicator's deadline for this operation.
  collective_sender with_timeout(std::chrono::milliseconds timeout) const {
    auto copy = *this;
    copy.spec_.timeout = timeout;
    return copy;
  }
  /// The rejected-argument error, if the call was invalid (also delivered through set_error).
  std::error_code validation_error() const noexcept { return spec_.invalid; }
  /// The algorithm the call resolved to, for diagnostics.
  const char* algorithm_name() const noexcept { return spec_.algorithm_name; }

 private:
  communicator* comm_;
  detail::collective_spec spec_;
};

}  // namespace pdcoll
