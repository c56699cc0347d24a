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
// another, and groups' collectives may be in flight at once.
#pragma once

#include <pdcoll/collectives.hpp>
#include <pdcoll/communicator.hpp>
#include <pdcoll/detail/log.hpp>
#include <pdcoll/exec/sync_wait.hpp>

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace pdcoll {

/// A sub-group of a job's ranks and its communicator. Move-only. Destroying
/// it runs a barrier on its communicator first (unless it was aborted,
/// bounded by its deadline), so no member tears its endpoint down while
/// another still reads from it. Every member must therefore destroy it, and
/// members must end their groups in the same order: a member ending group A
/// while another waits in group B's final barrier waits out the deadline.
class group {
 public:
  /// Takes a communicator over the members `job_ranks` (job ranks, indexed
  /// by rank in the group).
  group(std::unique_ptr<communicator> comm, std::vector<int> job_ranks)
      : comm_(std::move(comm)), job_ranks_(std::move(job_ranks)) {}

  /// Takes `other`'s communicator; `other` is left empty.
  group(group&&) noexcept = default;
  /// Ends this group as its destructor does, then takes `other`'s.
  group& operator=(group&& other) noexcept {
    if (this != &other) {
      finish();
      comm_ = std::move(other.comm_);
      job_ranks_ = std::move(other.job_ranks_);
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

 private:
  void finish() noexcept {
    if (!comm_) return;
    if (!comm_->aborted()) {
      try {
        exec::sync_wait(pdcoll::barrier(*comm_));
      } catch (const std::exception& e) {
        detail::log(detail::log_level::warn, comm_->rank(), std::string("group's final barrier failed: ") + e.what());
      }
    }
    comm_.reset();
  }

  std::unique_ptr<communicator> comm_;
  std::vector<int> job_ranks_;
};

}  // namespace pdcoll
