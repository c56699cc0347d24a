// File: transport/uring_tcp/detail/state.hpp — the bookkeeping records of the
// uring_tcp endpoint: one per posted operation, one per unexpected message,
// one per peer connection, and the io_uring user_data tags that lead a
// completion queue entry back to them.
#pragma once

#include <endian.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <system_error>

#include "pdcoll/transport/endpoint.hpp"
#include "pdcoll/transport/uring_tcp/detail/intrusive_list.hpp"
#include "pdcoll/transport/uring_tcp/detail/mesh.hpp"
#include "pdcoll/transport/uring_tcp/detail/provided_buffers.hpp"

namespace pdcoll::transport::uring_tcp::detail {

struct fixed_buffer;  // fixed_buffers.hpp

/// What precedes every message on a connection; little-endian on the wire.
struct wire_header {
  std::uint64_t tag = 0;
  std::uint64_t length = 0;
};
static_assert(sizeof(wire_header) == 16);

/// Which handler a completion queue entry belongs to.
enum class io_kind : std::uint8_t {
  recv,     ///< the peer's receive (provided buffers, staging buffer or in place)
  send,     ///< the peer's (possibly coalesced) sendmsg
  send_zc,  ///< a zero-copy sendmsg of one operation; its notification too
};

/// The object an SQE's user_data points at. A cancel request uses user_data 0.
struct io_slot {
  io_kind kind;
  void* owner;  ///< peer_link* for recv/send, operation* for send_zc
};

struct unexpected_message;

/// One posted send or receive, from post_* until its completion is delivered.
struct operation {
  enum class kind : std::uint8_t { send, recv };
  enum class phase : std::uint8_t {
    free,                   ///< in the endpoint's free list
    queued,                 ///< posted: in a send queue or a posted-receive list
    active,                 ///< send: maybe partly on the wire; recv: matched, payload arriving
    awaiting_notification,  ///< zero-copy send fully sent, the kernel still holds its pages
    ready,                  ///< completed; its completion waits in the ready list
  };

  completion_context* ctx = nullptr;
  kind type = kind::send;
  phase state = phase::free;
  bool cancel_requested = false;
  int peer = -1;                 ///< destination, or source (any_peer until matched)
  std::byte* buffer = nullptr;
  std::size_t length = 0;
  void* descriptor = nullptr;    ///< sends: the registration handle's descriptor (a fixed_buffer slot), if any
  std::uint64_t tag = 0;
  std::uint64_t ignore = 0;
  std::uint64_t sequence = 0;    ///< post order, to pick between per-peer and any-peer receives
  wire_header wire{};            ///< sends: the header in wire byte order
  std::size_t sent = 0;          ///< sends: header + payload bytes already on the wire
  unsigned zero_copy_pending = 0;///< zero-copy notifications not yet seen
  fixed_buffer* fixed_send = nullptr;  ///< the slot of the payload SQE in flight, for a fixed-buffer send
  io_slot zero_copy_slot{io_kind::send_zc, this};
  unexpected_message* claimed = nullptr;  ///< recv waiting for this message's payload
  completion result{};
  operation* prev = nullptr;
  operation* next = nullptr;

  std::size_t wire_length() const noexcept { return sizeof(wire_header) + length; }
};

/// A message whose header arrived before a matching receive was posted. Its
/// payload is buffered here and copied out when a receive matches it.
struct unexpected_message {
  int source = -1;
  std::uint64_t tag = 0;
  std::size_t length = 0;
  std::unique_ptr<std::byte[]> data;
  std::size_t capacity = 0;         ///< bytes at data (records are reused: at least length)
  std::size_t received = 0;
  bool complete = false;
  bool dropped = false;             ///< matched by a too-small receive: discard when complete
  std::uint64_t arrival = 0;        ///< arrival order over all peers, for any_peer receives
  operation* claimed_by = nullptr;  ///< receive that matched it before its payload finished
  unexpected_message* prev = nullptr;
  unexpected_message* next = nullptr;
};

/// Most iovecs one coalesced sendmsg carries (two per message).
inline constexpr std::size_t max_send_iovecs = 64;
/// Coalescing stops once this many bytes are in one sendmsg.
inline constexpr std::size_t coalesce_bytes = 1u << 20;

/// One connection (or, at this rank's own index, the loop-back queue).
struct alignas(64) peer_link {
  // The fields progress() looks at for every peer come first, in one cache
  // line: with more ranks than cores the line is usually cold by then.
  int rank = -1;
  bool lost = false;
  bool send_in_flight = false;
  bool send_cancel_wanted = false;
  bool send_broken = false;  ///< a send found the connection dead; the loss waits for the recv (see break_link)
  bool recv_in_flight = false;
  bool recv_in_place = false;
  bool recv_cancel_wanted = false;
  bool recv_multishot = false;  ///< the recv in flight is multishot, into `provided` buffers
  bool multishot_cancel_sent = false;  ///< its cancel is queued: the rest of a large payload goes in place
  bool in_message = false;   ///< a message's payload is arriving (see below)
  file_descriptor socket;  ///< invalid for this rank itself; with directional connections, sends only
  /// With directional connections (options::directional_connections), the
  /// connection this rank receives on; invalid otherwise (socket does both).
  file_descriptor inbound;
  // Sending: a FIFO of operations; one sendmsg in flight covers its first
  // `send_covered` entries. One at a time keeps a short send from
  // interleaving bytes of two messages on the stream.
  intrusive_list<operation> sends;
  intrusive_list<operation> posted;           ///< receives posted for this peer
  std::error_code loss;    ///< why it was lost

  io_slot recv_slot{io_kind::recv, this};
  io_slot send_slot{io_kind::send, this};

  intrusive_list<operation> awaiting_notification;
  unsigned send_parts = 0;  ///< SQEs of the send in flight still owing their result (2: header + fixed payload)
  std::size_t send_covered = 0;
  io_slot* send_user_data = nullptr;

  // Receiving: one recv always in flight: a multishot recv into `provided`
  // buffers, or where the kernel lacks it a recv into the staging buffer,
  // or, for the rest of a large payload, straight into its destination.
  provided_buffers provided;
  std::unique_ptr<std::byte[]> staging;  ///< allocated only where `provided` is not used
  std::size_t staging_capacity = 0;
  /// A header whose first bytes came at the end of one completion and whose
  /// rest comes with the next.
  std::array<std::byte, sizeof(wire_header)> partial_header{};
  std::size_t partial_header_bytes = 0;

  // The message whose payload is arriving (in_message).
  wire_header header{};                       ///< host byte order
  std::size_t received = 0;
  std::byte* target = nullptr;                ///< nullptr: discard the payload
  operation* target_op = nullptr;             ///< a matched receive
  unexpected_message* target_message = nullptr;

  intrusive_list<unexpected_message> unexpected;

  // The sendmsg being gathered (iovec pairs of header and payload).
  std::array<iovec, max_send_iovecs> iov{};
  msghdr message{};

  /// The socket this rank receives from the peer on.
  int receive_socket() const noexcept { return inbound.valid() ? inbound.get() : socket.get(); }
  /// shutdown(2) of both directions of every connection to the peer.
  void shut_down() const noexcept {
    if (socket.valid()) ::shutdown(socket.get(), SHUT_RDWR);
    if (inbound.valid()) ::shutdown(inbound.get(), SHUT_RDWR);
  }
  /// Drops what the kernel still queues to send to the peer: connect(2)
  /// with AF_UNSPEC disconnects the socket (the peer gets a reset) and
  /// empties its send queue, so zero-copy sends' notifications arrive.
  /// shutdown(2) keeps the queue, and a live peer that stopped reading
  /// answers zero-window probes, so TCP never gives up on it.
  void reset() const noexcept {
    sockaddr unspecified{};
    unspecified.sa_family = AF_UNSPEC;
    if (socket.valid()) ::connect(socket.get(), &unspecified, sizeof unspecified);
    if (inbound.valid()) ::connect(inbound.get(), &unspecified, sizeof unspecified);
  }
};

}  // namespace pdcoll::transport::uring_tcp::detail
