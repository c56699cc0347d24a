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
#include <pdcoll/collectives.hpp>
#include <pdcoll/communicator.hpp>
#include <pdcoll/detail/deadline.hpp>
#include <pdcoll/detail/env.hpp>
#include <pdcoll/detail/log.hpp>
#include <pdcoll/exec/sync_wait.hpp>
#include <pdcoll/group.hpp>
#include <pdcoll/transport/libfabric/endpoint.hpp>
#include <pdcoll/transport/uring_tcp/endpoint.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
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

namespace detail {

/// Makes a job's groups and its groups' groups: the endpoint factory of the
/// job's transport and options, the split protocol through the job's store,
/// and the store's key layout. The job and every group made from it share
/// it (group.hpp's group_source): the job's store is reached through a
/// pointer the job clears when it ends.
///
/// Store keys: split n of the job meets at `pdcoll/split/<n>/<color>` (the
/// group's endpoint rendezvous) and names the group `pdcoll/group/<n>/<color>`;
/// split k of group G meets at `G/split/<k>/<color>` and names its group
/// `G/group/<k>/<color>`. Rendezvous keys and group names are separate
/// trees, so erasing a finished split's rendezvous keys never touches a
/// group that is splitting meanwhile.
class group_maker final : public group_source, public std::enable_shared_from_this<group_maker> {
 public:
  /// For job rank `job_rank`, over `store` (the job's, which outlives this
  /// object or calls detach() first).
  group_maker(bootstrap::store& store, job_options options, std::string token, std::chrono::milliseconds timeout,
              int job_rank)
      : store_(&store), options_(std::move(options)), token_(std::move(token)), timeout_(timeout), rank_(job_rank) {}

  /// The job's store is gone: later splits of its groups fail, and no keys are erased.
  void detach() noexcept { store_ = nullptr; }

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

  /// The agreement every rank of a split passes (new_group passes a digest).
  static constexpr std::uint64_t split_agreement = 0;

  /// Why `color` is refused as a split's color; empty when it is not.
  static std::string color_refusal(int color) {
    if (color >= bootstrap::no_color) return {};
    return "split color " + std::to_string(color) + " is negative and not no_color (-1)";
  }
  /// A split's request (an invalid one, joining nothing, when refused).
  static bootstrap::split_request split_request_of(int color, int key, const std::string& refusal) {
    return {refusal.empty() ? color : bootstrap::no_color, key, split_agreement, refusal.empty()};
  }

  /// A split of the job: every rank's request through one store all_gather,
  /// then this rank's group, if it has one; `refusal` says why this rank's
  /// own request is invalid.
  std::optional<group> split_job(const bootstrap::split_request& mine, const std::string& refusal) {
    auto& store = attached();
    const int number = splits_++;
    // A member of a group whose setup failed inside the transport (a connect
    // to a member that is gone) arrives up to one transport deadline late;
    // a store collective that times out breaks the store for good, so wait
    // for it: the store's deadline plus the transport's (both timeout_).
    const auto gathered = store.all_gather(bootstrap::encode(mine), detail::twice(timeout_));
    // Every rank is past split number - 1, so its rendezvous keys are read:
    // free them (the store keeps keys until erased).
    if (rank_ == 0 && number > 0) store.erase_prefix(rendezvous_root(number - 1));
    std::vector<bootstrap::split_request> requests;
    requests.reserve(gathered.size());
    for (const auto& text : gathered) requests.push_back(bootstrap::decode_split_request(text));
    const std::string label = "split #" + std::to_string(number);
    check_requests(requests, mine, refusal, label);
    std::vector<int> members = bootstrap::split_members(requests, rank_);
    if (members.empty()) return std::nullopt;
    return join_group(std::move(members), rendezvous_root(number) + std::to_string(mine.color),
                      "pdcoll/group/" + std::to_string(number) + "/" + std::to_string(mine.color), label, mine.color);
  }

  /// group::split: the requests of `parent`'s members meet in an all_gather
  /// on its communicator; the rest as split_job, under the parent's prefix.
  std::optional<group> split(group& parent, int color, int key) override {
    auto& store = attached();
    const std::string refusal = color_refusal(color);
    const bootstrap::split_request mine = split_request_of(color, key, refusal);
    const int number = parent.next_split();
    const std::array<std::int64_t, 4> contribution{mine.valid ? 1 : 0, mine.color, mine.key,
                                                   static_cast<std::int64_t>(mine.agreement)};
    std::vector<std::int64_t> all(contribution.size() * static_cast<std::size_t>(parent.world_size()));
    const std::string label = "split #" + std::to_string(number) + " of a group (job rank " + std::to_string(rank_) +
                              " is its rank " + std::to_string(parent.rank()) + ")";
    // The collective's own deadline is the one that counts: the parent's
    // timeout would end it before any outer deadline of twice the job's.
    try {
      exec::sync_wait(pdcoll::all_gather(parent.comm(), std::span<const std::int64_t>(contribution),
                                         std::span<std::int64_t>(all))
                          .with_timeout(detail::twice(timeout_)));
    } catch (const std::system_error& e) {
      throw std::system_error(e.code(), label + ": the members' requests did not meet: " + e.what());
    }
    // Every member is past the parent's split number - 1: free its rendezvous keys.
    if (parent.rank() == 0 && number > 0) store.erase_prefix(parent.split_prefix(number - 1));
    std::vector<bootstrap::split_request> requests(static_cast<std::size_t>(parent.world_size()));
    for (std::size_t p = 0; p < requests.size(); ++p) {
      const std::int64_t* r = &all[p * contribution.size()];
      requests[p] = {static_cast<int>(r[1]), static_cast<int>(r[2]), static_cast<std::uint64_t>(r[3]), r[0] == 1};
    }
    check_requests(requests, mine, refusal, label);
    std::vector<int> members = bootstrap::split_members(requests, parent.rank());
    if (members.empty()) return std::nullopt;
    const auto job_ranks = parent.job_ranks();
    for (int& m : members) m = job_ranks[static_cast<std::size_t>(m)];  // ranks in the parent -> the job
    return join_group(std::move(members), parent.split_prefix(number) + std::to_string(mine.color),
                      parent.child_prefix(number, mine.color), label, mine.color);
  }

  void release(const std::string& prefix) noexcept override {
    if (!store_) return;
    try {
      store_->erase_prefix(prefix);
    } catch (const std::exception& e) {
      detail::log(detail::log_level::warn, rank_, "freeing a group's store keys failed: " + std::string(e.what()));
    }
  }

 private:
  /// The store's rendezvous keys of the job's split `number`.
  static std::string rendezvous_root(int number) { return "pdcoll/split/" + std::to_string(number) + "/"; }

  bootstrap::store& attached() const {
    if (!store_) throw std::system_error(make_error_code(errc::aborted), "split: the job this group came from has ended");
    return *store_;
  }

  /// Fails a split (`label`) on every rank that gathered `requests` when any
  /// rank's arguments were refused or the ranks called different splits.
  static void check_requests(const std::vector<bootstrap::split_request>& requests,
                             const bootstrap::split_request& mine, const std::string& refusal,
                             const std::string& label) {
    auto fail = [&](errc code, const std::string& why) {
      throw std::system_error(make_error_code(code), label + ": " + why);
    };
    if (!mine.valid) fail(errc::invalid_argument, refusal);
    for (std::size_t r = 0; r < requests.size(); ++r)
      if (!requests[r].valid) fail(errc::invalid_argument, "rank " + std::to_string(r) + "'s arguments were refused");
    for (const auto& r : requests)
      if (r.agreement != mine.agreement)
        fail(errc::collective_mismatch,
             "ranks called different splits (split and new_group, or new_group with different rank lists)");
  }

  /// This rank's group of `members` (job ranks, in group order): its
  /// endpoint set up through the store at `rendezvous`, then the closing
  /// round; the group is named `name` in the store.
  group join_group(std::vector<int> members, const std::string& rendezvous, std::string name, const std::string& label,
                   int color) {
    const int size = static_cast<int>(members.size());
    const int index = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
    bootstrap::group_rendezvous meeting(attached(), rendezvous, size, index);
    std::unique_ptr<communicator> comm;
    try {
      auto ep = make_endpoint(index, size, meeting.exchange(), token_ + "/" + rendezvous);
      detail::log(detail::log_level::info, rank_,
                  label + ": rank " + std::to_string(index) + " of a " + std::to_string(size) + "-rank group (color " +
                      std::to_string(color) + ") over " + ep->name());
      // Its log lines name the job rank and the group: "5 as rank 1 of group 2/1".
      auto options = options_.communicator;
      options.log_name = std::to_string(rank_) + " as rank " + std::to_string(index) + " of group " +
                         name.substr(std::string_view("pdcoll/group/").size());
      comm = std::make_unique<communicator>(std::move(ep), std::move(options));
    } catch (const std::exception& e) {
      meeting.fail(e.what());
      throw;
    }
    meeting.conclude();  // every member keeps the group, or none does
    return group(shared_from_this(), std::move(comm), std::move(members), std::move(name));
  }

  bootstrap::store* store_;
  job_options options_;
  std::string token_;
  std::chrono::milliseconds timeout_;
  int rank_;
  int splits_ = 0;
};

}  // namespace detail

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
        groups_(std::make_shared<detail::group_maker>(*store_, options, info.token, info.timeout, info.rank)) {
    auto ep = groups_->make_endpoint(info.rank, info.world_size, store_->exchange(), info.token);
    detail::log(detail::log_level::info, info.rank,
                "joined a " + std::to_string(info.world_size) + "-rank job launched by " + info.launcher +
                    " over " + ep->name());
    comm_ = std::make_unique<communicator>(std::move(ep), options.communicator);
  }

  job(job&&) noexcept = default;
  job& operator=(job&&) = delete;

  /// Final barrier through the store, then the communicator closes before
  /// the store. The barrier runs even when the job's communicator has
  /// aborted: the store is apart from it, and the other ranks' groups and
  /// splits may still need it (rank 0 serves it). A rank that is gone fails
  /// it at once; one that is alive but never arrives costs the job's
  /// timeout.
  ~job() {
    if (!comm_) return;
    try {
      store_->barrier();
    } catch (const std::system_error& e) {
      detail::log(detail::log_level::warn, comm_->rank(), std::string("final barrier failed: ") + e.what());
    }
    comm_.reset();
    groups_->detach();  // groups that outlive the job split no more
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
  /// up through it (bootstrap::group_rendezvous) over the job's transport
  /// and options. Every member gets the group, or every member throws.
  /// Throws std::system_error on every rank, which all stay in step for the
  /// next split: errc::invalid_argument when any rank passed a color below
  /// no_color, errc::collective_mismatch when ranks mixed split and
  /// new_group. Also the store's errors, and a member's transport or
  /// communicator setup error (the failing member's own; on the other
  /// members of its group errc::bootstrap naming it, or the transport's
  /// error if they were waiting on it there). The all_gather waits twice
  /// the job's deadline, for ranks still failing an earlier split's setup.
  std::optional<group> split(int color, int key) {
    const std::string refusal = detail::group_maker::color_refusal(color);
    return groups_->split_job(detail::group_maker::split_request_of(color, key, refusal), refusal);
  }
  /// split(color, key) with the job rank as key: groups keep the job's order.
  std::optional<group> split(int color) { return split(color, rank()); }

  /// A group of exactly `ranks` (job ranks, distinct), numbered in the
  /// list's order, as MPI_Group_incl and MPI_Comm_create number them
  /// (torch.distributed.new_group sorts its list first: pass it sorted for
  /// the same numbering). Ranks outside it get nullopt. Every rank of the
  /// job must call it with the same list, in the same order as its other
  /// splits and new_groups. Cost and errors as split(); a list that differs
  /// between ranks fails on every rank with errc::collective_mismatch, and
  /// an invalid one (a rank out of range or repeated) on any rank with
  /// errc::invalid_argument.
  std::optional<group> new_group(std::span<const int> ranks) {
    std::vector<bool> seen(static_cast<std::size_t>(world_size()), false);
    std::uint64_t digest = 14695981039346656037ull;  // FNV-1a over the list
    std::string refusal;
    int key = -1;
    for (std::size_t i = 0; i < ranks.size() && refusal.empty(); ++i) {
      const int r = ranks[i];
      if (r < 0 || r >= world_size()) {
        refusal = "new_group: rank " + std::to_string(r) + " is outside the job of " + std::to_string(world_size());
      } else if (seen[static_cast<std::size_t>(r)]) {
        refusal = "new_group: rank " + std::to_string(r) + " is listed twice";
      } else {
        seen[static_cast<std::size_t>(r)] = true;
        if (r == rank()) key = static_cast<int>(i);
        digest = (digest ^ static_cast<std::uint32_t>(r)) * 1099511628211ull;
      }
    }
    digest = (digest ^ ranks.size()) * 1099511628211ull;
    if (digest == detail::group_maker::split_agreement) ++digest;
    const bool member = key >= 0 && refusal.empty();
    return groups_->split_job({member ? 0 : bootstrap::no_color, key, digest, refusal.empty()}, refusal);
  }
  /// new_group over a braced list: `job.new_group({0, 2})`.
  std::optional<group> new_group(std::initializer_list<int> ranks) {
    return new_group(std::span<const int>(ranks.begin(), ranks.size()));
  }

 private:
  std::unique_ptr<bootstrap::store> store_;
  std::shared_ptr<detail::group_maker> groups_;  // shared with the groups made from this job
  std::unique_ptr<communicator> comm_;
};

}  // namespace pdcoll
