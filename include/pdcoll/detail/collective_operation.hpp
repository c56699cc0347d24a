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
#include <pdcoll/detail/cpu_relax.hpp>
#include <pdcoll/detail/deadline.hpp>
#include <pdcoll/detail/stop_link.hpp>
#include <pdcoll/detail/log.hpp>
#include <pdcoll/detail/node_layout.hpp>
#include <pdcoll/detail/node_small_all_reduce.hpp>
#include <pdcoll/detail/staging.hpp>
#include <pdcoll/detail/tags.hpp>
#include <pdcoll/error.hpp>
#include <pdcoll/exec/vocabulary.hpp>
#include <pdcoll/transport/endpoint.hpp>

#include <sched.h>

#include <chrono>
#include <cstring>
#include <algorithm>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <utility>
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
  all_to_allv = 8,
  all_gatherv = 9,
};

/// The collective's name in pdcoll's API ("all_reduce", ...).
constexpr const char* name_of(collective_kind kind) noexcept {
  switch (kind) {
    case collective_kind::all_reduce: return "all_reduce";
    case collective_kind::broadcast: return "broadcast";
    case collective_kind::reduce: return "reduce";
    case collective_kind::all_gather: return "all_gather";
    case collective_kind::reduce_scatter: return "reduce_scatter";
    case collective_kind::all_to_all: return "all_to_all";
    case collective_kind::barrier: return "barrier";
    case collective_kind::all_to_allv: return "all_to_allv";
    case collective_kind::all_gatherv: return "all_gatherv";
  }
  return "unknown collective";
}

namespace detail {

/// A reduction with its element type erased: what algorithms call to combine.
struct reduction_table {
  std::size_t element_size = 1;
  std::uint32_t type_id = 0;  ///< reduce::data_type value (signature)
  std::uint32_t op_id = 0;    ///< reduce::reduction value (signature)
  /// inout[i] = op(inout[i], in[i]) for i < count.
  void (*apply)(void* inout, const void* in, std::size_t count) noexcept = nullptr;
  /// out[i] = op(a[i], b[i]) for i < count (out may be a or b, but must not
  /// otherwise overlap them); nullptr for tables that do not reduce.
  void (*apply3)(void* out, const void* a, const void* b, std::size_t count) noexcept = nullptr;
  /// Post-processing after the last combine (avg divides by the world size).
  void (*finalize)(void* data, std::size_t count, int world_size) noexcept = nullptr;
};

/// What the engine calls on a device memory domain: scratch allocation and
/// the host copies of the staged path. One constant table per domain type
/// (collectives.hpp), so that a collective's arguments carry one pointer.
struct domain_operations {
  /// Allocates `bytes` in the domain; fills `region`; returns an opaque handle.
  void* (*allocate)(void* domain, std::size_t bytes, transport::memory_region& region) = nullptr;
  void (*deallocate)(void* domain, void* handle) noexcept = nullptr;
  /// Device → host copy of `bytes` at device address `address` (counted by the domain).
  void (*to_host)(void* domain, std::uint64_t address, void* dst, std::size_t bytes) = nullptr;
  /// Host → device copy (counted by the domain).
  void (*from_host)(void* domain, std::uint64_t address, const void* src, std::size_t bytes) = nullptr;
};

/// The table of a collective whose arguments were rejected before a type was known.
inline constexpr reduction_table no_reduction{};

/// A memory domain as the engine sees it. Null `ops` means host memory.
struct domain_access {
  const domain_operations* ops = nullptr;
  void* domain = nullptr;
  /// False when the CPU cannot touch the domain's memory in place (Gaudi):
  /// reductions and local copies then run on host bounce buffers.
  bool reduces_on_device = true;
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
  std::size_t count = 0;  ///< elements: per rank (all_gather, reduce_scatter: per block; all_to_all: per peer; 0 for the v forms)
  int root = 0;
  /// The v forms' per-peer blocks in elements (peer_blocks_layout); empty for the other collectives.
  std::vector<std::size_t> peer_blocks;
  const reduction_table* red = &no_reduction;  ///< a constant table (collectives.hpp)
  user_buffer input;
  user_buffer output;
  algorithm_fn algorithm = nullptr;
  std::error_code invalid;  ///< set when the arguments were rejected
  std::optional<std::chrono::milliseconds> timeout;
  const char* algorithm_name = "";
  /// All-reduces of at most this many bytes take the operation's one-step
  /// node-memory path (node_small_all_reduce.hpp) where the transport has
  /// node memory: set for algorithms that would run shared_memory's single
  /// step there; 0 for the others.
  std::size_t node_small_bytes = 0;
};

/// How long a held signature check (collective_context::hold_signature_check)
/// waits for a data message to rank + 1 before it leaves alone: a rank stuck
/// on a mismatched collective still reports it within about this long. The
/// hold delays no peer: rank + 1 waits for that data message anyway.
inline constexpr std::chrono::milliseconds check_hold_limit{100};

/// Where collective_spec::peer_blocks keeps the v forms' four arrays of P
/// entries each (elements): send counts, send displacements, receive counts,
/// receive displacements.
enum peer_blocks_layout : std::size_t { send_counts_at = 0, send_displs_at = 1, recv_counts_at = 2, recv_displs_at = 3 };

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
  /// The v forms' blocks (collective_spec::peer_blocks, 4·P elements);
  /// empty for the collectives whose blocks are all `count` elements.
  std::span<const std::size_t> peer_blocks;
  /// The blocks a staged chunk of a v form does not exchange (2·P flags:
  /// the send to p at p, the receive from p at P + p; see
  /// collective_op_base::start_staged_pairs); empty: every block is
  /// exchanged, empty ones included.
  std::span<const std::uint8_t> absent_blocks;

  /// Bytes of `n` elements.
  std::size_t bytes(std::size_t n) const noexcept { return n * element_size; }
  /// The all-to-all family's block for or from `peer`, as a byte offset into
  /// input or output and a byte length: block `peer` of `count` elements,
  /// or the v forms' counts and displacements (an empty block at offset 0:
  /// its displacement may lie past the buffer's extent).
  std::size_t send_bytes(int peer) const noexcept { return bytes(block_field(send_counts_at, peer)); }
  std::size_t send_offset(int peer) const noexcept {
    return send_bytes(peer) ? bytes(block_field(send_displs_at, peer)) : 0;
  }
  std::size_t recv_bytes(int peer) const noexcept { return bytes(block_field(recv_counts_at, peer)); }
  std::size_t recv_offset(int peer) const noexcept {
    return recv_bytes(peer) ? bytes(block_field(recv_displs_at, peer)) : 0;
  }
  /// Whether the block for `peer` goes out at all (as a message, if empty
  /// an empty one): false only in a staged v chunk past the block's end.
  bool sends_block(int peer) const noexcept {
    return absent_blocks.empty() || !absent_blocks[static_cast<std::size_t>(peer)];
  }
  /// Whether a block from `peer` comes in at all (see sends_block).
  bool receives_block(int peer) const noexcept {
    return absent_blocks.empty() || !absent_blocks[static_cast<std::size_t>(world_size + peer)];
  }
  /// dst[dst_off..] = op(dst, src[src_off..]) over `n` elements; offsets in bytes.
  void reduce(const buffer_desc& dst, std::size_t dst_off, const buffer_desc& src, std::size_t src_off,
              std::size_t n) const noexcept {
    if (n) red->apply(dst.address + dst_off, src.address + src_off, n);
  }
  /// dst[dst_off..] = op(src[src_off..], dst) over `n` elements: reduce() with
  /// the operands the other way round. Two partners that each combine the
  /// other's data with their own get the same bits only when both put the
  /// same rank's data first (min of +0 and -0, a custom op that is not
  /// commutative on ties). A float sum of two NaNs may still keep either
  /// payload: compilers order the operands of `+` freely.
  void reduce_src_first(const buffer_desc& dst, std::size_t dst_off, const buffer_desc& src, std::size_t src_off,
                        std::size_t n) const noexcept {
    if (n) red->apply3(dst.address + dst_off, src.address + src_off, dst.address + dst_off, n);
  }
  /// Local copy of `nbytes` (both buffers in the working domain; not a host staging copy).
  static void copy(const buffer_desc& dst, std::size_t dst_off, const buffer_desc& src, std::size_t src_off,
                   std::size_t nbytes) noexcept {
    if (nbytes && dst.address + dst_off != src.address + src_off)
      std::memmove(dst.address + dst_off, src.address + src_off, nbytes);
  }
  /// Scratch of `nbytes` in the working domain, registered, freed with the operation.
  virtual buffer_desc scratch(std::size_t nbytes) = 0;
  /// Shared memory of every rank (transport/node_memory.hpp) when the
  /// algorithm may use it: the transport has it and the buffers are the
  /// user's own (not a staged chunk, whose slots run concurrently). The same
  /// answer on every rank.
  virtual transport::node_memory* node_memory() noexcept { return nullptr; }
  /// Takes `n` consecutive steps of the communicator's shared-memory
  /// sequence (see algorithm/shared_memory.hpp); the first one's number.
  /// Called before the algorithm's first suspension, so that ranks take
  /// steps in the order they started their collectives.
  virtual std::uint64_t reserve_node_steps(std::uint64_t n) noexcept = 0;
  /// The collective's signature (kind, count, type, op, root: detail/tags.hpp).
  virtual std::uint16_t signature() const noexcept = 0;
  /// Holds this rank's signature check message (see collective_op_base)
  /// until the algorithm's first message to rank + 1, so that both leave in
  /// one write: for algorithms that send to rank + 1 at some step, but not
  /// necessarily the first. Call before the first transfer. Without it the
  /// check leaves beside the first step. A held check that found no message
  /// to ride with leaves when the work is done, or after check_hold_limit.
  virtual void hold_signature_check() noexcept {}

 protected:
  ~collective_context() = default;

 private:
  std::size_t block_field(peer_blocks_layout field, int peer) const noexcept {
    const auto p = static_cast<std::size_t>(peer);
    if (peer_blocks.empty()) return field == send_displs_at || field == recv_displs_at ? p * count : count;
    return peer_blocks[field * static_cast<std::size_t>(world_size) + p];
  }
};

}  // namespace detail
}  // namespace pdcoll

namespace pdcoll::detail {

/// The receiver-independent part of a collective's operation state.
class collective_op_base : public collective_context, public operation_base {
 public:
  collective_op_base(communicator& comm, collective_spec&& spec) noexcept : comm_(&comm), spec_(std::move(spec)) {}
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
    // A held check rides with the first message to rank + 1: posted just
    // before it. The algorithm is mid-step, so the check cannot end the
    // operation here.
    if (check_gate_ && !check_open_ && b.sends_to(check_peer())) release_signature_check();
  }
  void batch_finished(transfer_batch& b) noexcept override {
    if (b.prev_outstanding) b.prev_outstanding->next_outstanding = b.next_outstanding;
    else outstanding_ = b.next_outstanding;
    if (b.next_outstanding) b.next_outstanding->prev_outstanding = b.prev_outstanding;
    b.prev_outstanding = b.next_outstanding = nullptr;
  }
  void wait_started(condition_wait& w) noexcept override {
    w.prev_waiting = nullptr;
    w.next_waiting = waiting_;
    if (waiting_) waiting_->prev_waiting = &w;
    waiting_ = &w;
    if (cancelled_) w.cancel();
  }
  void wait_finished(condition_wait& w) noexcept override {
    if (w.prev_waiting) w.prev_waiting->next_waiting = w.next_waiting;
    else waiting_ = w.next_waiting;
    if (w.next_waiting) w.next_waiting->prev_waiting = w.prev_waiting;
    w.prev_waiting = w.next_waiting = nullptr;
  }

  // collective_context
  transport::node_memory* node_memory() noexcept override { return comm_->node_memory(); }
  std::uint64_t reserve_node_steps(std::uint64_t n) noexcept override { return comm_->reserve_node_steps(n); }
  std::uint16_t signature() const noexcept override { return signature_; }
  void hold_signature_check() noexcept override { check_held_ = true; }

  // operation_base
  void cancel_outstanding() noexcept override {
    cancelled_ = true;
    for (auto* b = outstanding_; b;) {
      auto* next = b->next_outstanding;  // cancel() may complete and unlink b
      b->cancel();
      b = next;
    }
    for (auto* w = waiting_; w; w = w->next_waiting) w->cancel();
  }
  // The hold on the signature check ran out: the next poll() sends it.
  void wake_time_reached() noexcept override { open_signature_check(); }
  // Resumes at most one wait: its coroutine may end (and destroy) the operation.
  std::size_t poll() noexcept override {
    if (small_) return advance_small() ? 1 : 0;
    for (auto* w = waiting_; w; w = w->next_waiting)
      if (w->poll()) return 1;
    return 0;
  }
  bool poll_ready() const noexcept override {
    if (small_) return cancelled_ || small_->can_advance();
    for (auto* w = waiting_; w; w = w->next_waiting)
      if (cancelled_ || w->ready()) return true;
    return false;
  }

  std::string describe() const override {
    std::string pending;
    for (auto* b = outstanding_; b; b = b->next_outstanding) b->describe_pending(pending);
    bool flags = false;
    for (auto* w = waiting_; w; w = w->next_waiting) flags = flags || w != check_gate_;
    if (flags) pending += std::string(pending.empty() ? "" : "; ") + "peers' shared-memory flags";
    if (check_gate_)
      pending += std::string(pending.empty() ? "" : "; ") + "signature check held for a message to rank " +
                 std::to_string(check_peer());
    if (small_) pending += std::string(pending.empty() ? "" : "; ") + small_->describe();
    const std::string size = spec_.peer_blocks.empty() ? std::to_string(spec_.count) + " elements" : "blocks of varied sizes";
    return std::string(name_of(spec_.kind)) + " #" + std::to_string(seq_) + " (" + size + ")" +
           (check_pending_ ? ", signature check pending" : "") +
           (pending.empty() ? std::string() : ": " + pending);
  }

  // collective_context
  buffer_desc scratch(std::size_t nbytes) override {
    auto& block = inline_scratch_used_ < inline_scratch_blocks
                      ? *std::construct_at(&inline_scratch_[inline_scratch_used_++].block)
                      : scratch_.emplace_back();
    return block.allocate(*comm_, working_domain_, nbytes);
  }

 protected:
  ~collective_op_base() { release_inline_scratch(); }

  /// Starts the collective; completes through deliver(). Called once from start().
  void launch() noexcept {
    auto& comm = *comm_;
    communicator::completion_turn turn(comm);  // a collective that ends inside start() completes as it returns
    launch_locked();
    comm.flush_abort_notices_unless_driving();
    comm.register_driver_if_pending();
  }

  /// Completes a collective whose stop was requested before it started.
  /// Its peers will run it, so skipping it would leave this rank one
  /// collective behind them, its next collective paired with their current
  /// one (silently, where the two match). Like a stop during the collective
  /// (design-notes item 5), it aborts the communicator and ends stopped.
  void stop_before_start() noexcept {
    communicator::completion_turn turn(*comm_);
    abort_skipped_locked();
    deliver({}, true);
  }

  /// For an operation destroyed without being started although its
  /// receiver's stop was requested: a when_all (ours or stdexec's) started
  /// with a stop already requested completes stopped without starting its
  /// children, and that skips this collective as surely as a stop before
  /// start would. So it aborts the same way. An operation dropped unstarted
  /// with no stop requested is the caller's choice and aborts nothing.
  void abandon_stopped() noexcept {
    communicator::completion_turn turn(*comm_);
    abort_skipped_locked();
  }
  // Aborts for a collective this rank skips, and sends the notices at once.
  void abort_skipped_locked() noexcept {
    comm_->abort_locked(make_error_code(errc::aborted), true);
    comm_->flush_abort_notices_unless_driving();
  }

  /// Ends the operation with this outcome: its receiver gets it when the
  /// turn ends (communicator::completion_turn). Must be the last thing the
  /// operation does, under the lock.
  virtual void deliver(std::error_code ec, bool stopped) noexcept = 0;

  communicator* comm_;

 private:
  // A stop requested after start() attached its callback and before
  // begin_operation() made the operation visible: the communicator's stop
  // service may have run without finding it. Asked again, the next progress
  // turn cancels it.
  void honour_early_stop() noexcept {
    if (stop_requested.load(std::memory_order_acquire)) comm_->request_stop(*this);
  }

  void launch_locked() noexcept {
    if (spec_.invalid) return deliver(spec_.invalid, false);
    // Rejected before a sequence number is taken, so the ranks stay in step.
    const auto input_path = comm_->path_for(spec_.input.region.kind);
    if (input_path == transport::data_path::unreachable ||
        (spec_.output.region.kind != spec_.input.region.kind &&
         comm_->path_for(spec_.output.region.kind) == transport::data_path::unreachable))
      return deliver(make_error_code(errc::unreachable_domain), false);
    const auto timeout = spec_.timeout.value_or(comm_->options().timeout);
    std::chrono::steady_clock::time_point launched;
    if (comm_->aborted()) return deliver(make_error_code(errc::aborted), false);
    seq_ = comm_->next_sequence();
    signature_ = collective_signature(static_cast<std::uint32_t>(spec_.kind), spec_.count, spec_.red->type_id,
                                      spec_.red->op_id, spec_.root);
    rank = comm_->rank();
    world_size = comm_->world_size();
    count = spec_.count;
    element_size = spec_.red->element_size;
    root = spec_.root;
    red = spec_.red;
    peer_blocks = spec_.peer_blocks;
    try {
      choose_data_path(input_path);
      if (start_small(timeout)) return;  // registers itself only if it has to wait
      if (auto ec = comm_->begin_operation(*this)) return deliver(ec, false);  // the deadline: below
      registered_ = true;
      honour_early_stop();
      launched = std::chrono::steady_clock::now();
      deadline = deadline_after(launched, timeout);
      bind_buffers();
      if (comm_->options().verify_collectives) start_signature_check();
      if (staged_) {
        release_signature_check();  // cannot end the operation: its chunks have not started
        return start_staged();
      }
      task_ = spec_.algorithm(*this);
    } catch (const std::system_error& e) {
      // The receiver gets the code; the text (which allocation, which
      // domain) goes to the log, or "Cannot allocate memory" is all there is.
      log_start_failure(e);
      return finish(e.code());
    } catch (const std::bad_alloc&) {
      return finish(std::make_error_code(std::errc::not_enough_memory));
    }
    // The work may finish inside start() (every transfer failed at once, or
    // completed inline), and with it the check, released by the first batch
    // to rank + 1: launching_ defers the end of the operation to here.
    launching_ = true;
    task_.start(&on_task_done, this);
    launching_ = false;
    if (work_done_ && !check_pending_) return finish(work_error_);  // ends the operation: nothing after
    if (!check_gate_ || check_open_) return;
    if (!check_held_) return release_signature_check();  // may end the operation: nothing after
    // Held: until the first message to rank + 1, at most check_hold_limit
    // (and well inside a short timeout, so a mismatch is not reported as one).
    wake_at = launched + std::min<std::chrono::milliseconds>(check_hold_limit, timeout / 2);
  }

  // Scratch memory of the working domain (device scratch for the direct
  // path, host memory otherwise), registered for as long as it lives.
  struct scratch_block {
    domain_access domain;
    void* handle = nullptr;
    communicator* pool_owner = nullptr;  // host blocks come from (and go back to) its pool
    host_block host;
    transport::memory_region region;
    registration_lease lease;
    scratch_block() = default;
    // Moved when the vector of blocks grows: the handle must move, not be copied.
    scratch_block(scratch_block&& o) noexcept
        : domain(o.domain),
          handle(std::exchange(o.handle, nullptr)),
          pool_owner(o.pool_owner),
          host(std::move(o.host)),
          region(std::exchange(o.region, {})),
          lease(std::move(o.lease)) {}
    scratch_block& operator=(scratch_block&&) = delete;
    ~scratch_block() { release(); }
    buffer_desc allocate(communicator& comm, const domain_access& in, std::size_t nbytes) {
      release();
      domain = in;
      if (nbytes == 0) return {};
      if (domain.ops) {
        handle = domain.ops->allocate(domain.domain, nbytes, region);
      } else {
        pool_owner = &comm;
        host = comm.take_host_block(nbytes);
        region = comm.host_block_region(host, host.size);  // the whole block: the same region (and cache entry) on reuse
      }
      auto got = comm.acquire_registration(region);
      if (!got) throw std::system_error(got.error());
      lease = std::move(*got);
      return desc();
    }
    buffer_desc desc() const noexcept { return {static_cast<std::byte*>(region.address), region.length, lease.descriptor()}; }
    void release() noexcept {
      lease.release();
      if (handle && domain.ops) domain.ops->deallocate(domain.domain, handle);
      handle = nullptr;
      if (host.bytes && pool_owner) pool_owner->return_host_block(std::move(host));
      host = {};
      region = {};
    }
  };

  // One chunk slot of a staged collective (staging.hpp): a sub-collective of
  // the same algorithm over host bounce buffers, whose messages carry the
  // slot in their index and whose transfers the operation can cancel.
  class staged_chunk final : public collective_context {
   public:
    collective_op_base* op = nullptr;
    std::uint32_t slot = 0;
    bool busy = false;
    std::size_t first = 0;   // first element of the chunk inside every block
    std::size_t length = 0;  // elements per block
    collective_task task;
    host_block in_host, out_host;  // from the communicator's pool, returned by the destructor
    registration_lease in_lease, out_lease;
    bool shared = false;  // in place: output is the input's bounce buffer
    // A v form's chunk (start_staged_pairs): its blocks and absent blocks,
    // which peer_blocks and absent_blocks point to.
    std::vector<std::size_t> pair_blocks;
    std::vector<std::uint8_t> pair_absent;

    staged_chunk() = default;
    ~staged_chunk() {
      task.reset();
      in_lease.release();
      out_lease.release();
      if (!op) return;
      if (in_host.bytes) op->comm_->return_host_block(std::move(in_host));
      if (out_host.bytes) op->comm_->return_host_block(std::move(out_host));
    }
    staged_chunk(const staged_chunk&) = delete;
    staged_chunk& operator=(const staged_chunk&) = delete;

    transport::endpoint& endpoint() noexcept override { return op->endpoint(); }
    std::uint64_t tag_for(std::uint32_t index) const noexcept override {
      return op->tag_for(index | (slot << staging_slot_shift));
    }
    std::uint64_t receive_ignore_bits() const noexcept override { return op->receive_ignore_bits(); }
    std::error_code check_received(const transport::completion& c, std::size_t expected) const noexcept override {
      return op->check_received(c, expected);
    }
    void batch_posted(transfer_batch& b) noexcept override { op->batch_posted(b); }
    void batch_finished(transfer_batch& b) noexcept override { op->batch_finished(b); }
    void wait_started(condition_wait& w) noexcept override { op->wait_started(w); }
    void wait_finished(condition_wait& w) noexcept override { op->wait_finished(w); }
    std::uint64_t reserve_node_steps(std::uint64_t n) noexcept override { return op->reserve_node_steps(n); }
    std::uint16_t signature() const noexcept override { return op->signature(); }
    // Scratch is reused chunk after chunk (same algorithm, same call order):
    // bounded memory and one registration per block.
    buffer_desc scratch(std::size_t nbytes) override {
      if (next_scratch_ == scratch_.size()) scratch_.emplace_back();
      auto& block = scratch_[next_scratch_++];
      if (nbytes != 0 && block.region.length >= nbytes) return {block.desc().address, nbytes, block.desc().descriptor};
      return block.allocate(*op->comm_, domain_access{}, nbytes);
    }
    void rewind_scratch() noexcept { next_scratch_ = 0; }

   private:
    std::vector<scratch_block> scratch_;
    std::size_t next_scratch_ = 0;
  };

  // Works out where the algorithm's bytes live: in the user's buffers (host
  // memory, or device memory the transport reaches directly) or in host
  // bounce buffers (device memory the transport cannot reach, staging
  // forced, or a domain the CPU cannot reduce on), given the communicator's
  // path_for() the input's kind (launch_locked() rejected unreachable). Logs
  // the choice at INFO when it changes and counts it in the communicator's
  // data_path_statistics.
  void choose_data_path(transport::data_path path) noexcept {
    const auto kind = spec_.input.region.kind;
    const char* why = "";
    if (path != transport::data_path::host && path != transport::data_path::host_staged &&
        !(spec_.input.domain.reduces_on_device && spec_.output.domain.reduces_on_device)) {
      // The engine reduces and copies with the CPU on the working buffers; on
      // memory it cannot touch (Gaudi HBM) that must happen in host memory.
      path = transport::data_path::host_staged;
      why = " (the domain's memory cannot be reduced or copied in place by the CPU)";
    } else if (path == transport::data_path::host_staged && comm_->options().force_host_staging) {
      why = " (forced: force_host_staging / PDCOLL_FORCE_STAGING)";
    }
    if (detail::current_log_level() >= detail::log_level::info) [[unlikely]]
      log_data_path(kind, path, why);
    comm_->record_data_path(kind, path);
    staged_ = path == transport::data_path::host_staged;
  }
  // The WARN line of a collective that failed to start, with the error's text.
  [[gnu::noinline, gnu::cold]] void log_start_failure(const std::system_error& e) noexcept {
    try {
      detail::log(detail::log_level::warn, comm_->log_name(),
                  std::string("a collective (algorithm ") + (spec_.algorithm_name ? spec_.algorithm_name : "") +
                      ") failed to start: " + e.what());
    } catch (const std::bad_alloc&) {
      // A log line is not worth more than the failure it reports.
    }
  }
  // The INFO line of choose_data_path(), when the path changed.
  [[gnu::noinline, gnu::cold]] void log_data_path(transport::memory_kind kind, transport::data_path path,
                                                 const char* why) noexcept {
    if (comm_->last_data_path() == path) return;  // takes the communicator's (recursive) lock again
    try {
      detail::log(detail::log_level::info, comm_->log_name(),
                  "data path for " + std::string(to_string(kind)) + " memory over " + comm_->transport_name() + ": " +
                      std::string(transport::to_string(path)) + why);
    } catch (const std::bad_alloc&) {
      // A log line is not worth failing the collective for.
    }
  }

  // Registers the user's buffers for the algorithm's transfers (not staged).
  void bind_buffers() {
    if (staged_) return;
    working_domain_ = spec_.input.domain;
    input = bind(spec_.input.region, input_lease_);
    // The same region only: in-place all_gather on rank 0 starts its input
    // (one block) where its output (every block) starts, and an in-place
    // broadcast's non-root sends nothing (an empty input) where it receives.
    if (spec_.output.region.address == spec_.input.region.address &&
        spec_.output.region.length == spec_.input.region.length) {
      output = input;
    } else {
      output = bind(spec_.output.region, output_lease_);
    }
  }

  // ---- the one-step node-memory path (node_small_all_reduce.hpp) -----------------------

  // Takes the path when it applies (the same answer on every rank); true
  // when it did (the operation may have finished; if not, its deadline is
  // `timeout` from when it began waiting).
  bool start_small(std::chrono::milliseconds timeout) noexcept {
    const std::size_t bytes = count * element_size;
    if (spec_.kind != collective_kind::all_reduce || staged_ || world_size < 2 || count == 0 ||
        bytes > std::min(spec_.node_small_bytes, node_mail_capacity))
      return false;
    auto* node = comm_->node_memory();
    if (!node) return false;
    // Peers on other cores are usually a fraction of a microsecond behind:
    // look at their mailboxes for a while (waking them once, at the end)
    // before leaving the wait to the endpoint, which yields and sleeps. With
    // more ranks than CPUs, hand the CPU over to the peers that may share it
    // right here, waking them before each yield (see spin_small). This holds
    // the communicator's lock: another thread starting an operation on it
    // waits as long (spin_plan::bound, at most 50 us).
    const auto spin = node_small_all_reduce::spin_for(world_size);
    const int cpu = spin.crowded ? ::sched_getcpu() : -1;
    const auto marks = comm_->follow_small_all_reduce(seq_);
    small_.emplace(*node, comm_->node_regions(), rank, world_size, seq_, marks.previous, marks.held, signature_,
                   comm_->options().verify_collectives, cpu);
    // The first looks need no clock: where the peers were there first the
    // operation ends without reading it (a clock read is a tenth of an
    // 8-byte all-reduce on 2 cores).
    bool give_way = false;
    if (spin.bound.count() > 0 && poll_small(spin.crowded, give_way)) return true;
    // It waits: from here on the communicator's abort, progress and
    // deadline diagnostics must see it.
    if (auto ec = comm_->begin_operation(*this)) {
      small_.reset();
      deliver(ec, false);
      return true;
    }
    registered_ = true;
    honour_early_stop();
    const auto started = std::chrono::steady_clock::now();
    deadline = deadline_after(started, timeout);
    if (spin.bound.count() > 0 &&
        spin_small(started, std::min(started + spin.bound, deadline), spin.crowded, give_way))
      return true;
    advance_small();
    return true;
  }

  // Up to 32 looks at the mailboxes, without waking peers; true when the
  // operation finished (touch nothing after). Stops early, setting
  // `give_way`, when `crowded` and a peer it waits for may share this
  // rank's CPU.
  bool poll_small(bool crowded, bool& give_way) noexcept {
    for (int i = 0; i < 32; ++i) {
      if (advance_small(false)) return true;
      if (crowded && !small_->peers_elsewhere()) {
        give_way = true;
        return false;
      }
      cpu_relax();
    }
    return false;
  }

  // poll_small() until `until` (the clock read at `now`), a stop request or
  // an abort; true when the operation finished (touch nothing after).
  // `crowded` (more ranks than CPUs): yields whenever a peer it waits for
  // may share this rank's CPU (at once when `give_way`), and at least every
  // node_small_all_reduce::crowded_spin, waking its peers first. A rank that
  // completes one all-reduce and publishes the next before yielding lets
  // the rank it hands over to finish both as well: one handoff per CPU per
  // all-reduce, where going through the endpoint's wait (progress,
  // completion queue, condition) costs about a microsecond more.
  bool spin_small(std::chrono::steady_clock::time_point now, std::chrono::steady_clock::time_point until,
                  bool crowded, bool give_way) noexcept {
    using clock = std::chrono::steady_clock;
    auto give_way_at = crowded ? now + node_small_all_reduce::crowded_spin : until;
    for (;;) {
      if (crowded && (give_way || now >= give_way_at)) {
        small_->wake_peers();  // one that waited too long sleeps until a peer wakes it
        ::sched_yield();
        give_way_at = clock::now() + node_small_all_reduce::crowded_spin;
      }
      give_way = false;
      if (poll_small(crowded, give_way)) return true;
      now = clock::now();
      if (now >= until || stop_requested.load(std::memory_order_relaxed) || comm_->aborted()) return false;
    }
  }

  // Moves the small all-reduce on as far as the peers allow; true when the
  // operation finished (and may be gone: touch nothing after). With
  // `wake_if_waiting` false, peers learn of a publication only once the
  // operation finishes or a later call wakes them.
  bool advance_small(bool wake_if_waiting = true) noexcept {
    if (cancelled_) {
      finish(std::make_error_code(std::errc::operation_canceled));
      return true;
    }
    if (!small_->try_publish(static_cast<const std::byte*>(spec_.input.region.address), count * element_size))
      return false;
    switch (small_->peers()) {
      case node_small_all_reduce::state::waiting:
        if (wake_if_waiting) small_->wake_peers();
        return false;
      case node_small_all_reduce::state::mismatch: finish(make_error_code(errc::collective_mismatch)); return true;
      case node_small_all_reduce::state::ready: break;
    }
    auto* out = static_cast<std::byte*>(spec_.output.region.address);
    small_->reduce_into(out, count, red->apply3, red->apply);
    if (red->finalize) red->finalize(out, count, world_size);
    if (registered_) {
      finish({});
    } else {
      // Finished inside start(), before it had to wait: it holds nothing
      // finish() releases and the communicator never counted it as active.
      small_.reset();
      deliver({}, false);
    }
    return true;
  }

  static std::string to_string(transport::memory_kind kind) {
    switch (kind) {
      case transport::memory_kind::host: return "host";
      case transport::memory_kind::emulated_device: return "emulated_device";
      case transport::memory_kind::gaudi: return "gaudi";
    }
    return "?";
  }

  buffer_desc bind(const transport::memory_region& region, registration_lease& lease) {
    auto got = comm_->acquire_registration(region);
    if (!got) throw std::system_error(got.error());  // the cause (aborted, ENOMEM, the provider's), not a generic one
    lease = std::move(*got);
    return {static_cast<std::byte*>(region.address), region.length, lease.descriptor()};
  }

  static void on_task_done(void* self) noexcept {
    auto* op = static_cast<collective_op_base*>(self);
    op->finish(op->task_.result());
  }

  // ---- the signature check --------------------------------------------------------------
  //
  // Receives ignore the signature bits and check them on completion, which
  // catches a mismatch only when a peer's wrong message lands on a message
  // index this rank's algorithm expects. Different collectives or algorithms
  // (broadcast against recursive doubling, say) often use different indices:
  // nothing would match and every rank would wait for its deadline. So each
  // rank also sends an empty message with a reserved index to its right
  // neighbour and checks the one from its left: if any two ranks disagree,
  // some neighbour pair does, that rank aborts with collective_mismatch and
  // the abort notice fails every peer's operation with it. Cost: one empty
  // message per collective, and an operation completes only once its left
  // neighbour has started it. The message leaves beside the algorithm's
  // first step, so a transport that writes a peer's queued messages at once
  // (io_uring TCP) sends it in the same write as a first-step message to
  // rank + 1. Recursive doubling meets rank + 1 in a later round
  // (algo::detail::hypercube_partner) and holds the check until then
  // (hold_signature_check): sent alone, it cost 4 ranks on 2 cores an extra
  // TCP segment and a pure ACK per collective on half the ranks, 15-20 % of
  // an 8-byte all-reduce's time. A held check leaves alone when the work is
  // done or after check_hold_limit, so a stuck rank still reports a mismatch.


  void start_signature_check() {
    if (world_size < 2) return;
    check_task_ = check_signature(*this);
    check_pending_ = true;
    check_task_.start(&on_check_done, this);
  }

  static collective_task check_signature(collective_op_base& op) {
    if (auto* node = op.comm_->endpoint().shared_node_memory()) return check_through_node(op, *node);
    return check_by_message(op);
  }

  // The receive is posted at once; the send waits at the gate until the
  // operation opens it (release_signature_check, or a poll() once
  // check_open_ is set), so that a held check can leave with a data message.
  static collective_task check_by_message(collective_op_base& op) {
    const auto mismatch = make_error_code(errc::collective_mismatch);
    transfer_batch arrived(op, 1);
    arrived.recv((op.rank + op.world_size - 1) % op.world_size, {}, 0, 0, signature_check_index);  // from the left
    arrived.post();
    const check_gate_state state{&op, &arrived};
    condition_wait gate(op, &collective_op_base::check_may_go, &state);
    op.check_gate_ = &gate;
    const std::error_code cancelled = co_await gate;
    op.check_gate_ = nullptr;
    if (cancelled) {  // the work failed or the communicator aborted: the receive is cancelled too
      const std::error_code receive_error = co_await arrived;
      co_return receive_error == mismatch ? receive_error : cancelled;
    }
    // The left neighbour's check failed (a mismatch): report it now, not
    // once the hold ends; the abort that follows ends every peer's wait.
    if (arrived.done() && arrived.error()) co_return arrived.error();
    transfer_batch sent(op, 1);
    sent.send(op.check_peer(), {}, 0, 0, signature_check_index);
    const std::error_code send_error = co_await sent;
    const std::error_code receive_error = co_await arrived;
    co_return receive_error == mismatch || !send_error ? receive_error : send_error;
  }

  struct check_gate_state {
    const collective_op_base* op;
    const transfer_batch* arrived;
  };
  // The check's send may go, or need not: the left neighbour's check failed.
  static bool check_may_go(const void* self) noexcept {
    const auto& s = *static_cast<const check_gate_state*>(self);
    return s.op->check_open_ || (s.arrived->done() && s.arrived->error());
  }

  // Where this rank's check goes: its right neighbour.
  int check_peer() const noexcept { return (rank + 1) % world_size; }

  // Lets the check's send go at the next poll().
  void open_signature_check() noexcept {
    check_open_ = true;
    wake_at = std::chrono::steady_clock::time_point::max();
  }
  // Sends the check now if it waits at the gate. Resumes the check's
  // coroutine, which may end the operation unless the work is still running.
  void release_signature_check() noexcept {
    open_signature_check();
    if (check_gate_) check_gate_->poll();
  }

  // With node memory the check needs no message (node_check in node_layout.hpp).
  static collective_task check_through_node(collective_op_base& op, transport::node_memory& node) {
    const node_check c{&node, op.rank, op.world_size, op.seq_};
    condition_wait room(op, &node_check::room, &c);
    if (auto ec = co_await room) co_return ec;
    c.post(op.signature_);
    wake_peers(node, op.rank, op.world_size);
    condition_wait arrived(op, &node_check::arrived, &c);
    if (auto ec = co_await arrived) co_return ec;
    const bool same = c.left_matches(op.signature_);
    c.complete();
    wake_peers(node, op.rank, op.world_size);
    co_return same ? std::error_code{} : make_error_code(errc::collective_mismatch);
  }

  static void on_check_done(void* self) noexcept {
    auto* op = static_cast<collective_op_base*>(self);
    op->check_pending_ = false;
    op->check_error_ = op->check_task_.result();
    // Cancels the algorithm's transfers here and tells every peer.
    if (op->check_error_ == make_error_code(errc::collective_mismatch)) op->comm_->abort_locked(op->check_error_, true);
    if (op->work_done_ && !op->launching_) op->finish(op->work_error_);  // may destroy the operation: nothing after
  }

  // ---- the staged path (staging.hpp) ----------------------------------------------------

  // Sets up the slots and starts the first chunks. Under the lock.
  void start_staged() {
    const std::size_t es = spec_.red->element_size;
    if (!spec_.peer_blocks.empty()) return start_staged_pairs();
    in_layout_ = staged_layout::of(spec_.input.region.length, spec_.count, es);
    out_layout_ = staged_layout::of(spec_.output.region.length, spec_.count, es);
    const bool per_rank_blocks = spec_.kind == collective_kind::all_gather ||
                                 spec_.kind == collective_kind::reduce_scatter ||
                                 spec_.kind == collective_kind::all_to_all;
    chunk_elements_ = staging_chunk_elements(staging_chunk_bytes(), es,
                                             per_rank_blocks ? static_cast<std::size_t>(world_size) : 1);
    chunks_ = spec_.count == 0 ? 1 : (spec_.count + chunk_elements_ - 1) / chunk_elements_;
    const bool in_place = spec_.output.region.address == spec_.input.region.address &&
                          spec_.output.region.length == spec_.input.region.length;
    const std::size_t chunk_bytes = std::min(chunk_elements_, spec_.count) * es;
    make_staged_slots();
    for (std::size_t i = 0; i < slot_count_; ++i) {
      auto& c = slots_[i];
      c.shared = in_place;
      c.in_host = comm_->take_host_block(in_layout_.blocks * chunk_bytes);
      c.in_lease = host_lease(c.in_host);
      if (!in_place) {
        c.out_host = comm_->take_host_block(out_layout_.blocks * chunk_bytes);
        c.out_lease = host_lease(c.out_host);
      }
    }
    pump_staged();
  }

  // The chunk slots for chunks_ chunks (at most staging_depth), with what
  // every chunk of this operation shares.
  void make_staged_slots() {
    slot_count_ = std::min<std::size_t>(staging_depth, chunks_);
    slots_ = std::make_unique<staged_chunk[]>(slot_count_);
    for (std::size_t i = 0; i < slot_count_; ++i) {
      auto& c = slots_[i];
      c.op = this;
      c.slot = static_cast<std::uint32_t>(i);
      c.rank = rank;
      c.world_size = world_size;
      c.element_size = spec_.red->element_size;
      c.root = root;
      c.red = red;
    }
  }

  // The v forms' staged path. Each pair's block goes in chunks of
  // pair_chunk_ elements, and a block of n elements takes n / pair_chunk_ + 1
  // of them, the last one shorter (maybe empty). Both ends of a pair know n,
  // so they agree on the sequence without asking anyone; a count they
  // disagree on shows as a chunk of the wrong length, a collective_mismatch.
  // Chunk k of this rank exchanges slice k of every block that has one (the
  // others are absent_blocks), so this rank runs as many chunks as its
  // longest block needs, and a peer's chunk k meets it in chunk k. Host
  // memory per slot: P slices in, P out (all_gatherv: one in), each at most
  // pair_chunk_ elements, about staging_chunk_bytes() each way.
  void start_staged_pairs() {
    const std::size_t es = spec_.red->element_size;
    const auto P = static_cast<std::size_t>(world_size);
    pair_chunk_ = std::max<std::size_t>(1, staging_chunk_bytes() / es / P);
    std::size_t longest = 0;
    for (int p = 0; p < world_size; ++p) longest = std::max({longest, send_bytes(p) / es, recv_bytes(p) / es});
    chunks_ = longest / pair_chunk_ + 1;
    pair_stride_ = std::min(pair_chunk_, longest);
    const bool one_input = spec_.kind == collective_kind::all_gatherv;
    make_staged_slots();
    for (std::size_t i = 0; i < slot_count_; ++i) {
      auto& c = slots_[i];
      c.pair_blocks.resize(4 * P);
      c.pair_absent.resize(2 * P);
      c.peer_blocks = c.pair_blocks;
      c.absent_blocks = c.pair_absent;
      c.in_host = comm_->take_host_block((one_input ? 1 : P) * pair_stride_ * es);
      c.in_lease = host_lease(c.in_host);
      c.out_host = comm_->take_host_block(P * pair_stride_ * es);
      c.out_lease = host_lease(c.out_host);
    }
    pump_staged();
  }

  // Chunk k's blocks on slot c (start_staged_pairs): slice k of each block
  // (elements [k·pair_chunk_, (k+1)·pair_chunk_) of it) where the block
  // reaches it, at pair_stride_ elements per peer in the host buffers
  // (all_gatherv's one input slice at 0).
  void set_pair_chunk(staged_chunk& c, std::size_t k) noexcept {
    const std::size_t es = spec_.red->element_size, P = static_cast<std::size_t>(world_size);
    const std::size_t begin = k * pair_chunk_;
    const bool one_input = spec_.kind == collective_kind::all_gatherv;
    auto slice = [&](std::size_t n, std::uint8_t& absent) {
      absent = n / pair_chunk_ < k;
      return absent ? 0 : std::min(pair_chunk_, n - begin);
    };
    for (std::size_t p = 0; p < P; ++p) {
      const int q = static_cast<int>(p);
      c.pair_blocks[send_counts_at * P + p] = slice(send_bytes(q) / es, c.pair_absent[p]);
      c.pair_blocks[send_displs_at * P + p] = one_input ? 0 : p * pair_stride_;
      c.pair_blocks[recv_counts_at * P + p] = slice(recv_bytes(q) / es, c.pair_absent[P + p]);
      c.pair_blocks[recv_displs_at * P + p] = p * pair_stride_;
    }
    c.first = begin;  // elements into each user block; c.length is unused
    c.count = 0;
    c.input = {c.in_host.bytes.get(), c.in_host.size, c.in_lease.descriptor()};
    c.output = {c.out_host.bytes.get(), c.out_host.size, c.out_lease.descriptor()};
  }

  registration_lease host_lease(const host_block& b) {
    auto got = comm_->acquire_registration(comm_->host_block_region(b, b.size));
    if (!got) throw std::system_error(got.error());
    return std::move(*got);
  }

  // Copies chunk c's slice of every block between the device buffer and the
  // slot's host buffer (blocks packed back to back on the host side).
  std::size_t copy_chunk(const user_buffer& dev, const staged_layout& layout, host_block& host,
                         const staged_chunk& c, bool to_host) {
    if (!peer_blocks.empty()) return copy_pairs(dev, host, c, to_host);
    const std::size_t es = spec_.red->element_size;
    const std::size_t bytes = c.length * es, offset = c.first * es;
    if (bytes == 0 || layout.blocks == 0) return 0;
    for (std::size_t b = 0; b < layout.blocks; ++b) {
      const std::uint64_t address = dev.device_address + b * layout.block_bytes + offset;
      std::byte* h = host.bytes.get() + b * bytes;
      if (to_host) dev.domain.ops->to_host(dev.domain.domain, address, h, bytes);
      else dev.domain.ops->from_host(dev.domain.domain, address, h, bytes);
    }
    return layout.blocks * bytes;
  }

  // A v form's chunk copies (start_staged_pairs): slice c.first of each
  // block of the user's buffer that the chunk exchanges, to or from its
  // place in the host buffer; all_gatherv's input slice once.
  std::size_t copy_pairs(const user_buffer& dev, host_block& host, const staged_chunk& c, bool to_host) {
    std::size_t copied = 0;
    const std::size_t first = bytes(c.first);
    for (int p = 0; p < world_size; ++p) {
      const std::size_t length = to_host ? c.send_bytes(p) : c.recv_bytes(p);
      if (length == 0) continue;
      if (to_host) {
        dev.domain.ops->to_host(dev.domain.domain, dev.device_address + send_offset(p) + first,
                                host.bytes.get() + c.send_offset(p), length);
        copied += length;
        if (spec_.kind == collective_kind::all_gatherv) break;  // every peer's slice is this one
      } else {
        dev.domain.ops->from_host(dev.domain.domain, dev.device_address + recv_offset(p) + first,
                                  host.bytes.get() + c.recv_offset(p), length);
        copied += length;
      }
    }
    return copied;
  }

  // Starts chunks in order, chunk k on slot k % slot_count_ once that slot is
  // idle, until every chunk has run, then finishes. The slot of a chunk is
  // the same on every rank: its message indices must be (staging.hpp), and
  // handing the next chunk to whichever slot went idle first let two ranks
  // run one chunk on different slots, and match one chunk's messages to
  // another's receives, when their transfers completed in different orders.
  // Re-entrant calls (a chunk that completes while being started) only mark
  // their slot idle; the outermost call keeps going. Under the lock.
  void pump_staged() noexcept {
    if (pumping_) return;
    pumping_ = true;
    while (!staged_error_ && !cancelled_ && next_chunk_ != chunks_) {
      auto& c = slots_[next_chunk_ % slot_count_];
      if (c.busy) break;
      start_chunk(c);
    }
    pumping_ = false;
    for (std::size_t i = 0; i < slot_count_; ++i)
      if (slots_[i].busy) return;
    if (staged_error_) return finish(staged_error_);
    if (next_chunk_ == chunks_) return finish({});
    if (cancelled_) finish(std::make_error_code(std::errc::operation_canceled));
  }

  void start_chunk(staged_chunk& c) noexcept {
    const std::size_t k = next_chunk_++;
    if (!peer_blocks.empty()) {
      set_pair_chunk(c, k);
    } else {
      c.first = k * chunk_elements_;
      c.length = std::min(chunk_elements_, spec_.count - std::min(spec_.count, c.first));
      c.count = c.length;
      const std::size_t es = spec_.red->element_size;
      c.input = {c.in_host.bytes.get(), in_layout_.blocks * c.length * es, c.in_lease.descriptor()};
      c.output = c.shared ? c.input
                          : buffer_desc{c.out_host.bytes.get(), out_layout_.blocks * c.length * es,
                                        c.out_lease.descriptor()};
    }
    if (c.input.bytes == 0) c.input = {};
    if (c.output.bytes == 0) c.output = {};
    c.rewind_scratch();
    c.busy = true;
    try {
      const std::size_t copied = copy_chunk(spec_.input, in_layout_, c.in_host, c, true);
      comm_->record_staging(copied, 1);
      c.task = spec_.algorithm(c);
    } catch (const std::system_error& e) {
      return chunk_failed(c, e.code());
    } catch (const std::bad_alloc&) {
      return chunk_failed(c, std::make_error_code(std::errc::not_enough_memory));
    }
    c.task.start(&on_chunk_done, &c);
  }

  void chunk_failed(staged_chunk& c, std::error_code ec) noexcept {
    c.busy = false;
    if (!staged_error_) staged_error_ = ec;
    cancel_outstanding();  // the other slot's transfers end (cancelled_) so the operation can finish
  }

  static void on_chunk_done(void* self) noexcept {
    auto& c = *static_cast<staged_chunk*>(self);
    auto* op = c.op;
    std::error_code ec = c.task.result();
    c.task.reset();  // suspended at its final point
    if (!ec && !op->staged_error_) {
      try {
        const std::size_t copied = op->copy_chunk(op->spec_.output, op->out_layout_, c.shared ? c.in_host : c.out_host,
                                                  c, false);
        op->comm_->record_staging(copied, 0);
      } catch (const std::system_error& e) {
        ec = e.code();
      }
    }
    c.busy = false;
    if (ec && !op->staged_error_) {
      op->staged_error_ = ec;
      op->cancel_outstanding();
    }
    op->pump_staged();  // may finish (and destroy) the operation: nothing after
  }

  // Runs once, when the algorithm's coroutine (or the last staged chunk) has
  // finished, or when the collective never started.
  void finish(std::error_code ec) noexcept {
    // The work is done: wait for the signature check (cancelled if the work
    // failed), or for the algorithm's start() to return (launch_locked).
    if (check_pending_ || launching_) {
      work_done_ = true;
      work_error_ = ec;
      if (ec) cancel_outstanding();
      open_signature_check();  // a held check that found no message to ride with: the next poll() sends it
      return;
    }
    if (check_error_ && (!ec || check_error_ == make_error_code(errc::collective_mismatch))) ec = check_error_;
    check_task_.reset();
    task_.reset();  // the frame is suspended at its final point (or absent)
    small_.reset();
    slots_.reset();
    release_inline_scratch();
    scratch_.clear();
    input_lease_.release();
    output_lease_.release();
    bool stopped = false;
    if (ec) {
      // Stopped only when the stop is what ended the work: a real failure
      // that raced the request (a mismatch, a lost peer) keeps its reason.
      const bool user_stop = ec == std::errc::operation_canceled && stop_requested.load(std::memory_order_acquire) &&
                             !timed_out && !comm_->aborted();
      if (user_stop) {
        // Peers are mid-collective and would wait for this rank until their
        // deadline: a stopped collective aborts the communicator (as
        // ncclCommAbort does) so they fail fast instead.
        stopped = true;
        comm_->abort_locked(make_error_code(errc::aborted), true);
      } else {
        ec = comm_->failure_reason(*this, ec);
        // Any failure leaves this rank out of step with its peers (they wait
        // for messages it will not send): abort so that they fail fast too.
        comm_->abort_locked(ec, true);
      }
    }
    if (registered_) comm_->end_operation(*this);
    deliver(ec, stopped);
  }

  collective_spec spec_;
  std::uint64_t seq_ = 0;
  std::uint16_t signature_ = 0;
  collective_task task_;
  collective_task check_task_;
  condition_wait* check_gate_ = nullptr;  // where a message check's send waits, while it does
  bool check_open_ = false;               // the check's send may go
  bool check_held_ = false;               // the algorithm asked to hold it (hold_signature_check)
  bool launching_ = false;                // inside the algorithm's start(): finish() only records
  bool check_pending_ = false;
  bool work_done_ = false;
  std::error_code work_error_;
  std::error_code check_error_;
  transfer_batch* outstanding_ = nullptr;
  condition_wait* waiting_ = nullptr;  // suspended condition waits, polled by poll()
  bool staged_ = false;
  bool cancelled_ = false;
  bool registered_ = false;  // begun on the communicator (begin_operation): it may wait, be aborted, time out
  std::optional<node_small_all_reduce> small_;  // the one-step node-memory path, while it runs
  domain_access working_domain_;
  registration_lease input_lease_;
  registration_lease output_lease_;
  // Scratch blocks: the first ones inside the operation (most algorithms
  // take one or two), the rest in the vector. The inline ones are built when
  // taken: an all-reduce on the node-memory path takes none, and building
  // two empty blocks was a tenth of its instructions.
  union inline_scratch_block {
    inline_scratch_block() noexcept {}
    ~inline_scratch_block() {}
    scratch_block block;
  };
  static constexpr std::size_t inline_scratch_blocks = 2;
  inline_scratch_block inline_scratch_[inline_scratch_blocks];
  std::size_t inline_scratch_used_ = 0;
  void release_inline_scratch() noexcept {
    for (std::size_t i = 0; i < inline_scratch_used_; ++i) std::destroy_at(&inline_scratch_[i].block);
    inline_scratch_used_ = 0;
  }
  std::vector<scratch_block> scratch_;
  // staged path
  std::unique_ptr<staged_chunk[]> slots_;
  std::size_t slot_count_ = 0;
  staged_layout in_layout_, out_layout_;
  std::size_t chunk_elements_ = 1;
  std::size_t pair_chunk_ = 1;   // a v form's chunk of each block, elements (start_staged_pairs)
  std::size_t pair_stride_ = 0;  // elements per peer in its chunks' host buffers
  std::size_t chunks_ = 0;
  std::size_t next_chunk_ = 0;
  bool pumping_ = false;
  std::error_code staged_error_;
};

/// The operation state of a collective for receiver R.
template <class R>
class collective_operation final : public collective_op_base {
 public:
  using operation_state_concept = exec::operation_state_t;  ///< marks this type as an operation state

  /// Takes the spec over (a temporary or a moved-from sender's: one move of
  /// its 272 bytes on the way in, not one per constructor).
  collective_operation(communicator& comm, collective_spec&& spec, R rcvr) noexcept(
      std::is_nothrow_move_constructible_v<R>)
      : collective_op_base(comm, std::move(spec)), rcvr_(std::move(rcvr)) {}

  /// Aborts the communicator when the operation was never started because
  /// its stop was requested (see abandon_stopped).
  ~collective_operation() {
    if (!started_ && exec::get_stop_token(exec::get_env(rcvr_)).stop_requested()) abandon_stopped();
  }

  void start() noexcept {
    started_ = true;
    if (exec::get_stop_token(exec::get_env(rcvr_)).stop_requested()) return stop_before_start();
    stop_.watch(rcvr_, *comm_, *this);  // a stop from here on is honoured once launched
    launch();
  }

 private:
  void deliver(std::error_code ec, bool stopped) noexcept override {
    stop_.detach();
    outcome_ = ec;
    stopped_ = stopped;
    comm_->complete_after_turn(*this);
  }
  void complete_receiver() noexcept override {
    if (stopped_) exec::set_stopped(std::move(rcvr_));
    else if (outcome_) exec::set_error(std::move(rcvr_), std::move(outcome_));
    else exec::set_value(std::move(rcvr_));
  }

  R rcvr_;
  stop_link<R> stop_;
  std::error_code outcome_;
  bool stopped_ = false;
  bool started_ = false;
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
  using sender_concept = exec::sender_t;  ///< marks this type as a sender
  /// The ways it completes (see the class comment).
  using completion_signatures = exec::completion_signatures<exec::set_value_t(), exec::set_error_t(std::error_code),
                                                            exec::set_stopped_t()>;
  /// The same completions in the C++26 static consteval form.
  template <class Self, class... Env>
  static consteval auto get_completion_signatures() {
    return completion_signatures{};
  }

  /// Made by the collective functions in collectives.hpp.
  collective_sender(communicator& comm, detail::collective_spec&& spec) noexcept
      : comm_(&comm), spec_(std::move(spec)) {}

  /// Connects to a receiver; the operation state must not move afterwards.
  template <class R>
  detail::collective_operation<R> connect(R rcvr) const& {
    return detail::collective_operation<R>(*comm_, detail::collective_spec(spec_), std::move(rcvr));
  }
  /// Connects a sender that is not used again (its spec moves into the operation).
  template <class R>
  detail::collective_operation<R> connect(R rcvr) && {
    return detail::collective_operation<R>(*comm_, std::move(spec_), std::move(rcvr));
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
