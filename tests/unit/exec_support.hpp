// File: tests/unit/exec_support.hpp — shared helpers for the exec unit tests:
// a recording receiver, a sender completed from outside (a stand-in for a
// transport operation with fi_cancel semantics), and bounded waits.
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <optional>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>
#include <variant>

#include "pdcoll/exec/exec.hpp"

namespace pdcoll::exec::test {

using namespace std::chrono_literals;

/// Spins (yielding) until pred() or the deadline; returns pred().
template <class Pred>
bool wait_for(Pred pred, std::chrono::milliseconds limit = 5000ms) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return pred();
    std::this_thread::yield();
  }
  return true;
}

/// An environment with a stop token (and nothing else).
struct token_env {
  inplace_stop_token token;
  inplace_stop_token query(get_stop_token_t) const noexcept { return token; }
};

/// What a recording_receiver saw.
struct record {
  std::atomic<int> completions{0};
  std::atomic<bool> done{false};
  int value = 0;
  bool stopped = false;
  std::error_code error;
  std::exception_ptr exception;
};

/// A receiver for senders completing with (), (int), error_code,
/// exception_ptr or stopped; counts completions.
struct recording_receiver {
  using receiver_concept = receiver_t;
  record* rec;
  inplace_stop_token token{};

  void set_value() noexcept { finish(); }
  void set_value(int v) noexcept {
    rec->value = v;
    finish();
  }
  void set_value(int a, int b) noexcept {
    rec->value = a * 100 + b;
    finish();
  }
  void set_error(std::error_code ec) noexcept {
    rec->error = ec;
    finish();
  }
  void set_error(std::exception_ptr e) noexcept {
    rec->exception = std::move(e);
    finish();
  }
  void set_stopped() noexcept {
    rec->stopped = true;
    finish();
  }
  token_env get_env() const noexcept { return {token}; }

 private:
  void finish() noexcept {
    rec->completions.fetch_add(1, std::memory_order_relaxed);
    rec->done.store(true, std::memory_order_release);
  }
};

/// The meeting point between an external_sender's operation and whoever
/// completes it from outside (another thread, a fake progress driver).
struct external_slot {
  struct op_base {
    virtual void complete(int value) noexcept = 0;
    virtual void complete_stopped() noexcept = 0;

   protected:
    ~op_base() = default;
  };
  std::atomic<op_base*> op{nullptr};
  /// Set before start: a stop request is only noted in stop_seen, and the
  /// operation ends when end_stopped() is called (a cancel that takes a while).
  bool stop_late = false;
  std::atomic<bool> stop_seen{false};
  /// Completes the started operation with set_stopped. Returns false if no
  /// operation has started.
  bool end_stopped() noexcept {
    op_base* o = op.exchange(nullptr, std::memory_order_acq_rel);
    if (o == nullptr) return false;
    o->complete_stopped();
    return true;
  }
  /// Completes the started operation with `value` (if it was not stopped
  /// first). Returns false if no operation has started.
  bool fire(int value) noexcept {
    op_base* o = op.exchange(nullptr, std::memory_order_acq_rel);
    if (o == nullptr) return false;
    o->complete(value);
    return true;
  }
};

/// A sender completed from outside through an external_slot, or with
/// set_stopped when its receiver's stop token is triggered: exactly one of the
/// two reaches the receiver, as for a transport op that races fi_cancel.
/// Test-only simplification: the operation state must outlive any thread that
/// may still call fire() on its slot (the tests join before destroying it).
struct external_sender {
  using sender_concept = sender_t;
  using completion_signatures =
      ::pdcoll::exec::completion_signatures<set_value_t(int), set_stopped_t()>;
  template <class Self, class... Env>
  static consteval auto get_completion_signatures() {
    return completion_signatures{};
  }

  external_slot* slot;

  template <class Receiver>
  struct operation final : external_slot::op_base {
    using operation_state_concept = operation_state_t;
    using token_type = stop_token_of_t<env_of_t<Receiver>>;
    struct on_stop {
      operation* self;
      void operator()() noexcept { self->cancel(); }
    };

    operation(external_slot* s, Receiver r) : slot(s), rcvr(std::move(r)) {}
    operation(operation&&) = delete;

    void start() noexcept {
      callback.emplace(get_stop_token(exec::get_env(rcvr)), on_stop{this});
      if (claimed.load(std::memory_order_acquire)) return;  // stopped already
      slot->op.store(this, std::memory_order_release);
    }
    void complete(int value) noexcept override {
      if (claimed.exchange(true, std::memory_order_acq_rel)) return;
      callback.reset();
      exec::set_value(std::move(rcvr), value);
    }
    void complete_stopped() noexcept override {
      if (claimed.exchange(true, std::memory_order_acq_rel)) return;
      callback.reset();
      exec::set_stopped(std::move(rcvr));
    }
    void cancel() noexcept {
      if (slot->stop_late) {
        slot->stop_seen.store(true, std::memory_order_release);
        return;
      }
      if (claimed.exchange(true, std::memory_order_acq_rel)) return;
      // Withdraw from the slot unless the completer already took us (then it
      // finds `claimed` set and backs off).
      op_base* expected = this;
      slot->op.compare_exchange_strong(expected, nullptr, std::memory_order_acq_rel);
      exec::set_stopped(std::move(rcvr));
    }

    external_slot* slot;
    Receiver rcvr;
    std::atomic<bool> claimed{false};
    std::optional<typename token_type::template callback_type<on_stop>> callback;
  };

  template <class Receiver>
  operation<Receiver> connect(Receiver rcvr) const {
    return {slot, std::move(rcvr)};
  }
};

/// A sender that completes only by being stopped (a receive that never
/// arrives); counts how often it was stopped.
struct stop_only_sender {
  using sender_concept = sender_t;
  using completion_signatures = ::pdcoll::exec::completion_signatures<set_stopped_t()>;
  template <class Self, class... Env>
  static consteval auto get_completion_signatures() {
    return completion_signatures{};
  }
  std::atomic<int>* stops = nullptr;

  template <class Receiver>
  struct operation {
    using operation_state_concept = operation_state_t;
    using token_type = stop_token_of_t<env_of_t<Receiver>>;
    struct on_stop {
      operation* self;
      void operator()() noexcept {
        if (self->stops != nullptr) self->stops->fetch_add(1);
        exec::set_stopped(std::move(self->rcvr));
      }
    };
    operation(std::atomic<int>* s, Receiver r) : stops(s), rcvr(std::move(r)) {}
    operation(operation&&) = delete;
    void start() noexcept { callback.emplace(get_stop_token(exec::get_env(rcvr)), on_stop{this}); }
    std::atomic<int>* stops;
    Receiver rcvr;
    std::optional<typename token_type::template callback_type<on_stop>> callback;
  };

  template <class Receiver>
  operation<Receiver> connect(Receiver rcvr) const {
    return {stops, std::move(rcvr)};
  }
};

}  // namespace pdcoll::exec::test
