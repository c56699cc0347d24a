// File: transport/inproc.hpp — the transport::endpoint contract over threads
// of one process, for fast unit tests of algorithms and communicators.
//
// Messages are copied eagerly: a send matches a posted receive (copy into the
// user's buffer) or is buffered as unexpected, and completes at once. Every
// completion is queued on its owner's endpoint and delivered from progress(),
// as the contract requires. `fabric::kill(rank)` makes a rank vanish, so peer
// failure paths can be tested without processes. close() ends a rank's posted
// receives with operation_canceled; sends to a closed rank complete with
// errc::peer_lost, as they do to a killed one.
#pragma once

#include <pdcoll/error.hpp>
#include <pdcoll/transport/endpoint.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

namespace pdcoll::transport::inproc {

namespace detail {

struct posted_receive {
  int peer;
  void* buffer;
  std::size_t length;
  std::uint64_t tag;
  std::uint64_t ignore;
  completion_context* ctx;
};

struct unexpected_message {
  std::uint64_t arrival;  // order across senders, for any_peer receives
  std::uint64_t tag;
  std::vector<unsigned char> payload;
};

struct queued_completion {
  completion_context* ctx;
  completion result;
};

inline bool tags_match(std::uint64_t want, std::uint64_t ignore, std::uint64_t got) noexcept {
  return ((want ^ got) & ~ignore) == 0;
}

// One rank's matching state and completion queue, shared with the senders.
struct mailbox {
  std::mutex mutex;
  std::condition_variable ready;
  std::list<posted_receive> posted;
  // One queue per sender: a receive scans only its peer's queue, whose
  // matching message is almost always at the front.
  std::vector<std::deque<unexpected_message>> unexpected;
  std::uint64_t arrivals = 0;
  std::vector<queued_completion> completions;
  // Written under `mutex`; also read by peers that hold only their own
  // mailbox's (post_recv), hence atomic. kill() marks it before it fails the
  // peers' receives under their mutexes, so such a read is never stale
  // for a receive that kill() would not fail.
  std::atomic<bool> dead{false};
  bool closed = false;  // this rank's endpoint was closed: it posts nothing more

  void push_completion(completion_context* ctx, completion result) {
    completions.push_back({ctx, std::move(result)});
    ready.notify_all();
  }
};

}  // namespace detail

/// The shared "wire" between the endpoints of one in-process job.
/// Cost: one mutex per rank; every message is one memcpy (two if unexpected).
class fabric : public std::enable_shared_from_this<fabric> {
 public:
  /// Creates the fabric for `world_size` ranks; obtain endpoints with endpoint_for().
  static std::shared_ptr<fabric> create(int world_size) {
    return std::shared_ptr<fabric>(new fabric(world_size));
  }
  /// The endpoint of `rank` (create each rank's endpoint once).
  std::unique_ptr<endpoint> endpoint_for(int rank);
  /// Simulates the death of `rank`: its pending and future receives never
  /// match, sends to it and receives from it complete with errc::peer_lost.
  void kill(int rank) {
    std::vector<int> others;
    {
      auto& box = *boxes_[rank];
      std::lock_guard lock(box.mutex);
      box.dead.store(true, std::memory_order_release);
    }
    for (int r = 0; r < world_size_; ++r) {
      if (r == rank) continue;
      auto& box = *boxes_[r];
      std::lock_guard lock(box.mutex);
      for (auto it = box.posted.begin(); it != box.posted.end();) {
        if (it->peer == rank) {
          box.push_completion(it->ctx, {make_error_code(errc::peer_lost), 0, 0, rank});
          it = box.posted.erase(it);
        } else {
          ++it;
        }
      }
    }
  }
  /// Number of ranks.
  int world_size() const noexcept { return world_size_; }
  /// Gives the endpoints node memory (transport/node_memory.hpp) of `bytes`
  /// per rank, zero-filled, as the shm transport has: threads stand in for
  /// processes. Call before endpoint_for(). Sizes below
  /// min_node_memory_bytes give none, as on shm. `bulk_through_slots` is
  /// what node_memory::bulk_through_slots() answers (on shm a measurement).
  void enable_node_memory(std::size_t bytes, bool bulk_through_slots = false) {
    regions_.clear();
    if (bytes < min_node_memory_bytes) return;
    node_bytes_ = bytes;
    bulk_through_slots_ = bulk_through_slots;
    for (int i = 0; i < world_size_; ++i) {
      auto* p = static_cast<std::byte*>(::operator new(bytes, std::align_val_t{4096}));
      std::memset(p, 0, bytes);
      regions_.emplace_back(p);
    }
  }

 private:
  friend class inproc_endpoint;
  struct region_deleter {
    void operator()(std::byte* p) const noexcept { ::operator delete(p, std::align_val_t{4096}); }
  };
  explicit fabric(int world_size) : world_size_(world_size) {
    for (int i = 0; i < world_size; ++i) {
      boxes_.push_back(std::make_unique<detail::mailbox>());
      boxes_.back()->unexpected.resize(static_cast<std::size_t>(world_size));
    }
  }
  int world_size_;
  std::vector<std::unique_ptr<detail::mailbox>> boxes_;
  std::size_t node_bytes_ = 0;
  bool bulk_through_slots_ = false;
  std::vector<std::unique_ptr<std::byte, region_deleter>> regions_;  // node memory, one per rank
};

/// One rank's endpoint on an inproc fabric.
class inproc_endpoint final : public endpoint, private node_memory {
 public:
  inproc_endpoint(std::shared_ptr<fabric> f, int rank) : fabric_(std::move(f)), rank_(rank) {}

  int rank() const noexcept override { return rank_; }
  int world_size() const noexcept override { return fabric_->world_size_; }
  std::string name() const override { return "inproc"; }

  std::error_code post_send(int peer, const void* buffer, std::size_t length, std::uint64_t tag,
                            void*, completion_context* ctx) noexcept override {
    if (peer < 0 || peer >= world_size()) return make_error_code(errc::root_out_of_range);
    auto& own = mine();
    if (closed()) return make_error_code(errc::aborted);
    auto& box = *fabric_->boxes_[peer];
    completion send_result{{}, length, tag, peer};
    {
      std::lock_guard lock(box.mutex);
      if (box.dead.load(std::memory_order_relaxed) || box.closed) {
        send_result.error = make_error_code(errc::peer_lost);
      } else {
        auto it = std::find_if(box.posted.begin(), box.posted.end(), [&](const detail::posted_receive& r) {
          return (r.peer == rank_ || r.peer == any_peer) && detail::tags_match(r.tag, r.ignore, tag);
        });
        if (it != box.posted.end()) {
          completion recv_result{{}, length, tag, rank_};
          if (length > it->length) {
            recv_result.error = make_error_code(errc::collective_mismatch);
          } else if (length != 0) {
            std::memcpy(it->buffer, buffer, length);
          }
          box.push_completion(it->ctx, recv_result);
          box.posted.erase(it);
        } else {
          try {
            auto bytes = static_cast<const unsigned char*>(buffer);
            box.unexpected[static_cast<std::size_t>(rank_)].push_back(
                {box.arrivals++, tag, std::vector<unsigned char>(bytes, bytes + length)});
          } catch (const std::bad_alloc&) {
            return std::make_error_code(std::errc::not_enough_memory);
          }
        }
      }
    }
    std::lock_guard lock(own.mutex);
    own.push_completion(ctx, send_result);
    return {};
  }

  std::error_code post_recv(int peer, void* buffer, std::size_t length, std::uint64_t tag,
                            std::uint64_t ignore, void*, completion_context* ctx) noexcept override {
    if (peer != any_peer && (peer < 0 || peer >= world_size())) return make_error_code(errc::root_out_of_range);
    auto& box = mine();
    std::lock_guard lock(box.mutex);
    if (box.closed) return make_error_code(errc::aborted);
    // The earliest matching unexpected message from `peer` (or from anyone).
    std::deque<detail::unexpected_message>* queue = nullptr;
    std::deque<detail::unexpected_message>::iterator found;
    const int first = peer == any_peer ? 0 : peer, last = peer == any_peer ? world_size() - 1 : peer;
    for (int src = first; src <= last; ++src) {
      auto& q = box.unexpected[static_cast<std::size_t>(src)];
      auto it = std::find_if(q.begin(), q.end(),
                             [&](const detail::unexpected_message& m) { return detail::tags_match(tag, ignore, m.tag); });
      if (it != q.end() && (!queue || it->arrival < found->arrival)) {
        queue = &q;
        found = it;
      }
    }
    if (queue) {
      const int src = static_cast<int>(queue - box.unexpected.data());
      completion result{{}, found->payload.size(), found->tag, src};
      if (found->payload.size() > length) {
        result.error = make_error_code(errc::collective_mismatch);
      } else if (!found->payload.empty()) {
        std::memcpy(buffer, found->payload.data(), found->payload.size());
      }
      queue->erase(found);
      box.push_completion(ctx, result);
      return {};
    }
    if (peer != any_peer && fabric_->boxes_[peer]->dead.load(std::memory_order_acquire)) {
      box.push_completion(ctx, {make_error_code(errc::peer_lost), 0, 0, peer});
      return {};
    }
    try {
      box.posted.push_back({peer, buffer, length, tag, ignore, ctx});
    } catch (const std::bad_alloc&) {
      return std::make_error_code(std::errc::not_enough_memory);
    }
    return {};
  }

  void cancel(completion_context* ctx) noexcept override {
    // Sends complete eagerly, so only a posted, unmatched receive can be cancelled.
    auto& box = mine();
    std::lock_guard lock(box.mutex);
    auto it = std::find_if(box.posted.begin(), box.posted.end(),
                           [&](const detail::posted_receive& r) { return r.ctx == ctx; });
    if (it == box.posted.end()) return;
    box.push_completion(ctx, {std::make_error_code(std::errc::operation_canceled), 0, 0, it->peer});
    box.posted.erase(it);
  }

  /// Ends every posted receive with operation_canceled (delivered by the
  /// next progress()); later posts fail with errc::aborted.
  void close() noexcept override {
    auto& box = mine();
    std::lock_guard lock(box.mutex);
    if (box.closed) return;
    box.closed = true;
    for (auto& r : box.posted)
      box.push_completion(r.ctx, {std::make_error_code(std::errc::operation_canceled), 0, 0, r.peer});
    box.posted.clear();
  }

  /// Runs the completions queued for this rank. Re-entrant: a completion
  /// may call progress() again (an algorithm unwinding from an exception
  /// drains its batches), and that inner call first runs what this one
  /// took off the queue but has not run yet; each runs once.
  std::size_t progress() noexcept override {
    auto& box = mine();
    if (ready_next_ == ready_.size()) {
      ready_.clear();
      ready_next_ = 0;
      std::lock_guard lock(box.mutex);
      if (box.completions.empty()) return 0;
      ready_.swap(box.completions);
    }
    // Completions run without the lock: their handlers post new operations.
    // By index and by copy: an inner call may run the rest and clear ready_.
    std::size_t n = 0;
    while (ready_next_ < ready_.size()) {
      const detail::queued_completion c = ready_[ready_next_++];
      c.ctx->on_complete(c.ctx, c.result);
      ++n;
    }
    ready_.clear();
    ready_next_ = 0;
    return n;
  }

  void wait(std::chrono::steady_clock::time_point deadline) noexcept override {
    auto& box = mine();
    std::unique_lock lock(box.mutex);
    box.ready.wait_until(lock, deadline, [&] {
      return !box.completions.empty() || (condition_.ready && condition_.ready(condition_.arg));
    });
  }
  node_memory* shared_node_memory() noexcept override { return fabric_->regions_.empty() ? nullptr : this; }
  void set_wait_condition(wait_condition condition) noexcept override { condition_ = condition; }

  data_path path_for(memory_kind kind) const noexcept override {
    // Threads share one address space: host and emulated device memory are
    // both reachable directly (the emulated device's mapping is the "DMA" target).
    return kind == memory_kind::gaudi ? data_path::host_staged
           : kind == memory_kind::host ? data_path::host
                                       : data_path::hmem_iface;
  }
  bool needs_registration(memory_kind) const noexcept override { return false; }
  std::error_code register_region(const memory_region& region, registration_handle& out) noexcept override {
    out = registration_handle{nullptr, reinterpret_cast<std::uintptr_t>(region.address), nullptr};
    return {};
  }
  void deregister(registration_handle& handle) noexcept override { handle = {}; }

 private:
  detail::mailbox& mine() noexcept { return *fabric_->boxes_[rank_]; }
  bool closed() noexcept {
    std::lock_guard lock(mine().mutex);
    return mine().closed;
  }
  // node_memory (fabric::enable_node_memory)
  std::byte* region(int rank) const noexcept override { return fabric_->regions_[static_cast<std::size_t>(rank)].get(); }
  std::size_t region_bytes() const noexcept override { return fabric_->node_bytes_; }
  bool bulk_through_slots() const noexcept override { return fabric_->bulk_through_slots_; }
  // The waiter re-checks its condition under its mailbox's lock, so taking
  // that lock here orders this wake after the flag it announces.
  void wake(int rank) noexcept override {
    auto& box = *fabric_->boxes_[static_cast<std::size_t>(rank)];
    std::lock_guard lock(box.mutex);
    box.ready.notify_all();
  }

  std::shared_ptr<fabric> fabric_;
  int rank_;
  std::vector<detail::queued_completion> ready_;  // taken off the queue by progress()
  std::size_t ready_next_ = 0;                      // the first of ready_ not yet run
  wait_condition condition_;
};

inline std::unique_ptr<endpoint> fabric::endpoint_for(int rank) {
  return std::make_unique<inproc_endpoint>(shared_from_this(), rank);
}

}  // namespace pdcoll::transport::inproc
