// File: exec/env.hpp — what algorithms with their own stop source (when_all,
// with_deadline) give their children: an environment whose stop token is the
// algorithm's, and the forwarding of the parent's stop requests into it.
#pragma once

#include <atomic>
#include <concepts>
#include <optional>
#include <type_traits>

#include "pdcoll/exec/stop_token.hpp"
#include "pdcoll/exec/vocabulary.hpp"

namespace pdcoll::exec::detail {

/// The environment `Base` with `get_stop_token` answered by an
/// inplace_stop_token (the token of an algorithm's own stop source, e.g.
/// when_all's). Every other query is forwarded to `Base`. Cost: the size of
/// Base plus one pointer.
template <class Base>
struct stop_token_env {
  inplace_stop_token token;
  Base base;

  inplace_stop_token query(get_stop_token_t) const noexcept { return token; }

  template <class Query>
    requires(!std::same_as<Query, get_stop_token_t>) &&
            requires(const Base& b, const Query& q) { b.query(q); }
  decltype(auto) query(const Query& q) const noexcept(noexcept(base.query(q))) {
    return base.query(q);
  }
};

/// Forwards a stop request from the parent's token (type Token) to an
/// algorithm's own inplace_stop_source, without racing the algorithm's
/// completion.
///
/// Why the "slot": the forwarding callback runs request_stop() on the
/// algorithm's source; the children may complete inside that call and the
/// algorithm would then complete its receiver, which may destroy the operation
/// (and the source) while request_stop() is still on the stack. So the
/// forwarder holds one of the owner's completion slots from arm() until either
/// the callback finished forwarding (it calls `release(owner)`), or the owner
/// disarmed it first (disarm() returns true: the owner releases the slot
/// itself). The owner completes only when every slot is released, and calls
/// reset() before completing its receiver.
template <class Token>
class stop_forwarder {
 public:
  using release_fn = void(void* owner) noexcept;

  /// Registers on `token`. If stop was already requested the forwarding runs
  /// here, before arm() returns.
  void arm(Token token, inplace_stop_source* source, release_fn* release, void* owner) noexcept {
    source_ = source;
    release_ = release;
    owner_ = owner;
    state_.store(armed, std::memory_order_relaxed);
    if constexpr (!unstoppable_token<Token>) callback_.emplace(std::move(token), on_stop{this});
  }

  /// The owner's children are done: stop forwarding. True if the callback had
  /// not fired (the owner must release the forwarder's slot itself); false if
  /// it fired (the callback releases the slot when it has finished).
  bool disarm() noexcept { return state_.exchange(disarmed, std::memory_order_acq_rel) == armed; }

  /// Deregisters the callback; call before completing the owner's receiver.
  void reset() noexcept {
    if constexpr (!unstoppable_token<Token>) callback_.reset();
  }

 private:
  static constexpr int armed = 0;
  static constexpr int fired = 1;
  static constexpr int disarmed = 2;

  struct on_stop {
    stop_forwarder* self;
    void operator()() noexcept {
      if (self->state_.exchange(fired, std::memory_order_acq_rel) != armed) return;
      // Copy out: releasing the slot may complete the owner and destroy *self.
      release_fn* release = self->release_;
      void* owner = self->owner_;
      self->source_->request_stop();
      release(owner);
    }
  };

  inplace_stop_source* source_ = nullptr;
  release_fn* release_ = nullptr;
  void* owner_ = nullptr;
  std::atomic<int> state_{disarmed};
  std::optional<stop_callback_for_t<Token, on_stop>> callback_;
};

}  // namespace pdcoll::exec::detail
