// File: tests/unit/collectives_variable.cpp — the v forms (all_to_allv,
// all_gatherv) in one process: counts on which a sender and its receiver
// disagree, either way, fail the receiver with collective_mismatch and abort
// every rank; empty blocks' displacements are not checked; and automatic's
// branch for ranks with node memory (direct) matches the reference.
// (matrix_collectives.cpp runs the reference matrix without node memory.)
#include <doctest/doctest.h>

#include <pdcoll/pdcoll.hpp>
#include <support/inproc_world.hpp>
#include <support/reference.hpp>
#include <support/variable_blocks.hpp>

#include <chrono>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

namespace {

using sizes = std::vector<std::size_t>;

template <class S>
std::error_code outcome(S&& sender) {
  try {
    pdcoll::exec::sync_wait(std::forward<S>(sender) | pdcoll::exec::with_deadline(std::chrono::seconds(20)));
  } catch (const std::system_error& e) {
    return e.code();
  }
  return {};
}

// Runs `call` on 3 ranks; rank 0 must fail it with collective_mismatch, and
// afterwards every rank's communicator must be aborted for that reason (a
// rank that finished first fails the barrier that follows).
void expect_mismatch(const std::function<std::error_code(pdcoll::communicator&)>& call) {
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
  });
  for (const auto& w : wrong) MESSAGE(w);
  CHECK(wrong.empty());
}

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

TEST_CASE("with node memory, automatic's all_to_allv and all_gatherv (direct) match the reference on 1 to 8 ranks") {
  using namespace pdcoll::testing;
  for (int P : {1, 2, 3, 5, 8}) {
    CAPTURE(P);
    std::mutex mutex;
    std::vector<std::string> wrong;
    run_inproc(
        P,
        [&](pdcoll::communicator& comm) {
          REQUIRE(comm.endpoint().shared_node_memory() != nullptr);
          const int r = comm.rank();
          for (std::size_t max_count : {std::size_t{1}, static_cast<std::size_t>(P + 1), std::size_t{20001}}) {
            const std::uint64_t salt = 600 + max_count;
            const auto l = all_to_allv_layout(salt, P, r, max_count, false);
            auto in = make_input<float>(salt, r, l.input_elems, false);
            std::vector<float> out(l.output_elems, gap_fill<float>());
            auto ec = outcome(pdcoll::all_to_allv(comm, in, l.send_counts, l.send_displs, out, l.recv_counts,
                                                  l.recv_displs));
            const bool a2av_right = !ec && out == expected_all_to_allv<float>(salt, P, r, max_count, false);
            const auto g = all_gatherv_layout(salt + 1, P, max_count, true);
            auto mine = make_input<double>(salt + 1, r, g.recv_counts[static_cast<std::size_t>(r)], false);
            std::vector<double> gathered(g.output_elems, gap_fill<double>());
            ec = outcome(pdcoll::all_gatherv(comm, mine, gathered, g.recv_counts));
            const bool agv_right = !ec && gathered == expected_all_gatherv<double>(salt + 1, P, max_count, true);
            std::lock_guard lock(mutex);
            if (!a2av_right) wrong.push_back("all_to_allv rank " + std::to_string(r) + " max " + std::to_string(max_count));
            if (!agv_right) wrong.push_back("all_gatherv rank " + std::to_string(r) + " max " + std::to_string(max_count));
          }
        },
        {}, std::size_t{4} << 20);
    for (const auto& w : wrong) MESSAGE(w);
    CHECK(wrong.empty());
  }
}
