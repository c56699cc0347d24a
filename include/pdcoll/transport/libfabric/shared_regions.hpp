// File: transport/libfabric/shared_regions.hpp — the POSIX shared memory
// behind the shm endpoint's node memory (transport/node_memory.hpp): one
// region per rank, created by its owner under a fresh name, mapped by every
// peer from the name it publishes at setup, and unlinked once every peer
// had its chance to map it, so nothing is left in /dev/shm when a rank dies
// after setup (one killed during setup leaves its region, which the next
// process to create one removes: shm_object.hpp).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <string>
#include <vector>

#include "pdcoll/transport/libfabric/shm_object.hpp"

namespace pdcoll::transport::libfabric::detail {

/// Every rank's region, mapped in this process.
class shared_regions {
 public:
  shared_regions() = default;
  shared_regions(const shared_regions&) = delete;
  shared_regions& operator=(const shared_regions&) = delete;
  ~shared_regions() {
    unlink_own();
    unmap_all();
  }

  /// Creates and maps this rank's region of `bytes` (zero-filled) as rank
  /// `rank` of `world_size`; on failure (errno says why: ENOSPC for a full
  /// /dev/shm) nothing is mapped and own_name() is "-".
  void create(int rank, int world_size, std::size_t bytes) noexcept {
    maps_.assign(static_cast<std::size_t>(world_size), nullptr);
    bytes_ = bytes;
    void* at = create_and_map_shm_object("pdcoll-node", bytes, name_);
    maps_[static_cast<std::size_t>(rank)] = static_cast<std::byte*>(at);
  }

  /// The name peers open this rank's region by ("-": there is none).
  std::string own_name() const { return name_.empty() ? std::string("-") : name_; }

  /// Maps `peer`'s region by the name it published. True on success.
  bool open(int peer, const char* name) noexcept {
    if (!name || name[0] != '/' || maps_.empty()) return false;
    auto& slot = maps_[static_cast<std::size_t>(peer)];
    if (slot) return true;
    const int fd = ::shm_open(name, O_RDWR, 0);
    if (fd < 0) return false;
    struct stat st {};
    if (::fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) == bytes_)
      slot = static_cast<std::byte*>(map_shm_object(fd, bytes_));
    ::close(fd);
    return slot != nullptr;
  }

  /// Removes this rank's name (every peer has mapped the region, or never will).
  void unlink_own() noexcept {
    if (!name_.empty()) ::shm_unlink(name_.c_str());
    name_.clear();
  }

  /// Unmaps every region.
  void unmap_all() noexcept {
    for (auto*& m : maps_) {
      if (m) ::munmap(m, bytes_);
      m = nullptr;
    }
  }

  /// Rank `rank`'s region (nullptr when not mapped).
  std::byte* region(int rank) const noexcept {
    return static_cast<std::size_t>(rank) < maps_.size() ? maps_[static_cast<std::size_t>(rank)] : nullptr;
  }
  /// Size of each region.
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  std::vector<std::byte*> maps_;
  std::size_t bytes_ = 0;
  std::string name_;
};

}  // namespace pdcoll::transport::libfabric::detail
