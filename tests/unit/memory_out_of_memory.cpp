// File: tests/unit/memory_out_of_memory.cpp — memory domains when the host
// runs out of memory part-way through an allocation: each allocation the
// domain makes fails in turn, and every failure must leave nothing taken.
#include <doctest/doctest.h>

#include <pdcoll/communicator.hpp>
#include <pdcoll/memory/domain.hpp>
#include <pdcoll/memory/emulated_device.hpp>
#include <pdcoll/transport/inproc.hpp>
#include <unit/allocation_counter.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

TEST_CASE("an emulated-device allocation that runs out of host memory gives its chunk back") {
  pdcoll::memory::emulated_device dev(std::size_t{1} << 20);
  auto keep = dev.allocate<float>(1000);  // the arena has a used chunk and a free one
  const std::size_t before = dev.bytes_in_use();
  bool allocated = false;
  for (long n = 1; n <= 64 && !allocated; ++n) {
    CAPTURE(n);
    try {
      // The buffer outlives the failing scope: its free must not fail.
      auto buffer = [&] {
        failing_allocation fail(n);
        return dev.allocate<float>(16);
      }();
      allocated = true;
    } catch (const std::bad_alloc&) {
      CHECK(dev.bytes_in_use() == before);  // the map insert failed after the arena gave a chunk
    }
  }
  CHECK(allocated);
  CHECK(dev.bytes_in_use() == before);
  // Every chunk is still there: the whole remainder can be taken at once.
  auto rest = dev.allocate<std::byte>(dev.capacity() - before);
  CHECK(dev.bytes_in_use() == dev.capacity());
}

TEST_CASE("the first-fit arena splits and merges chunks without allocating, but for a chunk with no free neighbour") {
  pdcoll::memory::detail::first_fit_arena arena(4096, 4 * 4096);
  std::uint64_t a = 0, b = 0, c = 0;
  {
    allocation_counter counter;
    REQUIRE(arena.allocate(4096, a));
    REQUIRE(arena.allocate(4096, b));
    REQUIRE(arena.allocate(4096, c));
    CHECK(counter.count() == 0);
  }
  CHECK(a == 4096);
  CHECK(b == 2 * 4096);
  CHECK(c == 3 * 4096);
  {
    allocation_counter counter;
    arena.release(c, 4096);  // joins the free tail: node reused
    CHECK(counter.count() == 0);
    arena.release(a, 4096);  // no free neighbour: one node
    CHECK(counter.count() == 1);
    arena.release(b, 4096);  // joins both
    CHECK(counter.count() == 1);
  }
  CHECK(arena.in_use() == 0);
  std::uint64_t whole = 0;
  CHECK(arena.allocate(4 * 4096, whole));
  CHECK(whole == 4096);
}

namespace {

/// An inproc endpoint that registers host memory, as verbs and efa do
/// (FI_MR_LOCAL): the communicator caches host blocks' registrations.
struct registering_endpoint final : pdcoll::transport::endpoint {
  explicit registering_endpoint(std::unique_ptr<pdcoll::transport::endpoint> inner) : inner_(std::move(inner)) {}
  int rank() const noexcept override { return inner_->rank(); }
  int world_size() const noexcept override { return inner_->world_size(); }
  std::string name() const override { return "registering"; }
  std::error_code post_send(int peer, const void* buffer, std::size_t length, std::uint64_t tag, void* descriptor,
                            pdcoll::transport::completion_context* ctx) noexcept override {
    return inner_->post_send(peer, buffer, length, tag, descriptor, ctx);
  }
  std::error_code post_recv(int peer, void* buffer, std::size_t length, std::uint64_t tag, std::uint64_t ignore,
                            void* descriptor, pdcoll::transport::completion_context* ctx) noexcept override {
    return inner_->post_recv(peer, buffer, length, tag, ignore, descriptor, ctx);
  }
  void cancel(pdcoll::transport::completion_context* ctx) noexcept override { inner_->cancel(ctx); }
  std::size_t progress() noexcept override { return inner_->progress(); }
  void wait(std::chrono::steady_clock::time_point deadline) noexcept override { inner_->wait(deadline); }
  pdcoll::transport::data_path path_for(pdcoll::transport::memory_kind kind) const noexcept override {
    return inner_->path_for(kind);
  }
  bool needs_registration(pdcoll::transport::memory_kind) const noexcept override { return true; }
  std::error_code register_region(const pdcoll::transport::memory_region&,
                                  pdcoll::transport::registration_handle& out) noexcept override {
    out.key = ++registrations_;
    return {};
  }
  void deregister(pdcoll::transport::registration_handle& handle) noexcept override { handle = {}; }

 private:
  std::unique_ptr<pdcoll::transport::endpoint> inner_;
  std::uint64_t registrations_ = 0;
};

}  // namespace

// The pool is full, so giving a block back lets blocks go, and the vector
// that carries them out cannot be had: the block returned is freed on the
// way. Its cached registration must go with it (item 56's hazard: the next
// block at its address would hit it).
TEST_CASE("a host block freed because pooling it ran out of memory loses its cached registration") {
  auto fabric = pdcoll::transport::inproc::fabric::create(1);
  pdcoll::communicator comm(std::make_unique<registering_endpoint>(fabric->endpoint_for(0)));
  std::vector<pdcoll::detail::host_block> fill;
  for (std::size_t i = 0; i < pdcoll::detail::host_block_pool::max_idle_blocks; ++i)
    fill.push_back(comm.take_host_block(std::size_t{1} << 20));
  for (auto& b : fill) comm.return_host_block(std::move(b));
  auto block = comm.take_host_block(std::size_t{4} << 20);
  {
    std::lock_guard lock(comm.mutex());
    auto lease = comm.acquire_registration(comm.host_block_region(block, block.size));
    REQUIRE(lease.has_value());
  }
  const auto before = comm.registration_statistics().invalidations;
  {
    failing_allocation fail(1);  // give()'s reserve for the blocks it lets go of
    comm.return_host_block(std::move(block));
  }
  CHECK(comm.registration_statistics().invalidations == before + 1);
}
