// A wake-up that runs nothing must not cost a rank its next wake-up: the
// communicator's drive() waits again rather than return to a caller that
// would sleep where peers' rings do not reach. And the poll-before-sleep
// default's environment override.
#include <doctest/doctest.h>

#include <pdcoll/pdcoll.hpp>
#include <pdcoll/transport/poll_policy.hpp>
#include <unit/exec_support.hpp>
#include <unit/failure_endpoints.hpp>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

namespace ex = pdcoll::exec;
using namespace std::chrono_literals;

TEST_CASE("drive() keeps waiting after wake-ups that run nothing: it never returns false while an all_reduce waits for a peer") {
  constexpr int early = 5;
  for (std::size_t count : {std::size_t{4}, std::size_t{20000}}) {
    CAPTURE(count);
    pdcoll::communicator_options options;
    options.progress_thread = false;
    options.timeout = 20s;
    pdcoll::testing::wrapped_world world(
        2,
        [](int rank) {
          pdcoll::testing::endpoint_faults faults;
          if (rank == 0) faults.early_wakeups = early;
          return faults;
        },
        options);
    std::vector<float> a(count, 1.0f), b(count, 2.0f);
    ex::test::record rec;
    auto op = ex::connect(pdcoll::all_reduce(*world.comms[0], a), ex::test::recording_receiver{&rec});
    ex::start(op);
    REQUIRE_FALSE(rec.done.load());  // rank 1 has not joined
    // Rank 1 joins only after rank 0's drive has used up its early wake-ups.
    std::thread peer([&] {
      REQUIRE(ex::test::wait_for([&] { return world.counters[0]->early_wakeups.load() == early; }));
      std::this_thread::sleep_for(20ms);
      ex::sync_wait(pdcoll::all_reduce(*world.comms[1], b));
    });
    // drive(until) may return true after any progress, but false only at
    // `until`: a false return here is a wake-up handed back to the caller.
    int returned_idle = 0;
    const auto give_up = std::chrono::steady_clock::now() + 15s;
    while (!rec.done.load() && std::chrono::steady_clock::now() < give_up)
      if (!world.comms[0]->drive(std::chrono::steady_clock::now() + 10s)) ++returned_idle;
    peer.join();
    CHECK(world.counters[0]->early_wakeups.load() == early);
    CHECK(returned_idle == 0);
    REQUIRE(rec.done.load());
    CHECK(!rec.error);
    CHECK(a[count - 1] == 3.0f);
    CHECK(b[0] == 3.0f);
  }
}

TEST_CASE("PDCOLL_POLL_US sets how long transports poll before they sleep; anything but a count keeps 20 us") {
  struct restore {
    ~restore() { ::unsetenv("PDCOLL_POLL_US"); }
  } restore_env;
  ::unsetenv("PDCOLL_POLL_US");
  CHECK(pdcoll::transport::default_poll_before_sleep() == 20us);
  ::setenv("PDCOLL_POLL_US", "150", 1);
  CHECK(pdcoll::transport::default_poll_before_sleep() == 150us);
  ::setenv("PDCOLL_POLL_US", "0", 1);
  CHECK(pdcoll::transport::default_poll_before_sleep() == 0us);
  for (const char* bad : {"", "fast", "-5", "10ms"}) {
    CAPTURE(bad);
    ::setenv("PDCOLL_POLL_US", bad, 1);
    CHECK(pdcoll::transport::default_poll_before_sleep() == 20us);
  }
}
