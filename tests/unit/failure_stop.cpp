// Stopping a collective (design-notes item 5): the stopped rank ends with
// set_stopped and aborts the communicator, so its peers fail fast instead of
// waiting for their deadline or, worse, pairing their collective with the
// stopped rank's next one. Over inproc, both ranks driven from one thread.
#include <doctest/doctest.h>

#include <pdcoll/pdcoll.hpp>
#include <unit/failure_endpoints.hpp>
#include <unit/uring_support.hpp>

#include <atomic>
#include <chrono>
#include <optional>
#include <system_error>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;
namespace ex = pdcoll::exec;

// How a collective ended under sync_wait with `token`.
struct ending {
  bool stopped = false;
  std::error_code error;
};

template <class S>
ending run(S&& sender, ex::inplace_stop_token token = {}) {
  ending e;
  try {
    e.stopped = !ex::sync_wait(std::forward<S>(sender), token).has_value();
  } catch (const std::system_error& failure) {
    e.error = failure.code();
  }
  return e;
}

double ms_since(clock_type::time_point t) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t).count();
}

pdcoll::testing::wrapped_world two_ranks(std::chrono::milliseconds timeout) {
  return pdcoll::testing::wrapped_world(2, [](int) { return pdcoll::testing::endpoint_faults{}; },
                                        pdcoll::testing::short_timeout(timeout));
}

}  // namespace

TEST_SUITE("failure: stopping a collective") {

TEST_CASE("a collective stopped while it waits for its peer ends stopped and the peer fails fast with aborted") {
  auto world = two_ranks(5000ms);
  auto& stopped_rank = *world.comms[0];
  auto& peer = *world.comms[1];
  std::vector<float> data(1000, 1.0f);
  ex::inplace_stop_source source;
  std::thread stopper([&] {
    std::this_thread::sleep_for(20ms);
    source.request_stop();
  });
  const auto start = clock_type::now();
  const ending mine = run(pdcoll::all_reduce(stopped_rank, data), source.get_token());
  stopper.join();
  CHECK(mine.stopped);
  CHECK_FALSE(mine.error);
  CHECK(ms_since(start) < 2000);
  CHECK(stopped_rank.aborted());
  // The stopped rank's data went out before its stop: the peer's all-reduce
  // may still complete with the right sum, or fail with the abort; either
  // way at once, not at its deadline. Its next collective fails.
  const auto peer_start = clock_type::now();
  const ending theirs = run(pdcoll::all_reduce(peer, data));
  CHECK(ms_since(peer_start) < 2000);
  if (theirs.error) CHECK(theirs.error == pdcoll::errc::aborted);
  else CHECK(data[0] == 2.0f);
  CHECK(run(pdcoll::all_reduce(peer, data)).error == pdcoll::errc::aborted);
}

TEST_CASE("a collective stopped before it starts aborts too: its peer fails instead of pairing with the next one") {
  auto world = two_ranks(5000ms);
  auto& stopped_rank = *world.comms[0];
  auto& peer = *world.comms[1];
  ex::inplace_stop_source source;
  source.request_stop();  // say a when_all sibling failed on this rank only
  std::vector<int> skipped{1}, next{100}, peers{10};
  const ending mine = run(pdcoll::all_reduce(stopped_rank, skipped), source.get_token());
  CHECK(mine.stopped);
  CHECK(stopped_rank.aborted());
  CHECK(run(pdcoll::all_reduce(stopped_rank, next)).error == pdcoll::errc::aborted);
  // Without the abort the peer's first all-reduce met rank 0's second and
  // summed to 110, with no error anywhere.
  const auto peer_start = clock_type::now();
  CHECK(run(pdcoll::all_reduce(peer, peers)).error == pdcoll::errc::aborted);
  CHECK(ms_since(peer_start) < 2000);
  CHECK(peers[0] != 110);
}

TEST_CASE("a when_all started stopped skips its collectives and aborts, so the peer does not pair with the next one") {
  // when_all (ours as stdexec's) completes stopped without starting its
  // children; the collectives it dropped abort as a stop before start does.
  auto world = two_ranks(5000ms);
  auto& stopped_rank = *world.comms[0];
  auto& peer = *world.comms[1];
  ex::inplace_stop_source source;
  source.request_stop();
  std::vector<int> first{1}, second{2}, next{100}, peers{10};
  const ending mine =
      run(ex::when_all(pdcoll::all_reduce(stopped_rank, first), pdcoll::all_reduce(stopped_rank, second)),
          source.get_token());
  CHECK(mine.stopped);
  CHECK(stopped_rank.aborted());
  CHECK(run(pdcoll::all_reduce(stopped_rank, next)).error == pdcoll::errc::aborted);
  // Without the abort the peer's first all-reduce met rank 0's third and
  // summed to 110, with no error anywhere.
  CHECK(run(pdcoll::all_reduce(peer, peers)).error == pdcoll::errc::aborted);
  CHECK(peers[0] != 110);
}

TEST_CASE("a collective dropped unstarted without a stop aborts nothing") {
  auto world = two_ranks(5000ms);
  auto& comm = *world.comms[0];
  std::vector<int> data{1};
  {
    struct sink {
      using receiver_concept = ex::receiver_t;
      void set_value() noexcept {}
      void set_error(std::error_code) noexcept {}
      void set_stopped() noexcept {}
    };
    auto op = ex::connect(pdcoll::all_reduce(comm, data), sink{});
  }
  CHECK_FALSE(comm.aborted());
}

TEST_CASE("over io_uring, a collective stopped before it starts tells its peer at once, not at the peer's deadline") {
  // The stopped collective completes inside start(), so sync_wait drives
  // nothing afterwards and the rank does other work: the abort notices must
  // leave before start() returns, as abort()'s do. Without that the peer
  // ended with timeout at its deadline.
  auto endpoints = uring_test::make_world(2);
  pdcoll::communicator_options options;
  options.timeout = 20s;
  options.progress_thread = false;
  pdcoll::communicator stopped_rank(std::move(endpoints[0]), options);
  pdcoll::communicator peer(std::move(endpoints[1]), options);
  std::atomic<bool> peer_done{false};
  std::thread rank0([&] {
    ex::inplace_stop_source source;
    source.request_stop();
    std::vector<int> skipped{1};
    CHECK(run(pdcoll::all_reduce(stopped_rank, skipped), source.get_token()).stopped);
    CHECK(stopped_rank.aborted());
    while (!peer_done.load()) std::this_thread::sleep_for(1ms);  // busy elsewhere, never driving stopped_rank
  });
  std::vector<int> peers{10};
  const ending theirs = run(pdcoll::all_reduce(peer, peers));
  peer_done = true;
  rank0.join();
  CHECK(theirs.error == pdcoll::errc::aborted);
}

TEST_CASE("a stop requested while the collective waits for the communicator's lock survives another driver's turn") {
  auto world = two_ranks(5000ms);
  auto& comm = *world.comms[0];  // its peer never joins: only the stop can end it early
  std::vector<float> data(1000, 1.0f);
  ex::inplace_stop_source source;
  ending mine;
  comm.mutex().lock();  // another thread is inside the communicator (a progress thread, another sync_wait)
  const auto start = clock_type::now();
  std::thread starter([&] { mine = run(pdcoll::all_reduce(comm, data), source.get_token()); });
  std::this_thread::sleep_for(50ms);  // the starter waits in launch() for the lock, its stop callback attached
  source.request_stop();
  comm.drive(clock_type::now());  // that other thread's progress turn runs the communicator's stop service
  comm.mutex().unlock();
  starter.join();
  CHECK(mine.stopped);
  CHECK_FALSE(mine.error);  // not a timeout at the 5 s deadline
  CHECK(ms_since(start) < 2500);
}

}  // TEST_SUITE
