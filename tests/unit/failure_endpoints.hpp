// File: tests/unit/failure_endpoints.hpp — endpoint doubles for the failure
// and bad-input tests: a wrapper that counts what is posted, can ignore
// cancels (as libfabric's shm does for a receive matched to a dead peer) and
// can declare a memory kind unreachable; and a runner of N communicators over
// such wrappers on the inproc transport.
#pragma once

#include <pdcoll/communicator.hpp>
#include <pdcoll/detail/tags.hpp>
#include <pdcoll/transport/inproc.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

namespace pdcoll::testing {

/// What a wrapped endpoint saw; shared with the test (the communicator owns the endpoint).
struct endpoint_counters {
  std::atomic<int> sends{0};
  std::atomic<int> receives{0};
  std::atomic<int> cancels{0};
  std::atomic<int> closes{0};
  /// Posts of the data path (abort notices and the control receive excluded).
  int data_posts() const noexcept { return data_sends.load() + data_receives.load(); }
  std::atomic<int> data_sends{0};
  std::atomic<int> data_receives{0};
  /// wait() calls that returned at once (endpoint_faults::early_wakeups).
  std::atomic<int> early_wakeups{0};
  /// Signature-check messages posted (the reserved message index).
  std::atomic<int> check_sends{0};
  /// progress() calls so far.
  std::atomic<std::uint64_t> progress_calls{0};
  /// newest_completion_first: completions handed out while an older one was
  /// still held (so the fault really reordered something).
  std::atomic<int> reordered{0};
  /// A posted send, and how many progress() calls came before it (two sends
  /// with the same count were handed to the transport in one turn).
  struct posted_send {
    int peer;
    std::uint64_t tag;
    std::uint64_t turn;
  };
  /// Every send in posting order. Written under the communicator's lock
  /// (by whichever thread drives it): read it once the ranks' threads joined.
  std::vector<posted_send> posted_sends;
};

/// How a wrapped endpoint misbehaves.
struct endpoint_faults {
  bool ignore_cancel = false;  ///< cancel() does nothing (close() still ends everything)
  std::optional<transport::memory_kind> unreachable;  ///< path_for(kind) answers unreachable
  /// The first this-many wait() calls return at once with nothing ready, as a
  /// doorbell rung for a flag the rank needs, but not the last one.
  int early_wakeups = 0;
  /// Data completions are held back and handed out one per progress() call,
  /// the newest first: on this rank, operations complete in about the
  /// reverse of the order in which the transport finished them (a transport
  /// may complete in any order; the other ranks see the inner order).
  bool newest_completion_first = false;
  /// Every memory kind needs registration, and every registration fails with this.
  std::optional<std::error_code> refuse_registration;
};

/// Forwards to an inner endpoint, counting and injecting endpoint_faults.
class wrapped_endpoint final : public transport::endpoint {
 public:
  wrapped_endpoint(std::unique_ptr<transport::endpoint> inner, std::shared_ptr<endpoint_counters> counters,
                   endpoint_faults faults)
      : inner_(std::move(inner)), counters_(std::move(counters)), faults_(faults) {}

  int rank() const noexcept override { return inner_->rank(); }
  int world_size() const noexcept override { return inner_->world_size(); }
  std::string name() const override { return "wrapped:" + inner_->name(); }
  std::error_code post_send(int peer, const void* buffer, std::size_t length, std::uint64_t tag, void* descriptor,
                            transport::completion_context* ctx) noexcept override {
    ++counters_->sends;
    if (!is_control(tag)) ++counters_->data_sends;
    if (!is_control(tag) && (tag & pdcoll::detail::tag_index_mask) == pdcoll::detail::tag_index_mask)
      ++counters_->check_sends;
    counters_->posted_sends.push_back({peer, tag, counters_->progress_calls.load()});
    if (!is_control(tag)) hold_completion(ctx);
    return unhold_on_error(inner_->post_send(peer, buffer, length, tag, descriptor, ctx), ctx);
  }
  std::error_code post_recv(int peer, void* buffer, std::size_t length, std::uint64_t tag, std::uint64_t ignore,
                            void* descriptor, transport::completion_context* ctx) noexcept override {
    ++counters_->receives;
    if (!is_control(tag)) ++counters_->data_receives;
    if (!is_control(tag)) hold_completion(ctx);
    return unhold_on_error(inner_->post_recv(peer, buffer, length, tag, ignore, descriptor, ctx), ctx);
  }
  void cancel(transport::completion_context* ctx) noexcept override {
    ++counters_->cancels;
    if (!faults_.ignore_cancel) inner_->cancel(ctx);
  }
  void close() noexcept override {
    ++counters_->closes;
    inner_->close();
  }
  std::size_t progress() noexcept override {
    ++counters_->progress_calls;
    if (!faults_.newest_completion_first) return inner_->progress();
    wrapped_endpoint* const outer = std::exchange(delivering_, this);
    std::size_t done = inner_->progress();  // the held ones (data) land in held_
    delivering_ = outer;
    if (!held_.empty()) {
      if (held_.size() > 1) ++counters_->reordered;
      held_completion h = held_.back();
      held_.pop_back();
      h.ctx->on_complete = h.on_complete;
      h.on_complete(h.ctx, h.result);
      ++done;
    }
    return done;
  }
  void wait(std::chrono::steady_clock::time_point deadline) noexcept override {
    if (counters_->early_wakeups.load() < faults_.early_wakeups) {  // only the driving thread calls wait()
      ++counters_->early_wakeups;
      return;
    }
    if (!held_.empty()) return;  // the next progress() has one to hand out
    inner_->wait(deadline);
  }
  transport::node_memory* shared_node_memory() noexcept override { return inner_->shared_node_memory(); }
  void set_wait_condition(transport::wait_condition condition) noexcept override {
    inner_->set_wait_condition(condition);
  }
  transport::data_path path_for(transport::memory_kind kind) const noexcept override {
    if (faults_.unreachable && *faults_.unreachable == kind) return transport::data_path::unreachable;
    return inner_->path_for(kind);
  }
  bool needs_registration(transport::memory_kind kind) const noexcept override {
    return faults_.refuse_registration || inner_->needs_registration(kind);
  }
  std::error_code register_region(const transport::memory_region& region,
                                  transport::registration_handle& out) noexcept override {
    if (faults_.refuse_registration) return *faults_.refuse_registration;
    return inner_->register_region(region, out);
  }
  void deregister(transport::registration_handle& handle) noexcept override { inner_->deregister(handle); }

 private:
  // detail/tags.hpp: control messages (abort notices) have a tag of their own.
  static bool is_control(std::uint64_t tag) noexcept { return tag == pdcoll::detail::control_tag(); }

  // newest_completion_first: a completion the inner transport delivered,
  // and the caller's callback to hand it to later.
  struct held_completion {
    transport::completion_context* ctx;
    void (*on_complete)(transport::completion_context*, const transport::completion&) noexcept;
    transport::completion result;
  };
  // Routes `ctx`'s completion into held_ (restored before it is handed on).
  void hold_completion(transport::completion_context* ctx) noexcept {
    if (!faults_.newest_completion_first) return;
    callbacks_.emplace_back(ctx, ctx->on_complete);
    ctx->on_complete = [](transport::completion_context* self, const transport::completion& c) noexcept {
      // The contract: completions come from inside progress(), on its
      // thread, once per posted context; a transport that broke it would
      // otherwise lose the completion and leave a test to its deadline.
      wrapped_endpoint* ep = delivering_;
      if (!ep) {
        std::fprintf(stderr, "wrapped_endpoint: a completion outside progress()\n");
        std::abort();
      }
      auto& cbs = ep->callbacks_;
      for (std::size_t i = 0; i < cbs.size(); ++i) {
        if (cbs[i].first != self) continue;
        ep->held_.push_back({self, cbs[i].second, c});
        cbs[i] = cbs.back();
        cbs.pop_back();
        return;
      }
      std::fprintf(stderr, "wrapped_endpoint: a completion for a context never posted\n");
      std::abort();
    };
  }

  // A failed post completes nothing: the context gets its callback back.
  std::error_code unhold_on_error(std::error_code ec, transport::completion_context* ctx) noexcept {
    if (!ec || !faults_.newest_completion_first) return ec;
    for (std::size_t i = 0; i < callbacks_.size(); ++i) {
      if (callbacks_[i].first != ctx) continue;
      ctx->on_complete = callbacks_[i].second;
      callbacks_[i] = callbacks_.back();
      callbacks_.pop_back();
      break;
    }
    return ec;
  }

  static inline thread_local wrapped_endpoint* delivering_ = nullptr;
  std::vector<std::pair<transport::completion_context*,
                        void (*)(transport::completion_context*, const transport::completion&) noexcept>>
      callbacks_;  // contexts posted and not yet completed, with their callbacks
  std::vector<held_completion> held_;

  std::unique_ptr<transport::endpoint> inner_;
  std::shared_ptr<endpoint_counters> counters_;
  endpoint_faults faults_;
};

/// Options with `timeout` and no progress thread (the test's threads drive).
inline communicator_options short_timeout(std::chrono::milliseconds timeout) {
  communicator_options o;
  o.timeout = timeout;
  o.progress_thread = false;
  return o;
}

/// N communicators over wrapped inproc endpoints, created together.
struct wrapped_world {
  std::shared_ptr<transport::inproc::fabric> fabric;
  std::vector<std::shared_ptr<endpoint_counters>> counters;
  std::vector<std::unique_ptr<communicator>> comms;

  /// `faults_of(rank)` picks each rank's faults; `node_memory_bytes`, when
  /// not 0, gives the ranks node memory (inproc::fabric::enable_node_memory).
  wrapped_world(int world_size, const std::function<endpoint_faults(int)>& faults_of,
                communicator_options options = {}, std::size_t node_memory_bytes = 0)
      : fabric(transport::inproc::fabric::create(world_size)) {
    if (node_memory_bytes != 0) fabric->enable_node_memory(node_memory_bytes);
    for (int r = 0; r < world_size; ++r) {
      counters.push_back(std::make_shared<endpoint_counters>());
      comms.push_back(std::make_unique<communicator>(
          std::make_unique<wrapped_endpoint>(fabric->endpoint_for(r), counters.back(), faults_of(r)), options));
    }
  }

  /// Runs body(rank, comm) on every rank in its own thread; rethrows the first exception.
  void run(const std::function<void(int, communicator&)>& body) {
    std::vector<std::exception_ptr> errors(comms.size());
    std::vector<std::thread> threads;
    for (std::size_t r = 0; r < comms.size(); ++r) {
      threads.emplace_back([&, r] {
        try {
          body(static_cast<int>(r), *comms[r]);
        } catch (...) {
          errors[r] = std::current_exception();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }
};

}  // namespace pdcoll::testing
