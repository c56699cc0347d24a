// File: tests/unit/peerdirect_staging.cpp — the host-staged path in one
// process (inproc transport, forced staging): chunked, pipelined staging
// gives the same results as the direct path, counts every staged byte, and
// the Gaudi domain compiles through the collectives.
#include <doctest/doctest.h>

#include <pdcoll/memory/domains.hpp>
#include <pdcoll/memory/track.hpp>
#include <pdcoll/pdcoll.hpp>
#include <support/inproc_world.hpp>
#include <support/outcome.hpp>
#include <support/variable_blocks.hpp>
#include <unit/failure_endpoints.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <span>
#include <system_error>
#include <vector>

namespace {

using device = pdcoll::memory::emulated_device;

// Small chunks so a few hundred KiB run many chunks (read once per process).
const bool small_chunks = [] {
  ::setenv("PDCOLL_STAGING_CHUNK_BYTES", "8192", 1);
  return true;
}();

void run_all_reduce_and_gather(bool force_staging, int P, std::size_t n, std::atomic<int>& wrong,
                               std::atomic<std::uint64_t>& staged_bytes, device& dev) {
  pdcoll::communicator_options options;
  options.force_host_staging = force_staging;
  pdcoll::testing::run_inproc(
      P,
      [&](pdcoll::communicator& comm) {
        const int r = comm.rank();
        std::vector<float> mine(n);
        for (std::size_t i = 0; i < n; ++i) mine[i] = static_cast<float>(r + 1 + static_cast<int>(i % 5));
        auto a = dev.allocate<float>(n);
        auto g = dev.allocate<float>(n * static_cast<std::size_t>(P));
        dev.copy_from_host(std::span<const float>(mine), a.view());
        auto deadline = pdcoll::exec::with_deadline(std::chrono::seconds(30));
        pdcoll::exec::sync_wait(pdcoll::all_gather(comm, a.view(), g.view()) | deadline);
        pdcoll::exec::sync_wait(pdcoll::all_reduce(comm, a.view(), pdcoll::op::sum) | deadline);
        std::vector<float> sum(n), all(n * static_cast<std::size_t>(P));
        dev.copy_to_host(a.const_view(), std::span<float>(sum));
        dev.copy_to_host(g.const_view(), std::span<float>(all));
        for (std::size_t i = 0; i < n; ++i) {
          wrong += sum[i] != static_cast<float>(P * (P + 1) / 2 + P * static_cast<int>(i % 5));
          for (int b = 0; b < P; ++b)
            wrong += all[static_cast<std::size_t>(b) * n + i] != static_cast<float>(b + 1 + static_cast<int>(i % 5));
        }
        const auto paths = comm.data_path_statistics();
        staged_bytes += paths.staged_bytes;
        if (force_staging) {
          CHECK(paths.staged_operations == 2);
          CHECK(paths.staged_chunks > 2);
        } else {
          CHECK(paths.direct_operations == 2);
        }
      },
      options);
}

// Runs `body` on P in-process ranks, with host staging forced or not.
void run_device_path(int P, bool staged, const std::function<void(pdcoll::communicator&)>& body) {
  pdcoll::communicator_options options;
  options.force_host_staging = staged;
  pdcoll::testing::run_inproc(P, body, options);
}

}  // namespace

TEST_CASE("forced host staging pipelines chunks and matches the direct path for 5 ranks and an uneven count") {
  REQUIRE(small_chunks);
  device dev(std::size_t{32} << 20);
  const int P = 5;
  const std::size_t n = 10'007;  // 39 KiB: all_reduce in 5 chunks, all_gather in 25
  std::atomic<int> wrong{0};
  std::atomic<std::uint64_t> staged{0};
  dev.reset_counters();
  run_all_reduce_and_gather(true, P, n, wrong, staged, dev);
  const auto c = dev.counters();
  CHECK(wrong == 0);
  // Staged bytes are exactly the domain's copies minus the test's own upload/downloads.
  const std::uint64_t own = static_cast<std::uint64_t>(P) * (n + n + n * P) * sizeof(float);
  CHECK(c.device_to_host_bytes + c.host_to_device_bytes - own == staged.load());
  // all_reduce: n in and out; all_gather: n in, P*n out; per rank.
  CHECK(staged.load() == static_cast<std::uint64_t>(P) * (2 * n + n + n * P) * sizeof(float));

  wrong = 0;
  staged = 0;
  dev.reset_counters();
  run_all_reduce_and_gather(false, P, n, wrong, staged, dev);
  CHECK(wrong == 0);
  CHECK(staged.load() == 0);
  CHECK(dev.counters().device_to_host_bytes == static_cast<std::uint64_t>(P) * (n + n * P) * sizeof(float));
}

TEST_CASE("staged chunks keep their slots when one rank's transfers complete newest first") {
  // Rank 1's transport hands out its completions newest first, so its later
  // chunk tends to finish before the earlier one; the other ranks' do not.
  // Chunk k must still run on slot k % 2 everywhere (each slot has its own
  // message indices): handing chunk k to whichever slot went idle first
  // matched one chunk's messages to another chunk's receives.
  REQUIRE(small_chunks);
  device dev(std::size_t{64} << 20);
  for (const int P : {2, 3, 4}) {
    CAPTURE(P);
    pdcoll::communicator_options options = pdcoll::testing::short_timeout(std::chrono::seconds(30));
    options.force_host_staging = true;
    pdcoll::testing::wrapped_world world(
        P,
        [](int rank) {
          pdcoll::testing::endpoint_faults f;
          f.newest_completion_first = rank == 1;
          return f;
        },
        options);
    const std::size_t n = 10'007;  // 39 KiB: all_reduce in 5 chunks, all_gather in 5 * P
    std::atomic<int> wrong{0};
    world.run([&](int r, pdcoll::communicator& comm) {
      std::vector<float> mine(n);
      for (std::size_t i = 0; i < n; ++i) mine[i] = static_cast<float>(r + 1 + static_cast<int>(i % 5));
      auto a = dev.allocate<float>(n);
      auto g = dev.allocate<float>(n * static_cast<std::size_t>(P));
      dev.copy_from_host(std::span<const float>(mine), a.view());
      for (int round = 0; round < 3; ++round) {
        pdcoll::exec::sync_wait(pdcoll::all_gather(comm, a.view(), g.view()));
        std::vector<float> all(n * static_cast<std::size_t>(P));
        dev.copy_to_host(g.const_view(), std::span<float>(all));
        for (int b = 0; b < P; ++b)
          for (std::size_t i = 0; i < n; ++i)
            wrong += all[static_cast<std::size_t>(b) * n + i] != static_cast<float>(b + 1 + static_cast<int>(i % 5));
      }
      pdcoll::exec::sync_wait(pdcoll::all_reduce(comm, a.view(), pdcoll::op::sum));
      std::vector<float> sum(n);
      dev.copy_to_host(a.const_view(), std::span<float>(sum));
      for (std::size_t i = 0; i < n; ++i)
        wrong += sum[i] != static_cast<float>(P * (P + 1) / 2 + P * static_cast<int>(i % 5));
      CHECK(comm.data_path_statistics().staged_operations == 4);
    });
    CHECK(wrong == 0);
    CHECK(world.counters[1]->reordered.load() > 0);
  }
}

TEST_CASE("in-place all_gather and reduce_scatter on device memory are right, staged and direct") {
  REQUIRE(small_chunks);
  device dev(std::size_t{32} << 20);
  const int P = 3;
  const std::size_t n = 5'003;  // 20 KiB blocks: several staged chunks
  for (bool staged : {true, false}) {
    CAPTURE(staged);
    std::atomic<int> wrong{0};
    run_device_path(
        P, staged,
        [&](pdcoll::communicator& comm) {
          const int r = comm.rank();
          const std::size_t total = n * static_cast<std::size_t>(P), mine = n * static_cast<std::size_t>(r);
          auto value = [](int rank, std::size_t i) { return static_cast<float>(rank * 7 + static_cast<int>(i % 11)); };
          std::vector<float> host(total);
          for (std::size_t i = 0; i < n; ++i) host[mine + i] = value(r, i);
          auto g = dev.allocate<float>(total);
          dev.copy_from_host(std::span<const float>(host), g.view());
          auto deadline = pdcoll::exec::with_deadline(std::chrono::seconds(30));
          // all_gather: the input is this rank's block of the output.
          pdcoll::exec::sync_wait(pdcoll::all_gather(comm, g.view().subview(mine, n), g.view()) | deadline);
          dev.copy_to_host(g.const_view(), std::span<float>(host));
          for (int b = 0; b < P; ++b)
            for (std::size_t i = 0; i < n; ++i) wrong += host[static_cast<std::size_t>(b) * n + i] != value(b, i);
          // reduce_scatter: the output is this rank's block of the input (every block holds value(r, ·) + b).
          for (std::size_t i = 0; i < total; ++i) host[i] = value(r, i % n) + static_cast<float>(i / n);
          dev.copy_from_host(std::span<const float>(host), g.view());
          pdcoll::exec::sync_wait(pdcoll::reduce_scatter(comm, g.view(), g.view().subview(mine, n)) | deadline);
          dev.copy_to_host(g.const_view().subview(mine, n), std::span<float>(host).subspan(0, n));
          for (std::size_t i = 0; i < n; ++i) {
            float expected = 0;
            for (int q = 0; q < P; ++q) expected += value(q, i) + static_cast<float>(r);
            wrong += host[i] != expected;
          }
          const auto paths = comm.data_path_statistics();
          CHECK((staged ? paths.staged_operations : paths.direct_operations) == 2);
        });
    CHECK(wrong == 0);
  }
}

TEST_CASE("all_to_allv and all_gatherv on device memory are right, staged per pair in chunks and direct, and leave the gaps alone") {
  using namespace pdcoll::testing;
  device dev(std::size_t{64} << 20);
  for (int P : {1, 3, 5}) {
    for (bool staged : {true, false}) {
      CAPTURE(P);
      CAPTURE(staged);
      std::atomic<int> wrong{0};
      run_device_path(
          P, staged,
          [&](pdcoll::communicator& comm) {
            const int r = comm.rank();
            const std::uint64_t salt = 40 + static_cast<std::uint64_t>(P);
            const std::size_t max_count = 9'001;  // blocks up to 35 KiB: many chunks of 8 KiB / P per pair
            auto deadline = pdcoll::exec::with_deadline(std::chrono::seconds(30));
            // Moves `host` to a fresh device buffer, runs `collective` on it, and compares with `expected`.
            auto to_device = [&](const std::vector<float>& host) {
              auto b = dev.allocate<float>(host.size());
              dev.copy_from_host(std::span<const float>(host), b.view());
              return b;
            };
            auto compare = [&](const auto& buffer, const std::vector<float>& expected) {
              std::vector<float> got(expected.size());
              dev.copy_to_host(buffer.const_view(), std::span<float>(got));
              wrong += got != expected;
            };
            const auto l = all_to_allv_layout(salt, P, r, max_count, false);
            auto in = to_device(make_input<float>(salt, r, l.input_elems, false));
            auto out = to_device(std::vector<float>(l.output_elems, gap_fill<float>()));
            pdcoll::exec::sync_wait(pdcoll::all_to_allv(comm, in.view(), l.send_counts, l.send_displs, out.view(),
                                                        l.recv_counts, l.recv_displs) |
                                    deadline);
            compare(out, expected_all_to_allv<float>(salt, P, r, max_count, false));
            // Each pair's block goes in chunks of 8 KiB / P: a rank runs as
            // many as its longest block needs (blocks of n elements take
            // n / chunk + 1), and stages exactly its blocks' bytes.
            const std::size_t chunk = 8192 / sizeof(float) / static_cast<std::size_t>(P);
            std::uint64_t received = 0, sent = 0;
            std::size_t longest = 0;
            for (int p = 0; p < P; ++p) {
              const auto q = static_cast<std::size_t>(p);
              received += l.recv_counts[q] * sizeof(float);
              sent += l.send_counts[q] * sizeof(float);
              longest = std::max({longest, l.send_counts[q], l.recv_counts[q]});
            }
            // all_gatherv in place: this rank's block already in the output.
            const auto g = all_gatherv_layout(salt + 1, P, max_count, false);
            const std::size_t n = g.recv_counts[static_cast<std::size_t>(r)], at = g.recv_displs[static_cast<std::size_t>(r)];
            auto gathered_host = std::vector<float>(g.output_elems, gap_fill<float>());
            const auto mine = make_input<float>(salt + 1, r, n, false);
            std::copy(mine.begin(), mine.end(), gathered_host.begin() + static_cast<std::ptrdiff_t>(at));
            auto gathered = to_device(gathered_host);
            pdcoll::exec::sync_wait(pdcoll::all_gatherv(comm, gathered.view().subview(at, n), gathered.view(),
                                                        g.recv_counts, g.recv_displs) |
                                    deadline);
            compare(gathered, expected_all_gatherv<float>(salt + 1, P, max_count, false));
            const auto paths = comm.data_path_statistics();
            if (staged) {
              // all_gatherv stages its input once per chunk, not once per peer.
              CHECK(paths.staged_operations == 2);
              std::uint64_t gathered_bytes = 0;
              std::size_t longest_gathered = 0;
              for (std::size_t c : g.recv_counts) {
                gathered_bytes += c * sizeof(float);
                longest_gathered = std::max(longest_gathered, c);
              }
              CHECK(paths.staged_chunks == longest / chunk + 1 + longest_gathered / chunk + 1);
              CHECK(paths.staged_bytes == sent + n * sizeof(float) + received + gathered_bytes);
            } else {
              CHECK(paths.direct_operations == 2);
            }
          });
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("staged all_to_allv: a count its sender and receiver disagree on fails with collective_mismatch, whichever chunk shows it") {
  // 8 KiB / 3 ranks: chunks of 682 floats per pair. Rank 1 sends rank 0
  // `sent` floats and rank 0 expects `expected`: the first chunk whose
  // lengths differ is the first, a middle one, the empty last one of an
  // exact multiple, or one the shorter block does not have at all.
  constexpr std::size_t chunk = 8192 / sizeof(float) / 3;
  struct disagreement {
    std::size_t sent, expected;
  };
  device dev(std::size_t{16} << 20);
  for (auto [sent, expected] : {disagreement{5, 6}, disagreement{3 * chunk + 7, 3 * chunk + 8},
                                disagreement{2 * chunk, 2 * chunk + 1}, disagreement{chunk + 3, 4 * chunk},
                                disagreement{4 * chunk, 0}}) {
    CAPTURE(sent);
    CAPTURE(expected);
    std::atomic<int> wrong{0};
    pdcoll::communicator_options options;
    options.force_host_staging = true;
    pdcoll::testing::run_inproc(
        3,
        [&](pdcoll::communicator& comm) {
          std::vector<std::size_t> send_counts(3, 10), recv_counts(3, 10);
          if (comm.rank() == 1) send_counts[0] = sent;
          if (comm.rank() == 0) recv_counts[1] = expected;
          auto in = dev.allocate<float>(send_counts[0] + 20);
          auto out = dev.allocate<float>(recv_counts[1] + 20);
          using pdcoll::testing::error_of;
          auto deadline = pdcoll::exec::with_deadline(std::chrono::seconds(20));
          const auto ec = error_of([&] {
            pdcoll::exec::sync_wait(pdcoll::all_to_allv(comm, in.view(), send_counts, out.view(), recv_counts) |
                                    deadline);
          });
          if (comm.rank() == 0) wrong += ec != pdcoll::errc::collective_mismatch;
          // Every rank ends aborted for the mismatch, at the latest on its next call.
          wrong += !error_of([&] { pdcoll::exec::sync_wait(pdcoll::barrier(comm) | deadline); });
          wrong += comm.abort_reason() != pdcoll::errc::collective_mismatch;
        },
        options);
    CHECK(wrong == 0);
  }
}

TEST_CASE("a staged collective with count zero completes without copying") {
  device dev(std::size_t{1} << 20);
  pdcoll::communicator_options options;
  options.force_host_staging = true;
  pdcoll::testing::run_inproc(
      3,
      [&](pdcoll::communicator& comm) {
        auto a = dev.allocate<float>(0);
        pdcoll::exec::sync_wait(pdcoll::all_reduce(comm, a.view(), pdcoll::op::sum) |
                                pdcoll::exec::with_deadline(std::chrono::seconds(30)));
        CHECK(comm.data_path_statistics().staged_bytes == 0);
      },
      options);
}

#if defined(PDCOLL_HAS_GAUDI)
TEST_CASE("collectives on gaudi views compile and are checked when the sender is made") {
  pdcoll::testing::run_inproc(2, [&](pdcoll::communicator& comm) {
    pdcoll::view<float, pdcoll::memory::gaudi> none;
    auto s = pdcoll::all_reduce(comm, none, pdcoll::op::sum);
    CHECK(!s.validation_error());  // an empty buffer is a valid zero-count call
    auto b = pdcoll::broadcast(comm, none, 0);
    CHECK(!b.validation_error());
    // Not started: the inproc transport stages gaudi memory, and there is no device here.
  });
}
#endif

TEST_CASE("direct collectives take their device scratch from the domain's cache and give it back") {
  device dev(std::size_t{64} << 20);
  std::atomic<int> wrong{0};
  pdcoll::testing::run_inproc(2, [&](pdcoll::communicator& comm) {
    constexpr std::size_t n = std::size_t{1} << 18;  // 1 MiB: the ring's chunk slots are scratch
    auto a = dev.allocate<float>(n);
    std::vector<float> ones(n, 1.0f), back(n);
    for (int round = 0; round < 3; ++round) {
      dev.copy_from_host(std::span<const float>(ones), a.view());
      pdcoll::exec::sync_wait(pdcoll::all_reduce<pdcoll::algo::ring>(comm, a.view()));
      dev.copy_to_host(a.const_view(), std::span<float>(back));
      for (float v : back) wrong += v != 2.0f;
    }
  });
  CHECK(wrong == 0);
  // Two ranks, three rounds: after the first round each rank's scratch came back.
  CHECK(dev.scratch().reused() >= 4);
  CHECK(dev.scratch().held_bytes() > 0);
  dev.scratch().clear();
  CHECK(dev.scratch().held_bytes() == 0);
}
