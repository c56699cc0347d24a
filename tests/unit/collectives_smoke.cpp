// Smoke test of the collective engine over inproc (the full matrix is in collectives_matrix.cpp).
#include <doctest/doctest.h>

#include <pdcoll/pdcoll.hpp>
#include <support/inproc_world.hpp>

#include <atomic>
#include <cstdint>
#include <chrono>
#include <numeric>
#include <system_error>
#include <span>
#include <vector>

TEST_CASE("ring all_reduce sums int32 over 3 ranks") {
  pdcoll::testing::run_inproc(3, [](pdcoll::communicator& comm) {
    std::vector<int> data(10);
    std::iota(data.begin(), data.end(), comm.rank() * 100);
    pdcoll::exec::sync_wait(pdcoll::all_reduce<pdcoll::algo::ring>(comm, data, pdcoll::op::sum));
    for (int i = 0; i < 10; ++i) CHECK(data[i] == 3 * i + 300);
  });
}

TEST_CASE("in-place reduce with one buffer: the root gets the sum, every other rank's data is left as it was") {
  for (int P : {1, 2, 3, 5, 8}) {
    for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{70000}}) {
      for (bool node_memory : {false, true}) {
        const int root = P / 2;
        CAPTURE(P);
        CAPTURE(count);
        CAPTURE(node_memory);
        std::atomic<int> wrong{0};
        auto body = [&](pdcoll::communicator& comm) {
          const int r = comm.rank();
          auto input = [&](std::size_t i) { return static_cast<std::int64_t>(i) * 3 + r * 1000 + 1; };
          std::vector<std::int64_t> data(count);
          for (std::size_t i = 0; i < count; ++i) data[i] = input(i);
          std::vector<std::int64_t> tree_data = data;
          pdcoll::exec::sync_wait(pdcoll::reduce(comm, data, pdcoll::op::sum, root));
          pdcoll::exec::sync_wait(pdcoll::reduce<pdcoll::algo::tree>(comm, std::span<std::int64_t>(tree_data),
                                                                      pdcoll::op::sum, root));
          for (std::size_t i = 0; i < count; ++i) {
            const std::int64_t sum = P * (static_cast<std::int64_t>(i) * 3 + 1) + 1000 * P * (P - 1) / 2;
            const std::int64_t expect = r == root ? sum : input(i);
            wrong += (data[i] != expect) + (tree_data[i] != expect);
          }
        };
        pdcoll::testing::run_inproc(P, body, {}, node_memory ? std::size_t{4} << 20 : 0);
        CHECK(wrong == 0);
      }
    }
  }
}

namespace {
/// An all-reduce that numbers one exchange past the last message index an
/// algorithm may use (as a ring of a few bytes per chunk over gigabytes would).
struct index_overrun {
  static constexpr const char* name = "index_overrun";
  static pdcoll::detail::collective_task all_reduce(pdcoll::detail::collective_context& ctx) {
    const std::size_t bytes = ctx.bytes(ctx.count);
    ctx.copy(ctx.output, 0, ctx.input, 0, bytes);
    if (ctx.world_size == 1) co_return std::error_code{};
    auto incoming = ctx.scratch(bytes);
    const int partner = ctx.rank ^ 1;
    pdcoll::detail::transfer_batch b(ctx, 2);
    b.recv(partner, incoming, 0, bytes, pdcoll::detail::max_message_index + 1);
    b.send(partner, ctx.output, 0, bytes, pdcoll::detail::max_message_index + 1);
    if (auto ec = co_await b) co_return ec;
    ctx.reduce(ctx.output, 0, incoming, 0, ctx.count);
    co_return std::error_code{};
  }
};
}  // namespace

TEST_CASE("a message index past max_message_index fails the collective with invalid_argument on every rank") {
  std::atomic<int> refused{0};
  pdcoll::communicator_options options;
  options.timeout = std::chrono::seconds(20);
  pdcoll::testing::run_inproc(
      2,
      [&](pdcoll::communicator& comm) {
        std::vector<float> data(16, 1.0f);
        try {
          pdcoll::exec::sync_wait(pdcoll::all_reduce<index_overrun>(comm, data));
        } catch (const std::system_error& e) {
          if (e.code() == pdcoll::errc::invalid_argument) ++refused;
        }
      },
      options);
  CHECK(refused == 2);
}
