// Stopping a collective (design-notes item 5): the stopped rank ends with
// set_stopped and aborts the communicator, so its peers fail fast instead of
// waiting for their deadline or, worse, pairing their collective with the
// stopped rank's next one. Over inproc, both ranks driven from one thread.
#include <doctest/doctest.h>

#include <pdcoll/pdcoll.hpp>
#include <unit/failure_endpoints.hpp>

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
