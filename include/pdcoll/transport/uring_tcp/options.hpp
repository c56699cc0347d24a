// File: transport/uring_tcp/options.hpp — settings of the host-staged
// io_uring TCP transport: where to listen, the job token, the setup deadline
// and the knobs whose defaults come from loopback measurements.
#pragma once

#include <pdcoll/transport/poll_policy.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace pdcoll::transport::uring_tcp {

/// How the endpoint receives from each connection.
enum class receive_mode : std::uint8_t {
  /// `multishot` where this rank and the peers on its host (loopback
  /// connections, or one address at both ends) outnumber the host's CPUs
  /// (std::thread::hardware_concurrency), `single` elsewhere. Measured on 2
  /// CPUs over loopback: multishot took an 8-byte all-reduce on 4 ranks from
  /// 75.2 to 68.9 us and a 4 KiB one from 78.6 to 72.0 us; on 2 ranks, which
  /// wait polling, it gained nothing and cost up to 5 % (4 KiB 16.0 -> 16.8
  /// us); bandwidth the same (docs/design-notes.md, item 27).
  automatic,
  /// One multishot recv per connection (Linux 6.0; older kernels fall back
  /// to `single`) that stays armed from message to message, into a provided
  /// buffer. The rest of a large payload is still received in place.
  multishot,
  /// A recv into the staging buffer, posted again after each completion.
  single,
};

/// Settings for make_endpoint(). The defaults suit one host and small clusters.
struct options {
  /// Numeric address or host name to listen on. Empty: the PDCOLL_URING_BIND
  /// environment variable, else every IPv4 interface, advertising the first
  /// non-loopback IPv4 address that is up (127.0.0.1 when there is none).
  std::string bind_address;
  /// The job's shared secret (typically PDCOLL_TOKEN). The connecting rank
  /// sends it first; a connection with a different token is closed. At most
  /// 4096 bytes.
  std::string token;
  /// Deadline for building the mesh (listen, exchange, connect, handshake).
  std::chrono::milliseconds timeout{30000};
  /// SO_SNDBUF and SO_RCVBUF of every connection; 0 keeps the kernel's
  /// autotuning. The kernel caps the value at net.core.{w,r}mem_max.
  int socket_buffer_bytes = 0;
  /// Two connections per pair of ranks, one per direction, instead of one
  /// carrying both. On loopback one shared socket serialises the two
  /// directions: a rank's long sendmsg holds the socket that the peer's
  /// data arrives on, so that data waits in the socket's backlog until the
  /// send is done. Measured on the reference machine (pdcoll-bench, io_uring,
  /// float sum, in place, both settings in one invocation): bus bandwidth
  /// on 2 ranks 1.2-1.5x at 1-16 MiB (bench/compare.sh: 1.49x, 1.36x,
  /// 1.17x at 1, 4, 16 MiB), even from 64 MiB; on 4 ranks (on 2 cores)
  /// about 1.1x at 1-4 MiB, and at 256 KiB anywhere from 0.6x to 2.8x from
  /// run to run. But 8- and 64-byte all-reduces take about 1.2 us more
  /// (4.7 against 3.5 us on 2 ranks), as every message then needs an
  /// acknowledgement of its own.
  /// Costs world_size - 1 more connections and one more listening port.
  /// Every rank must use the same value. Off by default (the job's
  /// PDCOLL_URING_DIRECTIONAL=1 turns it on).
  bool directional_connections = false;
  /// TCP congestion control of every connection (setsockopt TCP_CONGESTION,
  /// detail/congestion.hpp), set before the connection exists. Empty, the
  /// default: CUBIC on connections that stay on the host (a loopback peer,
  /// or one IP address at both ends) and the system's choice on the others;
  /// "system": the system's choice on all; any other name ("cubic", "reno",
  /// "bbr", "dctcp", ...): that one on all, and setup throws
  /// std::system_error if the kernel refuses it. The default exists because
  /// BBR, the system default on many cloud images, paces each connection
  /// from a timer even on loopback, where nothing needs pacing. Measured on
  /// the reference machine (system default BBR; pdcoll-bench, io_uring,
  /// automatic, float sum, in place, the default and "system" alternated,
  /// medians of 3 rounds): "system" took 1.47-1.75x as long at 4-64 MiB on
  /// 2 ranks (even at 256 KiB and 1 MiB), and 1.07-1.6x as long from
  /// 64 KiB to 64 MiB on 4 ranks (on 2 cores), 1.33x at 1 MiB.
  /// The job's PDCOLL_URING_CONGESTION sets it.
  std::string congestion_control;
  /// Payloads of at least this many bytes go out with IORING_OP_SENDMSG_ZC
  /// when the kernel supports it (probed at run time); 0 never uses it. Off by
  /// default: on loopback the kernel copies zero-copy pages anyway and the
  /// extra notification costs more than it saves (see the report in
  /// tests/multiproc/uring_transport.cpp, "bandwidth" test).
  std::size_t zero_copy_threshold = 0;
  /// Per-peer receive staging buffer: headers and small payloads are read
  /// into it in batches; payloads that do not fit are received in place.
  /// At most max_staging_bytes (make_endpoint refuses more).
  std::size_t staging_bytes = 64 * 1024;
  /// The largest staging_bytes: io_uring's receive lengths are 32-bit.
  static constexpr std::size_t max_staging_bytes = std::size_t{1} << 30;
  /// How long wait() polls the completion ring before it sleeps in the kernel
  /// (poll_policy.hpp).
  std::chrono::microseconds poll_before_sleep = default_poll_before_sleep();
  /// Slots of the ring's registered-buffer table, filled by
  /// tcp_endpoint::register_region (at most 16384, the kernel's limit; 0
  /// turns registration off). Only zero-copy sends use registered buffers,
  /// so registration also needs zero_copy_threshold > 0.
  unsigned fixed_buffer_slots = 256;
  /// Most bytes the registered buffers may pin in all. Without CAP_IPC_LOCK
  /// the kernel also holds them to RLIMIT_MEMLOCK.
  std::size_t fixed_buffer_bytes = std::size_t{1} << 30;
  /// How each connection receives (receive_mode).
  receive_mode receiving = receive_mode::automatic;
};

}  // namespace pdcoll::transport::uring_tcp
