// File: job.hpp — joining the job that launched this process: rank discovery,
// the rendezvous store, the transport and the communicator, in one call.
//
//     pdcoll::job job = pdcoll::job::from_environment();   // pdcoll-run, mpirun, srun, torchrun
//     auto& comm = job.comm();
//     pdcoll::exec::sync_wait(pdcoll::all_reduce(comm, grads));
//
// Transport: PDCOLL_TRANSPORT=libfabric (default; provider from
// PDCOLL_PROVIDER or FI_PROVIDER, else shm on one host and tcp across hosts)
// or PDCOLL_TRANSPORT=uring (host-staged TCP sockets over io_uring).
#pragma once

#include <pdcoll/bootstrap/launch_info.hpp>
#include <pdcoll/bootstrap/store.hpp>
#include <pdcoll/communicator.hpp>
#include <pdcoll/detail/env.hpp>
#include <pdcoll/detail/log.hpp>
#include <pdcoll/transport/libfabric/endpoint.hpp>
#include <pdcoll/transport/uring_tcp/endpoint.hpp>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

namespace pdcoll {

/// How a process joins its job; defaults come from the environment.
struct job_options {
  /// "libfabric" or "uring" (PDCOLL_TRANSPORT; default "libfabric").
  std::string transport = env_or("PDCOLL_TRANSPORT", "libfabric");
  /// libfabric provider; empty chooses (see transport/libfabric/endpoint.hpp).
  std::string provider;
  /// The communicator's options (timeout, progress thread, registration cache).
  communicator_options communicator;
  /// io_uring transport: payloads of at least this many bytes go out as
  /// zero-copy sends, from registered buffers where they lie in one
  /// (PDCOLL_URING_ZERO_COPY_BYTES, a whole number of bytes; default 0, off,
  /// as for anything else, such as "64k" or "-1": see uring_tcp/options.hpp).
  std::size_t uring_zero_copy_bytes =
      static_cast<std::size_t>(detail::env_number("PDCOLL_URING_ZERO_COPY_BYTES", 0).value_or(0));
  /// io_uring transport: one connection per direction between two ranks
  /// (PDCOLL_URING_DIRECTIONAL=1; default off: see
  /// uring_tcp::options::directional_connections).
  bool uring_directional = env_or("PDCOLL_URING_DIRECTIONAL", "0") == "1";
  /// io_uring transport: TCP congestion control of its connections
  /// (PDCOLL_URING_CONGESTION; default "": CUBIC within one host, else the
  /// system's; "system" never changes it; see
  /// uring_tcp::options::congestion_control).
  std::string uring_congestion = env_or("PDCOLL_URING_CONGESTION", "");
  /// io_uring transport: how connections receive (PDCOLL_URING_MULTISHOT:
  /// `1` multishot, `0` a recv at a time, unset or `auto` the automatic
  /// choice; see uring_tcp::receive_mode).
  transport::uring_tcp::receive_mode uring_receiving = uring_receive_mode(env_or("PDCOLL_URING_MULTISHOT", "auto"));

  /// PDCOLL_URING_MULTISHOT's value as a receive mode: "1" multishot, "0"
  /// single, anything else automatic.
  static transport::uring_tcp::receive_mode uring_receive_mode(const std::string& value) {
    using mode = transport::uring_tcp::receive_mode;
    return value == "1" ? mode::multishot : value == "0" ? mode::single : mode::automatic;
  }

  /// The variable's value, or `fallback` when unset or empty.
  static std::string env_or(const char* name, const char* fallback) {
    const char* v = std::getenv(name);
    return v && *v ? v : fallback;
  }
};

/// This process's membership of a job: the rendezvous store and the world
/// communicator. Destroying it runs a final barrier through the store (so no
/// rank tears its endpoint down while a peer still reads from it), bounded by
/// the communicator's timeout and skipped after an abort.
class job {
 public:
  /// Joins the job described by the launcher's environment (see
  /// bootstrap/launch_info.hpp). Throws std::system_error: errc::bootstrap or
  /// errc::timeout with a message naming the variable or the unreachable
  /// root, errc::invalid_argument for an unknown PDCOLL_TRANSPORT, or the
  /// transport's setup error.
  static job from_environment(const job_options& options = {}) {
    auto info = bootstrap::from_environment();
    return job(info, options);
  }

  /// Joins with explicit launch information.
  job(const bootstrap::launch_info& info, const job_options& options)
      : store_(std::make_unique<bootstrap::store>(bootstrap::store::connect(info))) {
    std::unique_ptr<transport::endpoint> ep;
    auto exchange = store_->exchange();
    if (options.transport == "libfabric") {
      transport::libfabric::options o;
      o.provider = options.provider;
      ep = transport::libfabric::make_endpoint(info.rank, info.world_size, exchange, o);
    } else if (options.transport == "uring" || options.transport == "uring_tcp") {
      transport::uring_tcp::options o;
      o.token = info.token;
      o.timeout = info.timeout;
      o.zero_copy_threshold = options.uring_zero_copy_bytes;
      o.directional_connections = options.uring_directional;
      o.congestion_control = options.uring_congestion;
      o.receiving = options.uring_receiving;
      ep = transport::uring_tcp::make_endpoint(info.rank, info.world_size, exchange, o);
    } else {
      throw std::system_error(make_error_code(errc::invalid_argument),
                              "PDCOLL_TRANSPORT=" + options.transport + " is not one of libfabric, uring");
    }
    detail::log(detail::log_level::info, info.rank,
                "joined a " + std::to_string(info.world_size) + "-rank job launched by " + info.launcher +
                    " over " + ep->name());
    comm_ = std::make_unique<communicator>(std::move(ep), options.communicator);
  }

  job(job&&) noexcept = default;
  job& operator=(job&&) = delete;

  /// Final barrier (unless aborted), then the communicator closes before the store.
  ~job() {
    if (!comm_) return;
    if (!comm_->aborted()) {
      try {
        store_->barrier();
      } catch (const std::system_error& e) {
        detail::log(detail::log_level::warn, comm_->rank(), std::string("final barrier failed: ") + e.what());
      }
    }
    comm_.reset();
    store_.reset();
  }

  /// The communicator of every rank of the job.
  communicator& comm() noexcept { return *comm_; }
  /// The rendezvous store (for a runtime's own key exchange).
  bootstrap::store& store() noexcept { return *store_; }
  /// This rank.
  int rank() const noexcept { return comm_->rank(); }
  /// Number of ranks.
  int world_size() const noexcept { return comm_->world_size(); }

 private:
  std::unique_ptr<bootstrap::store> store_;
  std::unique_ptr<communicator> comm_;
};

}  // namespace pdcoll
