// File: tests/unit/registration_counting_registrar.hpp — a registrar for the
// registration cache's tests: records every registration and counts every
// deregistration per handle, so tests can prove "pinned is never
// deregistered" and "everything is deregistered exactly once".
#pragma once

#include <pdcoll/registration/registrar.hpp>

#include <cstdint>
#include <functional>
#include <mutex>
#include <system_error>
#include <unordered_map>
#include <vector>

namespace pdcoll::registration::testing {

/// The handle the counting registrar hands out.
struct fake_handle {
  std::uint64_t id = 0;
};

/// Thread-safe; hooks run without its lock held, so they may call back into
/// the cache (which is how tests show that registration runs outside the
/// cache's lock).
class counting_registrar {
 public:
  struct record {
    transport::memory_region region;
    int deregistrations = 0;
    std::vector<std::uint32_t> snapshot;  ///< what `take_snapshot` returned at registration
  };

  /// Runs at the start of every register_region call.
  std::function<void(const transport::memory_region&)> on_register;
  /// Stored with the record (model tests snapshot memory epochs here).
  std::function<std::vector<std::uint32_t>(const transport::memory_region&)> take_snapshot;

  result<fake_handle> register_region(const transport::memory_region& region) {
    if (on_register) on_register(region);
    std::vector<std::uint32_t> snap;
    if (take_snapshot) snap = take_snapshot(region);
    std::lock_guard lock(mutex_);
    if (fail_with_) return fail_with_;
    const std::uint64_t id = next_id_++;
    records_.emplace(id, record{region, 0, std::move(snap)});
    ++live_;
    return fake_handle{id};
  }

  void deregister(fake_handle& handle) noexcept {
    std::lock_guard lock(mutex_);
    auto it = records_.find(handle.id);
    if (it == records_.end()) {
      unknown_deregistrations_ = true;
      return;
    }
    if (++it->second.deregistrations == 1) --live_; else double_deregistration_ = true;
  }

  /// Makes the following registrations fail with `ec` (empty: succeed again).
  void fail_with(std::error_code ec) {
    std::lock_guard lock(mutex_);
    fail_with_ = ec;
  }
  /// A copy of the record of handle `id`.
  record info(std::uint64_t id) const {
    std::lock_guard lock(mutex_);
    auto it = records_.find(id);
    return it == records_.end() ? record{} : it->second;
  }
  /// How many times handle `id` was deregistered (-1: never handed out).
  int deregistrations(std::uint64_t id) const {
    std::lock_guard lock(mutex_);
    auto it = records_.find(id);
    return it == records_.end() ? -1 : it->second.deregistrations;
  }
  std::size_t live() const {
    std::lock_guard lock(mutex_);
    return live_;
  }
  std::size_t registrations() const {
    std::lock_guard lock(mutex_);
    return records_.size();
  }
  /// True when every registration was deregistered exactly once and nothing
  /// unknown was deregistered.
  bool all_deregistered_once() const {
    std::lock_guard lock(mutex_);
    if (double_deregistration_ || unknown_deregistrations_) return false;
    for (const auto& [id, r] : records_)
      if (r.deregistrations != 1) return false;
    return true;
  }
  bool double_deregistration() const {
    std::lock_guard lock(mutex_);
    return double_deregistration_ || unknown_deregistrations_;
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<std::uint64_t, record> records_;
  std::uint64_t next_id_ = 1;
  std::size_t live_ = 0;
  std::error_code fail_with_;
  bool double_deregistration_ = false;
  bool unknown_deregistrations_ = false;
};

static_assert(registrar<counting_registrar>);

/// A host region at a made-up address (the counting registrar never touches
/// the bytes).
inline transport::memory_region host_region(std::uintptr_t address, std::size_t length) {
  transport::memory_region r;
  r.address = reinterpret_cast<void*>(address);
  r.length = length;
  return r;
}

}  // namespace pdcoll::registration::testing
