// File: transport/endpoint.hpp — the interface every transport implements:
// tagged, asynchronous sends and receives between the ranks of one job, with
// completions delivered through a per-operation context.
//
// Transports are chosen at run time (PDCOLL_PROVIDER, --transport), so the
// communicator holds one through this abstract interface; algorithms, data
// types and reduction ops stay compile-time. One virtual call per message is
// noise next to a network round trip.
//
// The contract, which every transport's tests check:
//  * post_send / post_recv either return an error (nothing was posted, no
//    completion will come) or succeed, and then exactly one completion is
//    delivered for that context, from inside progress(), on the thread that
//    called progress().
//  * cancel(ctx) asks for an outstanding operation to end; its completion then
//    carries std::errc::operation_canceled, unless it had already completed,
//    in which case the normal completion is delivered. Never both.
//  * A receive matches a send from `peer` (or any peer when peer == any_peer)
//    whose tag equals the receive's tag in every bit not set in `ignore`.
//    Messages between one pair of ranks with matching tags are matched in the
//    order they were sent. The completion reports the sender's full tag.
//  * A message longer than the receive buffer completes the receive with
//    errc::collective_mismatch (libfabric reports FI_ETRUNC); the data in the
//    buffer is then unspecified.
//  * Messages of any length (0 bytes included) are allowed; transports split
//    what their provider cannot carry in one message.
//  * close() shuts the data path for good, for when cancel() is not enough
//    (libfabric's shm provider cannot cancel a receive already matched to a
//    peer that died mid-transfer). Afterwards the transport holds no pointer
//    into any context: every operation outstanding at close() gets exactly one
//    completion from a later progress() (operation_canceled, or its normal
//    completion if that was already on its way), none from inside close();
//    post_send / post_recv fail at once with errc::aborted and post nothing;
//    wait() does not block while completions are pending; cancel() is a no-op;
//    register_region may fail but deregister still releases. Idempotent. A
//    transport may need to return kernel-held buffers first (io_uring), so
//    "a later progress()" can mean after a short, bounded while.
#pragma once

#include <pdcoll/transport/node_memory.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace pdcoll::transport {

/// All-gather of one byte string per rank (endpoint addresses), provided by
/// the bootstrap store: returns every rank's string, indexed by rank, or
/// throws std::system_error when the exchange fails or times out.
using address_exchange = std::function<std::vector<std::string>(std::string_view mine)>;

/// Where a buffer's bytes live, as far as a transport is concerned.
enum class memory_kind : std::uint8_t {
  host = 0,             ///< ordinary host memory
  emulated_device = 1,  ///< memfd-backed stand-in for device memory (CI)
  gaudi = 2,            ///< Habana Gaudi HBM exported as DMA-BUF
};

/// A contiguous range a transport may register and move: `address` is the
/// address the fabric sees (for device memory, the mapped device range; for
/// DMA-BUF registration, the fd/offset identify the buffer).
struct memory_region {
  void* address = nullptr;        ///< first byte as the fabric addresses it
  std::size_t length = 0;         ///< bytes
  memory_kind kind = memory_kind::host;  ///< which kind of memory the range is
  int dmabuf_fd = -1;             ///< DMA-BUF fd for device memory, -1 for host
  std::uint64_t dmabuf_offset = 0;///< offset of `address` inside the DMA-BUF
  int hmem_iface = 0;             ///< libfabric's enum fi_hmem_iface value (0: FI_HMEM_SYSTEM)
  std::uint64_t device_id = 0;    ///< device ordinal for the hmem iface
  /// Who announces this range's free before its address can be reused: the
  /// invalidation hooks of the memory domain that allocated it, or the
  /// communicator that owns the host block. Null for memory the caller owns
  /// (a vector, a span), whose free nobody announces. A communicator caches
  /// a registration only where it hears the announcement (track_frees).
  const void* free_notice = nullptr;
};

/// How a completed (or failed, or cancelled) operation ended.
struct completion {
  std::error_code error;    ///< empty on success
  std::size_t bytes = 0;    ///< bytes received (receives) or sent (sends)
  std::uint64_t tag = 0;    ///< the sender's full tag (receives)
  int peer = -1;            ///< the rank the message came from, when known (receives)
};

/// Per-operation context. Embed it in the operation state; the transport
/// keeps a pointer to it until it calls `on_complete` exactly once.
/// `provider_space` is reserved for the transport (libfabric's fi_context2 is
/// placed at the start of the object, as FI_CONTEXT2 mode requires).
struct completion_context {
  alignas(void*) unsigned char provider_space[8 * sizeof(void*)] = {};  ///< fi_context2
  /// Called once, from progress(), when the operation ends.
  void (*on_complete)(completion_context* self, const completion& result) noexcept = nullptr;
  std::uint64_t transport_state[8] = {};  ///< scratch for the transport (split messages, buffers, indices)
};

/// Rank value meaning "from any peer" in post_recv.
inline constexpr int any_peer = -1;

/// What an opaque registration handle gives back: the descriptor to pass with
/// transfers (libfabric's fi_mr_desc) and the key for RMA.
struct registration_handle {
  void* descriptor = nullptr;  ///< pass as `desc` to post_send / post_recv
  std::uint64_t key = 0;       ///< remote key, for RMA
  void* provider = nullptr;    ///< transport-owned (e.g. struct fid_mr*)
};

/// How a transport moves bytes of a given memory kind.
enum class data_path : std::uint8_t {
  unreachable = 0,   ///< cannot move this memory at all
  host = 1,          ///< ordinary host memory
  dmabuf = 2,        ///< device memory registered through FI_MR_DMABUF
  hmem_iface = 3,    ///< device memory registered as a mapped range with its fi_hmem_iface
  host_staged = 4,   ///< device memory copied through host bounce buffers
};

/// Printable name of a data path ("dmabuf", "host-staged", ...).
constexpr std::string_view to_string(data_path p) noexcept {
  switch (p) {
    case data_path::unreachable: return "unreachable";
    case data_path::host: return "host";
    case data_path::dmabuf: return "dmabuf";
    case data_path::hmem_iface: return "hmem-iface";
    case data_path::host_staged: return "host-staged";
  }
  return "?";
}

/// A connected endpoint of one rank in a job. Not thread-safe: the
/// communicator serialises calls.
class endpoint {
 public:
  virtual ~endpoint() = default;

  /// This rank, in [0, world_size()).
  virtual int rank() const noexcept = 0;
  /// Number of ranks in the job.
  virtual int world_size() const noexcept = 0;
  /// Human-readable description, e.g. "libfabric:shm" or "uring_tcp".
  virtual std::string name() const = 0;

  /// Posts a tagged send of `length` bytes at `buffer` to `peer`.
  /// `descriptor` is a registration's descriptor (nullptr when the transport
  /// does not need one). On error nothing was posted.
  virtual std::error_code post_send(int peer, const void* buffer, std::size_t length,
                                    std::uint64_t tag, void* descriptor,
                                    completion_context* ctx) noexcept = 0;
  /// Posts a tagged receive (see the matching rules above).
  virtual std::error_code post_recv(int peer, void* buffer, std::size_t length, std::uint64_t tag,
                                    std::uint64_t ignore, void* descriptor,
                                    completion_context* ctx) noexcept = 0;
  /// Requests cancellation of an outstanding operation (see contract above).
  virtual void cancel(completion_context* ctx) noexcept = 0;
  /// Shuts the data path (see the contract above): every outstanding
  /// operation completes from the following progress() calls, every later
  /// post fails with errc::aborted. The communicator calls it when an abort's
  /// cancels have not ended everything within communicator_options::abort_grace.
  /// Every pdcoll transport overrides it; the default does nothing and is only
  /// right for test doubles that never hold an operation.
  virtual void close() noexcept {}

  /// Reads completions and calls their contexts; returns how many ran.
  virtual std::size_t progress() noexcept = 0;
  /// Blocks until a completion may be ready or `deadline` passes, whichever
  /// is first, on the transport's wait object (fi_cq_sread, epoll, io_uring
  /// wait). May return early; callers loop on progress().
  virtual void wait(std::chrono::steady_clock::time_point deadline) noexcept = 0;
  /// Shared memory every rank maps (node_memory.hpp); nullptr when the
  /// transport has none (ranks on several hosts, or it was refused at setup).
  virtual node_memory* shared_node_memory() noexcept { return nullptr; }
  /// Makes wait() also return once `condition` holds. Only transports that
  /// offer shared_node_memory() need it: nothing else can change the condition.
  virtual void set_wait_condition(wait_condition condition) noexcept { (void)condition; }

  /// How this transport moves memory of `kind`.
  virtual data_path path_for(memory_kind kind) const noexcept = 0;
  /// Whether transfers need a registration descriptor (FI_MR_LOCAL etc.).
  virtual bool needs_registration(memory_kind kind) const noexcept = 0;
  /// Registers a region with the fabric (the registrar of the registration cache).
  virtual std::error_code register_region(const memory_region& region,
                                          registration_handle& out) noexcept = 0;
  /// Releases a registration made by register_region.
  virtual void deregister(registration_handle& handle) noexcept = 0;
};

}  // namespace pdcoll::transport
