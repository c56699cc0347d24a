// Unit tests: a small all-reduce (the latency path: recursive doubling)
// repeated in a loop allocates nothing once warm, over the io_uring
// transport: coroutine frames come back from the frame cache, transfer
// batches hold their transfers, unexpected messages reuse their records,
// scratch comes from the host block pool. (Pipelined algorithms still
// allocate per chunk: their queues of batches.) On 4 ranks on
// 2 cores an 8-byte all-reduce is CPU-bound, and each malloc/free pair on
// its path is time taken from the peer that shares the core.
//
// All ranks run on this thread (one communicator each, their all-reduces
// joined by when_all), so every frame is freed where it was allocated.
#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "pdcoll/pdcoll.hpp"
#include "unit/allocation_counter.hpp"
#include "unit/uring_support.hpp"

namespace {

/// `P` communicators over uring_tcp endpoints of one process.
template <std::size_t P>
struct uring_world {
  std::vector<std::unique_ptr<pdcoll::communicator>> comms;
  uring_world() {
    for (auto& ep : uring_test::make_world(static_cast<int>(P)))
      comms.push_back(std::make_unique<pdcoll::communicator>(std::move(ep)));
  }
};

/// One all-reduce of `data[r]` on every rank, in place; `Algo` as given.
template <class Algo, std::size_t... R>
void all_reduce_everywhere(uring_world<sizeof...(R)>& w, std::vector<std::vector<int>>& data,
                           std::index_sequence<R...>) {
  pdcoll::exec::sync_wait(pdcoll::exec::when_all(pdcoll::all_reduce<Algo>(*w.comms[R], data[R], pdcoll::op::sum)...));
}

/// Runs `warm` then `counted` all-reduces of `count` ints; returns the
/// allocations of the counted ones and checks every result.
template <class Algo, std::size_t P>
long allocations_of_repeated_all_reduce(std::size_t count, int warm, int counted) {
  uring_world<P> w;
  std::vector<std::vector<int>> data(P, std::vector<int>(count));
  long wrong = 0;
  auto round = [&](int i) {
    for (std::size_t r = 0; r < P; ++r)
      for (std::size_t k = 0; k < count; ++k) data[r][k] = static_cast<int>(r * 1000 + k) + i;
    all_reduce_everywhere<Algo>(w, data, std::make_index_sequence<P>{});
    for (std::size_t r = 0; r < P; ++r)
      for (std::size_t k = 0; k < count; ++k) {
        const long expected = static_cast<long>(P) * (static_cast<long>(k) + i) + 1000L * static_cast<long>(P * (P - 1) / 2);
        wrong += data[r][k] != expected;
      }
  };
  for (int i = 0; i < warm; ++i) round(i);
  long made = 0;
  {
    allocation_counter counter;
    for (int i = 0; i < counted; ++i) round(warm + i);
    made = counter.count();
  }
  CHECK(wrong == 0);
  return made;
}

}  // namespace

TEST_SUITE("steady.allocations") {

TEST_CASE("the frame cache hands a freed frame back for the same rounded size only") {
  using pdcoll::detail::frame_cache;
  void* a = frame_cache::allocate(200);
  frame_cache::deallocate(a, 200);
  long made = 0;
  void* b = nullptr;
  void* c = nullptr;
  {
    allocation_counter counter;
    b = frame_cache::allocate(250);  // rounds to the same 256 bytes
    made = counter.count();
  }
  CHECK(b == a);
  CHECK(made == 0);
  {
    allocation_counter counter;
    c = frame_cache::allocate(100);  // 128 bytes: new memory
    made = counter.count();
  }
  CHECK(c != a);
  CHECK(made == 1);
  frame_cache::deallocate(b, 250);
  frame_cache::deallocate(c, 100);
}

TEST_CASE("a full frame cache makes room for the sizes in use now") {
  using pdcoll::detail::frame_cache;
  // Fill every slot with frames of a size nobody asks for again.
  std::vector<void*> old_frames;
  for (std::size_t i = 0; i < frame_cache::slots; ++i) old_frames.push_back(frame_cache::allocate(4000));
  for (void* f : old_frames) frame_cache::deallocate(f, 4000);
  // A loop using three frames of another size: the first round allocates
  // them, giving them back displaces old frames, and later rounds reuse them.
  auto round = [] {
    void* x = frame_cache::allocate(300);
    void* y = frame_cache::allocate(300);
    void* z = frame_cache::allocate(300);
    frame_cache::deallocate(z, 300);
    frame_cache::deallocate(y, 300);
    frame_cache::deallocate(x, 300);
  };
  round();
  long made = 0;
  {
    allocation_counter counter;
    for (int i = 0; i < 10; ++i) round();
    made = counter.count();
  }
  CHECK(made == 0);
}

TEST_CASE("repeated 8-byte all-reduces over uring_tcp allocate nothing once warm") {
  CHECK(allocations_of_repeated_all_reduce<pdcoll::algo::automatic, 2>(2, 20, 200) == 0);
  CHECK(allocations_of_repeated_all_reduce<pdcoll::algo::automatic, 3>(2, 20, 200) == 0);
  CHECK(allocations_of_repeated_all_reduce<pdcoll::algo::automatic, 4>(2, 20, 200) == 0);
}

TEST_CASE("repeated 4 KiB recursive-doubling all-reduces allocate nothing once warm, folded worlds too") {
  CHECK(allocations_of_repeated_all_reduce<pdcoll::algo::recursive_doubling, 3>(1024, 20, 100) == 0);
  CHECK(allocations_of_repeated_all_reduce<pdcoll::algo::recursive_doubling, 5>(1024, 20, 100) == 0);
}

TEST_CASE("the allocation counter sees a collective's first, cold allocations") {
  // Not vacuous: the same loop, counted from the first call, allocates.
  CHECK(allocations_of_repeated_all_reduce<pdcoll::algo::automatic, 2>(2, 0, 5) > 0);
}

}  // TEST_SUITE

TEST_CASE("registering progress drivers allocates nothing while each holds a reserved slot (as every communicator does)") {
  // A communicator registers as a driver when an operation starts, inside a
  // noexcept start(): a registry that grew there could only terminate when
  // memory runs out.
  struct idle_driver final : pdcoll::exec::progress_driver {
    bool drive(std::chrono::steady_clock::time_point) noexcept override { return false; }
  };
  constexpr int drivers = 64;  // more than the registry has held before in this binary
  std::vector<std::unique_ptr<pdcoll::exec::progress_drivers::slot>> slots;
  for (int i = 0; i < drivers; ++i) slots.push_back(std::make_unique<pdcoll::exec::progress_drivers::slot>());
  std::vector<idle_driver> all(drivers);
  long allocations = 0;
  {
    allocation_counter counter;
    for (auto& d : all) pdcoll::exec::progress_drivers::register_driver(&d);
    allocations = counter.count();
  }
  for (auto& d : all) pdcoll::exec::progress_drivers::unregister_driver(&d);
  CHECK(allocations == 0);
}
