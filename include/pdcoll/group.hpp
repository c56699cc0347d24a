// File: group.hpp — a sub-group of a job's ranks with a communicator of its
// own, made by job::split or job::new_group (data-parallel replicas, tensor-
// parallel shards, one group per node...).
//
//     // 8 ranks as 2 x 4: tensor-parallel groups of 4 neighbours, data-parallel groups across them.
//     auto tp = job.split(job.rank() / 4);
//     auto dp = job.split(job.rank() % 4);
//     pdcoll::exec::sync_wait(pdcoll::all_reduce(dp->comm(), grads));
//
// Its communicator has its own transport endpoint, sequence numbers, abort
// state and deadlines: a collective on one group never pairs with one on
// another, and groups' collectives may be in flight at once. A group can be
// split again (group::split, as MPI_Comm_split on a sub-communicator).
#pragma once

#include <pdcoll/collectives.hpp>
#include <pdcoll/communicator.hpp>
#include <pdcoll/detail/log.hpp>
#include <pdcoll/exec/sync_wait.hpp>

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace pdcoll {

class group;

namespace detail {

/// What a group needs from the job that made it: splitting it again, and
/// freeing its splits' store keys. Shared by the job and its groups
/// (job.hpp implements it), so a group stays valid when the job object is
/// moved or ends first.
class group_source {
 public:
  /// The sub-group of `parent`'s members that this rank joins (group::split).
  virtual std::optional<group> split(group& parent, int color, int key) = 0;
  /// Erases the store keys under `prefix`, if the job's store is still there.
  virtual void release(const std::string& prefix) noexcept = 0;

 protected:
  ~group_source() = default;
};

}  // namespace detail

/// A sub-group of a job's ranks and its communicator. Move-only. Destroying
/// it runs a barrier on its communicator first (unless it was aborted,
/// bounded by its deadline), so no member tears its endpoint down while
/// another still reads from it. Every member must therefore destroy it, and
/// members must end their groups in the same order: a member ending group A
/// while another waits in group B's final barrier waits out the deadline.
/// A group that was split frees its splits' keys in the job's store after
/// that barrier (its rank 0 does), so it is destroyed, as it is split,
/// while no other thread uses the store. It may outlive the job object.
class group {
 public:
  /// Takes a communicator over the members `job_ranks` (job ranks, indexed
  /// by rank in the group) of the job behind `source`; `store_prefix` names
  /// the group in the job's store (its splits' keys go under it).
  group(std::shared_ptr<detail::group_source> source, std::unique_ptr<communicator> comm, std::vector<int> job_ranks,
        std::string store_prefix)
      : source_(std::move(source)),
        comm_(std::move(comm)),
        job_ranks_(std::move(job_ranks)),
        prefix_(std::move(store_prefix)) {}

  /// Takes `other`'s communicator; `other` is left empty.
  group(group&&) noexcept = default;
  /// Ends this group as its destructor does, then takes `other`'s.
  group& operator=(group&& other) noexcept {
    if (this != &other) {
      finish();
      source_ = std::move(other.source_);
      comm_ = std::move(other.comm_);
      job_ranks_ = std::move(other.job_ranks_);
      prefix_ = std::move(other.prefix_);
      splits_ = other.splits_;
    }
    return *this;
  }

  /// Final barrier on the group (unless aborted), then the communicator closes.
  ~group() { finish(); }

  /// The group's communicator.
  communicator& comm() noexcept { return *comm_; }
  /// This rank, in [0, world_size()).
  int rank() const noexcept { return comm_->rank(); }
  /// Number of members.
  int world_size() const noexcept { return comm_->world_size(); }
  /// Each member's rank in the job, indexed by its rank in the group.
  std::span<const int> job_ranks() const noexcept { return job_ranks_; }

  /// Splits this group's members as job::split splits the job's (colors,
  /// keys, ties by rank in this group, no_color, nullopt): every member
  /// calls it, its splits in the same order, while no other thread uses
  /// the job's store. The members' requests meet in one all_gather on this
  /// group's communicator (bounded by twice the job's deadline); the new
  /// group's endpoint then sets up through the job's store, as the job's
  /// splits do. Errors as job::split's, on every member of this group,
  /// errc::aborted once the job has ended; a failed all_gather (a member
  /// gone) throws its error and aborts this group.
  std::optional<group> split(int color, int key) { return source_->split(*this, color, key); }
  /// split(color, key) with the rank in this group as key: the order kept.
  std::optional<group> split(int color) { return split(color, rank()); }

  /// The store prefix of this group's split number `n`'s rendezvous keys.
  std::string split_prefix(int n) const { return prefix_ + "/split/" + std::to_string(n) + "/"; }
  /// The store prefix that names the group made by split `n` with `color`.
  std::string child_prefix(int n, int color) const {
    return prefix_ + "/group/" + std::to_string(n) + "/" + std::to_string(color);
  }
  /// Counts a split and returns its number.
  int next_split() noexcept { return splits_++; }

 private:

  // The final barrier, then (on rank 0, once every member is past it and so
  // past every split of this group) this group's splits' store keys go.
  void finish() noexcept {
    if (!comm_) return;
    bool ended = false;
    if (!comm_->aborted()) {
      try {
        exec::sync_wait(pdcoll::barrier(*comm_));
        ended = true;
      } catch (const std::exception& e) {
        detail::log(detail::log_level::warn, comm_->log_name(), std::string("group's final barrier failed: ") + e.what());
      }
    }
    if (ended && splits_ > 0 && comm_->rank() == 0) source_->release(prefix_ + "/split/");
    comm_.reset();
  }

  std::shared_ptr<detail::group_source> source_;
  std::unique_ptr<communicator> comm_;
  std::vector<int> job_ranks_;
  std::string prefix_;
  int splits_ = 0;
};

}  // namespace pdcoll
