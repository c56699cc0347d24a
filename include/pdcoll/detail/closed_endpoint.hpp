// File: detail/closed_endpoint.hpp — the endpoint a communicator holds while
// it destroys its real one.
//
// A transport may end transfers in its destructor (those it could neither
// cancel nor close in the drain). Their operations run on: a collective's
// coroutine cancels its other batches, a check posts nothing more. They
// reach the transport through the communicator, which must not hand them a
// half-destroyed or missing endpoint; this one refuses posts with `aborted`
// and has nothing to cancel, progress or wait for.
#pragma once

#include <pdcoll/error.hpp>
#include <pdcoll/transport/endpoint.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <system_error>

namespace pdcoll::detail {

/// An endpoint with no data path: every post fails with errc::aborted.
class closed_endpoint final : public transport::endpoint {
 public:
  /// Stands in for rank `rank` of `world_size`.
  closed_endpoint(int rank, int world_size) noexcept : rank_(rank), world_size_(world_size) {}
  int rank() const noexcept override { return rank_; }
  int world_size() const noexcept override { return world_size_; }
  std::string name() const override { return "closed"; }
  std::error_code post_send(int, const void*, std::size_t, std::uint64_t, void*,
                            transport::completion_context*) noexcept override {
    return make_error_code(errc::aborted);
  }
  std::error_code post_recv(int, void*, std::size_t, std::uint64_t, std::uint64_t, void*,
                            transport::completion_context*) noexcept override {
    return make_error_code(errc::aborted);
  }
  void cancel(transport::completion_context*) noexcept override {}
  std::size_t progress() noexcept override { return 0; }
  void wait(std::chrono::steady_clock::time_point) noexcept override {}
  transport::data_path path_for(transport::memory_kind) const noexcept override { return transport::data_path::host; }
  bool needs_registration(transport::memory_kind) const noexcept override { return false; }
  std::error_code register_region(const transport::memory_region&, transport::registration_handle&) noexcept override {
    return make_error_code(errc::aborted);
  }
  void deregister(transport::registration_handle&) noexcept override {}

 private:
  int rank_;
  int world_size_;
};

}  // namespace pdcoll::detail
