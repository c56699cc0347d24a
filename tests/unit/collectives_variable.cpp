// File: tests/unit/collectives_variable.cpp — the v forms (all_to_allv,
// all_gatherv) in one process: counts on which a sender and its receiver
// disagree, either way, fail the receiver with collective_mismatch and abort
// every rank, by messages and through node memory (where a block may go
// through the slot at one end and as a message at the other); empty blocks'
// displacements are not checked; and with node memory, shared_memory's and
// automatic's node step (small blocks through the slots, large ones as
// messages) matches the reference, alone and in flight with other
// node-memory collectives. (matrix_collectives.cpp runs the reference
// matrix without node memory.)
#include <doctest/doctest.h>

#include <pdcoll/pdcoll.hpp>
#include <support/inproc_world.hpp>
#include <support/outcome.hpp>
#include <support/reference.hpp>
#include <support/variable_blocks.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace {

using sizes = std::vector<std::size_t>;

// How `sender` ended, waited for at most 20 s.
template <class S>
std::error_code outcome(S&& sender) {
  return pdcoll::testing::error_of([&] {
    pdcoll::exec::sync_wait(std::forward<S>(sender) | pdcoll::exec::with_deadline(std::chrono::seconds(20)));
  });
}

// Runs `call` on 3 ranks; rank 0 must fail it with collective_mismatch, and
// afterwards every rank's communicator must be aborted for that reason (a
// rank that finished first fails the barrier that follows).
// `node_memory_bytes` > 0 gives the ranks node memory.
void expect_mismatch(const std::function<std::error_code(pdcoll::communicator&)>& call,
                     std::size_t node_memory_bytes = 0) {
  std::mutex mutex;
  std::vector<std::string> wrong;
  pdcoll::testing::run_inproc(3, [&](pdcoll::communicator& comm) {
    const auto ec = call(comm);
    const auto later = outcome(pdcoll::barrier(comm));
    std::lock_guard lock(mutex);
    if (comm.rank() == 0 && ec != pdcoll::errc::collective_mismatch)
      wrong.push_back("rank 0 ended with '" + ec.message() + "'");
    if (!later || !comm.aborted() || comm.abort_reason() != pdcoll::errc::collective_mismatch)
      wrong.push_back("rank " + std::to_string(comm.rank()) + " not aborted for the mismatch");
  }, {}, node_memory_bytes);
  for (const auto& w : wrong) MESSAGE(w);
  CHECK(wrong.empty());
}

// Node memory for the ranks of these tests: 4 MiB regions, slots of about
// 2 MiB (per-peer sections of 256 KiB and more on up to 8 ranks).
constexpr std::size_t node_bytes = std::size_t{4} << 20;

}  // namespace

TEST_CASE("all_to_allv: a receiver expecting fewer or more elements than its sender sends fails with collective_mismatch") {
  for (std::size_t expected_from_1 : {std::size_t{1}, std::size_t{3}, std::size_t{0}}) {
    CAPTURE(expected_from_1);
    expect_mismatch([&](pdcoll::communicator& comm) {
      sizes send_counts(3, 2), recv_counts(3, 2);
      if (comm.rank() == 0) recv_counts[1] = expected_from_1;
      std::vector<float> in(6, 1.0f), out(8);
      return outcome(pdcoll::all_to_allv<pdcoll::algo::pairwise>(comm, in, send_counts, out, recv_counts));
    });
  }
  // A block the receiver expects and its sender leaves empty.
  expect_mismatch([](pdcoll::communicator& comm) {
    sizes send_counts(3, 2), recv_counts(3, 2);
    if (comm.rank() == 1) send_counts[0] = 0;
    if (comm.rank() == 0) recv_counts[1] = 2;
    std::vector<float> in(6, 1.0f), out(6);
    return outcome(pdcoll::all_to_allv<pdcoll::algo::direct>(comm, in, send_counts, out, recv_counts));
  });
}

TEST_CASE("all_gatherv: ranks that disagree on a block's count fail with collective_mismatch") {
  expect_mismatch([](pdcoll::communicator& comm) {
    sizes counts{2, 3, 1};
    if (comm.rank() == 0) counts[1] = 4;  // rank 1 sends 3
    std::vector<float> in(counts[static_cast<std::size_t>(comm.rank())], 1.0f), out(10);
    return outcome(pdcoll::all_gatherv(comm, in, out, counts));
  });
}

TEST_CASE("empty blocks may have any displacement, and all-empty v forms take null buffers") {
  pdcoll::testing::run_inproc(3, [](pdcoll::communicator& comm) {
    const std::size_t far = std::numeric_limits<std::size_t>::max();
    const auto r = static_cast<std::size_t>(comm.rank());
    // Every rank sends 1 element to each higher rank, none to the others.
    sizes send_counts(3, 0), recv_counts(3, 0), send_displs(3, far), recv_displs(3, far);
    for (std::size_t p = 0; p < 3; ++p) {
      if (p > r) {
        send_counts[p] = 1;
        send_displs[p] = p;
      } else if (p < r) {
        recv_counts[p] = 1;
        recv_displs[p] = p;
      }
    }
    std::vector<int> in{10 * comm.rank(), 10 * comm.rank() + 1, 10 * comm.rank() + 2}, out(3, -1);
    CHECK(outcome(pdcoll::all_to_allv(comm, in, send_counts, send_displs, out, recv_counts, recv_displs)) ==
          std::error_code{});
    for (std::size_t p = 0; p < 3; ++p) CHECK(out[p] == (p < r ? static_cast<int>(10 * p + r) : -1));
    // Nothing to send or receive anywhere: null buffers are fine.
    pdcoll::view<int, pdcoll::memory::host> none(nullptr, 0);
    const sizes zeros(3, 0);
    CHECK(outcome(pdcoll::all_to_allv(comm, none, zeros, none, zeros)) == std::error_code{});
    CHECK(outcome(pdcoll::all_gatherv(comm, none, none, zeros, sizes(3, far))) == std::error_code{});
  });
}

TEST_CASE("with node memory, a mismatched block fails through the slot, and where one end sends a message the other does not take") {
  // On 3 ranks automatic's slot takes blocks below 256 KiB / 3 (21,845
  // floats) under the messages verdict (inproc's default);
  // shared_memory's takes blocks up to its section (over 600 KiB).
  // Rank 1 sends rank 0 `sent` floats, and rank 0 expects `expected`.
  struct disagreement {
    std::size_t sent, expected;
  };
  for (auto [sent, expected] : {disagreement{2, 1}, disagreement{2, 0}, disagreement{0, 2}, disagreement{30000, 2},
                                disagreement{2, 30000}, disagreement{30000, 30001}}) {
    CAPTURE(sent);
    CAPTURE(expected);
    auto call = [sent = sent, expected = expected](auto algorithm) {
      return [=](pdcoll::communicator& comm) {
        sizes send_counts(3, 2), recv_counts(3, 2);
        if (comm.rank() == 1) send_counts[0] = sent;
        if (comm.rank() == 0) recv_counts[1] = expected;
        std::vector<float> in(4 + send_counts[0], 1.0f), out(4 + recv_counts[1]);
        using Algo = decltype(algorithm);
        return outcome(pdcoll::all_to_allv<Algo>(comm, in, send_counts, out, recv_counts));
      };
    };
    expect_mismatch(call(pdcoll::algo::automatic{}), node_bytes);
    expect_mismatch(call(pdcoll::algo::shared_memory{}), node_bytes);
  }
  // Ranks that named different algorithms: automatic's slot takes blocks
  // below 21,845 floats on 3 ranks, shared_memory's up to its section, so
  // a block of 30,000 would go through the slot at one end and be waited
  // for as a message at the other (or read from a stale slot).
  expect_mismatch([](pdcoll::communicator& comm) {
    const sizes counts(3, 30000);
    std::vector<float> in(90000, 1.0f), out(90000);
    if (comm.rank() == 0) return outcome(pdcoll::all_to_allv<pdcoll::algo::automatic>(comm, in, counts, out, counts));
    return outcome(pdcoll::all_to_allv<pdcoll::algo::shared_memory>(comm, in, counts, out, counts));
  }, node_bytes);
  for (std::size_t claimed : {std::size_t{4}, std::size_t{30000}}) {
    CAPTURE(claimed);
    expect_mismatch([claimed](pdcoll::communicator& comm) {
      sizes counts{2, 3, 1};
      if (comm.rank() == 0) counts[1] = claimed;  // rank 1 sends 3
      std::vector<float> in(counts[static_cast<std::size_t>(comm.rank())], 1.0f), out(claimed + 3);
      return outcome(pdcoll::all_gatherv(comm, in, out, counts));
    }, node_bytes);
  }
}

namespace {

// Rank `comm`'s all_to_allv and all_gatherv (in and out of place) through
// Algo on case `salt`, checked against the reference; what went wrong goes
// to `wrong`.
template <class Algo>
void v_forms_case(pdcoll::communicator& comm, std::size_t max_count, std::uint64_t salt, bool packed,
                  std::vector<std::string>& wrong, std::mutex& mutex) {
  using namespace pdcoll::testing;
  const int P = comm.world_size(), r = comm.rank();
  const std::string what = std::string(Algo::name) + " rank " + std::to_string(r) + " max " + std::to_string(max_count) +
                           (packed ? " packed" : " with gaps");
  const auto l = all_to_allv_layout(salt, P, r, max_count, packed);
  auto in = make_input<float>(salt, r, l.input_elems, false);
  std::vector<float> out(l.output_elems, gap_fill<float>());
  auto ec = outcome(pdcoll::all_to_allv<Algo>(comm, in, l.send_counts, l.send_displs, out, l.recv_counts, l.recv_displs));
  const bool a2av_right = !ec && out == expected_all_to_allv<float>(salt, P, r, max_count, packed);
  const auto g = all_gatherv_layout(salt + 1, P, max_count, packed);
  const std::size_t n = g.recv_counts[static_cast<std::size_t>(r)], at = g.recv_displs[static_cast<std::size_t>(r)];
  const auto expected = expected_all_gatherv<double>(salt + 1, P, max_count, packed);
  auto mine = make_input<double>(salt + 1, r, n, false);
  std::vector<double> gathered(g.output_elems, gap_fill<double>());
  ec = outcome(pdcoll::all_gatherv<Algo>(comm, mine, gathered, g.recv_counts, g.recv_displs));
  const bool agv_right = !ec && gathered == expected;
  std::vector<double> in_place(g.output_elems, gap_fill<double>());
  std::copy(mine.begin(), mine.end(), in_place.begin() + static_cast<std::ptrdiff_t>(at));
  ec = outcome(pdcoll::all_gatherv<Algo>(comm, std::span<const double>(in_place).subspan(at, n), in_place,
                                         g.recv_counts, g.recv_displs));
  const bool in_place_right = !ec && in_place == expected;
  std::lock_guard lock(mutex);
  if (!a2av_right) wrong.push_back("all_to_allv " + what);
  if (!agv_right) wrong.push_back("all_gatherv " + what);
  if (!in_place_right) wrong.push_back("all_gatherv in place " + what);
}

}  // namespace

TEST_CASE("with node memory, shared_memory's and automatic's all_to_allv and all_gatherv match the reference on 1 to 8 ranks, blocks through the slots, as messages, and both in one call") {
  using namespace pdcoll::testing;
  // Both node verdicts: with the messages verdict automatic's slot limit
  // is 256 KiB / P (32 KiB on 2 ranks), with the slots verdict a section.
  for (const bool bulk : {false, true})
  for (int P : {1, 2, 3, 4, 5, 8}) {
    CAPTURE(bulk);
    CAPTURE(P);
    std::mutex mutex;
    std::vector<std::string> wrong;
    run_inproc(
        P,
        [&](pdcoll::communicator& comm) {
          REQUIRE(comm.endpoint().shared_node_memory() != nullptr);
          // Blocks of at most: none, 1, below and above the world size;
          // some above automatic's slot limit under the messages verdict
          // (256 KiB / P; 32 KiB on 2 ranks), some above shared_memory's
          // sections (slot / P).
          const auto W = static_cast<std::size_t>(P);
          for (std::size_t max_count : {std::size_t{0}, std::size_t{1}, W > 1 ? W - 1 : 2, W + 1, std::size_t{20001},
                                        std::size_t{300001}}) {
            for (bool packed : {true, false}) {
              const std::uint64_t salt = 600 + 10 * max_count + (packed ? 1 : 0);
              v_forms_case<pdcoll::algo::automatic>(comm, max_count, salt, packed, wrong, mutex);
              v_forms_case<pdcoll::algo::shared_memory>(comm, max_count, salt + 3, packed, wrong, mutex);
            }
          }
        },
        {}, node_bytes, bulk);
    for (const auto& w : wrong) MESSAGE(w);
    CHECK(wrong.empty());
  }
}

TEST_CASE("v forms through node memory in flight with slot all-to-alls and chunked all-reduces take their own steps") {
  using namespace pdcoll::testing;
  namespace ex = pdcoll::exec;
  namespace algo = pdcoll::algo;
  const int P = 4;
  std::mutex mutex;
  std::vector<std::string> wrong;
  run_inproc(
      P,
      [&](pdcoll::communicator& comm) {
        const int r = comm.rank();
        for (std::uint64_t round = 0; round < 4; ++round) {
          const std::uint64_t salt = 700 + 10 * round;
          const std::size_t max_count = round % 2 == 0 ? 100 : 90001;
          const auto l = all_to_allv_layout(salt, P, r, max_count, false);
          auto in = make_input<float>(salt, r, l.input_elems, false);
          std::vector<float> out(l.output_elems, gap_fill<float>());
          const auto g = all_gatherv_layout(salt + 1, P, max_count, true);
          auto mine = make_input<float>(salt + 1, r, g.recv_counts[static_cast<std::size_t>(r)], false);
          std::vector<float> gathered(g.output_elems, gap_fill<float>());
          const std::size_t n = 5000;
          auto a2a_in = make_input<float>(salt + 2, r, n * P, false);
          std::vector<float> a2a_out(n * P);
          std::vector<std::int32_t> summed(3 * n, r + 1);
          ex::sync_wait(ex::when_all(
              pdcoll::all_to_allv<algo::shared_memory>(comm, in, l.send_counts, l.send_displs, out, l.recv_counts,
                                                       l.recv_displs),
              pdcoll::all_reduce<algo::shared_memory_scatter>(comm, std::span<std::int32_t>(summed)),
              pdcoll::all_gatherv(comm, mine, gathered, g.recv_counts),
              pdcoll::all_to_all<algo::shared_memory>(comm, std::span<const float>(a2a_in), std::span<float>(a2a_out))));
          bool right = out == expected_all_to_allv<float>(salt, P, r, max_count, false) &&
                       gathered == expected_all_gatherv<float>(salt + 1, P, max_count, true);
          for (std::size_t i = 0; i < summed.size() && right; ++i) right = summed[i] == P * (P + 1) / 2;
          for (int q = 0; q < P && right; ++q) {
            const auto theirs = make_input<float>(salt + 2, q, n * P, false);
            right = std::equal(a2a_out.begin() + q * static_cast<std::ptrdiff_t>(n),
                               a2a_out.begin() + (q + 1) * static_cast<std::ptrdiff_t>(n),
                               theirs.begin() + r * static_cast<std::ptrdiff_t>(n));
          }
          if (!right) {
            std::lock_guard lock(mutex);
            wrong.push_back("rank " + std::to_string(r) + " round " + std::to_string(round));
          }
        }
      },
      {}, node_bytes);
  for (const auto& w : wrong) MESSAGE(w);
  CHECK(wrong.empty());
}
