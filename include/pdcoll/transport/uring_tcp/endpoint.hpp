// File: transport/uring_tcp/endpoint.hpp — the host-staged TCP transport:
// a full mesh of TCP connections driven by one io_uring per endpoint, with
// software tag matching. This is the "before Peer Direct" path: device memory
// reaches it through host bounce buffers staged by the collective layer.
//
// Wire format: every message is a 16-byte header {tag, length} (little
// endian) followed by `length` payload bytes, on the connection between the
// two ranks. TCP keeps per-pair order, and headers are matched in arrival
// order, so matching tags between one pair are matched in send order.
//
// Receiving: one recv per peer is always in flight, of one of two kinds
// (options::receiving):
// - a multishot recv (Linux 6.0) that stays armed from message to message,
//   into the connection's provided buffer (detail/provided_buffers.hpp),
//   which is parsed where it lies and given back at once;
// - a recv into a per-peer staging buffer, posted again after each
//   completion (older kernels fall back to it).
// By default the multishot recv where ranks outnumber CPUs on this host: it
// saves CPU time (about 8 % of a 4-rank 8-byte all-reduce on 2 CPUs); and a
// recv at a time elsewhere, where the ranks wait polling and the armed
// recv's completions cost a little more (up to 5 % on 2 ranks). Either way
// a completion carries headers and small payloads, many at a time. When a
// header matches a posted receive and enough of its payload is still to
// come, the rest is received in place, straight into the user's buffer (a
// multishot recv is cancelled first and armed again once that payload is
// in). A header with no matching receive becomes an unexpected message,
// buffered in memory and copied out when a receive matches it (unbounded:
// there is no flow control).
//
// Sending: per peer, queued messages go out as one sendmsg with a
// {header, payload} iovec pair per message, several messages per sendmsg
// while they are small. When the ring holds no send for that socket, the
// sendmsg is made directly from progress() with MSG_DONTWAIT (what Open MPI's
// TCP BTL does); only what the socket does not take at once (EAGAIN, a short
// write) goes through the ring. One sendmsg per peer is in flight at a time,
// so a short send never interleaves two messages. Payloads of at least
// options::zero_copy_threshold bytes use IORING_OP_SENDMSG_ZC (Linux ≥ 6.1,
// probed at run time); such a send completes after the kernel's
// notification that it no longer reads the buffer.
//
// Directional connections (options::directional_connections): two
// connections per pair, each carrying one direction. With one shared
// socket a rank's long sendmsg owns the socket the peer's data arrives on,
// which then waits in the socket's backlog until the send is done; two
// sockets let both directions run at once. Everything else is unchanged:
// `socket` sends and `inbound` receives, and a failure shuts both down.
//
// Registered buffers: register_region() puts a host range into the ring's
// table of fixed buffers (detail/fixed_buffers.hpp). A zero-copy send whose
// payload lies inside one goes out as two linked requests, the header as a
// plain IORING_OP_SEND (MSG_WAITALL, so a short header breaks the link
// instead of letting the payload overtake it; MSG_MORE, so the 16 bytes
// share a segment with the payload: sent alone, the tiny segment made most
// 64 KiB sends take ~33 ms on loopback, by the look of it a delayed ACK
// holding back the zero-copy notification) and the payload as
// IORING_OP_SEND_ZC with IORING_RECVSEND_FIXED_BUF, which skips pinning the
// pages again on every send. Such a send carries one message. Receives
// never use the table: IORING_OP_RECV does not take fixed buffers.
//
// Performance: progress() costs no syscall when nothing changed; it submits
// everything queued with a single io_uring_submit, and a small message to an
// idle socket costs one sendmsg and no ring round trip, made before
// progress() returns when a completion callback posted it (a collective's
// next step); a small message arriving costs one completion and no new recv
// (the multishot recv stays armed). Unexpected-message records and their
// buffers are reused.
// The ring runs its completion work cooperatively
// (IORING_SETUP_COOP_TASKRUN): on loopback in a 2-vCPU VM the default, an
// IPI per arriving message, made the 8-byte all-reduce on 2 ranks about
// twice as slow. wait() polls for
// options::poll_before_sleep with one cheap system call per round, then
// blocks in the kernel (io_uring_submit_and_wait_timeout). With more ranks
// than cores, polling longer does not help: sched_yield under EEVDF rarely
// hands the core to a waiting rank (over a million yields, 7,700 context
// switches on 4 ranks / 2 cores), so the partner runs only once we sleep.
#pragma once

#include <liburing.h>
#include <sched.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "pdcoll/detail/deadline.hpp"
#include "pdcoll/detail/descriptors.hpp"
#include "pdcoll/detail/log.hpp"
#include "pdcoll/error.hpp"
#include "pdcoll/transport/endpoint.hpp"
#include "pdcoll/transport/uring_tcp/detail/congestion.hpp"
#include "pdcoll/transport/uring_tcp/detail/fixed_buffers.hpp"
#include "pdcoll/transport/uring_tcp/detail/mesh.hpp"
#include "pdcoll/transport/uring_tcp/detail/state.hpp"
#include "pdcoll/transport/uring_tcp/options.hpp"

namespace pdcoll::transport::uring_tcp {

/// Counters of one endpoint, for tests and tuning. Reading them is free.
struct statistics {
  std::uint64_t messages_sent = 0;           ///< messages fully handed to the kernel
  std::uint64_t send_submissions = 0;        ///< sendmsg SQEs (coalesced messages count once)
  std::uint64_t zero_copy_submissions = 0;   ///< of which IORING_OP_SENDMSG_ZC
  std::uint64_t messages_received = 0;       ///< messages whose payload fully arrived
  std::uint64_t bytes_received_in_place = 0; ///< payload bytes received straight into their destination
  std::uint64_t bytes_staged = 0;            ///< payload bytes copied out of the staging or provided buffers
  std::uint64_t recv_submissions = 0;        ///< recv SQEs (a multishot recv counts once, however many completions)
  std::uint64_t provided_buffer_bytes = 0;   ///< bytes that arrived in provided buffers (multishot recvs)
  std::uint64_t recv_completions = 0;        ///< recv CQEs, data or not
  std::uint64_t multishot_ends = 0;          ///< multishot recvs that ended alive: out of buffers or cancelled
  std::uint64_t unexpected_messages = 0;     ///< messages that arrived before a matching receive
  std::uint64_t unexpected_bytes_copied = 0; ///< bytes copied from unexpected buffers at match time
  std::uint64_t fixed_buffer_submissions = 0;///< zero-copy sends whose payload came from a registered buffer
  std::uint64_t fixed_registrations = 0;     ///< register_region calls that filled a slot
  std::uint64_t fixed_refusals = 0;          ///< register_region calls answered with an empty handle instead
};

/// The uring_tcp endpoint. Create it with make_endpoint(); use it through
/// pdcoll::transport::endpoint (see the contract there). Not thread-safe.
class tcp_endpoint final : public transport::endpoint {
 public:
  /// Takes over a connected mesh (`sockets[r]` connected to rank r, invalid
  /// at `rank`) and sets up the ring. With directional connections,
  /// `second` is a second such mesh: between two ranks, the lower one sends
  /// on the first mesh's connection and the higher one on the second's, and
  /// each receives on the other. Throws std::system_error when
  /// io_uring_queue_init fails (e.g. ENOMEM from RLIMIT_MEMLOCK, EPERM when
  /// io_uring is disabled by sysctl or seccomp), and with
  /// errc::invalid_argument when `second` is neither empty nor one socket
  /// slot per rank.
  tcp_endpoint(int rank, int world_size, std::vector<detail::file_descriptor> sockets, const options& opts,
               std::vector<detail::file_descriptor> second = {})
      : rank_(rank),
        world_size_(world_size),
        zero_copy_threshold_(opts.zero_copy_threshold),
        poll_before_sleep_(opts.poll_before_sleep),
        fixed_(opts.fixed_buffer_slots, opts.fixed_buffer_bytes),
        directional_(!second.empty()) {
    if (directional_ && second.size() != static_cast<std::size_t>(world_size)) {
      detail::throw_pdcoll(errc::invalid_argument, "second mesh of " + std::to_string(second.size()) +
                                                       " sockets for " + std::to_string(world_size) + " ranks");
    }
    // io_uring's recv length and the provided buffers' sizes are 32-bit.
    if (opts.staging_bytes > options::max_staging_bytes)
      detail::throw_pdcoll(errc::invalid_argument, "staging_bytes " + std::to_string(opts.staging_bytes) +
                                                       " over " + std::to_string(options::max_staging_bytes));
    std::size_t staging = std::max<std::size_t>(opts.staging_bytes, 4096);
    in_place_threshold_ = staging / 4;
    peers_.reserve(static_cast<std::size_t>(world_size));
    for (int r = 0; r < world_size; ++r) {
      auto link = std::make_unique<detail::peer_link>();
      link->rank = r;
      if (r != rank) {
        link->socket = std::move(sockets[static_cast<std::size_t>(r)]);
        if (directional_) {
          link->inbound = std::move(second[static_cast<std::size_t>(r)]);
          if (rank > r) std::swap(link->socket, link->inbound);
        }
        link->staging_capacity = staging;
        ++alive_;
      }
      peers_.push_back(std::move(link));
    }
    multishot_ = opts.receiving == receive_mode::multishot ||
                 (opts.receiving == receive_mode::automatic && ranks_on_this_host() > std::thread::hardware_concurrency());
    // The ring last: nothing after it can throw and leak it.
    unsigned entries = 64;
    // Room for a recv, a send and two cancels per peer in one batch; larger
    // worlds flush a full SQ early (next_sqe) instead of growing the ring.
    while (entries < 4u * static_cast<unsigned>(world_size) + 8u && entries < 4096) entries <<= 1;
    io_uring_params params{};
    // COOP_TASKRUN: a completion (a recv that found data, a send that found
    // room) finishes as task work in this process. Without the flag the
    // kernel interrupts this process with an IPI to run it, a VM exit under
    // virtualisation; with it the work waits for our next system call, and
    // wait() makes one every few microseconds. TASKRUN_FLAG marks the SQ
    // ring when such work is pending, so progress() enters the kernel only
    // then. Both need Linux 5.19; older kernels get the plain ring.
    params.flags = IORING_SETUP_CQSIZE | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG;
    params.cq_entries = entries * 4;
    int rc = io_uring_queue_init_params(entries, &ring_, &params);
    if (rc == -EINVAL) {
      params = {};
      params.flags = IORING_SETUP_CQSIZE;
      params.cq_entries = entries * 4;
      rc = io_uring_queue_init_params(entries, &ring_, &params);
    }
    if (rc < 0) throw std::system_error(-rc, std::generic_category(), "uring_tcp: io_uring_queue_init_params");
    if (io_uring_probe* probe = io_uring_get_probe_ring(&ring_)) {
      zero_copy_supported_ = io_uring_opcode_supported(probe, IORING_OP_SENDMSG_ZC) != 0;
      send_zc_supported_ = io_uring_opcode_supported(probe, IORING_OP_SEND_ZC) != 0;
      io_uring_free_probe(probe);
    }
    if (multishot_) set_up_provided_buffers();
    schedule();
    io_uring_submit(&ring_);
  }

  tcp_endpoint(const tcp_endpoint&) = delete;
  tcp_endpoint& operator=(const tcp_endpoint&) = delete;

  /// Shuts every connection down and waits (up to 5 s) for the kernel to
  /// return every buffer. Operations still outstanding complete with
  /// errc::aborted, from inside the destructor.
  ~tcp_endpoint() override {
    closed_ = true;  // a completion's callback that posts again gets errc::aborted, not a post freed unrun
    const std::error_code aborted = make_error_code(errc::aborted);
    while (auto* op = any_posted_.pop_front()) complete(op, {aborted, 0, op->tag, -1});
    for (auto& link : peers_) {
      if (link->rank == rank_) {
        while (auto* op = link->posted.pop_front()) complete(op, {aborted, 0, op->tag, rank_});
      } else {
        fail_peer(*link, aborted);
      }
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (in_flight_ > 0 && std::chrono::steady_clock::now() < deadline) {
      __kernel_timespec ts{0, 100'000'000};
      io_uring_cqe* cqe = nullptr;
      io_uring_submit_and_wait_timeout(&ring_, &cqe, 1, &ts, nullptr);
      reap();
    }
    deliver();
    for (auto& link : peers_) {
      while (auto* m = link->unexpected.pop_front()) delete m;
    }
    while (auto* m = idle_unexpected_.pop_front()) delete m;
    io_uring_queue_exit(&ring_);
    log_statistics();
  }

  int rank() const noexcept override { return rank_; }
  int world_size() const noexcept override { return world_size_; }
  /// "uring_tcp", or "uring_tcp:directional" with one connection per direction.
  std::string name() const override { return directional_ ? "uring_tcp:directional" : "uring_tcp"; }

  /// The TCP congestion control of the connection(s) to `peer`, as the
  /// kernel reports it ("cubic", "bbr", ...; options::congestion_control);
  /// "" for this rank or a rank out of range. With directional connections
  /// the connection this rank sends on (both get the same setting).
  std::string congestion_control(int peer) const {
    if (peer < 0 || peer >= world_size_ || peer == rank_) return {};
    const auto& link = *peers_[static_cast<std::size_t>(peer)];
    return link.socket.valid() ? detail::congestion_control_of(link.socket.get()) : std::string{};
  }

  /// Whether this kernel offers IORING_OP_SENDMSG_ZC (probed at creation).
  bool zero_copy_supported() const noexcept { return zero_copy_supported_; }
  /// Whether sends of at least the threshold actually use zero copy.
  bool zero_copy_enabled() const noexcept { return zero_copy_supported_ && zero_copy_threshold_ > 0; }
  /// Whether connections receive with multishot recvs into provided buffers
  /// (options::receiving, and a kernel that has them: Linux 6.0). Turns
  /// false after setup if the first multishot recv finds the kernel without
  /// it.
  bool multishot_receive_enabled() const noexcept { return multishot_; }
  /// Counters since creation.
  const statistics& stats() const noexcept { return stats_; }
  /// Whether register_region can fill the fixed-buffer table: the kernel
  /// has IORING_OP_SEND_ZC, zero copy is enabled and the table has slots.
  bool fixed_buffers_enabled() const noexcept {
    return send_zc_supported_ && zero_copy_enabled() && fixed_.capacity() > 0;
  }
  /// Buffers in the fixed-buffer table now.
  std::size_t fixed_buffers_registered() const noexcept { return fixed_.registered(); }
  /// Bytes those buffers pin.
  std::size_t fixed_bytes_pinned() const noexcept { return fixed_.pinned_bytes(); }

  /// Queues a send; it goes out at the next progress() or wait(). Errors:
  /// invalid_argument (no ctx or callback), root_out_of_range (peer),
  /// null_buffer, peer_lost (the connection to `peer` is gone), transport
  /// (out of memory). A send to this rank itself is matched locally.
  ///
  /// `descriptor` may be a registration handle's descriptor from
  /// register_region(); a zero-copy send also finds its registered buffer
  /// without one (nearest registration starting at or below `buffer`).
  std::error_code post_send(int peer, const void* buffer, std::size_t length, std::uint64_t tag,
                            void* descriptor, completion_context* ctx) noexcept override {
    if (auto ec = validate(peer, buffer, length, ctx, false)) return ec;
    auto& link = *peers_[static_cast<std::size_t>(peer)];
    if (link.lost || link.send_broken) return make_error_code(errc::peer_lost);
    auto* op = allocate(ctx, detail::operation::kind::send, peer, const_cast<void*>(buffer), length, tag, 0);
    if (!op) return make_error_code(errc::transport);
    if (peer == rank_) return send_to_self(link, op);
    op->descriptor = descriptor;
    op->wire.tag = htole64(tag);
    op->wire.length = htole64(static_cast<std::uint64_t>(length));
    link.sends.push_back(op);
    sends_posted_ = true;
    return {};
  }

  /// Posts a receive: matched first against unexpected messages (oldest
  /// first), else kept until a header matches. Errors as post_send; a
  /// receive from a lost peer fails with peer_lost unless a message that
  /// arrived before the loss matches it.
  std::error_code post_recv(int peer, void* buffer, std::size_t length, std::uint64_t tag, std::uint64_t ignore,
                            void* /*descriptor*/, completion_context* ctx) noexcept override {
    if (auto ec = validate(peer, buffer, length, ctx, true)) return ec;
    if (auto* m = find_unexpected(peer, tag, ignore)) {
      auto* op = allocate(ctx, detail::operation::kind::recv, m->source, buffer, length, tag, ignore);
      if (!op) return make_error_code(errc::transport);
      take_unexpected(m, op);
      return {};
    }
    if (peer != any_peer && peers_[static_cast<std::size_t>(peer)]->lost) return make_error_code(errc::peer_lost);
    if (peer == any_peer && world_size_ > 1 && alive_ == 0) return make_error_code(errc::peer_lost);
    auto* op = allocate(ctx, detail::operation::kind::recv, peer, buffer, length, tag, ignore);
    if (!op) return make_error_code(errc::transport);
    (peer == any_peer ? any_posted_ : peers_[static_cast<std::size_t>(peer)]->posted).push_back(op);
    return {};
  }

  /// Cancels an outstanding operation. Not yet on the wire (queued send,
  /// unmatched receive, a receive that claimed an unexpected message still
  /// arriving, which stays for the next receive): completes as cancelled at
  /// the next progress(). In flight: IORING_OP_ASYNC_CANCEL; the operation
  /// then completes once, cancelled or done. Too late, as in MPI and
  /// libfabric, for a send whose first bytes are already on the wire and
  /// for a receive whose message has begun to arrive into it: either
  /// completes normally (or when the peer is lost or the endpoint closed),
  /// since ending it early would drop the message, and the stream would
  /// hand the next receive the message after it. Unknown or completed
  /// contexts are ignored.
  void cancel(completion_context* ctx) noexcept override {
    if (closed_) return;  // close() already ends everything
    auto* op = lookup(ctx);
    if (!op || op->cancel_requested) return;
    using phase = detail::operation::phase;
    if (op->state == phase::ready || op->state == phase::awaiting_notification) return;
    const auto canceled = std::make_error_code(std::errc::operation_canceled);
    if (op->type == detail::operation::kind::recv) {
      if (op->state == phase::queued) {
        (op->peer == any_peer ? any_posted_ : peers_[static_cast<std::size_t>(op->peer)]->posted).erase(op);
        complete(op, {canceled, 0, op->tag, op->peer});
      } else if (op->claimed) {
        // The unexpected message stays, for the receive that matches it
        // next: one already posted skipped it while it was claimed.
        unexpected_message* m = std::exchange(op->claimed, nullptr);
        m->claimed_by = nullptr;
        complete(op, {canceled, 0, op->tag, op->peer});
        if (operation* next = match_posted(*peers_[static_cast<std::size_t>(m->source)], m->tag)) take_unexpected(m, next);
      }
      // Otherwise its message is arriving into it: too late (see above).
      return;
    }
    auto& link = *peers_[static_cast<std::size_t>(op->peer)];
    std::size_t position = 0;
    for (auto* it = link.sends.front(); it && it != op; it = it->next) ++position;
    if (link.send_in_flight && position < link.send_covered) {
      op->cancel_requested = true;
      link.send_cancel_wanted = true;
    } else if (op->sent == 0) {
      link.sends.erase(op);
      complete(op, {canceled, 0, op->tag, op->peer});
    }
  }

  /// Shuts every connection down (shutdown(2), so receives and blocked sends
  /// in the kernel return at once) and ends every operation: queued ones with
  /// operation_canceled at the next progress(), ones the kernel still holds
  /// when it hands their buffers back (the next few progress() calls). Later
  /// posts fail with errc::aborted. Peers see this rank as lost.
  void close() noexcept override {
    if (closed_) return;
    closed_ = true;
    const auto canceled = std::make_error_code(std::errc::operation_canceled);
    while (auto* op = any_posted_.pop_front()) complete(op, {canceled, 0, op->tag, -1});
    for (auto& link : peers_) {
      if (link->rank == rank_) {
        while (auto* op = link->posted.pop_front()) complete(op, {canceled, 0, op->tag, rank_});
      } else {
        fail_peer(*link, canceled);
      }
    }
  }

  /// Reaps completions, sends what it can straight away (see send_directly),
  /// queues the next recv/sendmsg per peer, submits once (or only runs the
  /// kernel's pending completion work, when the ring flags some), reaps what
  /// completed inline, then calls the contexts of every completed operation.
  /// Sends those callbacks posted (a collective's next step answers the
  /// message that completed its last) go out before it returns, not at the
  /// next call, which comes only once the caller's loop has gone round.
  /// Returns how many completions were delivered.
  std::size_t progress() noexcept override {
    reap();
    submit_pending();
    reap();
    const std::size_t delivered = deliver();
    if (sends_posted_) flush_posted_sends();
    return delivered;
  }

  /// Polls for options::poll_before_sleep, then blocks in
  /// io_uring_submit_and_wait_timeout(3) until a completion entry arrives or
  /// `deadline` passes; returns at once when completions wait.
  void wait(std::chrono::steady_clock::time_point deadline) noexcept override {
    if (!ready_.empty() || io_uring_cq_ready(&ring_) > 0) return;
    schedule();  // a direct send may complete here
    if (io_uring_sq_ready(&ring_) > 0) io_uring_submit(&ring_);
    auto now = std::chrono::steady_clock::now();
    if (!ready_.empty() || deadline <= now) return;
    // Poll briefly before sleeping: a reply due within microseconds costs
    // less than a sleep and a wake-up. Each round is one system call, which
    // runs the completion work the kernel holds for us (COOP_TASKRUN).
    const auto spin_until = std::min(deadline, now + poll_before_sleep_);
    while (now < spin_until) {
      if (io_uring_cq_ready(&ring_) > 0) return;
      if (task_work_pending()) {
        io_uring_get_events(&ring_);
      } else {
        ::sched_yield();
      }
      now = std::chrono::steady_clock::now();
    }
    if (deadline <= now) return;
    auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count();
    __kernel_timespec ts{left / 1'000'000'000, left % 1'000'000'000};
    io_uring_cqe* cqe = nullptr;
    io_uring_submit_and_wait_timeout(&ring_, &cqe, 1, &ts, nullptr);
  }

  /// Host memory moves directly; device memory is staged through host
  /// buffers by the collective layer.
  data_path path_for(memory_kind kind) const noexcept override {
    return kind == memory_kind::host ? data_path::host : data_path::host_staged;
  }
  /// Always false: sockets move any host memory, and registration is only
  /// an optimisation. Saying true would have the communicator's cache
  /// register every host buffer a collective touches, including per-operation
  /// scratch and bounce buffers that are freed while still cached; host
  /// memory has no invalidation hook, so a later buffer at the same address
  /// would be sent from the pages pinned for the old one. Callers that own
  /// long-lived buffers call register_region() themselves.
  bool needs_registration(memory_kind) const noexcept override { return false; }

  /// Registers host memory as a fixed buffer of the ring, for zero-copy
  /// sends from it (see the file comment). Never fails: where the range
  /// cannot be registered (device memory, zero copy off, no IORING_OP_SEND_ZC,
  /// table full, over fixed_buffer_bytes or 1 GiB, ENOMEM from
  /// RLIMIT_MEMLOCK) it returns an empty handle, logs why at
  /// PDCOLL_DEBUG=INFO, and sends from the range work as before. Costs one
  /// io_uring_register(2) call that pins the range's pages (plus one that
  /// creates the sparse table, the first time). The range must stay mapped
  /// until deregister().
  ///
  ///     registration_handle h;
  ///     ep.register_region({.address = buf, .length = n}, h);
  ///     ep.post_send(peer, buf, n, tag, h.descriptor, &ctx);  // SEND_ZC, fixed
  ///     ...                                                    // after it completed
  ///     ep.deregister(h);
  std::error_code register_region(const memory_region& region, registration_handle& out) noexcept override {
    out = {};
    if (region.length == 0) return {};
    const char* why = nullptr;
    int error = 0;
    if (region.kind != memory_kind::host) {
      why = "not host memory";
    } else if (closed_) {
      why = "the endpoint is closed";
    } else if (!zero_copy_enabled() || !send_zc_supported_) {
      why = zero_copy_enabled() ? "the kernel lacks IORING_OP_SEND_ZC" : "zero copy is off (zero_copy_threshold 0)";
    } else {
      detail::fixed_refusal refusal = detail::fixed_refusal::none;
      if (detail::fixed_buffer* slot =
              fixed_.add(ring_, static_cast<std::byte*>(region.address), region.length, refusal, error)) {
        out.descriptor = slot;
        out.provider = slot;
        out.key = slot->generation;
        ++stats_.fixed_registrations;
        return {};
      }
      switch (refusal) {
        case detail::fixed_refusal::disabled: why = "fixed_buffer_slots is 0"; break;
        case detail::fixed_refusal::unsupported: why = "the kernel refused a sparse buffer table"; break;
        case detail::fixed_refusal::too_large: why = "over 1 GiB or over fixed_buffer_bytes"; break;
        case detail::fixed_refusal::slots_full: why = "every fixed-buffer slot is taken"; break;
        default: why = "io_uring_register_buffers_update_tag failed"; break;
      }
    }
    ++stats_.fixed_refusals;
    std::string message = "uring_tcp: " + std::to_string(region.length) + " bytes not registered as a fixed buffer (" +
                          why + (error ? std::string(": ") + std::strerror(-error) : std::string()) +
                          "); sends from it pin their pages each time";
    try {
      pdcoll::detail::log(pdcoll::detail::log_level::info, rank_, message);
    } catch (...) {
      // Diagnostics only: the fallback works without the line.
    }
    return {};
  }

  /// Empties the handle's fixed-buffer slot (a no-op for an empty handle).
  /// Safe while sends from the range are in flight: the slot is emptied when
  /// the last of them has been issued (fixed_buffers.hpp), and the kernel
  /// keeps its own reference to the pages until they complete.
  void deregister(registration_handle& handle) noexcept override {
    if (auto* slot = fixed_.slot_of(handle.provider); slot && slot->generation == handle.key) fixed_.remove(ring_, slot);
    handle = {};
  }

 private:
  using operation = detail::operation;
  using peer_link = detail::peer_link;
  using unexpected_message = detail::unexpected_message;

  std::error_code validate(int peer, const void* buffer, std::size_t length, completion_context* ctx,
                           bool allow_any) const noexcept {
    if (closed_) return make_error_code(errc::aborted);
    if (!ctx || !ctx->on_complete) return make_error_code(errc::invalid_argument);
    if (!(allow_any && peer == any_peer) && (peer < 0 || peer >= world_size_)) {
      return make_error_code(errc::root_out_of_range);
    }
    if (!buffer && length > 0) return make_error_code(errc::null_buffer);
    return {};
  }

  operation* allocate(completion_context* ctx, operation::kind type, int peer, void* buffer, std::size_t length,
                      std::uint64_t tag, std::uint64_t ignore) noexcept {
    operation* op = free_.pop_front();
    if (!op) {
      try {
        op = &pool_.emplace_back();
      } catch (const std::bad_alloc&) {
        return nullptr;
      }
    }
    op->ctx = ctx;
    op->type = type;
    op->state = operation::phase::queued;
    op->cancel_requested = false;
    op->peer = peer;
    op->buffer = static_cast<std::byte*>(buffer);
    op->length = length;
    op->tag = tag;
    op->ignore = ignore;
    op->sequence = ++sequence_;
    op->sent = 0;
    op->zero_copy_pending = 0;
    op->fixed_send = nullptr;
    op->descriptor = nullptr;
    op->claimed = nullptr;
    op->result = {};
    ctx->transport_state[0] = reinterpret_cast<std::uintptr_t>(op);
    return op;
  }

  operation* lookup(completion_context* ctx) const noexcept {
    if (!ctx) return nullptr;
    auto* op = reinterpret_cast<operation*>(static_cast<std::uintptr_t>(ctx->transport_state[0]));
    if (!op || op->ctx != ctx || op->state == operation::phase::free) return nullptr;
    return op;
  }

  /// Moves `op` (in no list) to the ready list; its callback runs in deliver().
  void complete(operation* op, const completion& result) noexcept {
    op->result = result;
    op->state = operation::phase::ready;
    op->claimed = nullptr;
    ready_.push_back(op);
  }

  std::size_t deliver() noexcept {
    std::size_t delivered = 0;
    while (auto* op = ready_.pop_front()) {
      completion_context* ctx = op->ctx;
      completion result = op->result;
      ctx->transport_state[0] = 0;
      op->ctx = nullptr;
      op->state = operation::phase::free;
      free_.push_back(op);
      // Last: the callback may post again, reusing `ctx` or this record.
      ctx->on_complete(ctx, result);
      ++delivered;
    }
    return delivered;
  }

  static bool matches(const operation& op, std::uint64_t tag) noexcept {
    return ((op.tag ^ tag) & ~op.ignore) == 0;
  }

  /// The earliest-posted receive for a message from `link` with `tag`.
  operation* match_posted(peer_link& link, std::uint64_t tag) noexcept {
    operation* best = nullptr;
    for (auto* op = link.posted.front(); op; op = op->next) {
      if (matches(*op, tag)) {
        best = op;
        break;
      }
    }
    for (auto* op = any_posted_.front(); op; op = op->next) {
      if (matches(*op, tag)) {
        if (!best || op->sequence < best->sequence) best = op;
        break;
      }
    }
    if (best) {
      (best->peer == any_peer ? any_posted_ : link.posted).erase(best);
      best->peer = link.rank;
    }
    return best;
  }

  /// The oldest unclaimed unexpected message a receive (peer, tag, ignore) matches.
  unexpected_message* find_unexpected(int peer, std::uint64_t tag, std::uint64_t ignore) noexcept {
    unexpected_message* best = nullptr;
    auto search = [&](peer_link& link) {
      for (auto* m = link.unexpected.front(); m; m = m->next) {
        if (m->claimed_by || m->dropped || ((m->tag ^ tag) & ~ignore) != 0) continue;
        if (!best || m->arrival < best->arrival) best = m;
        return;
      }
    };
    if (peer == any_peer) {
      for (auto& link : peers_) search(*link);
    } else {
      search(*peers_[static_cast<std::size_t>(peer)]);
    }
    return best;
  }

  /// Receive `op` (taken off every posted list) takes unexpected message
  /// `m`: a longer message consumes it with collective_mismatch (its payload
  /// discarded as it arrives); a complete one is copied out now; one still
  /// arriving is claimed, and delivered when its last byte lands.
  void take_unexpected(unexpected_message* m, operation* op) noexcept {
    auto& link = *peers_[static_cast<std::size_t>(m->source)];
    if (m->length > op->length) {
      complete(op, {make_error_code(errc::collective_mismatch), 0, m->tag, m->source});
      if (m->complete) {
        link.unexpected.erase(m);
        free_unexpected(m);
      } else {
        m->dropped = true;
      }
    } else if (m->complete) {
      deliver_unexpected(link, m, op);
    } else {
      m->claimed_by = op;
      op->claimed = m;
      op->state = detail::operation::phase::active;
    }
  }

  void deliver_unexpected(peer_link& link, unexpected_message* m, operation* op) noexcept {
    if (m->length) std::memcpy(op->buffer, m->data.get(), m->length);
    stats_.unexpected_bytes_copied += m->length;
    complete(op, {{}, m->length, m->tag, m->source});
    link.unexpected.erase(m);
    free_unexpected(m);
  }

  /// A record for an unexpected message of `length` payload bytes (all other
  /// fields reset): an idle one with room for it, else a new one; nullptr
  /// when out of memory. A peer a step ahead makes one per small collective
  /// step, so records and their buffers are kept for the next.
  unexpected_message* new_unexpected(std::size_t length) noexcept {
    unexpected_message* m = nullptr;
    for (auto* idle = idle_unexpected_.front(); idle; idle = idle->next) {
      if (idle->capacity >= length) {
        m = idle;
        idle_unexpected_.erase(m);
        --idle_unexpected_count_;
        break;
      }
    }
    if (!m) {
      m = new (std::nothrow) unexpected_message;
      if (!m) return nullptr;
      if (length) {
        const std::size_t capacity = std::max(length, min_unexpected_capacity);
        m->data.reset(new (std::nothrow) std::byte[capacity]);
        if (!m->data) {
          delete m;
          return nullptr;
        }
        m->capacity = capacity;
      }
    }
    m->source = -1;
    m->tag = 0;
    m->length = length;
    m->received = 0;
    m->complete = false;
    m->dropped = false;
    m->arrival = 0;
    m->claimed_by = nullptr;
    m->prev = m->next = nullptr;
    return m;
  }

  /// Ends a record from new_unexpected() (in no list): kept for reuse while
  /// few are idle and its buffer is small, else freed.
  void free_unexpected(unexpected_message* m) noexcept {
    if (idle_unexpected_count_ >= max_idle_unexpected || m->capacity > max_idle_unexpected_bytes) {
      delete m;
      return;
    }
    idle_unexpected_.push_back(m);
    ++idle_unexpected_count_;
  }

  std::error_code send_to_self(peer_link& self, operation* send) noexcept {
    if (operation* recv = match_posted(self, send->tag)) {
      if (send->length > recv->length) {
        complete(recv, {make_error_code(errc::collective_mismatch), 0, send->tag, rank_});
      } else {
        if (send->length) std::memcpy(recv->buffer, send->buffer, send->length);
        complete(recv, {{}, send->length, send->tag, rank_});
      }
    } else {
      auto* m = new_unexpected(send->length);
      if (!m) {
        send->ctx->transport_state[0] = 0;
        send->state = operation::phase::free;
        free_.push_back(send);
        return make_error_code(errc::transport);
      }
      m->source = rank_;
      m->tag = send->tag;
      m->received = send->length;
      if (send->length) std::memcpy(m->data.get(), send->buffer, send->length);
      m->complete = true;
      m->arrival = ++arrival_;
      self.unexpected.push_back(m);
      ++stats_.unexpected_messages;
    }
    complete(send, {{}, send->length, send->tag, rank_});
    return {};
  }

  // ---- completion queue --------------------------------------------------

  void reap() noexcept {
    unsigned head = 0;
    unsigned seen = 0;
    io_uring_cqe* cqe = nullptr;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      handle(cqe);
      ++seen;
    }
    if (seen) io_uring_cq_advance(&ring_, seen);
  }

  void handle(const io_uring_cqe* cqe) noexcept {
    // Kernels without IORING_FEAT_EXT_ARG (< 5.11): liburing's wait queues
    // its own timeout request, which we neither counted nor own.
    if (cqe->user_data == LIBURING_UDATA_TIMEOUT) return;
    // A request is finished with its last CQE: the one without F_MORE (for
    // a zero-copy send, that is the notification).
    if (!(cqe->flags & IORING_CQE_F_MORE)) --in_flight_;
    auto* slot = static_cast<detail::io_slot*>(io_uring_cqe_get_data(cqe));
    if (!slot) return;  // an IORING_OP_ASYNC_CANCEL request
    switch (slot->kind) {
      case detail::io_kind::recv:
        on_recv(*static_cast<peer_link*>(slot->owner), cqe->res, cqe->flags);
        break;
      case detail::io_kind::send:
        on_send(*static_cast<peer_link*>(slot->owner), cqe->res);
        break;
      case detail::io_kind::send_zc: {
        auto* op = static_cast<operation*>(slot->owner);
        if (cqe->flags & IORING_CQE_F_NOTIF) {
          on_notification(op);
        } else {
          if (op->fixed_send) {  // the kernel has looked its buffer up, or never will
            fixed_.send_completed(ring_, *op->fixed_send);
            op->fixed_send = nullptr;
          }
          if (cqe->flags & IORING_CQE_F_MORE) ++op->zero_copy_pending;
          on_send(*peers_[static_cast<std::size_t>(op->peer)], cqe->res);
        }
        break;
      }
    }
  }

  // ---- receiving ---------------------------------------------------------

  void on_recv(peer_link& link, int res, unsigned flags) noexcept {
    ++stats_.recv_completions;
    if (link.recv_multishot) {
      on_multishot_recv(link, res, flags);
      return;
    }
    link.recv_in_flight = false;
    const bool in_place = link.recv_in_place;
    link.recv_in_place = false;
    if (res == -ECANCELED) {
      // Nothing was read: a stale cancel (of a multishot recv) hit this
      // recv; the next schedule() re-posts it.
      if (link.lost) fail_peer(link, loss_reason(link));
      return;
    }
    if (res <= 0 || link.lost) {
      // recv(2): 0 is an orderly shutdown; ECONNRESET etc. a dead peer.
      fail_peer(link, link.lost ? loss_reason(link) : make_error_code(errc::peer_lost));
      return;
    }
    auto n = static_cast<std::size_t>(res);
    if (in_place) {
      link.received += n;
      stats_.bytes_received_in_place += n;
      if (link.received == link.header.length) finish_message(link);
      return;
    }
    parse(link, link.staging.get(), n);
  }

  /// A completion of the link's multishot recv: bytes in one provided
  /// buffer, parsed where they lie, or its end. The buffer goes back to the
  /// kernel at once, unless the payload under way is now to be received in
  /// place: then the multishot recv is cancelled, and the buffers are held
  /// until it ends, so that it copies little more of that payload (without
  /// a buffer it ends, ENOBUFS) while the cancel is on its way. It also
  /// ends on its own when data outruns the buffers. schedule() posts the
  /// next recv, once every buffer is back.
  void on_multishot_recv(peer_link& link, int res, unsigned flags) noexcept {
    const bool ended = !(flags & IORING_CQE_F_MORE);
    if (ended) {
      link.recv_in_flight = false;
      link.recv_multishot = false;
      link.multishot_cancel_sent = false;
    }
    if (flags & IORING_CQE_F_BUFFER) {
      const unsigned id = flags >> IORING_CQE_BUFFER_SHIFT;
      if (res > 0 && !link.lost) {
        stats_.provided_buffer_bytes += static_cast<std::size_t>(res);
        parse(link, link.provided.buffer(id), static_cast<std::size_t>(res));
      }
      if (!ended && !link.lost && wants_in_place(link)) {
        link.provided.hold(id);
        if (!link.multishot_cancel_sent) {
          link.multishot_cancel_sent = true;
          link.recv_cancel_wanted = true;
        }
      } else {
        link.provided.give_back(id);
      }
    }
    if (ended) link.provided.give_back_held();
    if (res > 0) {
      if (link.lost && ended) fail_peer(link, loss_reason(link));
      return;
    }
    if (res == -ENOBUFS || res == -ECANCELED) {
      ++stats_.multishot_ends;
      if (link.lost) fail_peer(link, loss_reason(link));
      return;
    }
    if (res == -EINVAL && !link.lost) {
      // A kernel with provided-buffer rings (5.19) but no multishot recv
      // (6.0): receive with one recv at a time from now on.
      multishot_ = false;
      return;
    }
    // 0 is an orderly shutdown; a negative errno a dead peer.
    fail_peer(link, link.lost ? loss_reason(link) : make_error_code(errc::peer_lost));
  }

  /// Whether the rest of the payload arriving on the link is large enough
  /// to be received in place, straight into its destination.
  bool wants_in_place(const peer_link& link) const noexcept {
    return link.in_message && link.target && link.header.length - link.received >= in_place_threshold_;
  }

  /// Takes `n` bytes that arrived on the link (in the staging buffer or a
  /// provided one): completes the header a previous completion began (kept
  /// in link.partial_header), starts each message whose header is here,
  /// copies payload bytes to their destination and finishes the messages
  /// whose last byte is here. Leaves at most a header's start behind.
  void parse(peer_link& link, const std::byte* data, std::size_t n) noexcept {
    constexpr std::size_t header_bytes = sizeof(detail::wire_header);
    for (;;) {
      if (!link.in_message) {
        if (n == 0) return;
        detail::wire_header header;
        if (link.partial_header_bytes > 0 || n < header_bytes) {
          const std::size_t take = std::min(n, header_bytes - link.partial_header_bytes);
          std::memcpy(link.partial_header.data() + link.partial_header_bytes, data, take);
          link.partial_header_bytes += take;
          data += take;
          n -= take;
          if (link.partial_header_bytes < header_bytes) return;
          link.partial_header_bytes = 0;
          std::memcpy(&header, link.partial_header.data(), header_bytes);
        } else {
          std::memcpy(&header, data, header_bytes);
          data += header_bytes;
          n -= header_bytes;
        }
        header.tag = le64toh(header.tag);
        header.length = le64toh(header.length);
        start_message(link, header);
        if (link.lost) return;
      }
      const std::size_t k = std::min<std::size_t>(n, link.header.length - link.received);
      if (k) {
        if (link.target) {
          std::memcpy(link.target + link.received, data, k);
          stats_.bytes_staged += k;
        }
        data += k;
        n -= k;
        link.received += k;
      }
      if (link.received < link.header.length) return;
      finish_message(link);
    }
  }

  void start_message(peer_link& link, const detail::wire_header& header) noexcept {
    link.in_message = true;
    link.header = header;
    link.received = 0;
    link.target = nullptr;
    link.target_op = nullptr;
    link.target_message = nullptr;
    if (operation* op = match_posted(link, header.tag)) {
      if (header.length > op->length) {
        // Truncation: report it now and discard the payload as it arrives.
        complete(op, {make_error_code(errc::collective_mismatch), 0, header.tag, link.rank});
        return;
      }
      op->state = operation::phase::active;
      link.target_op = op;
      link.target = op->buffer;
      return;
    }
    auto* m = new_unexpected(header.length);
    if (!m) {
      // Nowhere to put it: the stream cannot continue consistently.
      fail_peer(link, make_error_code(errc::transport));
      return;
    }
    m->source = link.rank;
    m->tag = header.tag;
    m->arrival = ++arrival_;
    link.unexpected.push_back(m);
    link.target_message = m;
    link.target = m->data.get();
    ++stats_.unexpected_messages;
  }

  void finish_message(peer_link& link) noexcept {
    link.in_message = false;
    ++stats_.messages_received;
    if (operation* op = link.target_op) {
      complete(op, {{}, link.header.length, link.header.tag, link.rank});
    } else if (unexpected_message* m = link.target_message) {
      m->received = m->length;
      m->complete = true;
      if (m->claimed_by) {
        deliver_unexpected(link, m, m->claimed_by);
      } else if (m->dropped) {
        link.unexpected.erase(m);
        free_unexpected(m);
      }
    }
    link.target = nullptr;
    link.target_op = nullptr;
    link.target_message = nullptr;
  }

  // ---- sending -----------------------------------------------------------

  void on_send(peer_link& link, int res) noexcept {
    // A fixed-buffer send is two linked SQEs; the send ends with the last.
    const bool last = link.send_parts <= 1;
    link.send_parts = last ? 0 : link.send_parts - 1;
    if (last) {
      link.send_in_flight = false;
      link.send_covered = 0;
    }
    if (res < 0 && res != -ECANCELED) {
      // send(2): EPIPE / ECONNRESET, the peer is gone (MSG_NOSIGNAL: no SIGPIPE).
      if (link.lost) {
        fail_peer(link, loss_reason(link));
      } else {
        break_link(link);
      }
      return;
    }
    account_sent(link, static_cast<std::size_t>(res > 0 ? res : 0));
    if (!last) return;
    // Cancelled sends that put nothing on the wire leave the queue; the
    // stream stays consistent because none of their bytes were sent.
    for (operation* op = link.sends.front(); op;) {
      operation* next = op->next;
      if (op->cancel_requested && op->sent == 0) {
        link.sends.erase(op);
        finish_send(link, op, std::make_error_code(std::errc::operation_canceled));
      }
      op = next;
    }
    if (link.lost) fail_peer(link, loss_reason(link));
  }

  /// Advances the link's queue by `n` bytes that reached the socket,
  /// finishing every message whose last byte is among them.
  void account_sent(peer_link& link, std::size_t n) noexcept {
    while (n > 0) {
      operation* op = link.sends.front();
      std::size_t take = std::min(n, op->wire_length() - op->sent);
      op->sent += take;
      n -= take;
      if (op->sent == op->wire_length()) {
        link.sends.erase(op);
        ++stats_.messages_sent;
        finish_send(link, op, {});
      }
    }
  }

  /// Sends the link's queue with sendmsg(2) from this thread, MSG_DONTWAIT,
  /// while the socket takes whole batches; only when the ring has no send on
  /// this socket, so bytes never interleave. Saves the SQE, the ring's issue
  /// path and the CQE round trip that make most of a small message's cost.
  /// Returns false when the rest must go through the ring: the socket is
  /// full (EAGAIN or a short write) or the head is a zero-copy send. A
  /// failed socket (EPIPE, ECONNRESET) breaks the link and returns true.
  bool send_directly(peer_link& link) noexcept {
    while (operation* head = link.sends.front()) {
      if (use_zero_copy(*head)) return false;
      std::size_t covered = 0;
      std::size_t bytes = 0;
      msghdr message{};
      message.msg_iov = link.iov.data();
      message.msg_iovlen = gather(link, false, covered, bytes);
      const ssize_t n = ::sendmsg(link.socket.get(), &message, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ENOBUFS) return false;
        break_link(link);  // EPIPE, ECONNRESET: the peer is gone
        return true;
      }
      ++stats_.send_submissions;
      account_sent(link, static_cast<std::size_t>(n));
      if (static_cast<std::size_t>(n) < bytes) return false;
    }
    return true;
  }

  void finish_send(peer_link& link, operation* op, std::error_code error) noexcept {
    op->result = {error, error ? 0 : op->length, op->tag, op->peer};
    if (op->zero_copy_pending > 0) {
      op->state = operation::phase::awaiting_notification;
      link.awaiting_notification.push_back(op);
    } else {
      complete(op, op->result);
    }
  }

  void on_notification(operation* op) noexcept {
    if (--op->zero_copy_pending == 0 && op->state == operation::phase::awaiting_notification) {
      peers_[static_cast<std::size_t>(op->peer)]->awaiting_notification.erase(op);
      complete(op, op->result);
    }
  }

  /// At PDCOLL_DEBUG=INFO, one line with the counters (statistics).
  void log_statistics() const noexcept {
    if (pdcoll::detail::current_log_level() < pdcoll::detail::log_level::info) return;
    const statistics& c = stats_;
    char line[768];  // room for every counter at 20 digits
    std::snprintf(line, sizeof line,
                  "uring_tcp statistics: %llu messages sent in %llu send submissions (%llu zero-copy, %llu from "
                  "fixed buffers); %llu messages received by %llu recv submissions and %llu recv completions "
                  "(%llu multishot recvs ended alive); payload bytes %llu in place, %llu copied from staging or "
                  "provided buffers (%llu bytes arrived in provided buffers); %llu unexpected messages, %llu payload "
                  "bytes copied out of them",
                  static_cast<unsigned long long>(c.messages_sent), static_cast<unsigned long long>(c.send_submissions),
                  static_cast<unsigned long long>(c.zero_copy_submissions),
                  static_cast<unsigned long long>(c.fixed_buffer_submissions),
                  static_cast<unsigned long long>(c.messages_received),
                  static_cast<unsigned long long>(c.recv_submissions),
                  static_cast<unsigned long long>(c.recv_completions),
                  static_cast<unsigned long long>(c.multishot_ends),
                  static_cast<unsigned long long>(c.bytes_received_in_place),
                  static_cast<unsigned long long>(c.bytes_staged),
                  static_cast<unsigned long long>(c.provided_buffer_bytes),
                  static_cast<unsigned long long>(c.unexpected_messages),
                  static_cast<unsigned long long>(c.unexpected_bytes_copied));
    try {
      pdcoll::detail::log(pdcoll::detail::log_level::info, rank_, line);
    } catch (...) {
      // Diagnostics only.
    }
  }

  // ---- failure -----------------------------------------------------------

  /// A send found the connection dead. What the peer sent before it died
  /// may still wait in the socket, and the recv that reads it may still wait
  /// for this process to run the kernel's completion work (COOP_TASKRUN), so
  /// failing the peer now would fail receives that data would match. Instead
  /// shut the socket down, which ends the recv in flight with that data and
  /// then end of stream; on_recv fails the peer from there, in arrival
  /// order. With no recv in flight, schedule() posts the one that reads it
  /// (and fails the peer at once only when it cannot). Queued sends fail
  /// now (schedule()), later posts at once.
  void break_link(peer_link& link) noexcept {
    if (link.lost || link.send_broken) return;
    link.send_broken = true;
    link.shut_down();
    fail_sends(link, make_error_code(errc::peer_lost));
  }

  /// Ends the link's queued sends with `error` once the ring holds none of them.
  void fail_sends(peer_link& link, std::error_code error) noexcept {
    if (!link.send_in_flight) {
      while (auto* op = link.sends.pop_front()) finish_send(link, op, error);
    }
  }

  std::error_code loss_reason(const peer_link& link) const noexcept {
    return link.loss ? link.loss : make_error_code(errc::peer_lost);
  }

  /// Marks `link` lost (first call) and completes, with `error`, every
  /// operation with that peer the kernel no longer references. Called again
  /// as in-flight requests return, until nothing is left.
  void fail_peer(peer_link& link, std::error_code error) noexcept {
    if (!link.lost) {
      link.lost = true;
      link.loss = error;
      // shutdown(2) makes the recv and any blocked send return promptly.
      link.shut_down();
      // With zero copy a send ends only at its notification, which needs the
      // kernel to let go of the queued bytes: a reset drops them.
      if (zero_copy_threshold_ > 0) link.reset();
      --alive_;
      while (auto* op = link.posted.pop_front()) complete(op, {error, 0, op->tag, link.rank});
      if (alive_ == 0) {
        while (auto* op = any_posted_.pop_front()) complete(op, {error, 0, op->tag, -1});
      }
    }
    error = loss_reason(link);
    if (!link.recv_in_flight) {
      if (link.in_message) {
        if (operation* op = link.target_op) complete(op, {error, 0, op->tag, link.rank});
        link.in_message = false;
        link.target = nullptr;
        link.target_op = nullptr;
        link.target_message = nullptr;
      }
      for (auto* m = link.unexpected.front(); m;) {
        auto* next = m->next;
        if (!m->complete) {
          if (m->claimed_by) complete(m->claimed_by, {error, 0, m->tag, link.rank});
          link.unexpected.erase(m);
          free_unexpected(m);
        }
        m = next;
      }
    }
    fail_sends(link, error);
  }

  // ---- submission --------------------------------------------------------

  /// Whether the kernel holds completion work that our next system call
  /// runs (IORING_SQ_TASKRUN; never set on kernels without TASKRUN_FLAG),
  /// or completions that did not fit the CQ (IORING_SQ_CQ_OVERFLOW), which
  /// only an entry with GETEVENTS (io_uring_get_events) moves into it:
  /// without this check wait()'s polling missed them until it slept.
  bool task_work_pending() const noexcept {
    return (IO_URING_READ_ONCE(*ring_.sq.kflags) & (IORING_SQ_TASKRUN | IORING_SQ_CQ_OVERFLOW)) != 0;
  }

  io_uring_sqe* next_sqe() noexcept {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (!sqe) {
      io_uring_submit(&ring_);  // the SQ is full: flush it and retry once
      sqe = io_uring_get_sqe(&ring_);
    }
    if (sqe) ++in_flight_;
    return sqe;
  }

  /// schedule(), then one io_uring_submit for what it queued, or, with
  /// nothing to submit, only the kernel's pending completion work.
  void submit_pending() noexcept {
    schedule();
    if (io_uring_sq_ready(&ring_) > 0) {
      io_uring_submit(&ring_);
    } else if (task_work_pending()) {
      io_uring_get_events(&ring_);
    }
  }

  /// Sends what post_send() queued since the last schedule() on sockets
  /// with no send in the ring: directly where the socket takes it, else
  /// through the ring (one submit). The rest of schedule()'s work waits for
  /// the next progress().
  void flush_posted_sends() noexcept {
    sends_posted_ = false;
    for (auto& owned : peers_) {
      peer_link& link = *owned;
      if (link.socket.valid() && !link.lost && !link.send_broken) start_sends(link);
    }
    if (io_uring_sq_ready(&ring_) > 0) io_uring_submit(&ring_);
  }

  /// Starts the link's queued sends unless the ring holds one of its sends:
  /// directly where the socket takes them (send_directly), else through the ring.
  void start_sends(peer_link& link) noexcept {
    if (!link.send_in_flight && !link.sends.empty() && !send_directly(link)) prepare_send(link);
  }

  void schedule() noexcept {
    sends_posted_ = false;
    for (auto& owned : peers_) {
      peer_link& link = *owned;
      if (!link.socket.valid()) continue;
      // A wish stays until its cancel has an SQE (the ring may be full).
      if (link.recv_cancel_wanted && (!link.recv_in_flight || prepare_cancel(&link.recv_slot)))
        link.recv_cancel_wanted = false;
      if (link.send_cancel_wanted && (!link.send_in_flight || prepare_cancel(link.send_user_data)))
        link.send_cancel_wanted = false;
      if (link.lost) continue;
      if (!link.recv_in_flight) prepare_recv(link);
      if (link.send_broken) {
        // The loss comes from the recv; without one in flight, report it now.
        if (!link.recv_in_flight) fail_peer(link, make_error_code(errc::peer_lost));
        fail_sends(link, make_error_code(errc::peer_lost));
        continue;
      }
      start_sends(link);
    }
  }

  /// Queues IORING_OP_ASYNC_CANCEL of `slot`'s request; false when no SQE was free.
  bool prepare_cancel(detail::io_slot* slot) noexcept {
    io_uring_sqe* sqe = next_sqe();
    if (!sqe) return false;
    io_uring_prep_cancel(sqe, slot, 0);
    io_uring_sqe_set_data(sqe, nullptr);
    return true;
  }

  void prepare_recv(peer_link& link) noexcept {
    std::byte* buffer;
    std::size_t length;
    bool in_place = false;
    if (wants_in_place(link)) {
      // Staging is empty here (parse() consumed it), so the next byte on
      // the stream is this payload's: read it where it belongs.
      buffer = link.target + link.received;
      length = std::min<std::size_t>(link.header.length - link.received, 1u << 30);
      in_place = true;
    } else if (multishot_ && link.provided.active()) {
      io_uring_sqe* sqe = next_sqe();
      if (!sqe) return;
      io_uring_prep_recv_multishot(sqe, link.receive_socket(), nullptr, 0, 0);
      sqe->flags |= IOSQE_BUFFER_SELECT;
      sqe->buf_group = link.provided.group();
      io_uring_sqe_set_data(sqe, &link.recv_slot);
      link.recv_in_flight = true;
      link.recv_multishot = true;
      link.recv_in_place = false;
      ++stats_.recv_submissions;
      return;
    } else {
      if (!link.staging) {
        // The first recv into staging (the staging buffer is allocated only
        // where no multishot recv is used).
        link.staging.reset(new (std::nothrow) std::byte[link.staging_capacity]);
        if (!link.staging) {
          fail_peer(link, make_error_code(errc::transport));
          return;
        }
      }
      buffer = link.staging.get();
      length = link.staging_capacity;
    }
    io_uring_sqe* sqe = next_sqe();
    if (!sqe) return;
    io_uring_prep_recv(sqe, link.receive_socket(), buffer, length, 0);
    io_uring_sqe_set_data(sqe, &link.recv_slot);
    ++stats_.recv_submissions;
    link.recv_in_flight = true;
    link.recv_in_place = in_place;
  }

  /// This rank and the peers whose connection stays on this host
  /// (detail::same_host: loopback, or one address at both ends).
  unsigned ranks_on_this_host() const noexcept {
    unsigned ranks = 1;
    for (const auto& link : peers_) {
      if (link->socket.valid() && detail::same_host(link->socket.get())) ++ranks;
    }
    return ranks;
  }

  /// Gives every connection a group of provided buffers for its multishot
  /// recv: one buffer of the staging size (the staging buffer it replaces),
  /// group id = the peer's rank. One: with two such buffers, or one of
  /// twice the size, 2-rank all-reduces of 32-64 KiB ran at half the bus
  /// bandwidth or less, for a cause not found (docs/design-notes.md, item
  /// 27). With one, the recv ends (ENOBUFS) when data comes faster than it
  /// is parsed, where a recv at a time would be posted again anyway. Where the kernel
  /// refuses (before Linux 5.19) or memory runs out, multishot receiving is
  /// off for the endpoint, and prepare_recv() gives each connection its
  /// staging buffer instead.
  void set_up_provided_buffers() noexcept {
    for (auto& link : peers_) {
      if (!link->socket.valid()) continue;
      if (link->rank > 0xffff ||
          link->provided.setup(ring_, static_cast<unsigned short>(link->rank), 1, link->staging_capacity) < 0) {
        multishot_ = false;
        return;
      }
    }
  }

  bool use_zero_copy(const operation& op) const noexcept {
    return zero_copy_supported_ && zero_copy_threshold_ > 0 && op.length >= zero_copy_threshold_;
  }

  /// Fills link.iov with the unsent rest of the queue's first messages: one
  /// message when `zero_copy`, else until a zero-copy one, 64 iovecs or
  /// coalesce_bytes. Sets how many messages and bytes it covers; returns the
  /// iovec count.
  std::size_t gather(peer_link& link, bool zero_copy, std::size_t& covered, std::size_t& bytes) noexcept {
    std::size_t count = 0;
    covered = 0;
    bytes = 0;
    for (operation* op = link.sends.front(); op && count + 2 <= link.iov.size(); op = op->next) {
      if (covered > 0 && (zero_copy || use_zero_copy(*op) || bytes >= detail::coalesce_bytes)) break;
      std::size_t done = op->sent;
      if (done < sizeof(detail::wire_header)) {
        link.iov[count++] = {reinterpret_cast<std::byte*>(&op->wire) + done, sizeof(detail::wire_header) - done};
        done = sizeof(detail::wire_header);
      }
      std::size_t payload_done = done - sizeof(detail::wire_header);
      if (op->length > payload_done) {
        link.iov[count++] = {op->buffer + payload_done, op->length - payload_done};
      }
      bytes += op->wire_length() - op->sent;
      ++covered;
    }
    return count;
  }

  void prepare_send(peer_link& link) noexcept {
    operation* head = link.sends.front();
    const bool zero_copy = use_zero_copy(*head);
    if (zero_copy && send_zc_supported_ && fixed_.registered() > 0 && prepare_fixed_send(link, *head)) return;
    io_uring_sqe* sqe = next_sqe();
    if (!sqe) return;
    std::size_t covered = 0;
    std::size_t bytes = 0;
    link.message = {};
    link.message.msg_iov = link.iov.data();
    link.message.msg_iovlen = gather(link, zero_copy, covered, bytes);
    if (zero_copy) {
      io_uring_prep_sendmsg_zc(sqe, link.socket.get(), &link.message, MSG_NOSIGNAL);
      link.send_user_data = &head->zero_copy_slot;
      ++stats_.zero_copy_submissions;
    } else {
      io_uring_prep_sendmsg(sqe, link.socket.get(), &link.message, MSG_NOSIGNAL);
      link.send_user_data = &link.send_slot;
    }
    io_uring_sqe_set_data(sqe, link.send_user_data);
    ++stats_.send_submissions;
    link.send_parts = 1;
    link.send_covered = covered;
    std::size_t left = covered;
    for (operation* op = head; op && left > 0; op = op->next, --left) op->state = operation::phase::active;
    link.send_in_flight = true;
  }

  /// Sends the rest of `op` from its registered buffer, if it lies in one:
  /// the header (unless already sent) as IORING_OP_SEND linked to an
  /// IORING_OP_SEND_ZC of the payload with IORING_RECVSEND_FIXED_BUF. False
  /// when the payload is not inside a registered buffer or no SQE is left.
  bool prepare_fixed_send(peer_link& link, operation& op) noexcept {
    constexpr std::size_t header_bytes = sizeof(detail::wire_header);
    const std::size_t payload_done = op.sent > header_bytes ? op.sent - header_bytes : 0;
    std::byte* payload = op.buffer + payload_done;
    const std::size_t remaining = op.length - payload_done;
    detail::fixed_buffer* slot = fixed_.find(payload, remaining, fixed_.slot_of(op.descriptor));
    if (!slot) return false;
    const bool header = op.sent < header_bytes;
    // Both SQEs must go to the kernel in one submission, or the link would
    // end at the first and the payload could overtake the header.
    if (io_uring_sq_space_left(&ring_) < (header ? 2u : 1u)) io_uring_submit(&ring_);
    if (io_uring_sq_space_left(&ring_) < (header ? 2u : 1u)) return false;
    if (header) {
      io_uring_sqe* sqe = next_sqe();
      io_uring_prep_send(sqe, link.socket.get(), reinterpret_cast<std::byte*>(&op.wire) + op.sent,
                         header_bytes - op.sent, MSG_NOSIGNAL | MSG_WAITALL | MSG_MORE);
      sqe->flags |= IOSQE_IO_LINK;
      io_uring_sqe_set_data(sqe, &link.send_slot);
    }
    io_uring_sqe* sqe = next_sqe();
    // sqe->len is 32 bits; a registered buffer is at most 1 GiB anyway.
    const auto length = static_cast<unsigned>(std::min<std::size_t>(remaining, detail::fixed_buffer_table::max_buffer_bytes));
    io_uring_prep_send_zc_fixed(sqe, link.socket.get(), payload, length, MSG_NOSIGNAL, 0, slot->index);
    io_uring_sqe_set_data(sqe, &op.zero_copy_slot);
    detail::fixed_buffer_table::send_submitted(*slot);  // deregister() leaves the slot until it completes
    op.fixed_send = slot;
    link.send_user_data = header ? &link.send_slot : &op.zero_copy_slot;
    link.send_parts = header ? 2 : 1;
    link.send_covered = 1;
    link.send_in_flight = true;
    op.state = operation::phase::active;
    ++stats_.send_submissions;
    ++stats_.zero_copy_submissions;
    ++stats_.fixed_buffer_submissions;
    return true;
  }

  int rank_;
  int world_size_;
  io_uring ring_{};
  bool zero_copy_supported_ = false;
  bool send_zc_supported_ = false;
  std::size_t zero_copy_threshold_;
  std::chrono::microseconds poll_before_sleep_;
  detail::fixed_buffer_table fixed_;  ///< registered buffers (filled by register_region)
  std::size_t in_place_threshold_ = 16 * 1024;
  std::vector<std::unique_ptr<peer_link>> peers_;
  int alive_ = 0;  ///< remote peers not lost
  bool closed_ = false;  ///< close() ran: nothing more is posted
  bool directional_ = false;  ///< one connection per direction (options::directional_connections)
  bool multishot_ = false;  ///< receive with multishot recvs into provided buffers (options::receiving)
  detail::intrusive_list<operation> any_posted_;
  detail::intrusive_list<operation> ready_;
  detail::intrusive_list<operation> free_;
  std::deque<operation> pool_;  ///< stable addresses: contexts and SQEs point here
  std::uint64_t sequence_ = 0;
  std::uint64_t arrival_ = 0;
  bool sends_posted_ = false;  // post_send queued a send that no schedule() has seen yet
  // Idle unexpected-message records (new_unexpected / free_unexpected).
  static constexpr std::size_t max_idle_unexpected = 64;
  static constexpr std::size_t max_idle_unexpected_bytes = 64 * 1024;
  static constexpr std::size_t min_unexpected_capacity = 256;
  detail::intrusive_list<unexpected_message> idle_unexpected_;
  std::size_t idle_unexpected_count_ = 0;
  std::size_t in_flight_ = 0;  ///< submitted or queued requests without their final CQE
  statistics stats_;
};

/// Builds this rank's endpoint: listens on an ephemeral TCP port, publishes
/// "host:port" through `exchange`, connects the full mesh (this rank
/// connects to every higher rank and accepts every lower one, checking the
/// job token), then sets up the io_uring. Costs world_size - 1 connections
/// and 64 KiB of staging per peer; with opts.directional_connections (and
/// more than one rank), a second listener and mesh, its address published
/// in the same exchange: twice the connections. Ranks that disagree on
/// directional_connections fail with errc::bootstrap. Every connection then
/// gets opts.congestion_control (detail/congestion.hpp). Blocks until the
/// meshes are built or `opts.timeout` passes.
///
/// Throws std::system_error: errc::invalid_argument (rank, world size, token
/// too long), errc::timeout (deadline), errc::unauthenticated (a higher rank
/// refused our token), errc::bootstrap / errc::protocol (bad addresses or
/// answers), errno codes from socket calls (among them a congestion control
/// named in opts.congestion_control that the kernel refuses), and whatever
/// `exchange` throws.
///
///     auto ep = pdcoll::transport::uring_tcp::make_endpoint(
///         rank, size, [&](std::string_view mine) { return store.all_gather(mine); },
///         {.token = token});
inline std::unique_ptr<transport::endpoint> make_endpoint(int rank, int world_size, const address_exchange& exchange,
                                                          const options& opts = {}) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    detail::throw_pdcoll(errc::invalid_argument, "rank " + std::to_string(rank) + " outside world of " +
                                                     std::to_string(world_size));
  }
  if (opts.token.size() > detail::max_token_bytes) {
    detail::throw_pdcoll(errc::invalid_argument, "job token longer than 4096 bytes");
  }
  const auto deadline = pdcoll::detail::deadline_after(detail::setup_clock::now(), opts.timeout);
  // One connection per peer, two with directional connections.
  pdcoll::detail::make_room_for_descriptors((opts.directional_connections ? 2 : 1) *
                                            static_cast<rlim_t>(world_size - 1));
  std::string bind = opts.bind_address;
  if (bind.empty()) {
    if (const char* from_environment = std::getenv("PDCOLL_URING_BIND")) bind = from_environment;
  }
  const detail::socket_settings settings{opts.socket_buffer_bytes, opts.congestion_control};
  detail::listener listening = detail::make_listener(bind, world_size + 16, settings);
  // Directional connections: a second listener for the second mesh (a rank
  // already building it must not be taken for a rank still connecting the
  // first), both addresses published in the one exchange round,
  // comma-separated, so a rank set differently is caught here.
  const std::size_t meshes = opts.directional_connections && world_size > 1 ? 2 : 1;
  std::optional<detail::listener> second_listening;
  std::string mine = listening.advertised;
  if (meshes == 2) {
    second_listening.emplace(detail::make_listener(bind, world_size + 16, settings));
    mine += "," + second_listening->advertised;
  }
  const std::vector<std::string> published = exchange(mine);
  if (published.size() != static_cast<std::size_t>(world_size)) {
    detail::throw_pdcoll(errc::bootstrap, "address exchange returned " + std::to_string(published.size()) +
                                              " addresses for " + std::to_string(world_size) + " ranks");
  }
  std::vector<std::string> addresses[2];
  for (std::size_t q = 0; q < published.size(); ++q) {
    const std::size_t comma = published[q].find(',');
    if (static_cast<std::size_t>(std::count(published[q].begin(), published[q].end(), ',')) + 1 != meshes) {
      detail::throw_pdcoll(errc::bootstrap, "rank " + std::to_string(q) + " published '" + published[q] +
                                                "' and this rank " + std::to_string(meshes) +
                                                " address(es): every rank must set the same "
                                                "directional_connections (PDCOLL_URING_DIRECTIONAL)");
    }
    addresses[0].push_back(published[q].substr(0, comma));
    if (meshes == 2) addresses[1].push_back(published[q].substr(comma + 1));
  }
  auto sockets = detail::connect_mesh(rank, world_size, listening.socket, addresses[0], opts.token, settings,
                                      deadline);
  std::vector<detail::file_descriptor> second;
  if (second_listening) {
    second = detail::connect_mesh(rank, world_size, second_listening->socket, addresses[1], opts.token, settings,
                                  deadline);
  }
  for (const auto* mesh : {&sockets, &second})
    for (const auto& socket : *mesh)
      if (socket.valid()) detail::apply_congestion_control(socket.get(), opts.congestion_control);
  return std::make_unique<tcp_endpoint>(rank, world_size, std::move(sockets), opts, std::move(second));
}

}  // namespace pdcoll::transport::uring_tcp
