// File: transport/libfabric/endpoint.hpp — pdcoll::transport::endpoint over a
// libfabric reliable-datagram (FI_EP_RDM) endpoint with tagged messages.
//
// One fabric_endpoint owns the whole libfabric object chain of one rank:
// fabric → domain → address vector (FI_AV_TABLE, so fi_addr_t == rank) and
// completion queue (FI_CQ_FORMAT_TAGGED) → endpoint. Operations are posted
// with the caller's completion_context as the libfabric context: its
// provider_space is the fi_context2 that FI_CONTEXT2 mode asks for
// (fi_getinfo(3) "mode"), so a CQ entry leads straight back to the operation.
//
// Messages longer than the provider's max_msg_size (or options.max_message_size)
// are split. Protocol, chosen so split messages never steal each other's
// receives: with C the chunk size, a message of L >= C bytes goes out as a
// first chunk of C bytes on the caller's tag carrying a per-(sender, receiver)
// sequence number s as remote CQ data (fi_tsenddata), then continuation chunks
// on tag `reserved_tag_bits | s`, C bytes each, ending with one chunk shorter
// than C (possibly 0 bytes). A message of L < C is one plain message. A
// receive whose buffer is >= C bytes first receives C bytes; a first chunk
// with CQ data starts the continuation. Callers' tags and ignore masks never
// contain reserved_tag_bits, so continuation chunks match only their own
// receive. All ranks must use the same provider and max_message_size.
//
// Single-copy rendezvous on shm: libfabric 1.17's shm provider copies a
// large message (CMA, process_vm_readv) inside its progress engine while
// it holds its own region's spin lock, and a peer posting a send to that
// region spins on the lock meanwhile, so the two ranks of a ring exchange
// copy one at a time; it also stalls on large messages that arrive before
// their receive (ofiwg/libfabric#9143). So on shm, to a peer whose CMA
// probe of this rank succeeded (see setup_shm_peers), a message of at least
// options.rendezvous_threshold bytes (never fewer than a notice's 16) goes out as a 16-byte notice {address,
// length} (rendezvous_notice, injected) on the caller's tag with remote CQ
// data rendezvous_flag | sender rank << 40 | cookie. The receive the notice
// matches reads the payload with one process_vm_readv straight from the
// sender's memory into the receive buffer, outside every libfabric lock, and
// answers: where it mapped the sender's doorbell (doorbell.hpp), by storing
// cookie << 2 | 2 | failed into the sender's finish word (receiver,
// cookie % rendezvous_slots) there and ringing it; otherwise with a
// zero-byte finish message on tag reserved_tag_bits | finish_bit |
// [finish_failed_bit] | cookie. The send completes when its answer arrives
// (its buffer is no longer read); progress() and wait() look at the finish
// words of the sends that wait for one. On a rank that may receive notices
// (it can read some peer), a receive shorter than a notice takes it into its
// context instead (transport_state[6..7]; shm drops the CQ data of a
// truncated message, and the sender would never hear back), so a too-small
// receive is reported to both sides. A rendezvous send
// is not cancelled, as the receiver may be reading it; close() still ends
// it. The cookie's slot (receiver, cookie % rendezvous_slots) marks the send
// in flight; a send whose slot is still busy takes the provider's path.
// The rendezvous goes ahead of the split, for messages of any length.
//
// Mixed readability: libfabric 1.17's shm decides once for all its
// endpoints whether it copies by CMA, so where some ranks may read each
// other and others may not, its copies between the latter fail. The setup
// probe reads every peer; when the answers differ between pairs, every
// rank splits what it leaves to the provider at the inject size
// (setup_shm_peers).
//
// Performance: a send or receive shorter than the chunk size is one fi_tsend /
// fi_trecv and no allocation. Split messages allocate one small record and
// move one chunk at a time. A caller's post that meets -FI_EAGAIN (the
// peer's queue or the provider's credits are full; for receives also shm's
// -FI_ENOMEM, its own receive queue full) is queued, and so is every post of
// its kind (sends, receives) after it until the queue drains, which keeps
// the posting order; progress() retries the queues, so the caller (and the
// communicator's lock) never waits for room. Posts the transport makes
// itself from progress() (split chunks, rendezvous answers) retry in place,
// bounded by options.post_timeout, stashing CQ entries for the next
// progress() meanwhile.
//
// libfabric's own MR cache: pdcoll caches registrations itself
// (registration/), so two caches would hold pins the other cannot see.
// libfabric reads FI_MR_CACHE_MAX_COUNT once, in ofi_monitors_init() during
// its first fi_getinfo()/fi_fabric() call of the process; make_endpoint sets
// it to 0 (unless the user set it) before its first fi_getinfo. A program that
// called libfabric earlier has already fixed the value.
#pragma once

#include <poll.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <sched.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "pdcoll/detail/log.hpp"
#include "pdcoll/error.hpp"
#include "pdcoll/transport/endpoint.hpp"
#include "pdcoll/transport/libfabric/copy_probe.hpp"
#include "pdcoll/transport/libfabric/doorbell.hpp"
#include "pdcoll/transport/libfabric/shared_regions.hpp"
#include "pdcoll/transport/libfabric/errors.hpp"
#include "pdcoll/transport/libfabric/provider_watchdog.hpp"
#include "pdcoll/transport/poll_policy.hpp"

namespace pdcoll::transport::libfabric {

/// Tag bits this transport keeps for the continuation chunks of split
/// messages. post_send / post_recv reject tags with these bits set
/// (errc::invalid_argument) and never ignore them in a receive's mask.
inline constexpr std::uint64_t reserved_tag_bits = std::uint64_t{1} << 63;

/// How make_endpoint sets up the fabric. Defaults fit production use.
struct options {
  /// Provider name for fi_getinfo ("shm", "tcp", "tcp;ofi_rxm", ...). Empty:
  /// PDCOLL_PROVIDER, then FI_PROVIDER, else "shm" when all ranks share one
  /// host and "tcp;ofi_rxm" otherwise. "tcp" alone means "tcp;ofi_rxm" when
  /// the tcp provider has no RDM endpoint of its own (libfabric 1.17).
  std::string provider;
  /// Overrides the hostname comparison behind the shm / tcp choice.
  std::optional<bool> all_local;
  /// Ask for FI_HMEM (device memory registration) when the provider has it.
  /// Unset: PDCOLL_FI_HMEM (0/1) when set, else yes for every provider but
  /// shm. libfabric's shm turns its single-copy path (CMA,
  /// process_vm_readv) off for an endpoint opened with FI_HMEM and then
  /// moves every message above 4 KiB through its bounce buffers, a quarter
  /// of the bandwidth; without FI_HMEM device memory on shm is staged.
  std::optional<bool> request_hmem;
  /// Largest message sent as one libfabric message; 0 = the provider's
  /// max_msg_size. Smaller values force the split path (tests). Same on all ranks.
  std::size_t max_message_size = 0;
  /// Messages of at least this many bytes take the single-copy rendezvous on
  /// shm (see the file comment); 0 turns it off. Unset: PDCOLL_SHM_RENDEZVOUS
  /// (bytes; 0 = off) when set, else one more than the provider's inject
  /// size. Same on all ranks.
  std::optional<std::size_t> rendezvous_threshold;
  /// Use a FI_WAIT_FD completion queue for wait() when the provider has one
  /// and progresses data by itself (FI_PROGRESS_AUTO), and on shm a doorbell
  /// in shared memory that peers ring.
  bool use_wait_fd = true;
  /// Bytes of each rank's node memory region on shm (transport/node_memory.hpp,
  /// used by the shared-memory all-reduce); less than min_node_memory_bytes
  /// (0, say) turns node memory off, and so does PDCOLL_SHM_COLLECTIVES=0.
  /// Same on all ranks. The default leaves two 1 MiB chunk slots after the
  /// flags and mailboxes (detail/node_layout.hpp).
  std::size_t node_memory_bytes = (std::size_t{2} << 20) + (std::size_t{76} << 10);
  /// How long wait() polls before it sleeps (poll_policy.hpp; on the CQ's fd, or on shm's doorbell).
  std::chrono::microseconds poll_before_sleep = default_poll_before_sleep();
  /// How long a post may meet -FI_EAGAIN before it ends with
  /// errc::peer_lost: a queued post (see the file comment) completes with it,
  /// an internal retry returns it. A peer that accepts nothing for this long
  /// is dead or stuck (shm and tcp;ofi_rxm answer -FI_EAGAIN for a peer
  /// killed with queued messages, and rxm then for every peer: its transmit
  /// credits are shared), and internal retries then give up after
  /// stalled_post_timeout until an operation completes successfully again.
  std::chrono::milliseconds post_timeout{500};
  /// Bound for posts while the endpoint is stalled (a post timed out).
  std::chrono::milliseconds stalled_post_timeout{10};
  /// How long the destructor drains cancelled operations before closing.
  std::chrono::milliseconds close_timeout{2000};
};

namespace detail {

/// libfabric 1.17's shm provider names an endpoint's region
/// /dev/shm/<pid>:<uid>:<endpoint index> and refuses (fi_enable: -EBUSY) to
/// create one that exists. A process killed with SIGKILL leaves its regions
/// behind, so a later process that gets the same pid could never open shm.
/// No live process but this one can own a region named after this pid, and
/// this process creates its regions only in fi_enable, so one that exists
/// before then for an endpoint this process has not made is stale.
inline void remove_stale_shm_regions(pid_t pid) noexcept {
  static std::unordered_set<std::string> created;  // regions this process made (name prefix reuse)
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  // Ends at the first name this process has not made: one per endpoint
  // opened so far, however many groups made them.
  for (int ep = 0;; ++ep) {
    const std::string name =
        "/dev/shm/" + std::to_string(pid) + ":" + std::to_string(::getuid()) + ":" + std::to_string(ep);
    if (created.count(name)) continue;
    if (::access(name.c_str(), F_OK) != 0) {
      created.insert(name);  // the next free name: fi_enable will create it
      return;
    }
    ::unlink(name.c_str());  // stale: left by a dead process with our pid
    created.insert(name);
    return;
  }
}

/// Which provider to open and why (the "why" is shown at PDCOLL_DEBUG=INFO).
struct provider_choice {
  std::string name;
  std::string reason;
};

/// The selection rule of options::provider, as a pure function so it is
/// tested without a fabric. `hostnames` holds every rank's hostname.
inline provider_choice choose_provider(const options& opts, const char* pdcoll_env,
                                       const char* fi_env,
                                       const std::vector<std::string>& hostnames) {
  if (!opts.provider.empty()) return {opts.provider, "requested in options"};
  if (pdcoll_env && *pdcoll_env) return {pdcoll_env, "from PDCOLL_PROVIDER"};
  if (fi_env && *fi_env) return {fi_env, "from FI_PROVIDER"};
  bool local = true;
  for (const auto& h : hostnames) local = local && h == hostnames.front();
  const std::string ranks = std::to_string(hostnames.size()) + " ranks";
  if (opts.all_local) {
    return *opts.all_local ? provider_choice{"shm", "options.all_local is true"}
                           : provider_choice{"tcp;ofi_rxm", "options.all_local is false"};
  }
  if (local) {
    return {"shm", "all " + ranks + " on host " + (hostnames.empty() ? "?" : hostnames.front())};
  }
  return {"tcp;ofi_rxm", ranks + " span more than one host"};
}

// transport_state[0] of a completion_context while this transport owns it:
// low bits are flags, the high 32 bits the peer it was posted to (+1, so
// any_peer is 0).
inline constexpr std::uint64_t state_outstanding = 1u << 0;
inline constexpr std::uint64_t state_receive = 1u << 1;
inline constexpr std::uint64_t state_cancel_requested = 1u << 2;
inline constexpr std::uint64_t state_split = 1u << 3;  // transport_state[1] holds a split_transfer*
inline constexpr std::uint64_t state_rendezvous = 1u << 4;  // a send waiting for its answer (finish message or word)
inline constexpr std::uint64_t state_deferred = 1u << 5;    // queued after -FI_EAGAIN, not yet with the provider
inline constexpr std::uint64_t state_bounce = 1u << 6;      // a short receive posted into transport_state[6..7]

/// A post that met -FI_EAGAIN, kept for progress() to retry (see defer()).
struct deferred_post {
  bool receive = false;
  int peer = 0;
  void* buffer = nullptr;
  std::size_t length = 0;
  std::uint64_t tag = 0;
  std::uint64_t ignore = 0;
  void* descriptor = nullptr;
  completion_context* ctx = nullptr;
  std::chrono::steady_clock::time_point since;
};

/// Remote CQ data of a rendezvous notice: this flag, the sender's rank in
/// bits 40..62, a per-peer cookie in bits 0..39.
inline constexpr std::uint64_t rendezvous_flag = std::uint64_t{1} << 63;
inline constexpr std::uint64_t rendezvous_cookie_mask = (std::uint64_t{1} << 40) - 1;
/// libfabric shm's inject size for host memory (SMR_INJECT_SIZE): messages
/// up to it go through the provider's own buffers, never by CMA.
inline constexpr std::size_t shm_inject_bytes = 4096;
/// Tag bits of a finish message (with reserved_tag_bits and the cookie).
inline constexpr std::uint64_t finish_bit = std::uint64_t{1} << 62;
inline constexpr std::uint64_t finish_failed_bit = std::uint64_t{1} << 61;

/// The body of a rendezvous notice (see the file comment): where the
/// payload lies in the sender's memory, and its length.
struct rendezvous_notice {
  std::uint64_t address = 0;
  std::uint64_t length = 0;
};

/// Busy-slots per receiving peer: rendezvous sends in flight to one peer.
inline constexpr std::size_t rendezvous_slots = 256;

/// Progress of one message that is moved in chunks (see the file comment).
struct split_transfer {
  std::byte* base = nullptr;
  std::size_t length = 0;    // buffer length (receive) or message length (send)
  std::size_t done = 0;      // bytes moved by completed chunks
  std::size_t posted = 0;    // size of the chunk in flight
  std::uint64_t tag = 0;     // the caller's tag (send) / the sender's full tag (receive)
  std::uint64_t sequence = 0;
  void* descriptor = nullptr;
  int peer = -1;             // resolved peer (receive: known after the first chunk)
  bool continuing = false;   // past the first chunk
};

/// A completion read from the CQ but not yet delivered (read while retrying
/// a post, or by wait()): delivery happens only inside progress().
struct cq_event {
  void* context = nullptr;
  std::uint64_t flags = 0;
  std::size_t length = 0;
  std::uint64_t data = 0;
  std::uint64_t tag = 0;
  fi_addr_t source = FI_ADDR_NOTAVAIL;
  std::error_code error;
};

/// The libfabric API version the endpoint asks fi_getinfo(3) for: 1.20 where
/// the headers have FI_MR_DMABUF, since providers take that flag only from a
/// fabric opened at 1.20 or later (efa's fi_mr_regattr refuses it below with
/// -FI_EBADFLAGS), else 1.17, Debian 12's.
#if defined(FI_MR_DMABUF)
inline constexpr std::uint32_t requested_api_version = FI_VERSION(1, 20);
#else
inline constexpr std::uint32_t requested_api_version = FI_VERSION(1, 17);
#endif

/// True when a registration may name its memory by DMA-BUF (FI_MR_DMABUF):
/// the headers define the flag, the fabric was opened at API 1.20 or later
/// and the provider granted FI_HMEM (fi_mr(3): "only usable for domains
/// opened with FI_HMEM").
constexpr bool dmabuf_registration_usable(bool headers_have_flag, std::uint32_t fabric_api_version,
                                          bool hmem_granted) noexcept {
  return headers_have_flag && FI_VERSION_GE(fabric_api_version, FI_VERSION(1, 20)) && hmem_granted;
}

/// Fills libfabric >= 1.20's `struct fi_mr_dmabuf` and points `attr` at it
/// (fi_mr(3), FI_MR_DMABUF). `base_addr` is where the buffer's offset 0 would
/// lie in the address space `region.address` belongs to (providers address
/// the registered bytes as base_addr + offset: efa's iova, cxi's buffer), or
/// null when the region has no address. A template so that it compiles
/// without those types: the endpoint uses it only when FI_MR_DMABUF is
/// defined, and tests/unit/fabric_dmabuf_compile.cpp instantiates it with
/// local copies of the 1.20 structures so the path cannot rot on 1.17.
template <class MrAttr, class MrDmabuf>
void fill_dmabuf_attr(const memory_region& region, MrDmabuf& dmabuf, MrAttr& attr) noexcept {
  dmabuf.fd = region.dmabuf_fd;
  dmabuf.offset = region.dmabuf_offset;
  dmabuf.len = region.length;
  dmabuf.base_addr = region.address ? reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(region.address) -
                                                              static_cast<std::uintptr_t>(region.dmabuf_offset))
                                    : nullptr;
  attr.dmabuf = &dmabuf;
  attr.iov_count = 1;
  attr.iface = static_cast<decltype(attr.iface)>(region.hmem_iface);
  attr.device.reserved = region.device_id;
}

/// fi_close with the fid's type erased; null-safe. Returns fi_close's value.
inline int close_fid(fid* f) noexcept { return f ? ::fi_close(f) : 0; }

/// The fabric objects of an abandoned endpoint (fabric_endpoint::close()).
struct abandoned_objects {
  fid_ep* ep;
  fid_av* av;
  fid_cq* cq;
  fid_domain* domain;
  fid_fabric* fabric;
  fi_info* info;
  std::unordered_set<fid_mr*> registrations;
};

/// Where abandoned endpoints' objects stay for the life of the process:
/// closing them can crash inside the provider, and kept here they are still
/// reachable (no leak report). One entry per endpoint abandoned after an abort.
class parked_objects {
 public:
  void park(abandoned_objects objects) noexcept {
    try {
      std::lock_guard lock(mutex_);
      parked_.push_back(std::move(objects));
    } catch (...) {
      // Out of memory: the objects are simply not referenced any more.
    }
  }

 private:
  std::mutex mutex_;
  std::vector<abandoned_objects> parked_;
};

}  // namespace detail

/// The process's parked_objects (never destroyed: a provider's exit handlers
/// may still run after static destructors).
inline detail::parked_objects& parked_fabric_objects() noexcept {
  static auto* parked = new detail::parked_objects;
  return *parked;
}

/// A libfabric RDM endpoint implementing pdcoll::transport::endpoint (see the
/// contract in transport/endpoint.hpp). Built by make_endpoint(). Not
/// thread-safe (FI_THREAD_DOMAIN): the communicator serialises calls.
class fabric_endpoint final : public endpoint, private node_memory {
 public:
  /// Opens the fabric for `rank` of `world_size`, exchanging endpoint
  /// addresses through `exchange` (called the same number of times on every
  /// rank: host names, then addresses, then on shm two rounds for the
  /// rendezvous probe). Throws std::system_error naming the failing
  /// fi_* call and its fi_strerror text.
  fabric_endpoint(int rank, int world_size, const address_exchange& exchange,
                  const options& opts)
      : rank_(rank), world_size_(world_size), opts_(opts) {
    if (world_size <= 0 || rank < 0 || rank >= world_size) {
      throw std::system_error(make_error_code(errc::invalid_argument),
                              "libfabric endpoint: rank " + std::to_string(rank) +
                                  " outside world of " + std::to_string(world_size));
    }
    // Before the process's first fi_getinfo: see the file comment.
    ::setenv("FI_MR_CACHE_MAX_COUNT", "0", /*overwrite=*/0);
    choose(exchange);
    if (provider_.rfind("tcp", 0) == 0) {
      // Before the first fi_getinfo, as above. tcp;ofi_rxm sends messages
      // above its 16 KiB eager limit by segmentation or by rendezvous, and in
      // 1.17 either costs about 2 ms per message here (64 KiB to 1 MiB
      // messages: 2.3–2.8 ms against 40–250 us eager, pdcoll-bench, 2
      // ranks). Over tcp the eager limit may exceed rxm's 16 KiB bounce
      // buffers (fi_rxm(7)); 16 MiB keeps an unexpected message's buffering
      // bounded while the sweep's every size up to 16 MiB goes eager.
      ::setenv("FI_OFI_RXM_EAGER_LIMIT", "16777216", /*overwrite=*/0);
    }
    try {
      open_objects();
      connect_peers(exchange);
    } catch (...) {
      close_objects();
      throw;
    }
    // shm only: a peer killed inside the provider can leave this rank's
    // calls spinning for good (provider_watchdog.hpp).
    if (const auto limit = detail::provider_watchdog::limit_from_environment();
        provider_.rfind("shm", 0) == 0 && limit.count() > 0) {
      call_slot_.rank = rank_;
      detail::provider_watchdog::instance().watch(&call_slot_, limit);
      watched_ = true;
    }
  }

  fabric_endpoint(const fabric_endpoint&) = delete;
  fabric_endpoint& operator=(const fabric_endpoint&) = delete;

  /// Cancels what is outstanding, delivers its completions (drained for up to
  /// options.close_timeout, then operation_canceled for whatever the provider
  /// still holds), closes leftover registrations and every fabric object in
  /// reverse order of creation. Completion callbacks that post get errc::aborted.
  ~fabric_endpoint() override {
    closing_ = true;
    const detail::provider_call closing(watch_slot(), "endpoint teardown", -1);
    for (auto* ctx = outstanding_head_; ctx; ctx = next_of(ctx)) request_cancel(ctx);
    const auto deadline = std::chrono::steady_clock::now() + opts_.close_timeout;
    while (outstanding_head_ && std::chrono::steady_clock::now() < deadline) {
      if (progress() == 0) wait(std::min(deadline, std::chrono::steady_clock::now() +
                                                       std::chrono::milliseconds(1)));
    }
    if (abandoned_) {
      // Not closed: fi_close on an abandoned rxm endpoint is the crash close()
      // avoids (seen here too, once in six runs, after the buffers were
      // freed). Parked, reachable, for the rest of the process.
      parked_fabric_objects().park({ep_, av_, cq_, domain_, fabric_, info_, std::move(live_registrations_)});
      live_registrations_.clear();
      forget_objects();
    }
    for (auto* mr : live_registrations_) detail::close_fid(&mr->fid);
    live_registrations_.clear();
    // Once the endpoint is closed the provider holds no context any more, so
    // the remaining operations can be ended here without a late CQ entry.
    detail::close_fid(ep_ ? &ep_->fid : nullptr);
    ep_ = nullptr;
    awaiting_finish_words_.clear();  // their sends end below, with the rest
    while (auto* ctx = outstanding_head_) {
      finish(ctx, completion{std::make_error_code(std::errc::operation_canceled), 0, 0, -1});
    }
    close_objects();
    if (watched_) detail::provider_watchdog::instance().unwatch(&call_slot_);
  }

  int rank() const noexcept override { return rank_; }
  int world_size() const noexcept override { return world_size_; }
  /// "libfabric:<provider>" (e.g. "libfabric:tcp;ofi_rxm").
  std::string name() const override { return "libfabric:" + provider_; }
  /// Why this provider was chosen, e.g. "shm: all 4 ranks on host n1".
  const std::string& selection_reason() const noexcept { return reason_; }
  /// The provider as libfabric names it ("shm", "tcp;ofi_rxm").
  const std::string& provider() const noexcept { return provider_; }
  /// The largest message sent without splitting.
  std::size_t chunk_bytes() const noexcept { return chunk_; }
  /// Posts queued behind -FI_EAGAIN so far (see the file comment).
  std::uint64_t deferred_posts() const noexcept { return deferred_total_; }
  /// Posts waiting in that queue now.
  std::size_t deferred_now() const noexcept { return deferred_[0].size() + deferred_[1].size(); }
  /// Whether wait() sleeps on a doorbell that peers ring (shm).
  bool has_doorbell() const noexcept { return sleeps_on_bell_; }
  /// Rendezvous sends completed by an answer in their finish word (not a message).
  std::uint64_t finish_words_collected() const noexcept { return finish_words_collected_; }
  /// Sleeps on the doorbell that a peer's ring ended.
  std::uint64_t doorbell_wakeups() const noexcept { return doorbell_wakeups_; }
  /// Smallest send that takes the single-copy rendezvous (SIZE_MAX: none do).
  std::size_t rendezvous_threshold() const noexcept { return rendezvous_threshold_; }
  /// Whether sends to `peer` of rendezvous_threshold() bytes or more take it.
  bool rendezvous_with(int peer) const noexcept {
    return peer >= 0 && peer < world_size_ && rendezvous_peers_[static_cast<std::size_t>(peer)];
  }
  /// On shm with node memory, every rank's copy-probe token in rank order,
  /// as the node-memory verdict read them (copy_probe.hpp: "<kernel
  /// ns>/<user ns>", "slots", "messages", or "-" where none was published);
  /// empty elsewhere.
  const std::vector<std::string>& copy_probe_tokens() const noexcept { return copy_probe_tokens_; }
  /// Whether wait() sleeps on the CQ's file descriptor (else it backs off).
  bool has_wait_fd() const noexcept { return wait_fd_ >= 0; }
  /// The fi_info in use (for diagnostics; owned by the endpoint).
  const fi_info* info() const noexcept { return info_; }
  /// The libfabric error behind the last errc::registration_failed.
  std::error_code last_registration_error() const noexcept { return last_registration_error_; }
  /// Number of posted operations whose completion has not been delivered.
  std::size_t outstanding() const noexcept { return outstanding_count_; }

  /// Posts fi_tsend (or the first chunk of a split message, or a rendezvous
  /// notice), or queues it behind -FI_EAGAIN (see the file comment; it then
  /// completes with peer_lost after options.post_timeout). Errors, with
  /// nothing posted: root_out_of_range, invalid_argument (no context or
  /// callback, reserved tag bits), null_buffer, aborted (endpoint closing),
  /// or a libfabric error.
  std::error_code post_send(int peer, const void* buffer, std::size_t length, std::uint64_t tag,
                            void* descriptor, completion_context* ctx) noexcept override {
    if (auto ec = check_post(peer, buffer, length, tag, ctx, /*receive=*/false)) return ec;
    if (deferred_[0].empty()) {
      bool again = false;
      if (auto ec = start_send(peer, buffer, length, tag, descriptor, ctx, again)) return ec;
      if (!again) {
        link(ctx);
        return {};
      }
    }
    return defer(detail::deferred_post{false, peer, const_cast<void*>(buffer), length, tag, 0, descriptor, ctx,
                                       std::chrono::steady_clock::now()});
  }

  /// Posts a send's first message; `again` (nothing posted) on -FI_EAGAIN.
  /// Sets the context's state but does not link it.
  std::error_code start_send(int peer, const void* buffer, std::size_t length, std::uint64_t tag, void* descriptor,
                             completion_context* ctx, bool& again) noexcept {
    auto* bytes = static_cast<const std::byte*>(buffer);
    ctx->transport_state[0] = peer_bits(peer);
    ctx->transport_state[1] = 0;
    // The rendezvous bypasses the provider, so it also takes messages the
    // provider would get in chunks (the notice must fit a first chunk).
    if (length >= rendezvous_threshold_ && chunk_ >= sizeof(detail::rendezvous_notice) &&
        rendezvous_peers_[static_cast<std::size_t>(peer)]) {
      std::error_code ec;
      if (post_rendezvous_send(peer, bytes, length, tag, ctx, ec, again)) return ec;
    }
    if (length >= chunk_) {
      if (cq_data_bits_ == 0) return make_error_code(errc::invalid_argument);
      auto* split = new (std::nothrow) detail::split_transfer{};
      if (!split) return std::make_error_code(std::errc::not_enough_memory);
      split->base = const_cast<std::byte*>(bytes);
      split->length = length;
      split->posted = chunk_;
      split->tag = tag;
      split->sequence = next_sequence(peer);
      split->descriptor = descriptor;
      split->peer = peer;
      auto ec = first_post(again, "fi_tsenddata", peer, [&] {
        return ::fi_tsenddata(ep_, bytes, chunk_, descriptor, split->sequence, static_cast<fi_addr_t>(peer), tag, ctx);
      });
      if (ec || again) {
        delete split;
        return ec;
      }
      ring(peer);  // a sleeping receiver waits on its doorbell, split message or not
      ctx->transport_state[0] |= detail::state_split;
      ctx->transport_state[1] = reinterpret_cast<std::uintptr_t>(split);
    } else {
      auto ec = first_post(again, "fi_tsend", peer, [&] {
        return ::fi_tsend(ep_, bytes, length, descriptor, static_cast<fi_addr_t>(peer), tag, ctx);
      });
      if (ec || again) return ec;
      ring(peer);
      // fi_cq(3): `len` is only defined for receives, so a send remembers its own.
      ctx->transport_state[1] = length;
    }
    return {};
  }

  /// The send side of the single-copy rendezvous: posts the notice, then
  /// waits for the answer in its finish word, or posts the receive for the
  /// finish message with the caller's context (see the file comment).
  /// Returns false (nothing posted) when the cookie's slot is busy; `again`
  /// when the notice met -FI_EAGAIN (nothing posted either).
  bool post_rendezvous_send(int peer, const std::byte* bytes, std::size_t length, std::uint64_t tag,
                            completion_context* ctx, std::error_code& ec, bool& again) noexcept {
    const std::uint64_t cookie = next_sequence(peer) & detail::rendezvous_cookie_mask;
    const std::size_t slot = static_cast<std::size_t>(peer) * detail::rendezvous_slots +
                             static_cast<std::size_t>(cookie % detail::rendezvous_slots);
    if (rendezvous_busy_[slot]) return false;
    const detail::rendezvous_notice notice{reinterpret_cast<std::uintptr_t>(bytes), length};
    const auto to = static_cast<fi_addr_t>(peer);
    const std::uint64_t data = detail::rendezvous_flag | (static_cast<std::uint64_t>(rank_) << 40) | cookie;
    ec = first_post(again, "fi_tinjectdata", peer,
                    [&] { return ::fi_tinjectdata(ep_, &notice, sizeof notice, data, to, tag); });
    if (ec || again) return true;  // nothing went out
    ring(peer);
    rendezvous_busy_[slot] = 1;
    ctx->transport_state[1] = length;
    ctx->transport_state[4] = slot;
    if (finish_by_word_[static_cast<std::size_t>(peer)]) {
      ctx->transport_state[0] |= detail::state_rendezvous;
      ctx->transport_state[5] = cookie;
      rendezvous_senders_[slot] = ctx;
      try {
        awaiting_finish_words_.push_back(static_cast<std::uint32_t>(slot));
      } catch (...) {  // unreachable in practice: reserved for every slot at setup
      }
      return true;
    }
    // A finish that arrives before this receive waits in the provider's
    // unexpected queue.
    ec = retry_post(
        peer,
        [&] {
          return ::fi_trecv(ep_, nullptr, 0, nullptr, to, reserved_tag_bits | detail::finish_bit | cookie,
                            detail::finish_failed_bit, ctx);
        },
        /*receive=*/true);
    // The notice is out and the peer may read the buffer: the caller learns
    // the send failed, and the slot stays busy for good.
    if (ec) return true;
    ctx->transport_state[0] |= detail::state_rendezvous;
    return true;
  }

  /// Completes the rendezvous sends whose finish word holds their answer
  /// (see the file comment); returns how many.
  std::size_t collect_finish_words() noexcept {
    std::size_t done = 0;
    for (std::size_t i = 0; i < awaiting_finish_words_.size();) {
      const std::uint32_t slot = awaiting_finish_words_[i];
      completion_context* ctx = rendezvous_senders_[slot];
      const std::uint64_t word = finish_answer(slot);
      if (!word) {
        ++i;
        continue;
      }
      awaiting_finish_words_[i] = awaiting_finish_words_.back();
      awaiting_finish_words_.pop_back();
      rendezvous_senders_[slot] = nullptr;
      rendezvous_busy_[slot] = 0;
      const std::error_code ec = (word & 1) ? make_error_code(errc::peer_lost) : std::error_code{};
      finish(ctx, completion{ec, ec ? 0 : static_cast<std::size_t>(ctx->transport_state[1]), 0, posted_peer(ctx)});
      ++done;
      ++finish_words_collected_;
    }
    return done;
  }

  /// Whether some rendezvous send's finish word holds its answer.
  bool finish_word_ready() const noexcept {
    for (const std::uint32_t slot : awaiting_finish_words_)
      if (finish_answer(slot)) return true;
    return false;
  }

  /// The answer to the send awaiting finish word `slot` (cookie << 2 | 2 |
  /// failed, see send_finish), or 0 while the word holds an earlier send's.
  std::uint64_t finish_answer(std::uint32_t slot) const noexcept {
    const std::uint64_t word = own_bell_.finish_word(slot).load(std::memory_order_acquire);
    return (word >> 2) == rendezvous_senders_[slot]->transport_state[5] && (word & 2) ? word : 0;
  }

  /// The receive side: `ctx` matched a notice from the rank in `e.data`
  /// (in its buffer, or in its context when shorter: see the file comment);
  /// reads the payload, answers (send_finish) and completes the
  /// receive.
  void complete_rendezvous_receive(completion_context* ctx, const detail::cq_event& e) noexcept {
    auto* buffer = reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(ctx->transport_state[4]));
    const auto capacity = static_cast<std::size_t>(ctx->transport_state[5]);
    const int source = static_cast<int>((e.data & ~detail::rendezvous_flag) >> 40);
    const std::uint64_t cookie = e.data & detail::rendezvous_cookie_mask;
    if (source < 0 || source >= world_size_ || !peer_pids_[static_cast<std::size_t>(source)]) {
      finish(ctx, completion{make_error_code(errc::invalid_argument), 0, e.tag, source});
      return;
    }
    const pid_t pid = peer_pids_[static_cast<std::size_t>(source)];
    detail::rendezvous_notice notice;
    std::memcpy(&notice, received_at(ctx), sizeof notice);  // the payload overwrites it
    auto read_from = [&](void* to, std::uint64_t address, std::size_t bytes) -> std::error_code {
      std::size_t moved = 0;
      while (moved < bytes) {
        iovec local{static_cast<std::byte*>(to) + moved, bytes - moved};
        iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(address + moved)), bytes - moved};
        const ssize_t n = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
        if (n > 0) {
          moved += static_cast<std::size_t>(n);
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        // ESRCH: the sender is gone. Anything else (EFAULT, EPERM) means the
        // sender's memory is not what its notice promised; not retried.
        if (n < 0 && errno == ESRCH) return make_error_code(errc::peer_lost);
        return std::error_code(n < 0 ? errno : EIO, std::system_category());
      }
      return {};
    };
    std::size_t moved = std::min<std::size_t>(notice.length, capacity);
    std::error_code ec;
    if (moved && !buffer) ec = make_error_code(errc::null_buffer);
    if (!ec) ec = read_from(buffer, notice.address, moved);
    if (ec) moved = 0;
    else if (notice.length > capacity) ec = make_error_code(errc::collective_mismatch);  // truncated
    send_finish(source, cookie, ec && ec != errc::collective_mismatch);
    finish(ctx, completion{ec, moved, e.tag, source});
  }

  /// Where receive `ctx`'s message landed: its buffer, or its context for a
  /// receive shorter than a rendezvous notice (see start_recv).
  static const void* received_at(const completion_context* ctx) noexcept {
    if (ctx->transport_state[0] & detail::state_bounce) return &ctx->transport_state[6];
    return reinterpret_cast<const void*>(static_cast<std::uintptr_t>(ctx->transport_state[4]));
  }

  /// Wakes `peer` if it sleeps on its doorbell (after a post to it).
  void ring(int peer) noexcept {
    if (static_cast<std::size_t>(peer) < peer_bells_.size()) peer_bells_[static_cast<std::size_t>(peer)].ring_if_sleeping();
  }

  // node_memory (shm only; see setup_shm_peers)
  std::byte* region(int rank) const noexcept override { return node_regions_.region(rank); }
  std::size_t region_bytes() const noexcept override { return node_regions_.bytes(); }
  void wake(int rank) noexcept override { ring(rank); }
  bool bulk_through_slots() const noexcept override { return bulk_through_slots_; }

  /// Answers a rendezvous notice: in the sender's finish word where this
  /// rank mapped its doorbell, else with a finish message (zero bytes,
  /// injected: no completion). A failed post leaves the sender to its
  /// deadline or the communicator's abort.
  void send_finish(int peer, std::uint64_t cookie, bool failed) noexcept {
    auto& bell = peer == rank_ ? own_bell_ : peer_bells_[static_cast<std::size_t>(peer)];
    if (bell.words) {  // the sender knows this rank mapped it (setup_shm_peers)
      const std::size_t word = static_cast<std::size_t>(rank_) * detail::rendezvous_slots +
                               static_cast<std::size_t>(cookie % detail::rendezvous_slots);
      bell.finish_word(word).store(cookie << 2 | 2 | (failed ? 1 : 0), std::memory_order_release);
      bell.ring_if_sleeping();
      return;
    }
    if (!ep_ || abandoned_) return;
    const std::uint64_t tag =
        reserved_tag_bits | detail::finish_bit | (failed ? detail::finish_failed_bit : 0) | cookie;
    if (!retry_post(peer, [&] { return ::fi_tinject(ep_, nullptr, 0, static_cast<fi_addr_t>(peer), tag); }))
      ring(peer);
  }

  /// Posts fi_trecv (directed unless peer == any_peer); a buffer of at least
  /// chunk_bytes() takes the split path. Errors as post_send.
  std::error_code post_recv(int peer, void* buffer, std::size_t length, std::uint64_t tag,
                            std::uint64_t ignore, void* descriptor,
                            completion_context* ctx) noexcept override {
    if (auto ec = check_post(peer, buffer, length, tag, ctx, /*receive=*/true)) return ec;
    ignore &= ~reserved_tag_bits;
    if (deferred_[1].empty()) {
      bool again = false;
      if (auto ec = start_recv(peer, buffer, length, tag, ignore, descriptor, ctx, again)) return ec;
      if (!again) {
        link(ctx);
        return {};
      }
    }
    return defer(detail::deferred_post{true, peer, buffer, length, tag, ignore, descriptor, ctx,
                                       std::chrono::steady_clock::now()});
  }

  /// Posts a receive (its first chunk when split); `again` (nothing posted)
  /// on -FI_EAGAIN. Sets the context's state but does not link it.
  std::error_code start_recv(int peer, void* buffer, std::size_t length, std::uint64_t tag, std::uint64_t ignore,
                             void* descriptor, completion_context* ctx, bool& again) noexcept {
    const fi_addr_t source = peer == any_peer ? FI_ADDR_UNSPEC : static_cast<fi_addr_t>(peer);
    ctx->transport_state[0] = peer_bits(peer) | detail::state_receive;
    ctx->transport_state[1] = 0;
    ctx->transport_state[4] = reinterpret_cast<std::uintptr_t>(buffer);  // for a rendezvous notice
    ctx->transport_state[5] = length;
    detail::split_transfer* split = nullptr;
    std::size_t first = length;
    void* into = buffer;
    if (length < sizeof(detail::rendezvous_notice) && receives_notices_ && length < chunk_) {
      // Room for a notice (see the file comment): the message lands in the
      // context and is copied out on completion.
      into = &ctx->transport_state[6];
      first = sizeof(detail::rendezvous_notice);
      descriptor = nullptr;
      ctx->transport_state[0] |= detail::state_bounce;
    }
    if (length >= chunk_ && cq_data_bits_ != 0) {
      split = new (std::nothrow) detail::split_transfer{};
      if (!split) return std::make_error_code(std::errc::not_enough_memory);
      split->base = static_cast<std::byte*>(buffer);
      split->length = length;
      split->posted = first = chunk_;
      split->descriptor = descriptor;
      split->peer = peer;
    }
    auto ec = first_post(
        again, "fi_trecv", peer, [&] { return ::fi_trecv(ep_, into, first, descriptor, source, tag, ignore, ctx); },
        /*receive=*/true);
    if (ec || again) {
      delete split;
      return ec;
    }
    if (split) {
      ctx->transport_state[0] |= detail::state_split;
      ctx->transport_state[1] = reinterpret_cast<std::uintptr_t>(split);
    }
    return {};
  }

  /// Queues a post that met -FI_EAGAIN (or arrived while others of its kind
  /// wait, which keeps the posting order of sends and of receives);
  /// progress() retries the queues in order.
  std::error_code defer(const detail::deferred_post& post) noexcept {
    try {
      deferred_[post.receive].push_back(post);
    } catch (...) {
      return std::make_error_code(std::errc::not_enough_memory);
    }
    post.ctx->transport_state[0] =
        peer_bits(post.peer) | (post.receive ? detail::state_receive : 0) | detail::state_deferred;
    link(post.ctx);
    ++deferred_total_;
    return {};
  }

  /// Retries the deferred posts in order until one meets -FI_EAGAIN again.
  /// Cancelled ones end with operation_canceled; a send that waited longer
  /// than options.post_timeout ends with peer_lost (its peer accepts
  /// nothing). A receive waits for room in this rank's own queue, which
  /// frees as earlier receives complete, so only its operation's deadline
  /// bounds it. Returns the operations it ended.
  std::size_t flush_deferred() noexcept {
    std::size_t ended = 0;
    for (auto& queue : deferred_) {
      if (queue.empty()) continue;
      // One cancelled entry at a time, found afresh after each finish: a
      // callback may re-enter progress() (an algorithm unwinding drains its
      // batches) and end the others itself; a local list of them would hide
      // them from that inner call.
      for (;;) {
        const auto it = std::find_if(queue.begin(), queue.end(), [](const detail::deferred_post& d) {
          return (d.ctx->transport_state[0] & detail::state_cancel_requested) != 0;
        });
        if (it == queue.end()) break;
        completion_context* ctx = it->ctx;
        const int peer = it->peer;
        queue.erase(it);
        finish(ctx, completion{std::make_error_code(std::errc::operation_canceled), 0, 0, peer});
        ++ended;
      }
      const auto now = std::chrono::steady_clock::now();
      while (!queue.empty()) {
        const detail::deferred_post d = queue.front();
        // Cancelled by a callback that ran since the sweep above (a failed
        // transfer's collective cancelling its siblings): start_* would
        // overwrite the flag and post it after all.
        if (d.ctx->transport_state[0] & detail::state_cancel_requested) {
          queue.pop_front();
          finish(d.ctx, completion{std::make_error_code(std::errc::operation_canceled), 0, 0, d.peer});
          ++ended;
          continue;
        }
        if (!d.receive && now - d.since > opts_.post_timeout) {
          queue.pop_front();
          stalled_ = true;
          finish(d.ctx, completion{make_error_code(errc::peer_lost), 0, 0, d.peer});
          ++ended;
          continue;
        }
        bool again = false;
        const std::error_code ec =
            d.receive ? start_recv(d.peer, d.buffer, d.length, d.tag, d.ignore, d.descriptor, d.ctx, again)
                      : start_send(d.peer, d.buffer, d.length, d.tag, d.descriptor, d.ctx, again);
        // start_* rewrote the flags; the context is still linked.
        d.ctx->transport_state[0] |= detail::state_outstanding;
        if (!ec && again) {
          d.ctx->transport_state[0] |= detail::state_deferred;
          break;
        }
        queue.pop_front();
        if (ec) {
          finish(d.ctx, completion{ec, 0, 0, d.peer});
          ++ended;
        }
      }
    }
    return ended;
  }

  /// Whether a post's return means "no room now, try again": -FI_EAGAIN,
  /// and for a receive also -FI_ENOMEM, shm's answer while its receive
  /// queue is full until receives complete.
  static bool no_room_yet(ssize_t rc, bool receive) noexcept {
    return rc == -FI_EAGAIN || (receive && rc == -FI_ENOMEM);
  }

  /// One post attempt: no room (no_room_yet) sets `again` (not an error).
  /// `call` and `peer` name it for the provider watchdog.
  template <class Post>
  std::error_code first_post(bool& again, const char* call, int peer, Post&& post, bool receive = false) noexcept {
    const ssize_t rc = [&] {
      const detail::provider_call in(watch_slot(), call, peer);
      return post();
    }();
    again = no_room_yet(rc, receive);
    return rc == 0 || again ? std::error_code{} : make_fabric_error(rc);
  }

  /// fi_cancel(3) on the operation's chunk in flight. A cancelled operation
  /// completes with std::errc::operation_canceled; one that completes first
  /// (or a send the provider cannot cancel) completes normally. A context
  /// that is not outstanding is ignored.
  void cancel(completion_context* ctx) noexcept override {
    if (ctx && (ctx->transport_state[0] & detail::state_outstanding)) request_cancel(ctx);
  }

  /// Closes the fid_ep (fi_close(3)), which is the only way to make some
  /// providers let go of a receive that fi_cancel cannot reach (shm: a receive
  /// matched to a peer killed mid-transfer). CQ entries already written are
  /// kept; progress() then delivers them and ends every other outstanding
  /// operation with operation_canceled. Later posts fail with errc::aborted;
  /// the CQ, domain and registrations stay until destruction.
  ///
  /// tcp;ofi_rxm (libfabric 1.17) crashes inside fi_close(ep) when sends are
  /// stuck on a connection whose link went down (tests/netns/run.sh), so there
  /// the endpoint is abandoned instead: every outstanding operation still
  /// ends at the next progress(), and the provider is never called again. Its
  /// progress is manual, so nothing then moves: a rendezvous receive matched
  /// before the close would otherwise go on writing into a buffer already
  /// handed back as cancelled (measured: 128 MiB written after the cancel,
  /// session 50). The destructor parks the abandoned objects for the life
  /// of the process instead of closing them (parked_fabric_objects).
  void close() noexcept override {
    if (!ep_ || abandoned_) return;
    closing_ = true;
    // Entries already written: read them now, while their contexts are
    // certainly alive, and deliver them from progress().
    while (stash_cq() != 0) {
    }
    if (provider_.find("ofi_rxm") != std::string::npos) {
      abandoned_ = true;
      return;
    }
    // The close ends what the provider holds with FI_ECANCELED entries (shm):
    // operation_canceled, as the contract says, not a lost peer.
    for (auto* ctx = outstanding_head_; ctx; ctx = next_of(ctx)) ctx->transport_state[0] |= detail::state_cancel_requested;
    detail::close_fid(&ep_->fid);
    ep_ = nullptr;
    while (stash_cq() != 0) {  // entries written by the close itself
    }
  }

  /// Delivers stashed completions, then reads the CQ (at most 64 entries per
  /// call, so one busy peer cannot starve the caller). Returns the number of
  /// operations completed; chunks of split messages do not count. After
  /// close(), ends what is still outstanding with operation_canceled.
  std::size_t progress() noexcept override {
    std::size_t ran = deliver_stash();
    if (!ep_ || abandoned_) {
      deferred_[0].clear();
      deferred_[1].clear();
      awaiting_finish_words_.clear();  // their sends end below, with the rest
      while (auto* ctx = outstanding_head_) {
        finish(ctx, completion{std::make_error_code(std::errc::operation_canceled), 0, 0, posted_peer(ctx)});
        ++ran;
      }
      // Abandoned: the CQ is not read (see close()); its late entries stay unread.
      return ran;
    }
    for (int round = 0; round < 4; ++round) {
      const std::size_t n = stash_cq();
      ran += deliver_stash();
      if (n < 16) break;
    }
    if (!awaiting_finish_words_.empty()) ran += collect_finish_words();
    ran += flush_deferred();
    if (ran) idle_rounds_ = 0;
    return ran;
  }

  /// Sleeps until a completion may be ready or `deadline`, after polling for
  /// options.poll_before_sleep: on the CQ's fd (providers with automatic
  /// data progress) once fi_trywait(3) says it is safe to block; on shm on
  /// the doorbell peers ring (doorbell.hpp, at most 1 ms at a time);
  /// otherwise (tcp) with a backoff that yields a few times
  /// and then sleeps in doubling steps of up to 200 us, so ranks that
  /// outnumber cores do not burn them.
  void wait(std::chrono::steady_clock::time_point deadline) noexcept override {
    using namespace std::chrono;
    if (!stash_.empty() || !ep_ || abandoned_ || condition_ready() || finish_word_ready()) return;
    if (!deferred_[0].empty()) {  // sends wait for room at a peer: back to progress() soon
      ::sched_yield();
      return;
    }
    if (wait_fd_ >= 0 && awaiting_finish_words_.empty()) {  // a finish word comes with no CQ event
      if (poll_briefly(deadline)) return;
      fid* cq_fid = &cq_->fid;
      const int rc = ::fi_trywait(fabric_, &cq_fid, 1);
      if (rc == -FI_EAGAIN) return;  // fi_trywait(3): completions are ready, do not block
      if (rc == FI_SUCCESS) {
        const auto left = deadline - steady_clock::now();
        if (left <= nanoseconds::zero()) return;
        const auto ns = duration_cast<nanoseconds>(left).count();
        timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
        pollfd pfd{wait_fd_, POLLIN, 0};
        ::ppoll(&pfd, 1, &ts, nullptr);
        return;
      }
      // Any other fi_trywait failure: fall back to polling below.
    }
    if (sleeps_on_bell_) {  // shm: poll briefly, then sleep until a peer rings (doorbell.hpp)
      if (poll_briefly(deadline)) return;
      const auto left = deadline - steady_clock::now();
      if (left <= nanoseconds::zero()) return;
      // The bound only matters should an event come without a ring.
      const auto how =
          own_bell_.sleep([&] { return stash_cq() > 0 || condition_ready() || finish_word_ready(); },
                          duration_cast<nanoseconds>(std::min<nanoseconds>(left, milliseconds(1))));
      if (how == detail::doorbell::woken::rung) ++doorbell_wakeups_;
      return;
    }
    while (steady_clock::now() < deadline) {
      if (stash_cq() > 0 || condition_ready() || finish_word_ready()) {
        idle_rounds_ = 0;
        return;
      }
      ++idle_rounds_;
      if (idle_rounds_ <= 16) {
        ::sched_yield();
      } else {
        const auto step = microseconds(std::min<long>(200, 1L << std::min(idle_rounds_ - 16, 8)));
        const auto left = duration_cast<microseconds>(deadline - steady_clock::now());
        if (left <= microseconds::zero()) return;
        std::this_thread::sleep_for(std::min(step, left));
      }
    }
  }

  /// Polls the CQ for options.poll_before_sleep (or until `deadline`): a
  /// completion due within microseconds costs less than a sleep and a
  /// wake-up. True when one was read (stashed for progress()).
  bool poll_briefly(std::chrono::steady_clock::time_point deadline) noexcept {
    const auto until = std::min(deadline, std::chrono::steady_clock::now() + opts_.poll_before_sleep);
    do {
      if (stash_cq() > 0 || condition_ready() || finish_word_ready()) return true;
      ::sched_yield();
    } while (std::chrono::steady_clock::now() < until);
    return false;
  }

  /// True when the communicator's wait condition (set_wait_condition) holds.
  bool condition_ready() const noexcept { return condition_.ready && condition_.ready(condition_.arg); }

  node_memory* shared_node_memory() noexcept override { return node_regions_.region(rank_) ? this : nullptr; }
  void set_wait_condition(wait_condition condition) noexcept override { condition_ = condition; }

  /// host → host; emulated_device → dmabuf where FI_MR_DMABUF is usable
  /// (detail::dmabuf_registration_usable; a provider that refuses its memfd
  /// gets the mapped range instead, see register_region) else hmem_iface (the
  /// mapped range, FI_HMEM_SYSTEM); gaudi → dmabuf / hmem_iface
  /// (FI_HMEM_SYNAPSEAI, when FI_HMEM is granted) / host_staged.
  data_path path_for(memory_kind kind) const noexcept override {
    switch (kind) {
      case memory_kind::host: return data_path::host;
      case memory_kind::emulated_device:
        return dmabuf_usable() ? data_path::dmabuf : data_path::hmem_iface;
      case memory_kind::gaudi:
        if (dmabuf_usable()) return data_path::dmabuf;
        return has_hmem_ ? data_path::hmem_iface : data_path::host_staged;
    }
    return data_path::unreachable;
  }

  /// True when transfers need a descriptor: FI_MR_LOCAL for host memory,
  /// FI_MR_LOCAL or FI_MR_HMEM for device memory moved in place.
  bool needs_registration(memory_kind kind) const noexcept override {
    const auto mode = info_->domain_attr->mr_mode;
    if (kind == memory_kind::host) return (mode & FI_MR_LOCAL) != 0;
    const auto path = path_for(kind);
    if (path == data_path::host_staged || path == data_path::unreachable) return false;
    return path == data_path::dmabuf || (mode & (FI_MR_LOCAL | FI_MR_HMEM)) != 0;
  }

  /// fi_mr_regattr(3) of `region` along path_for(region.kind), honouring the
  /// domain's mr_mode (FI_MR_PROV_KEY: the provider picks the key, else a
  /// per-endpoint counter; FI_MR_ENDPOINT: fi_mr_bind + fi_mr_enable). Cost:
  /// a kernel pin for most providers. Errors: invalid_argument (null or
  /// empty range, DMA-BUF path without an fd), unreachable_domain (the kind
  /// is staged or unreachable), registration_failed (see last_registration_error()).
  std::error_code register_region(const memory_region& region,
                                  registration_handle& out) noexcept override {
    if (!ep_) return make_error_code(errc::aborted);
    if (!region.address || region.length == 0) return make_error_code(errc::invalid_argument);
    const data_path path = path_for(region.kind);
    if (path == data_path::host_staged || path == data_path::unreachable) {
      return make_error_code(errc::unreachable_domain);
    }
#if defined(FI_MR_DMABUF)
    if (path == data_path::dmabuf && region.dmabuf_fd < 0) return make_error_code(errc::invalid_argument);
#endif
    if (path == data_path::hmem_iface && !has_hmem_ && hmem_iface_of(region) != FI_HMEM_SYSTEM) {
      return make_error_code(errc::unreachable_domain);
    }
    fid_mr* mr = nullptr;
    int rc = register_along(path, region, &mr);
    // The emulated device's DMA-BUF is a memfd: a provider that hands the fd
    // to the kernel (verbs, efa) refuses it, and its mapping still registers
    // as system memory.
    if (rc != 0 && path == data_path::dmabuf && region.kind == memory_kind::emulated_device) {
      const int refused = rc;
      rc = register_along(data_path::hmem_iface, region, &mr);
      if (rc == 0 && !dmabuf_refusal_reported_) {  // reported, not switched silently (DESIGN §5)
        dmabuf_refusal_reported_ = true;
        try {
          pdcoll::detail::log(pdcoll::detail::log_level::warn, rank_,
                              std::string("libfabric: ") + provider_ + " refused the emulated device's memfd as a " +
                                  "DMA-BUF (" + ::fi_strerror(-refused) + "); its mapped range is registered instead");
        } catch (...) {
          // Diagnostics only.
        }
      }
    }
    if (rc != 0) {
      last_registration_error_ = make_fabric_error(rc);
      return make_error_code(errc::registration_failed);
    }
    try {
      live_registrations_.insert(mr);
    } catch (...) {
      detail::close_fid(&mr->fid);
      return std::make_error_code(std::errc::not_enough_memory);
    }
    out.descriptor = ::fi_mr_desc(mr);
    out.key = ::fi_mr_key(mr);
    out.provider = mr;
    return {};
  }

  /// fi_close(3) of the registration; the handle is cleared. Unknown or
  /// already released handles are ignored.
  void deregister(registration_handle& handle) noexcept override {
    auto* mr = static_cast<fid_mr*>(handle.provider);
    if (mr && live_registrations_.erase(mr) == 1) detail::close_fid(&mr->fid);
    handle = registration_handle{};
  }

 private:
  // ---- setup ---------------------------------------------------------------

  void choose(const address_exchange& exchange) {
    // Every rank takes part in the host-name round, whatever it was asked
    // for, so the number of exchange() calls never differs between ranks.
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    const char* pdcoll_env = std::getenv("PDCOLL_PROVIDER");
    const char* fi_env = std::getenv("FI_PROVIDER");
    std::vector<std::string> hosts = exchange(host);
    if (hosts.size() != static_cast<std::size_t>(world_size_)) {
      throw std::system_error(make_error_code(errc::bootstrap),
                              "libfabric endpoint: host-name exchange returned " +
                                  std::to_string(hosts.size()) + " entries for " +
                                  std::to_string(world_size_) + " ranks");
    }
    auto choice = detail::choose_provider(opts_, pdcoll_env, fi_env, hosts);
    provider_ = choice.name;
    reason_ = choice.name + ": " + choice.reason;
  }

  fi_info* query(const std::string& provider, std::uint64_t optional_caps, int* rc_out) {
    fi_info* hints = ::fi_allocinfo();
    if (!hints) throw std::bad_alloc();
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_TAGGED | FI_MSG | FI_SEND | FI_RECV | FI_DIRECTED_RECV | optional_caps;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
                                  FI_MR_PROV_KEY | FI_MR_HMEM | FI_MR_ENDPOINT;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    hints->domain_attr->av_type = FI_AV_TABLE;
    // The contract's "matched in the order they were sent" is send-after-send order.
    hints->tx_attr->msg_order = FI_ORDER_SAS;
    hints->rx_attr->msg_order = FI_ORDER_SAS;
    hints->fabric_attr->prov_name = ::strdup(provider.c_str());
    fi_info* found = nullptr;
    // Never above the library the process runs with: built against 1.20
    // headers and run on a 1.17 library, fi_getinfo(1.20) is -FI_ENOSYS.
    // FI_VERSION orders as an integer; dmabuf_usable() reads the version granted.
    const std::uint32_t version = std::min<std::uint32_t>(detail::requested_api_version, ::fi_version());
    *rc_out = ::fi_getinfo(version, nullptr, nullptr, 0, hints, &found);
    ::fi_freeinfo(hints);
    return *rc_out == 0 ? found : nullptr;
  }

  bool wants_hmem() const {
    if (opts_.request_hmem) return *opts_.request_hmem;
    if (const char* env = std::getenv("PDCOLL_FI_HMEM"); env && *env) return std::string_view(env) != "0";
    return provider_ != "shm";
  }

  void open_objects() {
    const std::uint64_t rma = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    std::vector<std::uint64_t> wishes = {FI_SOURCE | rma | FI_HMEM, FI_SOURCE | rma,
                                         FI_SOURCE | FI_HMEM, FI_SOURCE, rma, 0};
    if (!wants_hmem()) {
      wishes.erase(std::remove_if(wishes.begin(), wishes.end(),
                                  [](std::uint64_t w) { return (w & FI_HMEM) != 0; }),
                   wishes.end());
    }
    std::vector<std::string> names = {provider_};
    if (provider_.find(';') == std::string::npos) names.push_back(provider_ + ";ofi_rxm");
    int rc = -FI_ENODATA;
    for (const auto& name : names) {
      for (auto wish : wishes) {
        info_ = query(name, wish, &rc);
        if (info_) break;
        if (rc != -FI_ENODATA) detail::throw_fabric_error("fi_getinfo", rc);
      }
      if (info_) break;
    }
    if (!info_) {
      throw std::system_error(
          make_fabric_error(rc),
          detail::describe_call("fi_getinfo", rc) + " for provider \"" + provider_ +
              "\" with FI_EP_RDM, FI_TAGGED, FI_DIRECTED_RECV (" + reason_ + ")");
    }
    provider_ = info_->fabric_attr->prov_name;
    has_hmem_ = (info_->caps & FI_HMEM) != 0;
    has_source_ = (info_->caps & FI_SOURCE) != 0;
    access_ = FI_SEND | FI_RECV;
    if (info_->caps & FI_RMA) access_ |= FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    const std::size_t max_msg = info_->ep_attr->max_msg_size;
    chunk_ = opts_.max_message_size ? std::min(opts_.max_message_size, max_msg) : max_msg;
    // A chunk size of SIZE_MAX means nothing is ever split.
    const std::size_t data_bytes = std::min<std::size_t>(info_->domain_attr->cq_data_size, 8);
    cq_data_bits_ = static_cast<unsigned>(data_bytes * 8);

    if (int r = ::fi_fabric(info_->fabric_attr, &fabric_, nullptr)) detail::throw_fabric_error("fi_fabric", r);
    if (int r = ::fi_domain(fabric_, info_, &domain_, nullptr)) detail::throw_fabric_error("fi_domain", r);

    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    av_attr.count = static_cast<std::size_t>(world_size_);
    if (int r = ::fi_av_open(domain_, &av_attr, &av_, nullptr)) detail::throw_fabric_error("fi_av_open", r);

    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_TAGGED;
    cq_attr.size = info_->tx_attr->size + info_->rx_attr->size;
    // With manual data progress (tcp;ofi_rxm, verbs;ofi_rxm) transfers move
    // only while the caller drives the provider, and a rank asleep on the
    // CQ's fd was not woken when its socket could move more: half the runs
    // of a 2-rank 1 MiB ring on tcp sat out ~1 ms stalls (1.3 ms per
    // all-reduce instead of 0.4). Those providers back off instead (wait()).
    const bool progresses_alone = info_->domain_attr->data_progress == FI_PROGRESS_AUTO;
    cq_attr.wait_obj = opts_.use_wait_fd && progresses_alone ? FI_WAIT_FD : FI_WAIT_NONE;
    int r = ::fi_cq_open(domain_, &cq_attr, &cq_, nullptr);
    if (r != 0 && cq_attr.wait_obj != FI_WAIT_NONE) {
      cq_attr.wait_obj = FI_WAIT_NONE;  // the provider has no fd to sleep on: back off instead
      r = ::fi_cq_open(domain_, &cq_attr, &cq_, nullptr);
    }
    if (r != 0) detail::throw_fabric_error("fi_cq_open", r);
    if (cq_attr.wait_obj == FI_WAIT_FD) {
      int fd = -1;
      if (::fi_control(&cq_->fid, FI_GETWAIT, &fd) == 0 && fd >= 0) wait_fd_ = fd;
    }

    if (int e = ::fi_endpoint(domain_, info_, &ep_, nullptr)) detail::throw_fabric_error("fi_endpoint", e);
    if (int e = ::fi_ep_bind(ep_, &av_->fid, 0)) detail::throw_fabric_error("fi_ep_bind(av)", e);
    if (int e = ::fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV)) {
      detail::throw_fabric_error("fi_ep_bind(cq)", e);
    }
    if (provider_ == "shm") detail::remove_stale_shm_regions(::getpid());
    if (int e = ::fi_enable(ep_)) detail::throw_fabric_error("fi_enable", e);
  }

  void connect_peers(const address_exchange& exchange) {
    std::size_t len = 0;
    int r = ::fi_getname(&ep_->fid, nullptr, &len);
    if (r != -FI_ETOOSMALL && r != 0) detail::throw_fabric_error("fi_getname", r);
    std::string mine(len, '\0');
    if ((r = ::fi_getname(&ep_->fid, mine.data(), &len)) != 0) detail::throw_fabric_error("fi_getname", r);
    mine.resize(len);
    const std::vector<std::string> all = exchange(mine);
    if (all.size() != static_cast<std::size_t>(world_size_)) {
      throw std::system_error(make_error_code(errc::bootstrap),
                              "libfabric endpoint: address exchange returned " +
                                  std::to_string(all.size()) + " entries for " +
                                  std::to_string(world_size_) + " ranks");
    }
    // One insert per rank, in rank order: with FI_AV_TABLE the fi_addr_t of
    // rank i is then i (fi_av(3)), so no translation table is needed.
    for (int i = 0; i < world_size_; ++i) {
      fi_addr_t addr = FI_ADDR_NOTAVAIL;
      const int n = ::fi_av_insert(av_, all[static_cast<std::size_t>(i)].data(), 1, &addr, 0, nullptr);
      if (n != 1) detail::throw_fabric_error("fi_av_insert", n < 0 ? n : -FI_EINVAL);
      if (addr != static_cast<fi_addr_t>(i)) {
        throw std::system_error(make_error_code(errc::bootstrap),
                                "libfabric endpoint: fi_av_insert gave rank " + std::to_string(i) +
                                    " fi_addr " + std::to_string(addr));
      }
    }
    setup_shm_peers(exchange);
  }

  /// On shm, sets up what pdcoll adds to the provider, per peer: the
  /// single-copy rendezvous (see the file comment) and the doorbells that
  /// let an idle rank sleep (see wait()). Round one: every rank publishes
  /// its pid, the address of a probe word, and
  /// the name of its doorbell; every rank reads each peer's probe word with
  /// process_vm_readv (refused when ptrace rules, seccomp or a different
  /// user forbid it) and maps each peer's doorbell and node region. Round
  /// two: every rank publishes, per peer, which of the three worked; a send
  /// to peer p uses the rendezvous when p could read this rank, p answers it
  /// in a finish word when p also mapped this rank's doorbell, and this rank
  /// sleeps on its doorbell only when every peer can ring it. Every shm rank
  /// takes both rounds, whatever its options.
  void setup_shm_peers(const address_exchange& exchange) {
    const auto n = static_cast<std::size_t>(world_size_);
    rendezvous_peers_.assign(n, 0);
    rendezvous_threshold_ = SIZE_MAX;
    if (provider_ != "shm") return;
    // Default: every message above the provider's inject size, so that every
    // message the provider moves itself completes when it is posted and each
    // event a sleeping peer waits for comes with a doorbell ring.
    std::size_t threshold = info_->tx_attr->inject_size + 1;
    if (opts_.rendezvous_threshold) {
      threshold = *opts_.rendezvous_threshold;
    } else if (const char* env = std::getenv("PDCOLL_SHM_RENDEZVOUS"); env && *env) {
      threshold = static_cast<std::size_t>(std::strtoull(env, nullptr, 10));
    }
    // A notice lands in the receive buffer: a shorter message would leave
    // part of it there.
    if (threshold != 0) threshold = std::max(threshold, sizeof(detail::rendezvous_notice));
    // With FI_HMEM a buffer may be device memory that process_vm_readv cannot reach.
    const bool willing = threshold != 0 && !has_hmem_ && cq_data_bits_ >= 64;
    if (willing) {
      rendezvous_busy_.assign(n * detail::rendezvous_slots, 0);
      rendezvous_senders_.assign(rendezvous_busy_.size(), nullptr);
      awaiting_finish_words_.reserve(rendezvous_busy_.size());
    }
    finish_by_word_.assign(n, 0);
    // Every shm rank's doorbell holds the same number of finish words, so
    // peers can map it whatever their own options.
    const std::size_t finish_words = n * detail::rendezvous_slots;
    // A failed creation (a full /dev/shm, say) costs speed, not correctness:
    // the rank polls instead of sleeping, and the collectives send messages.
    auto warn_failed = [&](const char* what, std::size_t bytes) {
      const int error = errno;
      pdcoll::detail::log(pdcoll::detail::log_level::warn, rank_,
                          std::string("libfabric:shm: no ") + what + " (" + std::to_string(bytes) +
                              " bytes in /dev/shm): " + std::strerror(error));
    };
    own_bell_.create(opts_.use_wait_fd, finish_words);
    if (opts_.use_wait_fd && !own_bell_.words) warn_failed("doorbell", detail::doorbell_bytes(finish_words));
    const char* collectives_env = std::getenv("PDCOLL_SHM_COLLECTIVES");
    if (opts_.node_memory_bytes >= min_node_memory_bytes && !(collectives_env && std::string(collectives_env) == "0")) {
      node_regions_.create(rank_, world_size_, opts_.node_memory_bytes);
      if (!node_regions_.region(rank_)) warn_failed("node memory", opts_.node_memory_bytes);
    }
    // The sixth field: this rank's copy probe (copy_probe.hpp), where it
    // may have node memory.
    std::string ignored_bulk;
    const std::string mine = std::to_string(::getpid()) + " " +
                             std::to_string(reinterpret_cast<std::uintptr_t>(&probe_word_)) + " " +
                             (own_bell_.name.empty() ? std::string("-") : own_bell_.name) + " " +
                             node_regions_.own_name() + " " + std::to_string(info_->tx_attr->inject_size) + " " +
                             (node_regions_.region(rank_) ? detail::copy_probe_token(!has_hmem_, ignored_bulk)
                                                          : std::string("-"));
    if (!ignored_bulk.empty())
      pdcoll::detail::log(pdcoll::detail::log_level::warn, rank_,
                          "PDCOLL_NODE_BULK=" + ignored_bulk + " ignored (slots or messages); measuring instead");
    const auto probes = exchange(mine);
    peer_pids_.assign(n, 0);
    peer_bells_.clear();
    peer_bells_.resize(n);
    // Per peer: bit 0 its memory is readable and this rank takes rendezvous
    // notices, bit 1 its doorbell is mapped, bit 2 its node region is
    // mapped, bit 3 its memory is readable (probed whatever the options).
    std::string verdict(n, '0');
    // The smallest inject size any rank's provider reported (FI_HMEM
    // endpoints report 0): the chunk size for mixed readability, below.
    std::size_t smallest_inject = SIZE_MAX;
    for (std::size_t p = 0; p < n && probes.size() == n; ++p) {
      unsigned long long pid = 0, address = 0, inject = 0;
      char bell[128] = {}, region[128] = {};
      if (std::sscanf(probes[p].c_str(), "%llu %llu %127s %127s %llu", &pid, &address, bell, region, &inject) != 5)
        continue;
      if (inject >= sizeof(detail::rendezvous_notice)) smallest_inject = std::min<std::size_t>(smallest_inject, inject);
      int bits = 0;
      std::uint64_t word = 0;
      iovec local{&word, sizeof word};
      iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(address)), sizeof word};
      if (::process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0) == sizeof word &&
          word == probe_value) {
        bits |= 8;
        if (willing) {
          bits |= 1;
          peer_pids_[p] = static_cast<pid_t>(pid);
          receives_notices_ = true;
        }
      }
      if (static_cast<int>(p) == rank_ ? own_bell_.words != nullptr : peer_bells_[p].open(bell, finish_words))
        bits |= 2;
      if (node_regions_.open(static_cast<int>(p), region)) bits |= 4;
      verdict[p] = static_cast<char>('0' + bits);
    }
    const auto verdicts = exchange(verdict);
    own_bell_.unlink();  // every peer that could map it has
    node_regions_.unlink_own();
    // Node memory exists only where every rank mapped every region; every
    // rank reads the same verdicts, so all agree.
    bool all_mapped = verdicts.size() == n;
    for (std::size_t p = 0; p < n && all_mapped; ++p)
      for (std::size_t q = 0; q < n && all_mapped; ++q)
        all_mapped = verdicts[p].size() == n && ((verdicts[p][q] - '0') & 4);
    if (!all_mapped) node_regions_.unmap_all();
    if (all_mapped) {
      // A rank whose token does not parse counts as one without figures.
      copy_probe_tokens_.assign(n, "-");
      std::string figures;
      for (std::size_t p = 0; p < n; ++p) {
        char token[64] = {};
        if (std::sscanf(probes[p].c_str(), "%*s %*s %*s %*s %*s %63s", token) == 1)
          copy_probe_tokens_[p] = token;
        figures += " " + copy_probe_tokens_[p];
      }
      const bool all_readable = readability(verdicts).all;
      bulk_through_slots_ = detail::bulk_through_slots(copy_probe_tokens_, all_readable);
      pdcoll::detail::log(pdcoll::detail::log_level::info, rank_,
                          std::string("libfabric:shm: bulk transfers between ranks go ") +
                              (bulk_through_slots_ ? "through node memory" : "as messages where large") +
                              (all_readable ? "" : " (some ranks may not read others)") +
                              " (copy probes, kernel/user ns per 256 KiB, or PDCOLL_NODE_BULK:" + figures + ")");
    }
    bool any = false, all_ring = own_bell_.words != nullptr;
    for (std::size_t p = 0; p < n; ++p) {
      const auto& v = verdicts.size() == n ? verdicts[p] : std::string();
      const int bits = v.size() == n ? v[static_cast<std::size_t>(rank_)] - '0' : 0;
      rendezvous_peers_[p] = willing && (bits & 1);
      // p answers this rank's rendezvous sends in their finish words when it
      // mapped this rank's doorbell (and reads this rank at all).
      finish_by_word_[p] = rendezvous_peers_[p] && own_bell_.words && (bits & 2);
      any = any || rendezvous_peers_[p];
      all_ring = all_ring && (bits & 2);
    }
    if (any) rendezvous_threshold_ = threshold;
    // libfabric's shm decides once whether it may move messages by CMA and
    // shares that verdict between endpoints through their regions (its
    // smr_cma_check probes one pair and copies the answer to the others),
    // so where some ranks may read each other and others may not, the
    // provider's copy fails (EIO) for the pairs that may not. Then every
    // rank splits the messages it leaves to the provider at the inject
    // size, below which shm copies through its own buffers. Every rank
    // reads the same probes and verdicts, so all agree on the chunk size
    // (the smallest inject size published, whatever each rank's FI_HMEM).
    if (const auto r = readability(verdicts); verdicts.size() == n && r.some && !r.all) {
      const std::size_t inject = smallest_inject == SIZE_MAX ? detail::shm_inject_bytes : smallest_inject;
      if (cq_data_bits_ != 0 && inject < chunk_) {
        chunk_ = inject;
        pdcoll::detail::log(pdcoll::detail::log_level::info, rank_,
                            "libfabric:shm: some ranks may not read others (CMA); messages the provider moves "
                            "are split at " + std::to_string(inject) + " bytes");
      }
    }
    // Some peer cannot ring it: wait() backs off instead (the mapping stays,
    // for the finish words of the peers that did map it).
    sleeps_on_bell_ = all_ring;
  }

  /// Whether some pairs of ranks, and whether all, may read each other's
  /// memory (bit 3 of the verdicts, see setup_shm_peers).
  struct pair_readability {
    bool some = false;  ///< at least one pair
    bool all = true;    ///< every pair
  };
  static pair_readability readability(const std::vector<std::string>& verdicts) noexcept {
    pair_readability r;
    for (std::size_t p = 0; p < verdicts.size(); ++p) {
      for (std::size_t q = 0; q < verdicts.size(); ++q) {
        if (p == q) continue;
        const bool readable = verdicts[p].size() == verdicts.size() && ((verdicts[p][q] - '0') & 8);
        r.some = r.some || readable;
        r.all = r.all && readable;
      }
    }
    return r;
  }

  void close_objects() noexcept {
    detail::close_fid(ep_ ? &ep_->fid : nullptr);
    detail::close_fid(av_ ? &av_->fid : nullptr);
    detail::close_fid(cq_ ? &cq_->fid : nullptr);
    detail::close_fid(domain_ ? &domain_->fid : nullptr);
    detail::close_fid(fabric_ ? &fabric_->fid : nullptr);
    if (info_) ::fi_freeinfo(info_);
    forget_objects();
  }

  // Drops the pointers to the fabric objects (closed or parked).
  void forget_objects() noexcept {
    ep_ = nullptr;
    av_ = nullptr;
    cq_ = nullptr;
    domain_ = nullptr;
    fabric_ = nullptr;
    info_ = nullptr;
    wait_fd_ = -1;
  }

  // ---- posting ---------------------------------------------------------------

  std::error_code check_post(int peer, const void* buffer, std::size_t length, std::uint64_t tag,
                             completion_context* ctx, bool receive) const noexcept {
    if (closing_ || !ep_) return make_error_code(errc::aborted);
    if (!ctx || !ctx->on_complete) return make_error_code(errc::invalid_argument);
    if (ctx->transport_state[0] & detail::state_outstanding) return make_error_code(errc::invalid_argument);
    if (peer >= world_size_ || peer < (receive ? any_peer : 0)) {
      return make_error_code(errc::root_out_of_range);
    }
    if (tag & reserved_tag_bits) return make_error_code(errc::invalid_argument);
    if (!buffer && length) return make_error_code(errc::null_buffer);
    return {};
  }

  static std::uint64_t peer_bits(int peer) noexcept {
    return static_cast<std::uint64_t>(static_cast<std::uint32_t>(peer + 1)) << 32;
  }
  static int posted_peer(const completion_context* ctx) noexcept {
    return static_cast<int>(ctx->transport_state[0] >> 32) - 1;
  }
  static detail::split_transfer* split_of(const completion_context* ctx) noexcept {
    if (!(ctx->transport_state[0] & detail::state_split)) return nullptr;
    return reinterpret_cast<detail::split_transfer*>(static_cast<std::uintptr_t>(ctx->transport_state[1]));
  }

  std::uint64_t next_sequence(int peer) {
    if (sequences_.empty()) sequences_.assign(static_cast<std::size_t>(world_size_), 0);
    const std::uint64_t mask = cq_data_bits_ >= 63 ? ~reserved_tag_bits
                                                   : ((std::uint64_t{1} << cq_data_bits_) - 1);
    return sequences_[static_cast<std::size_t>(peer)]++ & mask;
  }

  /// Posts through `post`, retrying while there is no room (no_room_yet)
  /// and driving the CQ meanwhile (entries are stashed for progress(), which
  /// alone may call completions).
  /// Once a post timed out the endpoint is stalled: posts get
  /// options.stalled_post_timeout until an operation completes successfully,
  /// so that an abort's notices to every peer cost one post_timeout, not one
  /// per peer. `peer` is for diagnostics (any_peer for wildcard receives).
  template <class Post>
  std::error_code retry_post(int peer, Post&& post, bool receive = false) noexcept {
    std::chrono::steady_clock::time_point deadline{};
    for (;;) {
      const ssize_t rc = [&] {
        const detail::provider_call in(watch_slot(), "a post", peer);
        return post();
      }();
      if (rc == 0) return {};
      if (!no_room_yet(rc, receive)) return make_fabric_error(rc);
      const auto now = std::chrono::steady_clock::now();
      if (deadline == std::chrono::steady_clock::time_point{}) {
        deadline = now + (stalled_ ? opts_.stalled_post_timeout : opts_.post_timeout);
      } else if (now >= deadline) {
        // Nothing accepted for a whole post_timeout: the peer is dead or stuck.
        stalled_ = true;
        return make_error_code(errc::peer_lost);
      }
      if (stash_cq() == 0) ::sched_yield();
    }
  }

  // ---- completions -------------------------------------------------------------

  /// Reads up to `capacity` CQ entries (an error entry ends the batch).
  std::size_t read_cq(detail::cq_event* out, std::size_t capacity) noexcept {
    if (!cq_) return 0;
    fi_cq_tagged_entry entries[16];
    fi_addr_t sources[16];
    capacity = std::min<std::size_t>(capacity, 16);
    const detail::provider_call in(watch_slot(), "fi_cq_read", -1);
    const ssize_t n = has_source_ ? ::fi_cq_readfrom(cq_, entries, capacity, sources)
                                  : ::fi_cq_read(cq_, entries, capacity);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        auto& e = entries[i];
        out[i] = detail::cq_event{e.op_context, e.flags, e.len, e.data, e.tag,
                                  has_source_ ? sources[i] : FI_ADDR_NOTAVAIL, {}};
      }
      return static_cast<std::size_t>(n);
    }
    if (n == -FI_EAVAIL) {
      // fi_cq(3): -FI_EAVAIL means an error entry is waiting; read it with
      // fi_cq_readerr. err_data_size 0 lets the provider lend its buffer.
      fi_cq_err_entry err{};
      if (::fi_cq_readerr(cq_, &err, 0) != 1) return 0;
      auto code = make_fabric_error(err.err ? err.err : FI_EOTHER);
      if (code.category() == fabric_category()) {
        char text[256] = {};
        const char* prov = ::fi_cq_strerror(cq_, err.prov_errno, err.err_data, text, sizeof text);
        fabric_category().record_provider_text(code.value(), prov ? prov : text);
      }
      out[0] = detail::cq_event{err.op_context, err.flags, err.len, err.data, err.tag,
                                FI_ADDR_NOTAVAIL, code};
      return 1;
    }
    // -FI_EAGAIN: empty. Any other failure of the CQ itself has no operation
    // to report it on; the caller's deadline covers it.
    return 0;
  }

  /// Moves ready CQ entries (up to 16) to the stash; returns how many.
  /// Reads only what the stash has room for, growing it first where it
  /// can: an entry is never delivered from a local list (a completion may
  /// re-enter progress(), which must find every entry read; see
  /// deliver_stash). Out of memory with the stash full, entries stay in the
  /// completion queue for a later call.
  std::size_t stash_cq() noexcept {
    constexpr std::size_t most = 16;
    if (stash_.capacity() - stash_.size() < most) {
      try {
        stash_.reserve(stash_.size() + 4 * most);
      } catch (...) {
        // Read what fits.
      }
    }
    const std::size_t room = std::min(most, stash_.capacity() - stash_.size());
    if (room == 0) return 0;
    detail::cq_event batch[most];
    const std::size_t n = read_cq(batch, room);
    stash_.insert(stash_.end(), batch, batch + n);  // within the capacity: no allocation
    return n;
  }

  /// Delivers the stashed entries in order; returns the operations
  /// completed. Re-entrant: a completion may call progress() again (an
  /// algorithm unwinding from an exception drains its batches), and that
  /// inner call delivers what this one read but has not delivered yet, so
  /// by index and by copy, never from a local list; each entry once.
  std::size_t deliver_stash() noexcept {
    std::size_t ran = 0;
    while (stash_next_ < stash_.size()) {
      const detail::cq_event e = stash_[stash_next_++];
      ran += dispatch(e);
    }
    stash_.clear();
    stash_next_ = 0;
    return ran;
  }

  int source_of(const detail::cq_event& e, const completion_context* ctx) const noexcept {
    if (e.source != FI_ADDR_NOTAVAIL && e.source < static_cast<fi_addr_t>(world_size_)) {
      return static_cast<int>(e.source);
    }
    return posted_peer(ctx);
  }

  /// Handles one CQ entry; returns 1 when an operation completed.
  std::size_t dispatch(const detail::cq_event& e) noexcept {
    auto* ctx = static_cast<completion_context*>(e.context);
    if (!ctx || !(ctx->transport_state[0] & detail::state_outstanding)) return 0;
    const bool receive = (ctx->transport_state[0] & detail::state_receive) != 0;
    auto* split = split_of(ctx);
    if (ctx->transport_state[0] & detail::state_rendezvous) {  // the finish of a rendezvous send
      rendezvous_busy_[static_cast<std::size_t>(ctx->transport_state[4])] = 0;
      std::error_code ec = e.error;
      if (!ec && (e.tag & detail::finish_failed_bit)) ec = make_error_code(errc::peer_lost);
      finish(ctx, completion{ec, ec ? 0 : static_cast<std::size_t>(ctx->transport_state[1]), 0,
                             posted_peer(ctx)});
      return 1;
    }
    if (receive && !e.error && e.length == sizeof(detail::rendezvous_notice) && (e.flags & FI_REMOTE_CQ_DATA) &&
        (e.data & detail::rendezvous_flag)) {
      complete_rendezvous_receive(ctx, e);
      return 1;
    }
    if (receive && !e.error && (ctx->transport_state[0] & detail::state_bounce)) {
      // A short receive's message, from its context into its buffer; one
      // longer than the buffer (but not than the bounce) is truncated here.
      const auto capacity = static_cast<std::size_t>(ctx->transport_state[5]);
      const std::size_t moved = std::min(e.length, capacity);
      if (moved) std::memcpy(reinterpret_cast<void*>(static_cast<std::uintptr_t>(ctx->transport_state[4])),
                             received_at(ctx), moved);
      const std::error_code ec = e.length > capacity ? make_error_code(errc::collective_mismatch) : std::error_code{};
      finish(ctx, completion{ec, moved, e.tag, source_of(e, ctx)});
      return 1;
    }
    if (e.error && receive && (ctx->transport_state[0] & detail::state_bounce)) {
      // A message longer than the bounce: nothing was delivered to the buffer.
      finish(ctx, completion{e.error, 0, e.tag, source_of(e, ctx)});
      return 1;
    }
    if (e.error) {
      // tcp;ofi_rxm ends the receives pending on a connection that broke
      // with FI_ECANCELED; nobody asked for that cancel, so say what it is.
      auto error = e.error;
      if (error == std::errc::operation_canceled &&
          !(ctx->transport_state[0] & detail::state_cancel_requested)) {
        error = make_error_code(errc::peer_lost);
      }
      finish(ctx, completion{error, receive ? e.length : 0, receive ? e.tag : 0,
                             receive ? source_of(e, ctx) : posted_peer(ctx)});
      return 1;
    }
    if (!split) {
      if (receive) {
        finish(ctx, completion{{}, e.length, e.tag, source_of(e, ctx)});
      } else {
        finish(ctx, completion{{}, static_cast<std::size_t>(ctx->transport_state[1]), 0,
                               posted_peer(ctx)});
      }
      return 1;
    }
    const std::size_t moved = receive ? e.length : split->posted;
    split->done += moved;
    if (receive && !split->continuing) {
      split->tag = e.tag;
      split->peer = source_of(e, ctx);
      if (moved < chunk_ || !(e.flags & FI_REMOTE_CQ_DATA)) {
        finish(ctx, completion{{}, split->done, split->tag, split->peer});
        return 1;
      }
      split->sequence = e.data;
      split->continuing = true;
    } else if (moved < chunk_) {  // the short chunk ends every split message
      finish(ctx, completion{{}, split->done, split->tag, split->peer});
      return 1;
    }
    split->continuing = true;
    // A cancel asked for meanwhile is too late (see request_cancel): only a
    // closed endpoint ends the message here.
    if (!ep_ || abandoned_) {
      finish(ctx, completion{std::make_error_code(std::errc::operation_canceled), split->done,
                             split->tag, split->peer});
      return 1;
    }
    // And forgotten: a connection that breaks later is a lost peer, not the cancel.
    ctx->transport_state[0] &= ~detail::state_cancel_requested;
    const std::size_t remaining = split->length - split->done;
    const std::uint64_t tag = reserved_tag_bits | split->sequence;
    const auto peer = static_cast<fi_addr_t>(split->peer);
    std::byte* at = split->base + split->done;
    std::error_code ec;
    if (receive) {
      split->posted = std::min(chunk_, remaining);
      ec = retry_post(
          split->peer, [&] { return ::fi_trecv(ep_, at, split->posted, split->descriptor, peer, tag, 0, ctx); },
          /*receive=*/true);
    } else {
      split->posted = std::min(chunk_, remaining);
      ec = retry_post(split->peer, [&] {
        return ::fi_tsend(ep_, at, split->posted, split->descriptor, peer, tag, ctx);
      });
      if (!ec) ring(split->peer);
    }
    if (ec) {
      finish(ctx, completion{ec, split->done, split->tag, split->peer});
      return 1;
    }
    return 0;
  }

  void request_cancel(completion_context* ctx) noexcept {
    // A message sent in chunks is past cancelling once a chunk has moved:
    // its peer matched (or will match) that chunk and waits for the rest on
    // the continuation tag, so ending it would leave the peer's receive
    // waiting until its deadline, or the sender's chunks unmatched. It
    // completes normally (or at close()), as fi_cancel leaves a matched
    // operation. The first chunk's own fi_cancel still wins while queued.
    if (const auto* split = split_of(ctx); split && split->done > 0) return;
    ctx->transport_state[0] |= detail::state_cancel_requested;
    // The receiver may be reading a rendezvous send's buffer right now: only
    // its answer (or close()) ends it.
    if (ctx->transport_state[0] & (detail::state_rendezvous | detail::state_deferred)) return;  // deferred: flush_deferred ends it
    // fi_cancel(3): the operation completes with FI_ECANCELED if it was still
    // queued; otherwise its normal completion stands.
    if (!ep_ || abandoned_) return;  // abandoned: progress() ends it without the provider
    const detail::provider_call in(watch_slot(), "fi_cancel", -1);
    ::fi_cancel(&ep_->fid, ctx);
  }

  /// Unlinks `ctx`, releases its split record and calls its callback last,
  /// so the callback may reuse the context at once.
  void finish(completion_context* ctx, const completion& result) noexcept {
    if (!result.error) stalled_ = false;
    delete split_of(ctx);
    unlink(ctx);
    ctx->transport_state[0] = 0;
    ctx->transport_state[1] = 0;
    ctx->on_complete(ctx, result);
  }

  // Outstanding operations form an intrusive doubly linked list through
  // transport_state[2] (previous) and [3] (next): no allocation per post, and
  // the destructor can still reach every context.
  static completion_context* prev_of(const completion_context* c) noexcept {
    return reinterpret_cast<completion_context*>(static_cast<std::uintptr_t>(c->transport_state[2]));
  }
  static completion_context* next_of(const completion_context* c) noexcept {
    return reinterpret_cast<completion_context*>(static_cast<std::uintptr_t>(c->transport_state[3]));
  }
  void link(completion_context* ctx) noexcept {
    ctx->transport_state[0] |= detail::state_outstanding;
    ctx->transport_state[2] = 0;
    ctx->transport_state[3] = reinterpret_cast<std::uintptr_t>(outstanding_head_);
    if (outstanding_head_) outstanding_head_->transport_state[2] = reinterpret_cast<std::uintptr_t>(ctx);
    outstanding_head_ = ctx;
    ++outstanding_count_;
  }
  void unlink(completion_context* ctx) noexcept {
    auto* prev = prev_of(ctx);
    auto* next = next_of(ctx);
    if (prev) prev->transport_state[3] = reinterpret_cast<std::uintptr_t>(next);
    else outstanding_head_ = next;
    if (next) next->transport_state[2] = reinterpret_cast<std::uintptr_t>(prev);
    ctx->transport_state[2] = ctx->transport_state[3] = 0;
    --outstanding_count_;
  }

  // The hmem iface a region registers with along data_path::hmem_iface: its
  // own, with a Gaudi region that names none taken as FI_HMEM_SYNAPSEAI.
  static fi_hmem_iface hmem_iface_of(const memory_region& region) noexcept {
    if (region.kind == memory_kind::gaudi && region.hmem_iface == FI_HMEM_SYSTEM) return FI_HMEM_SYNAPSEAI;
    return static_cast<fi_hmem_iface>(region.hmem_iface);
  }

  // fi_mr_regattr of `region` along `path` (host, hmem_iface, or dmabuf where
  // the headers have it), then fi_mr_bind + fi_mr_enable for FI_MR_ENDPOINT.
  // Returns 0 with *out set, or the fi_* error with nothing left open.
  int register_along(data_path path, const memory_region& region, fid_mr** out) noexcept {
    iovec iov{region.address, region.length};
    fi_mr_attr attr{};
    attr.mr_iov = &iov;
    attr.iov_count = 1;
    attr.access = access_;
    attr.requested_key = (info_->domain_attr->mr_mode & FI_MR_PROV_KEY) ? 0 : next_key_++;
    attr.iface = FI_HMEM_SYSTEM;
    std::uint64_t flags = 0;
    if (path == data_path::hmem_iface) {
      attr.iface = hmem_iface_of(region);
      attr.device.reserved = region.device_id;
    }
#if defined(FI_MR_DMABUF)
    fi_mr_dmabuf dmabuf{};
    if (path == data_path::dmabuf) {
      detail::fill_dmabuf_attr(region, dmabuf, attr);
      flags |= FI_MR_DMABUF;
    }
#endif
    fid_mr* mr = nullptr;
    int rc = ::fi_mr_regattr(domain_, &attr, flags, &mr);
    if (rc == 0 && (info_->domain_attr->mr_mode & FI_MR_ENDPOINT)) {
      rc = ::fi_mr_bind(mr, &ep_->fid, 0);
      if (rc == 0) rc = ::fi_mr_enable(mr);
    }
    if (rc != 0) {
      detail::close_fid(mr ? &mr->fid : nullptr);
      return rc;
    }
    *out = mr;
    return 0;
  }

  bool dmabuf_usable() const noexcept {
#if defined(FI_MR_DMABUF)
    constexpr bool headers_have_flag = true;
#else
    constexpr bool headers_have_flag = false;
#endif
    return detail::dmabuf_registration_usable(headers_have_flag, info_->fabric_attr->api_version, has_hmem_);
  }

  static_assert(sizeof(fi_context2) <= sizeof(completion_context::provider_space),
                "completion_context::provider_space must hold a fi_context2");

  int rank_;
  int world_size_;
  options opts_;
  std::string provider_;
  std::string reason_;
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_av* av_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_ep* ep_ = nullptr;
  int wait_fd_ = -1;
  bool has_hmem_ = false;
  bool dmabuf_refusal_reported_ = false;  // the emulated device's fallback was logged
  bool has_source_ = false;
  bool closing_ = false;
  bool abandoned_ = false;  // close() on tcp;ofi_rxm: the ep stays open, its CQ is drained unread
  std::uint64_t access_ = 0;
  std::size_t chunk_ = SIZE_MAX;
  unsigned cq_data_bits_ = 0;
  std::uint64_t next_key_ = 1;
  int idle_rounds_ = 0;
  std::error_code last_registration_error_;
  std::vector<std::uint64_t> sequences_;
  static constexpr std::uint64_t probe_value = 0x7064636f6c6c2131;  // what peers' probes must read
  volatile std::uint64_t probe_word_ = probe_value;
  std::size_t rendezvous_threshold_ = SIZE_MAX;  // SIZE_MAX: no rendezvous
  std::vector<char> rendezvous_peers_;           // peer p reads this rank's sends
  std::vector<char> rendezvous_busy_;            // [peer * rendezvous_slots + slot]: a send in flight
  std::vector<completion_context*> rendezvous_senders_;  // same index: the send awaiting its finish word
  std::vector<std::uint32_t> awaiting_finish_words_;     // the slots whose send awaits its finish word
  std::vector<char> finish_by_word_;                     // peer p answers in finish words (see the file comment)
  bool sleeps_on_bell_ = false;                          // every peer can ring own_bell_: wait() sleeps on it
  bool receives_notices_ = false;  // this rank can read some peer, so rendezvous notices may come (start_recv)
  std::uint64_t finish_words_collected_ = 0;
  std::vector<pid_t> peer_pids_;                 // 0: this rank cannot read the peer
  std::uint64_t doorbell_wakeups_ = 0;
  detail::doorbell own_bell_;                 // shm: peers ring it and answer in its finish words
  std::vector<detail::doorbell> peer_bells_;  // shm: rung after posting to a peer
  detail::shared_regions node_regions_;       // shm: node memory (mapped only where every rank mapped every region)
  bool bulk_through_slots_ = false;           // shm: the copy probes' verdict (copy_probe.hpp)
  std::vector<std::string> copy_probe_tokens_;  // shm with node memory: every rank's published probe token
  wait_condition condition_;                  // also ends wait() (set by the communicator)
  bool stalled_ = false;  // a post timed out and nothing completed since (see retry_post)
  detail::provider_call_slot call_slot_;  // what the provider watchdog reads (shm)
  bool watched_ = false;                  // registered with the watchdog
  /// The slot provider calls mark, or null where no watchdog reads it.
  detail::provider_call_slot* watch_slot() noexcept { return watched_ ? &call_slot_ : nullptr; }
  std::vector<detail::cq_event> stash_;  // CQ entries read, delivered by progress() (deliver_stash)
  std::size_t stash_next_ = 0;           // the first of stash_ not yet delivered
  std::deque<detail::deferred_post> deferred_[2];  // [receive]: posts that met -FI_EAGAIN, in posting order
  std::uint64_t deferred_total_ = 0;
  std::unordered_set<fid_mr*> live_registrations_;
  completion_context* outstanding_head_ = nullptr;
  std::size_t outstanding_count_ = 0;
};

/// Opens a libfabric endpoint for `rank` of `world_size` (see fabric_endpoint
/// and options for the provider choice). Every rank must call it; it calls
/// `exchange` two or four times (see the constructor). Throws std::system_error on setup failure, with a
/// message naming the failing fi_* call and its fi_strerror text.
///
///     auto ep = pdcoll::transport::libfabric::make_endpoint(rank, size, exchange);
///     std::puts(static_cast<fabric_endpoint&>(*ep).selection_reason().c_str());
inline std::unique_ptr<endpoint> make_endpoint(int rank, int world_size,
                                               const address_exchange& exchange,
                                               const options& opts = {}) {
  return std::make_unique<fabric_endpoint>(rank, world_size, exchange, opts);
}

}  // namespace pdcoll::transport::libfabric
