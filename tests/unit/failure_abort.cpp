// Abort, deadline and data-path-close behaviour of the communicator over inproc.
#include <doctest/doctest.h>

#include <pdcoll/pdcoll.hpp>
#include <unit/exec_support.hpp>
#include <unit/failure_endpoints.hpp>

#include <chrono>
#include <memory>
#include <span>
#include <system_error>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

// The error a sender completed with (empty on success).
template <class S>
std::error_code outcome(S&& sender) {
  try {
    pdcoll::exec::sync_wait(std::forward<S>(sender));
  } catch (const std::system_error& e) {
    return e.code();
  }
  return {};
}

double ms_since(clock_type::time_point t) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t).count();
}

using pdcoll::testing::short_timeout;

}  // namespace

TEST_CASE("an all_reduce whose peer never joins times out and later operations fail at once with aborted") {
  pdcoll::testing::wrapped_world world(2, [](int) { return pdcoll::testing::endpoint_faults{}; }, short_timeout(300ms));
  auto& comm = *world.comms[0];
  std::vector<float> data(1000, 1.0f);
  const auto start = clock_type::now();
  CHECK(outcome(pdcoll::all_reduce(comm, data)) == pdcoll::errc::timeout);
  const double took = ms_since(start);
  CHECK(took >= 290);
  CHECK(took < 300 + 1000);
  CHECK(comm.aborted());
  CHECK(comm.abort_reason() == pdcoll::errc::timeout);
  CHECK(comm.pending_operations() == 0);
  // Every later operation: aborted, at once, nothing posted.
  const int posts_before = world.counters[0]->data_posts();
  for (int i = 0; i < 5; ++i) {
    const auto t = clock_type::now();
    CHECK(outcome(pdcoll::all_reduce(comm, data)) == pdcoll::errc::aborted);
    CHECK(outcome(pdcoll::barrier(comm)) == pdcoll::errc::aborted);
    CHECK(outcome(pdcoll::broadcast(comm, data, 1)) == pdcoll::errc::aborted);
    CHECK(ms_since(t) < 50);
  }
  CHECK(world.counters[0]->data_posts() == posts_before);
}

TEST_CASE("transfers that ignore their cancel are ended by closing the data path after abort_grace") {
  // Rank 0's endpoint ignores cancels, as libfabric's shm provider does for a
  // receive already matched to a peer killed mid-transfer.
  auto options = short_timeout(200ms);
  options.abort_grace = 150ms;
  pdcoll::testing::wrapped_world world(
      3, [](int rank) { return pdcoll::testing::endpoint_faults{.ignore_cancel = rank == 0, .unreachable = {}}; },
      options);
  auto& comm = *world.comms[0];
  std::vector<double> data(4096, 2.0);
  const auto start = clock_type::now();
  CHECK(outcome(pdcoll::all_reduce<pdcoll::algo::ring>(comm, data)) == pdcoll::errc::timeout);
  const double took = ms_since(start);
  CHECK(took >= 200 + 150 - 10);
  CHECK(took < 200 + 150 + 1000);
  CHECK(world.counters[0]->cancels.load() > 0);
  CHECK(world.counters[0]->closes.load() == 1);
  CHECK(comm.data_path_closed());
  CHECK(comm.pending_operations() == 0);
  CHECK(outcome(pdcoll::all_reduce(comm, data)) == pdcoll::errc::aborted);
  // Ranks 1 and 2 received the abort notice: their next operation fails with the reason.
  for (int r = 1; r < 3; ++r) {
    auto& other = *world.comms[static_cast<std::size_t>(r)];
    const auto t = clock_type::now();
    const auto ec = outcome(pdcoll::all_reduce(other, data));
    CHECK((ec == pdcoll::errc::timeout || ec == pdcoll::errc::aborted));
    CHECK(ms_since(t) < 1000);
    CHECK(other.aborted());
  }
}

TEST_CASE("a v form through node memory that times out ends its large blocks' transfers through the abort, not a drain") {
  // shared_memory's all_to_allv posts blocks larger than its slot section as
  // messages, then waits on the slots. Rank 1 never joins and rank 0's
  // transport ignores cancels: the step's error must wait for those
  // transfers under the operation's progress, where the abort closes the
  // data path after abort_grace. Returning at once left them to the
  // batch's one-second drain under the communicator's lock, after which
  // the transport still pointed into the coroutine's frame.
  auto options = short_timeout(200ms);
  options.abort_grace = 150ms;
  pdcoll::testing::wrapped_world world(
      2, [](int rank) { return pdcoll::testing::endpoint_faults{.ignore_cancel = rank == 0, .unreachable = {}}; },
      options, pdcoll::transport::min_node_memory_bytes);
  auto& comm = *world.comms[0];
  REQUIRE(comm.endpoint().shared_node_memory() != nullptr);
  const std::vector<std::size_t> counts(2, std::size_t{1} << 18);  // 1 MiB blocks: past any section
  std::vector<float> in(2 * counts[0], 1.0f), out(in.size());
  const auto start = clock_type::now();
  CHECK(outcome(pdcoll::all_to_allv<pdcoll::algo::shared_memory>(comm, in, counts, out, counts)) ==
        pdcoll::errc::timeout);
  const double took = ms_since(start);
  CHECK(world.counters[0]->data_sends.load() > 0);  // the large block went as a message
  CHECK(took >= 200 + 150 - 10);
  CHECK(took < 1100);  // the drain alone took 1,000 ms after the 200 ms deadline
  CHECK(world.counters[0]->closes.load() == 1);
  CHECK(comm.pending_operations() == 0);
}

TEST_CASE("a transport that honours cancel never needs its data path closed") {
  auto options = short_timeout(200ms);
  options.abort_grace = 150ms;
  pdcoll::testing::wrapped_world world(2, [](int) { return pdcoll::testing::endpoint_faults{}; }, options);
  auto& comm = *world.comms[0];
  std::vector<int> data(100, 1);
  CHECK(outcome(pdcoll::all_reduce(comm, data)) == pdcoll::errc::timeout);
  CHECK_FALSE(comm.data_path_closed());
  CHECK(world.counters[0]->closes.load() == 0);
}

TEST_CASE("abort from another thread ends pending collectives on every rank with its reason") {
  auto options = short_timeout(10s);
  pdcoll::testing::wrapped_world world(4, [](int) { return pdcoll::testing::endpoint_faults{}; }, options);
  std::vector<std::error_code> seen(4);
  std::vector<double> took(4);
  // Ranks 0..2 start an all_reduce that rank 3 never joins; rank 3 aborts with peer_lost.
  world.run([&](int rank, pdcoll::communicator& comm) {
    std::vector<float> data(512, 1.0f);
    const auto start = clock_type::now();
    if (rank == 3) {
      std::this_thread::sleep_for(100ms);
      comm.abort(make_error_code(pdcoll::errc::peer_lost));
      seen[3] = outcome(pdcoll::all_reduce(comm, data));
    } else {
      seen[static_cast<std::size_t>(rank)] = outcome(pdcoll::all_reduce(comm, data));
    }
    took[static_cast<std::size_t>(rank)] = ms_since(start);
  });
  for (int r = 0; r < 3; ++r) {
    CHECK(seen[static_cast<std::size_t>(r)] == pdcoll::errc::peer_lost);
    CHECK(took[static_cast<std::size_t>(r)] < 2000);  // far below the 10 s deadline
  }
  CHECK(seen[3] == pdcoll::errc::aborted);
}

TEST_CASE("operations in flight on several threads all complete when a rank is killed") {
  // Two concurrent all_reduces per rank (when_all) while rank 2 dies: every
  // survivor's operations end with an error within deadline + grace + slack.
  auto options = short_timeout(300ms);
  options.abort_grace = 100ms;
  pdcoll::testing::wrapped_world world(
      3, [](int) { return pdcoll::testing::endpoint_faults{.ignore_cancel = true, .unreachable = {}}; }, options);
  std::vector<std::error_code> seen(3);
  std::vector<double> took(3);
  world.run([&](int rank, pdcoll::communicator& comm) {
    if (rank == 2) {
      world.fabric->kill(2);
      return;
    }
    std::vector<float> a(3000, 1.0f), b(17, 2.0f);
    const auto start = clock_type::now();
    seen[static_cast<std::size_t>(rank)] = outcome(pdcoll::exec::when_all(
        pdcoll::all_reduce<pdcoll::algo::ring>(comm, a), pdcoll::all_reduce<pdcoll::algo::recursive_doubling>(comm, b)));
    took[static_cast<std::size_t>(rank)] = ms_since(start);
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << " took " << took[static_cast<std::size_t>(r)] << " ms");
    CHECK(seen[static_cast<std::size_t>(r)]);
    CHECK(took[static_cast<std::size_t>(r)] < 300 + 100 + 1000);
    CHECK(world.comms[static_cast<std::size_t>(r)]->pending_operations() == 0);
  }
}

TEST_CASE("a closed inproc endpoint cancels its posted receives and refuses posts") {
  auto fabric = pdcoll::transport::inproc::fabric::create(2);
  auto ep = fabric->endpoint_for(0);
  struct recorded : pdcoll::transport::completion_context {
    int calls = 0;
    std::error_code error;
  } r1, r2;
  auto record = [](pdcoll::transport::completion_context* ctx, const pdcoll::transport::completion& c) noexcept {
    auto* self = static_cast<recorded*>(ctx);
    ++self->calls;
    self->error = c.error;
  };
  r1.on_complete = r2.on_complete = record;
  int a = 0, b = 0;
  REQUIRE_FALSE(ep->post_recv(1, &a, sizeof a, 5, 0, nullptr, &r1));
  REQUIRE_FALSE(ep->post_recv(pdcoll::transport::any_peer, &b, sizeof b, 6, 0, nullptr, &r2));
  ep->close();
  CHECK(r1.calls == 0);  // never from inside close()
  ep->close();           // idempotent
  ep->progress();
  CHECK(r1.calls == 1);
  CHECK(r2.calls == 1);
  CHECK(r1.error == std::errc::operation_canceled);
  CHECK(r2.error == std::errc::operation_canceled);
  recorded r3;
  r3.on_complete = record;
  CHECK(ep->post_send(1, &a, sizeof a, 5, nullptr, &r3) == pdcoll::errc::aborted);
  CHECK(ep->post_recv(1, &a, sizeof a, 5, 0, nullptr, &r3) == pdcoll::errc::aborted);
  ep->progress();
  CHECK(r3.calls == 0);
  // The peer's sends to the closed rank fail instead of piling up.
  auto peer = fabric->endpoint_for(1);
  recorded s;
  s.on_complete = record;
  REQUIRE_FALSE(peer->post_send(0, &a, sizeof a, 5, nullptr, &s));
  peer->progress();
  CHECK(s.error == pdcoll::errc::peer_lost);
}

TEST_CASE("different collectives fail fast with collective_mismatch, or time out when verification is off") {
  for (bool verify : {true, false}) {
    CAPTURE(verify);
    auto options = short_timeout(verify ? 5000ms : 300ms);
    options.verify_collectives = verify;
    pdcoll::testing::wrapped_world world(2, [](int) { return pdcoll::testing::endpoint_faults{}; }, options);
    // Same collectives on both ranks: correct either way.
    std::error_code same[2];
    std::vector<int> sums[2] = {std::vector<int>(100, 1), std::vector<int>(100, 2)};
    {
      std::thread t([&] { same[1] = outcome(pdcoll::all_reduce(*world.comms[1], sums[1])); });
      same[0] = outcome(pdcoll::all_reduce(*world.comms[0], sums[0]));
      t.join();
    }
    CHECK(!same[0]);
    CHECK(!same[1]);
    CHECK(sums[0][99] == 3);
    CHECK(sums[1][0] == 3);
    // Rank 0 broadcasts while rank 1 all-reduces: no message of one matches the other.
    std::vector<float> a(1000, 1.0f), b(1000, 1.0f);
    std::error_code ec[2];
    const auto start = clock_type::now();
    {
      std::thread t([&] { ec[1] = outcome(pdcoll::all_reduce<pdcoll::algo::recursive_doubling>(*world.comms[1], b)); });
      ec[0] = outcome(pdcoll::broadcast(*world.comms[0], a, 1));
      t.join();
    }
    if (verify) {
      CHECK(ec[0] == pdcoll::errc::collective_mismatch);
      CHECK(ec[1] == pdcoll::errc::collective_mismatch);
      CHECK(ms_since(start) < 5000);
    } else {
      CHECK(ec[0] == pdcoll::errc::timeout);
      CHECK(ec[1] == pdcoll::errc::timeout);
    }
  }
}

TEST_CASE("a rank that receives an abort notice passes it on to every peer but the one it came from") {
  // Rank 2 must not learn of rank 0's abort only from rank 1's connection
  // closing (rank 1 may end as soon as it is aborted): rank 1 tells it too.
  pdcoll::testing::wrapped_world world(4, [](int) { return pdcoll::testing::endpoint_faults{}; }, short_timeout(10s));
  auto control_sends = [&](int r) {
    return world.counters[static_cast<std::size_t>(r)]->sends.load() -
           world.counters[static_cast<std::size_t>(r)]->data_sends.load();
  };
  world.comms[0]->abort();
  CHECK(control_sends(0) == 3);  // the originator: every peer
  const auto give_up = clock_type::now() + 5s;
  for (int r = 1; r < 4; ++r) {
    auto& comm = *world.comms[static_cast<std::size_t>(r)];
    while (!comm.aborted() && clock_type::now() < give_up) comm.drive(clock_type::now() + 10ms);
    CHECK(comm.aborted());
    CHECK(comm.abort_reason() == pdcoll::errc::aborted);
    // Let its forwarded notices leave; the ones it receives in turn change nothing.
    for (int i = 0; i < 20; ++i) comm.drive(clock_type::now() + 1ms);
    CAPTURE(r);
    CHECK(control_sends(r) == 2);  // every peer but rank 0, once
  }
}

namespace {

// A transport whose transfers ignore cancel and close and end only in its
// destructor (a zero-copy send to a peer that vanished without a reset):
// the communicator's drain gives up after a second, and the endpoint ends
// the receive as the communicator destroys it.
struct stubborn_endpoint final : pdcoll::transport::endpoint {
  std::vector<pdcoll::transport::completion_context*> posted;
  ~stubborn_endpoint() override {
    for (auto* ctx : posted) ctx->on_complete(ctx, {std::make_error_code(std::errc::operation_canceled), 0, 0, 1});
  }
  int rank() const noexcept override { return 0; }
  int world_size() const noexcept override { return 2; }
  std::string name() const override { return "stubborn"; }
  std::error_code post_send(int, const void*, std::size_t, std::uint64_t, void*,
                            pdcoll::transport::completion_context* ctx) noexcept override {
    posted.push_back(ctx);
    return {};
  }
  std::error_code post_recv(int, void*, std::size_t, std::uint64_t, std::uint64_t, void*,
                            pdcoll::transport::completion_context* ctx) noexcept override {
    posted.push_back(ctx);
    return {};
  }
  void cancel(pdcoll::transport::completion_context*) noexcept override {}
  std::size_t progress() noexcept override { return 0; }
  void wait(clock_type::time_point deadline) noexcept override {
    std::this_thread::sleep_until(std::min(deadline, clock_type::now() + 1ms));
  }
  pdcoll::transport::data_path path_for(pdcoll::transport::memory_kind) const noexcept override {
    return pdcoll::transport::data_path::host;
  }
  bool needs_registration(pdcoll::transport::memory_kind) const noexcept override { return false; }
  std::error_code register_region(const pdcoll::transport::memory_region&,
                                  pdcoll::transport::registration_handle&) noexcept override {
    return {};
  }
  void deregister(pdcoll::transport::registration_handle&) noexcept override {}
};

}  // namespace

TEST_CASE("a transfer that ends only as its endpoint is destroyed completes its receiver once, on a live communicator") {
  auto options = short_timeout(60s);
  options.abort_grace = 50ms;
  auto comm = std::make_unique<pdcoll::communicator>(std::make_unique<stubborn_endpoint>(), options);
  int value = 0;
  pdcoll::exec::test::record rec;
  auto op = pdcoll::exec::connect(pdcoll::recv(*comm, 1, std::span<int>(&value, 1), 5),
                                  pdcoll::exec::test::recording_receiver{&rec});
  pdcoll::exec::start(op);
  CHECK(rec.completions == 0);
  const auto start = clock_type::now();
  comm.reset();
  CHECK(clock_type::now() - start < 3s);
  CHECK(rec.completions == 1);
  CHECK(rec.error == pdcoll::errc::aborted);
}

// The same with a collective of several transfers: as the endpoint ends the
// first, the ring's coroutine cancels the others through the communicator,
// whose endpoint is by then the closed stand-in (it was a null reference:
// SIGSEGV). With and without the signature check, which posts too.
TEST_CASE("a collective whose transfers end only as its endpoint is destroyed completes once with aborted") {
  for (bool verify : {false, true}) {
    CAPTURE(verify);
    auto options = short_timeout(60s);
    options.abort_grace = 50ms;
    options.verify_collectives = verify;
    auto comm = std::make_unique<pdcoll::communicator>(std::make_unique<stubborn_endpoint>(), options);
    std::vector<float> data(4096, 1.0f);
    pdcoll::exec::test::record rec;
    auto op = pdcoll::exec::connect(pdcoll::all_reduce<pdcoll::algo::ring>(*comm, std::span<float>(data)),
                                    pdcoll::exec::test::recording_receiver{&rec});
    pdcoll::exec::start(op);
    CHECK(rec.completions == 0);
    comm.reset();
    CHECK(rec.completions == 1);
    CHECK(rec.error == pdcoll::errc::aborted);
  }
}
