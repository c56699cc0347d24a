// Every rank of an all-reduce gets the same bits, also where the op is not
// commutative bit for bit: min and max of +0 and -0 and of NaNs with
// different payloads, and a custom op that keeps its first operand on ties.
// Sums of NaNs with different payloads are NaN on every rank, with either
// payload (see check_agreement).
// Tolerance checks against a reference (collectives_matrix.cpp) cannot see
// this: each rank's value is right, only the ranks disagree.
#include <doctest/doctest.h>

#include <pdcoll/pdcoll.hpp>
#include <support/inproc_world.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

namespace {

// The larger magnitude; on a tie the first operand (reduce/ops.hpp's example).
struct absmax {
  float operator()(float a, float b) const noexcept { return std::fabs(a) < std::fabs(b) ? b : a; }
};

// A NaN whose payload names the rank.
float nan_of(int rank) {
  std::uint32_t bits = 0x7fc00000u | static_cast<std::uint32_t>(rank + 1);
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Element i of rank r: ties and NaNs spread over the elements so that every
// pair of partners meets some.
float value(int rank, std::size_t i) {
  switch (i % 4) {
    case 0: return rank % 2 ? -0.0f : 0.0f;
    case 1: return (rank + static_cast<int>(i)) % 2 ? -1.0f : 1.0f;
    case 2: return nan_of(rank);
    default: return static_cast<float>(rank) * 0.1f + static_cast<float>(i);
  }
}

// Runs the all-reduce on `world` ranks and checks that every rank's result
// has rank 0's bits.
template <class Algo, class Op>
void check_agreement(int world, std::size_t count, Op op, std::size_t node_memory_bytes) {
  std::vector<std::vector<std::uint32_t>> bits(static_cast<std::size_t>(world));
  std::mutex guard;
  pdcoll::testing::run_inproc(
      world,
      [&](pdcoll::communicator& comm) {
        std::vector<float> data(count);
        for (std::size_t i = 0; i < count; ++i) data[i] = value(comm.rank(), i);
        pdcoll::exec::sync_wait(pdcoll::all_reduce<Algo>(comm, data, op));
        std::vector<std::uint32_t> mine(count);
        std::memcpy(mine.data(), data.data(), count * sizeof(float));
        std::lock_guard lock(guard);
        bits[static_cast<std::size_t>(comm.rank())] = std::move(mine);
      },
      {}, node_memory_bytes);
  const std::string where = std::string(Algo::name) + ", " + std::to_string(world) + " ranks, count " +
                            std::to_string(count) + (node_memory_bytes ? ", node memory" : "");
  // Sums of two NaNs: x86 gives the first operand's payload, and compilers
  // order the operands of a float + as they like (g++ -O2 does, differently
  // in the two in-place loops), so ranks agree only that the result is NaN.
  constexpr bool any_nan_payload = std::is_same_v<Op, pdcoll::op::sum_t>;
  auto is_nan = [](std::uint32_t b) { return (b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu) != 0; };
  for (int r = 1; r < world; ++r) {
    std::size_t differing = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const std::uint32_t mine = bits[static_cast<std::size_t>(r)][i], first = bits[0][i];
      differing += any_nan_payload && is_nan(first) ? !is_nan(mine) : mine != first;
    }
    INFO(where, ": rank ", r, " against rank 0");
    CHECK(differing == 0);
  }
}

template <class Algo>
void check_every_op(std::size_t node_memory_bytes = 0, std::size_t large = 20000) {
  for (int world = 2; world <= 8; ++world) {
    for (std::size_t count : {std::size_t{1}, std::size_t{4}, std::size_t{37}, large}) {
      if (count == 0) continue;
      check_agreement<Algo>(world, count, pdcoll::op::min, node_memory_bytes);
      check_agreement<Algo>(world, count, pdcoll::op::max, node_memory_bytes);
      check_agreement<Algo>(world, count, pdcoll::op::sum, node_memory_bytes);
      check_agreement<Algo>(world, count, absmax{}, node_memory_bytes);
    }
  }
}

}  // namespace

TEST_SUITE("collectives: every rank gets the same bits") {
  TEST_CASE("recursive doubling") { check_every_op<pdcoll::algo::recursive_doubling>(); }
  TEST_CASE("automatic without node memory (recursive doubling for small counts)") {
    check_every_op<pdcoll::algo::automatic>();
  }
  TEST_CASE("automatic with node memory (the small path, then shared_memory_scatter from 32 KiB)") {
    check_every_op<pdcoll::algo::automatic>(std::size_t{1} << 20, 20000);
  }
  TEST_CASE("shared_memory with node memory") {
    check_every_op<pdcoll::algo::shared_memory>(std::size_t{1} << 20, 20000);
  }
  TEST_CASE("two_shot") { check_every_op<pdcoll::algo::two_shot>(); }
  TEST_CASE("rabenseifner") { check_every_op<pdcoll::algo::rabenseifner>(); }
  TEST_CASE("ring") { check_every_op<pdcoll::algo::ring>(); }
  TEST_CASE("tree") { check_every_op<pdcoll::algo::tree>(); }
  TEST_CASE("direct") { check_every_op<pdcoll::algo::direct>(); }
}
