// File: communicator.hpp — a group of ranks: its transport endpoint, its
// progress engine, collective sequence numbers, deadlines and abort state.
//
// Progress: operations complete from the transport's completion queue. While
// a communicator has operations pending and no progress thread, it registers
// itself as a progress driver with pdcoll's run loop, so that
// `sync_wait(all_reduce(...))` on one thread polls the transport briefly and
// then blocks on its wait object. It registers when a start() returns with
// its operation pending (one that completed inside start() needs no driver)
// and leaves at the first drive() that finds it idle, so back-to-back
// collectives on one thread do not pay the registry's mutex each time. With
// `progress_thread = true` a thread of the communicator drives progress
// instead (for runtimes that compute while collectives run); only an
// operation started on that thread itself (by a continuation running there)
// registers the communicator too, so that a wait there drives it, and other
// threads' run loops may then drive it until it is idle. Receivers run
// after the communicator's lock is released (completion_turn), on the thread
// whose turn ended the operation: a continuation may start work on this
// communicator or another without holding this one's lock.
//
// Failure: every operation has a deadline (options.timeout, PDCOLL_TIMEOUT_MS,
// or a per-operation override). When a deadline passes, a peer is lost, or a
// rank sees a collective mismatch, the communicator aborts:
//  1. it tells every peer (a control message) so theirs abort too;
//  2. it cancels every outstanding transfer of every pending operation;
//  3. if transfers are still outstanding options.abort_grace (250 ms) later,
//     it closes the endpoint's data path (transport::endpoint::close()).
//     Cancels alone are not enough: libfabric's shm provider cannot cancel a
//     receive already matched to a peer that was killed mid-transfer, and
//     only closing the fid_ep ends it. After close() every outstanding
//     transfer completes from the next progress() calls, so each pending
//     operation completes with the abort's reason (errc::timeout for the one
//     that passed its deadline) and its coroutine frame and registrations are
//     released only after the transport has let go of them;
//  4. every later operation completes at once with errc::aborted (nothing is
//     posted; after step 3 the endpoint refuses posts as well).
// So a survivor's operation ends at most about abort_grace after its deadline.
// An aborted communicator stays aborted; make a new one to continue.
#pragma once

#include <pdcoll/detail/closed_endpoint.hpp>
#include <pdcoll/detail/collective_task.hpp>
#include <pdcoll/detail/deadline.hpp>
#include <pdcoll/detail/env.hpp>
#include <pdcoll/detail/host_block_pool.hpp>
#include <pdcoll/detail/log.hpp>
#include <pdcoll/detail/tags.hpp>
#include <pdcoll/error.hpp>
#include <pdcoll/exec/run_loop.hpp>
#include <pdcoll/registration/registration_cache.hpp>
#include <pdcoll/result.hpp>
#include <pdcoll/transport/endpoint.hpp>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace pdcoll {

class communicator;

/// How a communicator's collectives moved their bytes so far (see
/// communicator::data_path_statistics()).
struct data_path_statistics {
  std::uint64_t host_operations = 0;    ///< collectives on host memory
  std::uint64_t direct_operations = 0;  ///< collectives on device memory moved in place (dmabuf, hmem-iface)
  std::uint64_t staged_operations = 0;  ///< collectives on device memory moved through host bounce buffers
  std::uint64_t staged_bytes = 0;       ///< device<->host bytes copied by staged collectives (both directions)
  std::uint64_t staged_chunks = 0;      ///< bounce-buffer chunks the staged collectives ran
  transport::data_path last_path = transport::data_path::unreachable;  ///< the latest collective's path
};

/// How a communicator behaves; defaults come from the environment.
struct communicator_options {
  /// Deadline of every operation unless overridden (PDCOLL_TIMEOUT_MS, default 60 s).
  std::chrono::milliseconds timeout = default_timeout();
  /// Run a progress thread (PDCOLL_PROGRESS_THREAD=1). Otherwise whoever
  /// waits (sync_wait, run_loop::run) drives progress.
  bool progress_thread = env_flag("PDCOLL_PROGRESS_THREAD");
  /// Cache fabric registrations (PDCOLL_REGISTRATION_CACHE=0 turns it off:
  /// register and deregister around every operation).
  bool cache_registrations = !env_is_zero("PDCOLL_REGISTRATION_CACHE");
  /// Move device memory through host bounce buffers even where the transport
  /// reaches it directly (PDCOLL_FORCE_STAGING=1): the "before Peer Direct"
  /// baseline on the same provider. Every rank must use the same setting.
  bool force_host_staging = env_flag("PDCOLL_FORCE_STAGING");
  /// Check that every rank issued the same collective (PDCOLL_VERIFY=0 turns
  /// it off): one empty message to the right neighbour per collective (on
  /// shm an entry in node memory), so that a mismatch fails fast with
  /// collective_mismatch instead of hanging until the deadline. Measured
  /// cost of an 8-byte all-reduce: on 2 ranks over shm at most 0.04 us of
  /// 0.45-0.65 us; on 4 ranks over io_uring TCP (2 cores) about 10 us of
  /// 60. Every rank must use the same setting.
  bool verify_collectives = !env_is_zero("PDCOLL_VERIFY");
  /// After an abort, how long cancelled transfers may take to complete before
  /// the endpoint's data path is closed under them (see the file comment).
  std::chrono::milliseconds abort_grace{250};
  /// How this communicator's log lines name their rank (empty: its number).
  /// A group's says both ranks and the split, e.g. "5: rank 1 of split #2".
  std::string log_name;

  /// PDCOLL_TIMEOUT_MS or 60 s.
  static std::chrono::milliseconds default_timeout() noexcept {
    return std::chrono::milliseconds(detail::env_number("PDCOLL_TIMEOUT_MS", 1).value_or(60'000));
  }
  /// True when the variable is set to something other than "0".
  static bool env_flag(const char* name) noexcept {
    const char* v = std::getenv(name);
    return v && *v && std::string(v) != "0";
  }
  /// True when the variable is set to "0".
  static bool env_is_zero(const char* name) noexcept {
    const char* v = std::getenv(name);
    return v && std::string(v) == "0";
  }
};

namespace detail {

/// An operation in flight on a communicator (collective or point-to-point).
class operation_base {
 public:
  /// Cancels every outstanding transfer; their completions finish the operation.
  virtual void cancel_outstanding() noexcept = 0;
  /// What the operation is and which transfers it still waits for, for the
  /// deadline's diagnostic (e.g. "all_reduce #12: recv from 2 (index 3, 4096 B)").
  virtual std::string describe() const = 0;
  /// Resumes work that waits on something no completion announces (shared
  /// memory); returns how much ran. May end (and destroy) the operation.
  virtual std::size_t poll() noexcept { return 0; }
  /// True when poll() would resume something.
  virtual bool poll_ready() const noexcept { return false; }
  /// Called (under the lock, once) when wake_at has passed; what it sets in
  /// motion runs at the next poll().
  virtual void wake_time_reached() noexcept {}
  /// Hands the outcome the operation ended with to its receiver. Called
  /// once, without the communicator's lock, by the turn the operation ended
  /// in (communicator::completion_turn); the operation may be gone after.
  virtual void complete_receiver() noexcept = 0;

  std::chrono::steady_clock::time_point deadline{};
  /// When the operation wants wake_time_reached() even if nothing completes
  /// (max: never). The communicator's waits end by then.
  std::chrono::steady_clock::time_point wake_at = std::chrono::steady_clock::time_point::max();
  std::atomic<bool> stop_requested{false};
  operation_base* prev_active = nullptr;
  operation_base* next_active = nullptr;
  operation_base* next_due = nullptr;  ///< in the communicator's list of ended operations not yet completed
  bool timed_out = false;

 protected:
  ~operation_base() = default;
};

}  // namespace detail

/// The registration cache a communicator keeps for its endpoint.
using fabric_registration_cache = registration::registration_cache<registration::endpoint_registrar>;

/// A fabric registration held by an operation for as long as it runs: a pin
/// on a cached entry, or (cache off) a registration of its own that is
/// released with the lease.
class registration_lease {
 public:
  registration_lease() = default;
  /// A pin on a cache entry.
  explicit registration_lease(fabric_registration_cache::pinned_registration pinned) noexcept
      : pinned_(std::move(pinned)), descriptor_(pinned_.handle().descriptor) {}
  /// An uncached registration of `ep`, deregistered on release.
  registration_lease(transport::endpoint& ep, transport::registration_handle handle) noexcept
      : endpoint_(&ep), direct_(handle), descriptor_(handle.descriptor) {}
  registration_lease(registration_lease&& o) noexcept
      : pinned_(std::move(o.pinned_)),
        endpoint_(std::exchange(o.endpoint_, nullptr)),
        direct_(o.direct_),
        descriptor_(o.descriptor_) {}
  registration_lease& operator=(registration_lease&& o) noexcept {
    if (this != &o) {
      release();
      pinned_ = std::move(o.pinned_);
      endpoint_ = std::exchange(o.endpoint_, nullptr);
      direct_ = o.direct_;
      descriptor_ = o.descriptor_;
    }
    return *this;
  }
  [[gnu::always_inline]] ~registration_lease() { release(); }
  /// The descriptor to pass with transfers.
  void* descriptor() const noexcept { return descriptor_; }
  /// Unpins or deregisters now.
  void release() noexcept {
    // The empty case inline: a small all-reduce on node memory binds no buffer.
    if (pinned_ || endpoint_) release_held();
  }

 private:
  void release_held() noexcept {
    pinned_.release();
    if (endpoint_) std::exchange(endpoint_, nullptr)->deregister(direct_);
  }

  fabric_registration_cache::pinned_registration pinned_;
  transport::endpoint* endpoint_ = nullptr;
  transport::registration_handle direct_{};
  void* descriptor_ = nullptr;
};

/// A group of ranks that run collectives together. Create one per job (or per
/// sub-group) and share it; it is not copyable or movable (operations point
/// to it). Thread-safe: operations may be started from any thread.
class communicator final : private exec::progress_driver {
 public:
  /// Takes ownership of a connected endpoint.
  explicit communicator(std::unique_ptr<transport::endpoint> endpoint, communicator_options options = {})
      : endpoint_(std::move(endpoint)), options_(options) {
    rank_ = endpoint_->rank();
    world_size_ = endpoint_->world_size();
    stand_in_ = std::make_unique<detail::closed_endpoint>(rank_, world_size_);
    log_name_ = options_.log_name.empty() ? std::to_string(rank_) : options_.log_name;
    notices_.resize(static_cast<std::size_t>(world_size_));
    if (options_.cache_registrations) cache_.emplace(registrar_);
    post_control_receive();
    if (auto* node = endpoint_->shared_node_memory()) {
      endpoint_->set_wait_condition({&communicator::operations_ready, this});
      for (int q = 0; q < world_size_; ++q) node_regions_.push_back(node->region(q));
      node_memory_ = node;
    }
    if (options_.progress_thread) {
      progress_thread_ = std::thread([this, stop = thread_stop_] { run_progress_thread(*stop); });
    }
    detail::log(detail::log_level::info, log_name_,
                "communicator up: " + endpoint_->name() + ", " + std::to_string(world_size_) +
                    " ranks, timeout " + std::to_string(options_.timeout.count()) + " ms" +
                    (options_.progress_thread ? ", progress thread" : ""));
  }

  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;

  /// Ends the communicator. Operations still pending are aborted and drained;
  /// what has not completed after abort_grace has the endpoint's data path
  /// closed under it (bounded by one second in all).
  ~communicator() {
    if (progress_thread_.joinable()) {
      thread_stop_->store(true, std::memory_order_release);
      if (progress_thread_.get_id() == std::this_thread::get_id()) {
        // A receiver on the progress thread destroys the communicator: the
        // thread cannot join itself. It reads only its own stop flag (which
        // it shares) once this returns, and ends.
        progress_thread_.detach();
      } else {
        wake_progress_thread();
        progress_thread_.join();
      }
    }
    {
      completion_turn turn(*this);
      if (active_) abort_locked(make_error_code(errc::aborted), false);
      endpoint_->cancel(&control_ctx_);
    }
    const auto start = std::chrono::steady_clock::now();
    const auto until = start + std::chrono::seconds(1);
    for (;;) {
      // The state is read under the lock: a thread polling the driver
      // registry may be inside drive() (the communicator is registered
      // until its next idle drive).
      completion_turn turn(*this);
      if (!(control_posted_ || active_ || notices_in_flight_) || std::chrono::steady_clock::now() >= until) break;
      const bool was_driving = std::exchange(driving_, true);
      if (!endpoint_closed_ && std::chrono::steady_clock::now() >= start + options_.abort_grace) close_endpoint_locked();
      drain_step(std::chrono::steady_clock::time_point::max());
      driving_ = was_driving;
    }
    // Unconditionally, before anything else is torn down: on return no other
    // thread is inside drive() or will call it.
    exec::progress_drivers::unregister_driver(this);
    driver_registered_ = false;
    endpoint_->set_wait_condition({});
    cache_.reset();  // deregisters before the endpoint closes
    // Transfers still outstanding end as the endpoint is destroyed: inside a
    // turn, so their operations end on a live communicator (its pool and
    // lock) and their receivers run. What they do on the way (a collective
    // cancelling its other batches) meets the closed stand-in, not an
    // endpoint half destroyed (unique_ptr::reset clears the pointer first).
    completion_turn turn(*this);
    std::unique_ptr<transport::endpoint> closing = std::exchange(endpoint_, std::move(stand_in_));
    closing.reset();
  }

  /// This rank, in [0, world_size()).
  int rank() const noexcept { return rank_; }
  /// How log lines name this rank (communicator_options::log_name, or the rank's number).
  const std::string& log_name() const noexcept { return log_name_; }
  /// Number of ranks.
  int world_size() const noexcept { return world_size_; }
  /// The transport's name, e.g. "libfabric:shm".
  std::string transport_name() const { return endpoint_->name(); }
  /// How this communicator's transport moves memory of `kind`.
  /// Honours options.force_host_staging for device memory.
  transport::data_path path_for(transport::memory_kind kind) const noexcept {
    const auto path = endpoint_->path_for(kind);
    if (options_.force_host_staging && kind != transport::memory_kind::host && path != transport::data_path::unreachable)
      return transport::data_path::host_staged;
    return path;
  }
  /// Which path the collectives took and what staging copied (a collective
  /// is counted when it starts; staged bytes as they are copied).
  pdcoll::data_path_statistics data_path_statistics() const {
    std::lock_guard lock(mutex_);
    return path_stats_;
  }
  /// The path of the latest collective started (unreachable before the first).
  transport::data_path last_data_path() const { return data_path_statistics().last_path; }
  /// The options in force.
  const communicator_options& options() const noexcept { return options_; }

  /// True once the communicator was aborted.
  bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }
  /// Why it was aborted (empty when it was not).
  std::error_code abort_reason() const {
    std::lock_guard lock(mutex_);
    return abort_reason_;
  }
  /// Aborts: every pending operation completes with `reason`, every later one
  /// with errc::aborted, and every peer is told so theirs do too. Pending
  /// operations complete through whoever drives progress; transfers that
  /// ignore their cancel are ended by closing the data path after abort_grace.
  ///
  /// The notices leave before abort() returns (waiting at most abort_grace):
  /// on transports that move data only while driven (libfabric tcp) a rank
  /// that aborts and then leaves the communicator alone would otherwise hold
  /// them back, and its peers would learn of the abort only at their deadline.
  void abort(std::error_code reason = make_error_code(errc::aborted)) {
    completion_turn turn(*this);
    abort_locked(reason, true);
    flush_abort_notices_unless_driving();
  }
  /// True once an abort closed the endpoint's data path (see the file comment).
  bool data_path_closed() const {
    std::lock_guard lock(mutex_);
    return endpoint_closed_;
  }

  /// Polls the transport and runs what completed; returns whether anything
  /// happened. Blocks on the transport's wait object up to `until` when
  /// nothing did. As the only registered driver it keeps going until an
  /// operation ends (or `until`); with others it returns after any work.
  /// Safe from any thread (one drives at a time).
  bool drive(std::chrono::steady_clock::time_point until) noexcept override {
    completion_turn turn(*this, std::try_to_lock);
    if (!turn.owns_lock()) {
      std::this_thread::yield();
      return false;
    }
    // Operations may end from here on (their receivers run as the turn ends); the outermost drive flushes the
    // notices of an abort that one of them made (see abort()).
    const bool outermost = !std::exchange(driving_, true);
    struct end_of_drive {
      communicator& self;
      bool outermost;
      ~end_of_drive() {
        self.driving_ = !outermost;
        if (outermost) self.flush_abort_notices();
      }
    } ending{*this, outermost};
    const std::uint64_t ended_before = ended_operations_;
    std::size_t n = progress_turn();
    if (n == 0 && driver_registered_ && active_count_ == 0 && notices_in_flight_ == 0) {
      // Idle since the last operation ended: leave the registry now rather
      // than when that operation ended, so that a thread issuing collectives
      // one after another registers once (see register_driver_if_pending).
      // Without waiting for other threads' calls: one of them may be running
      // a completion that needs this lock (it starts the next operation).
      exec::progress_drivers::leave(this);
      driver_registered_ = false;
      return false;
    }
    // Completions that only moved operations along (a step's message came
    // in, the next step's went out) give the caller nothing to run. As the
    // only driver, keep going until an operation ends: back up through the
    // caller's run_loop and the driver registry, each step of a collective
    // cost five lock round trips and a clock read. With other drivers
    // registered, return after any work so that they get their turn.
    const bool stay = exec::progress_drivers::size() == 1;
    bool did_work = n > 0;
    while ((stay || !did_work) && ended_operations_ == ended_before &&
           (active_ != nullptr || notices_in_flight_ != 0)) {
      const auto limit = std::min(until, earliest_deadline_locked());
      if (limit <= std::chrono::steady_clock::now()) break;
      // Wait until something runs or `limit`. A wake-up that runs nothing (a
      // peer rang for a flag this rank needs, but not the last one) waits
      // again here: returning false would send the caller's run_loop to sleep
      // on its own condition variable for the rest of its horizon (1 ms),
      // where no peer's ring reaches it.
      if (n == 0) endpoint_->wait(limit);
      n = progress_turn();
      did_work = did_work || n > 0;
    }
    return did_work;
  }

  /// Registers `region` for the duration of an operation. An empty lease
  /// when the transport needs no registration for this memory. Through the
  /// cache (unless options.cache_registrations is off) only where this
  /// communicator hears of the memory's free before its address can be
  /// reused (region.free_notice: its own host blocks, a domain it tracks
  /// with track_frees). Other memory (a caller's vector, an untracked
  /// domain) is registered for this operation alone: a cached registration
  /// of it would outlive a free and a reallocation at the same address and
  /// pin the old pages, and the NIC would move the wrong bytes. Under the lock.
  result<registration_lease> acquire_registration(const transport::memory_region& region) {
    if (!endpoint_->needs_registration(region.kind) || region.length == 0) return registration_lease{};
    drain_deferred_invalidations();
    if (cache_ && hears_free_of(region)) {
      auto pinned = cache_->acquire(region);
      if (!pinned) return pinned.error();
      return registration_lease(std::move(*pinned));
    }
    transport::registration_handle handle;
    if (auto ec = endpoint_->register_region(region, handle)) return ec;
    ++uncached_registrations_;
    return registration_lease(*endpoint_, handle);
  }
  /// Registrations made for one operation only, outside the cache (see
  /// acquire_registration): memory whose free this communicator does not
  /// hear of, or every registration when the cache is off.
  std::uint64_t uncached_registrations() const {
    std::lock_guard lock(mutex_);
    return uncached_registrations_;
  }
  /// Counts `notice` (a memory domain's free_notice()) as announcing its
  /// frees to this communicator, so that registrations of its memory may be
  /// cached. memory/track.hpp's free_tracking calls it when it subscribes
  /// the communicator to the domain's hooks; calls nest.
  void hear_frees_from(const void* notice) {
    if (notice == nullptr) return;
    std::lock_guard lock(mutex_);
    for (auto& [heard, count] : heard_notices_)
      if (heard == notice) return void(++count);
    heard_notices_.emplace_back(notice, 1);
  }
  /// Undoes one hear_frees_from. With the last one for `notice` the cache
  /// drops every entry (entries are not kept by domain, and this domain's
  /// frees will go unheard from now on); later operations register anew.
  void stop_hearing_frees_from(const void* notice) {
    if (notice == nullptr) return;
    std::lock_guard lock(mutex_);
    for (auto it = heard_notices_.begin(); it != heard_notices_.end(); ++it) {
      if (it->first != notice) continue;
      if (--it->second == 0) {
        heard_notices_.erase(it);
        drain_deferred_invalidations();
        if (cache_) cache_->clear();
      }
      return;
    }
  }
  /// Declares that host memory [address, address + length), which the
  /// caller owns, stays allocated until forget_caller_buffer(id): its
  /// registrations may then be cached (NCCL's ncclCommRegister). Returns the
  /// id. memory/track.hpp's register_buffer is the RAII form.
  std::uint64_t note_caller_buffer(const void* address, std::size_t length) {
    std::lock_guard lock(mutex_);
    const auto begin = reinterpret_cast<std::uintptr_t>(address);
    caller_buffers_.push_back({begin, begin + length, ++last_caller_buffer_});
    return last_caller_buffer_;
  }
  /// Ends note_caller_buffer(id): the cache drops every registration
  /// overlapping that memory (pinned ones at their operation's end), so the
  /// caller may free it. Unknown ids are ignored.
  void forget_caller_buffer(std::uint64_t id) {
    std::lock_guard lock(mutex_);
    for (auto it = caller_buffers_.begin(); it != caller_buffers_.end(); ++it) {
      if (it->id != id) continue;
      transport::memory_region region;
      region.address = reinterpret_cast<void*>(it->begin);
      region.length = it->end - it->begin;
      caller_buffers_.erase(it);
      drain_deferred_invalidations();
      if (cache_ && region.length) (void)cache_->invalidate(region);
      return;
    }
  }
  /// A host block for a collective's scratch or staging buffers, from the
  /// communicator's pool (see detail/host_block_pool.hpp).
  detail::host_block take_host_block(std::size_t bytes) { return host_blocks_.take(bytes); }
  /// The region of the first `length` bytes of `block`, one of this
  /// communicator's host blocks: return_host_block announces its free, so
  /// its registrations are cached.
  transport::memory_region host_block_region(const detail::host_block& block, std::size_t length) const noexcept {
    transport::memory_region region;
    region.address = block.bytes.get();
    region.length = length;
    region.free_notice = this;
    return region;
  }
  /// Gives a block from take_host_block back; a block the pool lets go of
  /// loses its cached registrations before it is freed.
  void return_host_block(detail::host_block block) noexcept {
    auto region_of = [](const detail::host_block& b) {
      transport::memory_region region;
      region.address = b.bytes.get();
      region.length = b.size;
      return region;
    };
    const transport::memory_region returned = region_of(block);
    std::vector<detail::host_block> dropped;
    try {
      dropped = host_blocks_.give(std::move(block));
    } catch (...) {
      // Out of memory while pooling (give() lets no idle block go before
      // it can carry them out): the block was freed on the way, and its
      // registrations go too, or the next block at its address would find
      // them cached.
      forget_registrations(returned);
      return;
    }
    for (auto& d : dropped) forget_registrations(region_of(d));
  }
  /// invalidate_registrations for a host block about to be freed. It can
  /// fail only queueing the invalidation for a lock another thread holds
  /// (a block comes back under this thread's turn, which holds the lock,
  /// so it invalidates at once); out of memory there, nothing is left to do.
  void forget_registrations(const transport::memory_region& region) noexcept {
    if (region.address == nullptr) return;
    try {
      invalidate_registrations(region);
    } catch (...) {
    }
  }
  /// Idle bytes the host block pool holds.
  std::size_t pooled_host_bytes() const { return host_blocks_.held_bytes(); }

  /// Drops cached registrations overlapping `region` (memory domains call
  /// this when memory is freed; in-use entries go at their last release).
  /// From a domain's free hook it may run on any thread while another holds
  /// the communicator's lock and frees memory of the same domain (which
  /// takes the domain's hook lock): waiting for the lock there could
  /// deadlock, so when the lock is busy the invalidation is queued and
  /// carried out before the next registration is looked up. It is queued by
  /// name (fabric_registration_cache::name_invalidation), taken now: the
  /// domain closes a DMA-BUF fd right after its hook returns, and by the time
  /// the queue drains that fd's number may belong to the next buffer.
  void invalidate_registrations(const transport::memory_region& region) {
    std::unique_lock lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock()) {
      auto name = fabric_registration_cache::name_invalidation(region);
      std::lock_guard queue(deferred_mutex_);
      deferred_invalidations_.push_back(std::move(name));
      deferred_pending_.store(true, std::memory_order_release);
      return;
    }
    drain_deferred_invalidations();
    if (cache_) cache_->invalidate(region);
  }
  /// The registration cache's statistics (all zero when the cache is off).
  registration::cache_statistics registration_statistics() const {
    std::lock_guard lock(mutex_);
    return cache_ ? cache_->statistics() : registration::cache_statistics{};
  }

  /// Counts a collective's data path (detail; under the lock).
  void record_data_path(transport::memory_kind kind, transport::data_path path) noexcept {
    path_stats_.last_path = path;
    if (kind == transport::memory_kind::host) ++path_stats_.host_operations;
    else if (path == transport::data_path::host_staged) ++path_stats_.staged_operations;
    else ++path_stats_.direct_operations;
  }
  /// Counts staging copies (detail; under the lock).
  void record_staging(std::uint64_t bytes, std::uint64_t chunks) noexcept {
    path_stats_.staged_bytes += bytes;
    path_stats_.staged_chunks += chunks;
  }

  /// Number of operations in flight.
  std::size_t pending_operations() const {
    std::lock_guard lock(mutex_);
    return active_count_;
  }

  // ---- for pdcoll's operations (detail) -------------------------------------------------

  /// The endpoint; callers hold the lock from lock().
  transport::endpoint& endpoint() noexcept { return *endpoint_; }
  /// The communicator's lock (recursive). Receivers never run under it
  /// (completion_turn); library code that ends operations takes it as a
  /// completion_turn.
  std::recursive_mutex& mutex() const noexcept { return mutex_; }
  /// Next collective sequence number; called in start() order, under the lock.
  std::uint64_t next_sequence() noexcept { return next_seq_++; }
  /// Every rank's node memory region (node_memory::region, read once: the
  /// small all-reduce looks at them several times per collective); nullptr
  /// without node memory.
  std::byte* const* node_regions() const noexcept { return node_regions_.empty() ? nullptr : node_regions_.data(); }
  /// The endpoint's shared_node_memory() when the communicator was made
  /// (detail): what node_regions() points into, without a virtual call.
  transport::node_memory* node_memory() const noexcept { return node_memory_; }
  /// The marks (seq + 1; 0 for none) of this rank's earlier small all-reduces
  /// through node memory that a new one depends on.
  struct small_all_reduce_marks {
    std::uint64_t previous;  ///< the latest one
    std::uint64_t held;      ///< the latest one in the same mailbox (parity of seq)
  };
  /// Records collective `seq` as this rank's latest small all-reduce through
  /// node memory (detail/node_small_all_reduce.hpp) and returns the marks of
  /// the ones before it. In start() order, under the lock.
  small_all_reduce_marks follow_small_all_reduce(std::uint64_t seq) noexcept {
    // Marks grow with seq: the latest of all is the larger of the two mailboxes'.
    const std::uint64_t previous = std::max(mailbox_marks_[0], mailbox_marks_[1]);
    return {previous, std::exchange(mailbox_marks_[seq & 1], seq + 1)};
  }
  /// Takes `n` steps of the shared-memory sequence (algorithm/shared_memory.hpp),
  /// in start() order, under the lock; returns the first.
  std::uint64_t reserve_node_steps(std::uint64_t n) noexcept {
    const auto first = next_node_step_;
    next_node_step_ += n;
    return first;
  }

  /// Registers a starting operation whose deadline is `timeout` from now;
  /// returns errc::aborted (and registers nothing) when the communicator is
  /// aborted. Under the lock.
  std::error_code begin_operation(detail::operation_base& op, std::chrono::milliseconds timeout) {
    if (auto ec = begin_operation(op)) return ec;
    op.deadline = detail::deadline_after(std::chrono::steady_clock::now(), timeout);
    return {};
  }
  /// begin_operation() without setting the deadline, for an operation that
  /// may finish before it would read the clock: it must set op.deadline
  /// before it releases the lock unfinished.
  std::error_code begin_operation(detail::operation_base& op) {
    if (aborted()) return make_error_code(errc::aborted);
    op.next_active = active_;
    op.prev_active = nullptr;
    if (active_) active_->prev_active = &op;
    active_ = &op;
    ++active_count_;
    return {};
  }
  /// Registers this communicator as a progress driver while operations (or
  /// abort notices) are pending and no progress thread runs. Called under
  /// the lock as each operation's start() ends, so that one which completes
  /// inside start() (a peer was there first) costs no registration.
  void register_driver_if_pending() {
    if (active_count_ == 0 && notices_in_flight_ == 0) return;
    // On the progress thread itself (a receiver there waits for another
    // operation of this communicator) the thread cannot drive from its loop:
    // register, so that the receiver's wait drives it.
    if (options_.progress_thread && progress_thread_.get_id() != std::this_thread::get_id()) {
      wake_progress_thread();
      return;
    }
    if (driver_registered_) return;
    exec::progress_drivers::register_driver(this);
    driver_registered_ = true;
  }
  /// The communicator's lock, held for a turn in which operations may end
  /// (driving progress, starting an operation, aborting). The receivers of
  /// the operations that ended run when the thread's outermost turn has
  /// released the lock, in the order the operations ended. So a completion
  /// that starts work on another communicator (a let_value chaining one
  /// group's collective to another's) never holds this one's lock
  /// meanwhile: two progress threads doing that crosswise, each under its
  /// own lock, would wait for each other for ever.
  class completion_turn {
   public:
    /// Takes the lock (recursive: a nested turn adds to the outermost).
    explicit completion_turn(communicator& comm) : comm_(comm), lock_(comm.mutex_) { ++comm_.turn_depth_; }
    /// Takes the lock if it is free; see owns_lock().
    completion_turn(communicator& comm, std::try_to_lock_t) : comm_(comm), lock_(comm.mutex_, std::try_to_lock) {
      if (lock_.owns_lock()) ++comm_.turn_depth_;
    }
    completion_turn(const completion_turn&) = delete;
    completion_turn& operator=(const completion_turn&) = delete;
    /// Releases the lock; the outermost turn then completes what ended.
    ~completion_turn() {
      if (!lock_.owns_lock()) return;
      detail::operation_base* due = nullptr;
      if (--comm_.turn_depth_ == 0) {
        due = std::exchange(comm_.due_head_, nullptr);
        comm_.due_tail_ = nullptr;
      }
      lock_.unlock();
      // Neither the communicator nor a completed operation is touched from
      // here: a receiver may destroy either.
      while (due) {
        detail::operation_base* next = std::exchange(due->next_due, nullptr);
        due->complete_receiver();
        due = next;
      }
    }
    /// Whether the lock is held (false only for a try_to_lock turn that found it busy).
    bool owns_lock() const noexcept { return lock_.owns_lock(); }

   private:
    communicator& comm_;
    std::unique_lock<std::recursive_mutex> lock_;
  };

  /// Queues `op`, which has ended, to have its receiver completed when this
  /// thread's outermost turn ends (see completion_turn). Under the lock.
  void complete_after_turn(detail::operation_base& op) noexcept {
    assert(turn_depth_ > 0 && "an operation ended outside a completion_turn: its receiver would wait for the next turn");
    op.next_due = nullptr;
    (due_tail_ ? due_tail_->next_due : due_head_) = &op;
    due_tail_ = &op;
  }

  /// Unregisters a finished operation. Under the lock.
  void end_operation(detail::operation_base& op) noexcept {
    if (op.prev_active) op.prev_active->next_active = op.next_active;
    else active_ = op.next_active;
    if (op.next_active) op.next_active->prev_active = op.prev_active;
    op.prev_active = op.next_active = nullptr;
    --active_count_;  // the driver stays registered until its next drive() finds the communicator idle
    ++ended_operations_;
  }
  /// Marks `op` as asked to stop (from any thread, without the lock; the
  /// driving thread cancels its transfers).
  void request_stop(detail::operation_base& op) noexcept {
    op.stop_requested.store(true, std::memory_order_release);
    stop_pending_.store(true, std::memory_order_release);
  }
  /// The error an operation ends with after its transfers were cancelled.
  std::error_code failure_reason(const detail::operation_base& op, std::error_code own) const noexcept {
    if (op.timed_out) return make_error_code(errc::timeout);
    if (aborted() && abort_reason_) return abort_reason_;
    return own;
  }
  /// Aborts under the lock (see abort()); `notify_peers`: tells every peer
  /// but `except` (the rank whose notice this abort answers, or -1).
  void abort_locked(std::error_code reason, bool notify_peers, int except = -1) noexcept {
    if (aborted()) return;
    abort_reason_ = reason;
    abort_time_ = std::chrono::steady_clock::now();
    aborted_.store(true, std::memory_order_release);
    detail::log(detail::log_level::warn, log_name_, "communicator aborted: " + reason.message());
    if (notify_peers) send_abort_notices(reason, except);
    for (auto* op = active_; op; op = op->next_active) op->cancel_outstanding();
  }
  /// Sends the abort notices now, unless this thread is inside a drive()
  /// turn (a lock held around it), which flushes them as it ends. abort()
  /// and an operation's start() that aborted (a stop before start, a failure
  /// inside start) call it: an operation that completed inside start()
  /// leaves its caller nothing to drive, and on transports that move data
  /// only while driven (io_uring, libfabric tcp) the peers would learn of the
  /// abort only at their deadline. Nothing when no notice is pending. Under
  /// the lock.
  void flush_abort_notices_unless_driving() noexcept {
    if (!driving_) flush_abort_notices();
  }

 private:
  // Whether this communicator hears of `region`'s free (see acquire_registration). Under the lock.
  bool hears_free_of(const transport::memory_region& region) const noexcept {
    if (region.free_notice == this) return true;
    if (region.free_notice == nullptr) {
      if (region.kind != transport::memory_kind::host) return false;
      const auto begin = reinterpret_cast<std::uintptr_t>(region.address);
      for (const auto& buffer : caller_buffers_)
        if (begin >= buffer.begin && begin < buffer.end && region.length <= buffer.end - begin) return true;
      return false;
    }
    for (const auto& heard : heard_notices_)
      if (heard.first == region.free_notice) return true;
    return false;
  }

  // Invalidations queued while the lock was busy (see invalidate_registrations). Under the lock.
  void drain_deferred_invalidations() {
    if (!deferred_pending_.load(std::memory_order_acquire)) return;
    std::vector<fabric_registration_cache::invalidation> queued;
    {
      std::lock_guard queue(deferred_mutex_);
      queued.swap(deferred_invalidations_);
      deferred_pending_.store(false, std::memory_order_release);
    }
    if (cache_)
      for (const auto& name : queued) (void)cache_->invalidate(name);
  }

  struct control_context : transport::completion_context {
    communicator* comm = nullptr;
  };
  struct notice_context : transport::completion_context {
    communicator* comm = nullptr;
    std::int32_t payload = 0;
    bool in_flight = false;
  };

  void post_control_receive() {
    control_ctx_.comm = this;
    control_ctx_.on_complete = &on_control_message;
    std::error_code ec = endpoint_->post_recv(transport::any_peer, &control_payload_, sizeof control_payload_,
                                              detail::control_tag(), 0, nullptr, &control_ctx_);
    control_posted_ = !ec;
  }

  static void on_control_message(transport::completion_context* ctx, const transport::completion& c) noexcept {
    auto* self = static_cast<control_context*>(ctx)->comm;
    self->control_posted_ = false;
    if (c.error) return;  // cancelled at shutdown, or the endpoint failed
    auto code = static_cast<errc>(self->control_payload_);
    detail::log(detail::log_level::info, self->log_name_,
                "abort notice from rank " + std::to_string(c.peer) + ": " + make_error_code(code).message());
    // Pass it on to every other peer: a rank that learns of the abort may end
    // at once, and a peer of its own that had not yet read the originator's
    // notice would otherwise see its connection close first and fail with
    // peer_lost (seen in a CI run of multiproc.failure.abort_idle.uring).
    // Messages between two ranks arrive in order, so the forwarded notice
    // comes before the end of that connection.
    self->abort_locked(make_error_code(code), /*notify_peers=*/true, /*except=*/c.peer);
    self->post_control_receive();
  }

  // Tells every peer but `except` (a rank) of the abort.
  void send_abort_notices(std::error_code reason, int except = -1) noexcept {
    std::int32_t code = reason.category() == error_category() ? reason.value() : static_cast<int>(errc::aborted);
    for (int peer = 0; peer < world_size_; ++peer) {
      if (peer == rank_ || peer == except) continue;
      auto& n = notices_[static_cast<std::size_t>(peer)];
      if (n.in_flight) continue;
      n.comm = this;
      n.payload = code;
      n.on_complete = [](transport::completion_context* ctx, const transport::completion&) noexcept {
        auto* self = static_cast<notice_context*>(ctx);
        self->in_flight = false;
        auto* comm = self->comm;
        // The last notice of an idle communicator releases the progress driver.
        if (--comm->notices_in_flight_ == 0 && comm->active_count_ == 0 && comm->driver_registered_) {
          exec::progress_drivers::leave(comm);  // under the lock: see drive()
          comm->driver_registered_ = false;
        }
      };
      if (!endpoint_->post_send(peer, &n.payload, sizeof n.payload, detail::control_tag(), nullptr, &n)) {
        n.in_flight = true;
        ++notices_in_flight_;
      }
    }
    if (notices_in_flight_ != 0 && options_.progress_thread) wake_progress_thread();
  }

  // Resumes what active operations wait for in shared memory. Under the lock.
  // A resumed operation may end, and its completion may end others (nested
  // driving): after each resume the walk starts over from the list's head.
  std::size_t poll_operations() noexcept {
    std::size_t n = 0;
    for (auto* op = active_; op;) {
      if (op->poll() == 0) {
        op = op->next_active;
        continue;
      }
      ++n;
      op = active_;
    }
    return n;
  }

  // Runs what completed: the endpoint's completions, then what operations
  // wait for in shared memory. Under the lock.
  // One turn of drive(): stop requests, completions and what they ran,
  // deadlines, the stuck-path close. Returns what ran.
  std::size_t progress_turn() noexcept {
    service_stop_requests();
    std::size_t n = run_completions();
    if (check_deadlines()) n += poll_operations();
    close_if_stuck();
    return n;
  }
  std::size_t run_completions() noexcept {
    const std::size_t n = endpoint_->progress();
    return n + poll_operations();
  }
  // One round of a drain (destructor, abort flush): runs what completed, or
  // waits for at most 1 ms (and not past `limit`) when nothing did.
  void drain_step(std::chrono::steady_clock::time_point limit) noexcept {
    if (run_completions() == 0)
      endpoint_->wait(std::min(limit, std::chrono::steady_clock::now() + std::chrono::milliseconds(1)));
  }

  // Drives the endpoint until the abort notices have left, at most until
  // abort_grace after the abort, when the data path closes under whatever
  // is left (a notice to a dead peer). Under the lock, outside any completion.
  void flush_abort_notices() noexcept {
    if (!aborted() || notices_in_flight_ == 0 || endpoint_closed_) return;
    const bool was_driving = std::exchange(driving_, true);
    const auto until = abort_time_ + options_.abort_grace;
    while (notices_in_flight_ > 0 && std::chrono::steady_clock::now() < until) drain_step(until);
    close_if_stuck();
    driving_ = was_driving;
  }
  // The endpoint's wait condition: some operation's poll() would run (called
  // from inside endpoint_->wait(), under the lock).
  static bool operations_ready(void* self) noexcept {
    for (auto* op = static_cast<communicator*>(self)->active_; op; op = op->next_active)
      if (op->poll_ready()) return true;
    return false;
  }

  void service_stop_requests() noexcept {
    if (!stop_pending_.exchange(false, std::memory_order_acq_rel)) return;
    for (auto* op = active_; op; op = op->next_active)
      if (op->stop_requested.load(std::memory_order_acquire)) op->cancel_outstanding();
  }

  // Aborts with timeout when an operation passed its deadline; calls
  // wake_time_reached() on those whose wake_at passed and then returns true.
  bool check_deadlines() noexcept {
    if (!active_) return false;
    auto now = std::chrono::steady_clock::now();
    bool woke = false;
    for (auto* op = active_; op; op = op->next_active) {
      if (now >= op->wake_at) {
        op->wake_at = std::chrono::steady_clock::time_point::max();
        op->wake_time_reached();
        woke = true;
      }
      if (!op->timed_out && now >= op->deadline) {
        op->timed_out = true;
        if (detail::current_log_level() >= detail::log_level::warn) {
          try {
            std::string what = "operation passed its deadline: " + op->describe();
            for (auto* other = active_; other; other = other->next_active)
              if (other != op) what += "\n  also pending: " + other->describe();
            detail::log(detail::log_level::warn, log_name_, what);
          } catch (...) {
          }
        }
        abort_locked(make_error_code(errc::timeout), true);
        return woke;  // abort cancelled everything
      }
    }
    return woke;
  }

  std::chrono::steady_clock::time_point earliest_deadline_locked() const noexcept {
    auto t = std::chrono::steady_clock::time_point::max();
    for (auto* op = active_; op; op = op->next_active)
      if (!op->timed_out) t = std::min({t, op->deadline, op->wake_at});
    if (close_pending()) t = std::min(t, abort_time_ + options_.abort_grace);
    return t;
  }

  // An abort whose cancelled transfers have not all completed yet.
  bool close_pending() const noexcept {
    return aborted() && !endpoint_closed_ && (active_ || notices_in_flight_);
  }

  // Step 3 of the abort (file comment): close the data path under transfers
  // that ignored their cancel for abort_grace. Under the lock.
  void close_if_stuck() noexcept {
    if (close_pending() && std::chrono::steady_clock::now() >= abort_time_ + options_.abort_grace)
      close_endpoint_locked();
  }

  void close_endpoint_locked() noexcept {
    if (endpoint_closed_) return;
    endpoint_closed_ = true;
    detail::log(detail::log_level::warn, log_name_,
                "closing the endpoint's data path: " + std::to_string(active_count_) +
                    " operation(s) still had transfers outstanding after the abort");
    endpoint_->close();
  }

  // Ends the progress thread's idle sleep at once (an operation or an abort
  // notice is pending, or the communicator is closing). Any thread.
  void wake_progress_thread() {
    {
      std::lock_guard lock(thread_sleep_mutex_);
      thread_woken_ = true;
    }
    thread_wakeup_.notify_one();
  }

  // `stop` outlives the communicator (the thread shares it): a receiver on
  // this thread may destroy the communicator inside drive(), and the loop
  // then reads nothing else before it ends.
  void run_progress_thread(const std::atomic<bool>& stop) {
    while (!stop.load(std::memory_order_acquire)) {
      bool idle;
      {
        std::lock_guard lock(mutex_);
        idle = active_count_ == 0 && !notices_in_flight_;
      }
      if (idle) {
        // Nothing pending: sleep, without the communicator's lock, until an
        // operation starts (register_driver_if_pending wakes this thread) or
        // for 2 ms, then take one turn without waiting, which reads the
        // control messages (a peer's abort) that came in meanwhile. drive()
        // itself returns at once when idle: looping on it spun a core.
        {
          std::unique_lock lock(thread_sleep_mutex_);
          thread_wakeup_.wait_for(lock, std::chrono::milliseconds(2), [this, &stop] {
            return thread_woken_ || stop.load(std::memory_order_acquire);
          });
          thread_woken_ = false;
        }
        drive(std::chrono::steady_clock::now());
      } else {
        drive(std::chrono::steady_clock::now() + std::chrono::milliseconds(1));
      }
    }
  }

  exec::progress_drivers::slot driver_slot_;  // registering as an operation starts (noexcept) never allocates
  std::unique_ptr<transport::endpoint> endpoint_;
  std::unique_ptr<transport::endpoint> stand_in_;  // endpoint_ while the destructor destroys the real one
  communicator_options options_;
  registration::endpoint_registrar registrar_{*endpoint_};
  detail::host_block_pool host_blocks_;  // before cache_: its blocks outlive their cached registrations
  std::optional<fabric_registration_cache> cache_;
  pdcoll::data_path_statistics path_stats_;
  std::mutex deferred_mutex_;
  std::vector<fabric_registration_cache::invalidation> deferred_invalidations_;
  std::atomic<bool> deferred_pending_{false};
  std::vector<std::pair<const void*, int>> heard_notices_;  // free_notice → hear_frees_from calls outstanding
  struct caller_buffer {
    std::uintptr_t begin, end;
    std::uint64_t id;
  };
  std::vector<caller_buffer> caller_buffers_;  // note_caller_buffer's, until forgotten
  std::uint64_t last_caller_buffer_ = 0;
  std::uint64_t uncached_registrations_ = 0;
  int rank_ = 0;
  std::string log_name_;  // how log lines name this rank (communicator_options::log_name)
  int world_size_ = 1;
  mutable std::recursive_mutex mutex_;
  std::atomic<bool> aborted_{false};
  std::error_code abort_reason_;
  std::chrono::steady_clock::time_point abort_time_{};
  bool endpoint_closed_ = false;
  std::atomic<bool> stop_pending_{false};
  detail::operation_base* active_ = nullptr;
  std::size_t active_count_ = 0;
  std::uint64_t ended_operations_ = 0;  // end_operation() calls: drive() returns when one ends
  bool driver_registered_ = false;
  std::uint64_t next_seq_ = 0;
  std::vector<std::byte*> node_regions_;  // see node_regions()
  transport::node_memory* node_memory_ = nullptr;  // see node_memory()
  std::uint64_t mailbox_marks_[2] = {0, 0};  // per mailbox parity, the last mark published there: see follow_small_all_reduce()
  std::uint64_t next_node_step_ = 2;  // shared-memory steps start at 2 (algorithm/shared_memory.hpp)
  control_context control_ctx_;
  std::int32_t control_payload_ = 0;
  bool control_posted_ = false;
  std::vector<notice_context> notices_;
  int notices_in_flight_ = 0;
  bool driving_ = false;  // a thread is inside drive(), a flush or the destructor's drain: operations may end
  int turn_depth_ = 0;    // completion_turns the lock's owner holds
  detail::operation_base* due_head_ = nullptr;  // ended operations whose receivers run as the outermost turn ends
  detail::operation_base* due_tail_ = nullptr;
  std::thread progress_thread_;
  std::shared_ptr<std::atomic<bool>> thread_stop_ = std::make_shared<std::atomic<bool>>(false);
  std::mutex thread_sleep_mutex_;             // guards thread_woken_
  std::condition_variable thread_wakeup_;     // ends the progress thread's idle sleep
  bool thread_woken_ = false;
};

}  // namespace pdcoll
