// File: job.hpp — joining the job that launched this process: rank discovery,
// the rendezvous store, the transport and the communicator, in one call; and
// splitting the job into groups with communicators of their own (group.hpp).
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
#include <pdcoll/bootstrap/split.hpp>
#include <pdcoll/bootstrap/store.hpp>
#include <pdcoll/communicator.hpp>
#include <pdcoll/detail/env.hpp>
#include <pdcoll/detail/log.hpp>
#include <pdcoll/group.hpp>
#include <pdcoll/transport/libfabric/endpoint.hpp>
#include <pdcoll/transport/uring_tcp/endpoint.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

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
      : store_(std::make_unique<bootstrap::store>(bootstrap::store::connect(info))),
        options_(options),
        token_(info.token),
        timeout_(info.timeout) {
    auto ep = make_endpoint(info.rank, info.world_size, store_->exchange(), token_);
    detail::log(detail::log_level::info, info.rank,
                "joined a " + std::to_string(info.world_size) + "-rank job launched by " + info.launcher +
                    " over " + ep->name());
    comm_ = std::make_unique<communicator>(std::move(ep), options_.communicator);
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

  /// Splits the job's ranks into groups, as MPI_Comm_split and ncclCommSplit
  /// do: ranks that pass the same `color` (>= 0) form a group with a
  /// communicator of its own, ordered by `key`, ties by job rank; a rank
  /// that passes bootstrap::no_color joins none and gets nullopt. Every rank
  /// of the job must call it, with its splits and new_groups in the same
  /// order, and not while another thread uses store().
  ///
  /// Cost: one all_gather through the store, then the group's endpoint set
  /// up through it (bootstrap::group_exchange) over the job's transport and
  /// options. Throws std::system_error: errc::invalid_argument for a color
  /// below no_color (on the calling rank only; the others then time out),
  /// errc::collective_mismatch when ranks mixed split and new_group, the
  /// store's errors, or the transport's setup error.
  std::optional<group> split(int color, int key) {
    if (color < bootstrap::no_color)
      throw std::system_error(make_error_code(errc::invalid_argument),
                              "split color " + std::to_string(color) + " is negative and not no_color (-1)");
    return make_group({color, key, split_agreement});
  }
  /// split(color, key) with the job rank as key: groups keep the job's order.
  std::optional<group> split(int color) { return split(color, rank()); }

  /// A group of exactly `ranks` (job ranks, distinct, listed in the group's
  /// rank order), as torch.distributed.new_group makes; ranks outside it get
  /// nullopt. Every rank of the job must call it with the same list, in the
  /// same order as its other splits and new_groups. Cost and errors as
  /// split(); a list that differs between ranks fails on every rank with
  /// errc::collective_mismatch, an invalid one (a rank out of range or
  /// repeated) with errc::invalid_argument before anything is exchanged.
  std::optional<group> new_group(std::span<const int> ranks) {
    std::vector<bool> seen(static_cast<std::size_t>(world_size()), false);
    std::uint64_t digest = 14695981039346656037ull;  // FNV-1a over the list
    int key = -1;
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      const int r = ranks[i];
      if (r < 0 || r >= world_size() || seen[static_cast<std::size_t>(r)])
        throw std::system_error(make_error_code(errc::invalid_argument),
                                "new_group: rank " + std::to_string(r) +
                                    (r < 0 || r >= world_size() ? " is outside the job of " + std::to_string(world_size())
                                                                : std::string(" is listed twice")));
      seen[static_cast<std::size_t>(r)] = true;
      if (r == rank()) key = static_cast<int>(i);
      digest = (digest ^ static_cast<std::uint32_t>(r)) * 1099511628211ull;
    }
    digest = (digest ^ ranks.size()) * 1099511628211ull;
    if (digest == split_agreement) ++digest;
    return make_group({key < 0 ? bootstrap::no_color : 0, key, digest});
  }
  /// new_group over a braced list: `job.new_group({0, 2})`.
  std::optional<group> new_group(std::initializer_list<int> ranks) {
    return new_group(std::span<const int>(ranks.begin(), ranks.size()));
  }

 private:
  /// The agreement every rank of a split() passes (new_group passes a digest).
  static constexpr std::uint64_t split_agreement = 0;

  /// An endpoint of the job's transport for `rank` of `size`, set up through `exchange`.
  std::unique_ptr<transport::endpoint> make_endpoint(int rank, int size, const transport::address_exchange& exchange,
                                                     const std::string& token) const {
    if (options_.transport == "libfabric") {
      transport::libfabric::options o;
      o.provider = options_.provider;
      return transport::libfabric::make_endpoint(rank, size, exchange, o);
    }
    if (options_.transport == "uring" || options_.transport == "uring_tcp") {
      transport::uring_tcp::options o;
      o.token = token;
      o.timeout = timeout_;
      o.zero_copy_threshold = options_.uring_zero_copy_bytes;
      o.directional_connections = options_.uring_directional;
      o.congestion_control = options_.uring_congestion;
      o.receiving = options_.uring_receiving;
      return transport::uring_tcp::make_endpoint(rank, size, exchange, o);
    }
    throw std::system_error(make_error_code(errc::invalid_argument),
                            "PDCOLL_TRANSPORT=" + options_.transport + " is not one of libfabric, uring");
  }

  /// Gathers every rank's request and builds this rank's group, if it has one.
  std::optional<group> make_group(const bootstrap::split_request& mine) {
    const int number = splits_++;
    const auto gathered = store_->all_gather(bootstrap::encode(mine));
    std::vector<bootstrap::split_request> requests;
    requests.reserve(gathered.size());
    for (const auto& text : gathered) requests.push_back(bootstrap::decode_split_request(text));
    for (const auto& r : requests)
      if (r.agreement != mine.agreement)
        throw std::system_error(make_error_code(errc::collective_mismatch),
                                "split #" + std::to_string(number) +
                                    ": ranks called different splits (split and new_group, or new_group with "
                                    "different rank lists)");
    std::vector<int> members = bootstrap::split_members(requests, rank());
    if (members.empty()) return std::nullopt;
    const int index = static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
    const std::string name = "pdcoll/split/" + std::to_string(number) + "/" + std::to_string(mine.color);
    auto ep = make_endpoint(index, static_cast<int>(members.size()),
                            bootstrap::group_exchange(*store_, name, static_cast<int>(members.size()), index),
                            token_ + "/" + name);
    detail::log(detail::log_level::info, rank(),
                "split #" + std::to_string(number) + ": rank " + std::to_string(index) + " of a " +
                    std::to_string(members.size()) + "-rank group (color " + std::to_string(mine.color) + ") over " +
                    ep->name());
    return group(std::make_unique<communicator>(std::move(ep), options_.communicator), std::move(members));
  }

  std::unique_ptr<bootstrap::store> store_;
  job_options options_;
  std::string token_;
  std::chrono::milliseconds timeout_;
  int splits_ = 0;
  std::unique_ptr<communicator> comm_;
};

}  // namespace pdcoll
