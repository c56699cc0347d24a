// File: detail/collective_task.hpp — the coroutine an algorithm is written as,
// and the batches of transfers it awaits.
//
// An algorithm is a coroutine returning `collective_task` (a std::error_code
// when it ends). It posts transfers in batches and `co_await`s them:
//
//     transfer_batch step(ctx);
//     step.send(right, data, offset, bytes, index);
//     step.recv(left, scratch, 0, bytes, index);
//     if (auto ec = co_await step) co_return ec;
//     ctx.reduce(data, offset, scratch, 0, count);
//
// The batch's transfers live in the coroutine frame (up to four inside the
// batch itself, more on the heap), so a completion leads straight back to its
// transfer and batch, with no lookup and, for a usual step, no allocation;
// the frames themselves come from a per-thread cache (frame_cache.hpp). A
// batch whose transfer fails cancels its siblings and completes only when
// every transfer has completed: the transport never holds a pointer into a
// frame that is gone.
#pragma once

#include <pdcoll/detail/frame_cache.hpp>
#include <pdcoll/detail/tags.hpp>
#include <pdcoll/error.hpp>
#include <pdcoll/transport/endpoint.hpp>

#include <algorithm>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

namespace pdcoll::detail {

/// A buffer as the engine moves it: the fabric address, its size and its
/// registration descriptor (nullptr when the transport needs none).
struct buffer_desc {
  std::byte* address = nullptr;
  std::size_t bytes = 0;
  void* descriptor = nullptr;
};

/// Coroutine type of algorithms and their sub-steps. Lazily started;
/// `co_await`ing a task runs it to completion (symmetric transfer) and yields
/// its error code.
class [[nodiscard]] collective_task {
 public:
  struct promise_type;
  using handle = std::coroutine_handle<promise_type>;

  struct final_awaiter {
    bool await_ready() const noexcept { return false; }
    std::coroutine_handle<> await_suspend(handle h) noexcept {
      auto& p = h.promise();
      if (p.continuation) return p.continuation;
      if (p.on_done) p.on_done(p.owner);  // may destroy the frame: touch nothing after
      return std::noop_coroutine();
    }
    void await_resume() const noexcept {}
  };

  struct promise_type {
    std::error_code result;
    std::coroutine_handle<> continuation;
    void (*on_done)(void* owner) noexcept = nullptr;
    void* owner = nullptr;

    /// Frames come from the thread's frame cache (frame_cache.hpp): a
    /// collective repeated in a loop reuses them.
    static void* operator new(std::size_t bytes) { return frame_cache::allocate(bytes); }
    static void operator delete(void* frame, std::size_t bytes) noexcept { frame_cache::deallocate(frame, bytes); }

    collective_task get_return_object() noexcept { return collective_task{handle::from_promise(*this)}; }
    std::suspend_always initial_suspend() const noexcept { return {}; }
    final_awaiter final_suspend() const noexcept { return {}; }
    void return_value(std::error_code ec) noexcept { result = ec; }
    void unhandled_exception() noexcept {
      try {
        throw;
      } catch (const std::system_error& e) {
        result = e.code();
      } catch (const std::bad_alloc&) {
        result = std::make_error_code(std::errc::not_enough_memory);
      } catch (...) {
        result = make_error_code(errc::invalid_argument);
      }
    }
  };

  collective_task() = default;
  explicit collective_task(handle h) noexcept : h_(h) {}
  collective_task(collective_task&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  collective_task& operator=(collective_task&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, {});
    }
    return *this;
  }
  ~collective_task() { reset(); }

  /// Awaiting a sub-task runs it and yields its result.
  auto operator co_await() && noexcept {
    struct awaiter {
      handle child;
      bool await_ready() const noexcept { return !child; }
      std::coroutine_handle<> await_suspend(std::coroutine_handle<> parent) noexcept {
        child.promise().continuation = parent;
        return child;
      }
      std::error_code await_resume() const noexcept { return child ? child.promise().result : std::error_code{}; }
    };
    return awaiter{h_};
  }

  /// Starts a top-level task; `on_done(owner)` runs when it finishes.
  void start(void (*on_done)(void*) noexcept, void* owner) noexcept {
    h_.promise().on_done = on_done;
    h_.promise().owner = owner;
    h_.resume();
  }
  /// The finished task's result.
  std::error_code result() const noexcept { return h_.promise().result; }
  /// Destroys the frame (only when not running).
  void reset() noexcept {
    if (h_) h_.destroy();
    h_ = {};
  }
  explicit operator bool() const noexcept { return static_cast<bool>(h_); }

 private:
  handle h_;
};

class transfer_batch;
class condition_wait;

/// What a batch needs from the operation that owns it.
class batch_owner {
 public:
  /// The endpoint transfers are posted on.
  virtual transport::endpoint& endpoint() noexcept = 0;
  /// Tag of message `index` of this operation.
  virtual std::uint64_t tag_for(std::uint32_t index) const noexcept = 0;
  /// Bits a receive ignores (checked by check_received).
  virtual std::uint64_t receive_ignore_bits() const noexcept = 0;
  /// Validates a received message's tag (signature) and size.
  virtual std::error_code check_received(const transport::completion& c, std::size_t expected) const noexcept = 0;
  /// Called when a batch posts / finishes, so an abort can cancel what is outstanding.
  virtual void batch_posted(transfer_batch& b) noexcept = 0;
  virtual void batch_finished(transfer_batch& b) noexcept = 0;
  /// Called when a condition_wait suspends / is resumed (the owner polls it).
  virtual void wait_started(condition_wait& w) noexcept = 0;
  virtual void wait_finished(condition_wait& w) noexcept = 0;

 protected:
  ~batch_owner() = default;
};

/// A set of sends and receives posted together and awaited together.
class transfer_batch {
 public:
  /// A batch of `owner`'s operation; `expected_transfers` reserves space.
  explicit transfer_batch(batch_owner& owner, std::size_t expected_transfers = 2) : owner_(&owner) {
    if (expected_transfers > inline_transfers) grow(expected_transfers);
  }
  transfer_batch(const transfer_batch&) = delete;
  transfer_batch& operator=(const transfer_batch&) = delete;
  /// Algorithms await every batch they post. Should one be left outstanding
  /// (an early return on an error path), its transfers are cancelled and
  /// drained here, bounded by one second, because the transport still points
  /// into this object.
  ~transfer_batch() {
    if (!posted_ || remaining_ == 0) return;
    cancel();
    auto& ep = owner_->endpoint();
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (remaining_ != 0 && std::chrono::steady_clock::now() < until) {
      if (ep.progress() == 0) ep.wait(std::chrono::steady_clock::now() + std::chrono::milliseconds(1));
    }
    if (linked_) owner_->batch_finished(*this);
  }

  /// Adds a send of `bytes` at `buf.address + offset` to `peer` as message `index`.
  void send(int peer, const buffer_desc& buf, std::size_t offset, std::size_t bytes, std::uint32_t index) {
    add(false, peer, buf, offset, bytes, index);
  }
  /// Adds a receive of exactly `bytes` into `buf.address + offset` from `peer` as message `index`.
  void recv(int peer, const buffer_desc& buf, std::size_t offset, std::size_t bytes, std::uint32_t index) {
    add(true, peer, buf, offset, bytes, index);
  }
  /// True when nothing was added.
  bool empty() const noexcept { return size_ == 0; }
  /// True when the batch holds a send to `peer`.
  bool sends_to(int peer) const noexcept {
    for (const auto& t : transfers())
      if (!t.receive && t.peer == peer) return true;
    return false;
  }

  /// Posts every transfer now (await later). Posting twice is a no-op.
  void post() noexcept {
    if (posted_) return;
    posted_ = true;
    remaining_ = size_;
    if (remaining_ == 0) return;
    owner_->batch_posted(*this);
    linked_ = true;
    auto& ep = owner_->endpoint();
    // An index whose tag could be another message's (tags.hpp) fails the
    // batch before any of it is posted: nothing then waits for a peer.
    for (const auto& t : transfers())
      if (t.index > max_message_index && t.index != signature_check_index) error_ = make_error_code(errc::invalid_argument);
    for (auto& t : transfers()) {
      if (error_) {  // an earlier post failed: the rest are never posted
        t.done = true;
        if (--remaining_ == 0) finish();
        continue;
      }
      std::error_code ec =
          t.receive ? ep.post_recv(t.peer, t.address, t.bytes, owner_->tag_for(t.index),
                                   owner_->receive_ignore_bits(), t.descriptor, &t)
                    : ep.post_send(t.peer, t.address, t.bytes, owner_->tag_for(t.index), t.descriptor, &t);
      if (ec) {
        t.done = true;
        fail(ec);
        if (--remaining_ == 0) finish();
      }
    }
  }

  /// Cancels every outstanding transfer (their completions still arrive).
  void cancel() noexcept {
    if (!posted_) return;
    auto& ep = owner_->endpoint();
    for (auto& t : transfers())
      if (!t.done) ep.cancel(&t);
  }

  /// Appends "; recv from P (index I, B B)" for each transfer not yet completed.
  void describe_pending(std::string& out) const {
    for (const auto& t : transfers()) {
      if (t.done || !posted_) continue;
      out += std::string(out.empty() ? "" : "; ") + (t.receive ? "recv from " : "send to ") + std::to_string(t.peer) +
             " (index " + std::to_string(t.index) + ", " + std::to_string(t.bytes) + " B)";
    }
  }

  /// True once every posted transfer completed.
  bool done() const noexcept { return posted_ && remaining_ == 0; }
  /// The first error among the transfers.
  std::error_code error() const noexcept { return error_; }

  /// Awaiting posts the batch (if needed) and resumes when all transfers completed.
  auto operator co_await() noexcept {
    struct awaiter {
      transfer_batch& b;
      bool await_ready() noexcept {
        b.post();
        return b.done();
      }
      void await_suspend(std::coroutine_handle<> h) noexcept { b.waiter_ = h; }
      std::error_code await_resume() const noexcept { return b.error_; }
    };
    return awaiter{*this};
  }

  /// Intrusive link for the owner's list of outstanding batches.
  transfer_batch* next_outstanding = nullptr;
  transfer_batch* prev_outstanding = nullptr;

 private:
  struct transfer : transport::completion_context {
    transfer_batch* batch = nullptr;
    bool receive = false;
    bool done = false;
    int peer = 0;
    std::uint32_t index = 0;
    void* address = nullptr;
    std::size_t bytes = 0;
    void* descriptor = nullptr;
  };
  static_assert(std::is_trivially_copyable_v<transfer> && std::is_trivially_destructible_v<transfer>);
  /// Transfers a batch holds without allocating: an algorithm's step is
  /// usually a send and a receive, plus the signature check's send.
  static constexpr std::size_t inline_transfers = 4;

  std::span<transfer> transfers() noexcept { return {items_, size_}; }
  std::span<const transfer> transfers() const noexcept { return {items_, size_}; }

  // Room for `capacity` transfers on the heap (only before the batch is
  // posted: the transport holds pointers to posted transfers).
  void grow(std::size_t capacity) {
    auto bigger = std::make_unique<transfer[]>(capacity);
    std::copy(items_, items_ + size_, bigger.get());
    heap_ = std::move(bigger);
    items_ = heap_.get();
    capacity_ = capacity;
  }

  void add(bool receive, int peer, const buffer_desc& buf, std::size_t offset, std::size_t bytes,
           std::uint32_t index) {
    if (posted_) throw std::logic_error("pdcoll: transfer added to a batch after it was posted");
    // Its registration covers buf alone; an algorithm that reached past it
    // would hand the provider memory the descriptor does not cover.
    if (offset > buf.bytes || bytes > buf.bytes - offset)
      throw std::logic_error("pdcoll: transfer outside its buffer");
    if (size_ == capacity_) grow(2 * capacity_);
    auto& t = *new (&items_[size_++]) transfer{};
    t.on_complete = &on_transfer_complete;
    t.batch = this;
    t.receive = receive;
    t.peer = peer;
    t.index = index;
    t.address = buf.address + offset;
    t.bytes = bytes;
    t.descriptor = buf.descriptor;
  }

  static void on_transfer_complete(transport::completion_context* ctx, const transport::completion& c) noexcept {
    auto* t = static_cast<transfer*>(ctx);
    auto* b = t->batch;
    t->done = true;
    std::error_code ec = c.error;
    if (!ec && t->receive) ec = b->owner_->check_received(c, t->bytes);
    if (ec) b->fail(ec);
    if (--b->remaining_ == 0) b->finish();
  }

  void fail(std::error_code ec) noexcept {
    if (error_) return;
    error_ = ec;
    cancel();
  }

  void finish() noexcept {
    if (linked_) {
      linked_ = false;
      owner_->batch_finished(*this);
    }
    if (auto h = std::exchange(waiter_, {})) h.resume();
  }

  batch_owner* owner_;
  alignas(transfer) std::byte inline_[inline_transfers * sizeof(transfer)];
  transfer* items_ = reinterpret_cast<transfer*>(inline_);
  std::size_t size_ = 0;
  std::size_t capacity_ = inline_transfers;
  std::unique_ptr<transfer[]> heap_;
  std::size_t remaining_ = 0;
  bool posted_ = false;
  bool linked_ = false;
  std::error_code error_;
  std::coroutine_handle<> waiter_;
};

/// An await on a condition that no completion announces (a flag in shared
/// memory written by a peer): the owner polls it from progress, and the
/// transport's wait() is told to return when some wait's condition holds.
///
///     condition_wait published(ctx, [](const void* a) noexcept { return ...; }, &state);
///     if (auto ec = co_await published) co_return ec;
///
/// cancel() (an abort, the deadline) makes the next poll resume it with
/// operation_canceled.
class condition_wait {
 public:
  /// The condition: true once the awaited state is there (`arg` is passed through).
  using predicate = bool (*)(const void* arg) noexcept;

  /// A wait of `owner`'s operation for `condition(arg)`.
  condition_wait(batch_owner& owner, predicate condition, const void* arg) noexcept
      : owner_(&owner), ready_(condition), arg_(arg) {}
  condition_wait(const condition_wait&) = delete;
  condition_wait& operator=(const condition_wait&) = delete;
  /// A frame destroyed while suspended here (the operation ended) unlinks it.
  ~condition_wait() {
    if (waiter_) owner_->wait_finished(*this);
  }

  /// True when the condition holds.
  bool ready() const noexcept { return ready_(arg_); }
  /// Resumes the awaiting coroutine when the condition holds or the wait was
  /// cancelled; true when it did (the coroutine may have ended the operation).
  bool poll() noexcept {
    if (!waiter_ || !(cancelled_ || ready())) return false;
    owner_->wait_finished(*this);
    std::exchange(waiter_, {}).resume();
    return true;
  }
  /// Ends the wait with operation_canceled at its next poll.
  void cancel() noexcept { cancelled_ = true; }

  /// Suspends unless the condition already holds (or the wait was cancelled).
  auto operator co_await() noexcept {
    struct awaiter {
      condition_wait& w;
      bool await_ready() const noexcept { return w.cancelled_ || w.ready(); }
      void await_suspend(std::coroutine_handle<> h) noexcept {
        w.waiter_ = h;
        w.owner_->wait_started(w);
      }
      std::error_code await_resume() const noexcept {
        return w.cancelled_ ? std::make_error_code(std::errc::operation_canceled) : std::error_code{};
      }
    };
    return awaiter{*this};
  }

  /// Intrusive link for the owner's list of suspended waits.
  condition_wait* next_waiting = nullptr;
  condition_wait* prev_waiting = nullptr;

 private:
  batch_owner* owner_;
  predicate ready_;
  const void* arg_;
  bool cancelled_ = false;
  std::coroutine_handle<> waiter_;
};

}  // namespace pdcoll::detail
