// Unit tests: the progress-driver hook. sync_wait on one thread completes an
// operation that only a registered driver can complete, with no extra thread.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "pdcoll/exec/exec.hpp"
#include "unit/exec_support.hpp"

namespace ex = pdcoll::exec;
namespace test = pdcoll::exec::test;
using namespace std::chrono_literals;

namespace {

/// A fake transport: completes its slot's operation from drive() after a few
/// polls, on whatever thread drives it.
struct fake_network final : ex::progress_driver {
  test::external_slot* slot = nullptr;
  int polls_before_completion = 3;
  std::atomic<int> polls{0};
  std::thread::id driven_on{};
  bool unregister_on_completion = false;

  bool drive(std::chrono::steady_clock::time_point) noexcept override {
    driven_on = std::this_thread::get_id();
    if (++polls < polls_before_completion) return false;
    if (slot == nullptr || !slot->fire(42)) return false;
    if (unregister_on_completion) ex::progress_drivers::unregister_driver(this);
    return true;
  }
};

/// A driver that counts its calls and never has work.
struct counting final : ex::progress_driver {
  int calls = 0;
  bool drive(std::chrono::steady_clock::time_point) noexcept override { return ++calls, false; }
};

/// Unregisters a driver at scope exit, so a failing check cannot leave a
/// dangling driver in the process-wide registry.
struct registration {
  ex::progress_driver* driver;
  explicit registration(ex::progress_driver* d) : driver(d) { ex::progress_drivers::register_driver(d); }
  ~registration() { ex::progress_drivers::unregister_driver(driver); }
};

}  // namespace

TEST_SUITE("exec.progress") {

TEST_CASE("sync_wait completes an operation that only a progress driver completes, on the calling thread") {
  test::external_slot slot;
  fake_network network;
  network.slot = &slot;
  registration reg{&network};
  CHECK(ex::progress_drivers::size() == 1);
  auto [v] = *ex::sync_wait(test::external_sender{&slot} | ex::then([](int x) { return x + 1; }));
  CHECK(v == 43);
  CHECK(network.polls >= 3);
  CHECK(network.driven_on == std::this_thread::get_id());
}

TEST_CASE("a driver that unregisters itself from inside drive does not deadlock") {
  test::external_slot slot;
  fake_network network;
  network.slot = &slot;
  network.unregister_on_completion = true;
  ex::progress_drivers::register_driver(&network);
  auto [v] = *ex::sync_wait(test::external_sender{&slot});
  CHECK(v == 42);
  CHECK(ex::progress_drivers::size() == 0);
}

TEST_CASE("a driver that unregisters itself does not make the same round skip the next one") {
  // An idle communicator leaves the registry from inside its drive(); the
  // communicator registered after it moves into its slot. Before the fix
  // that round skipped it, and its caller slept 1 ms with its work undone:
  // about 1 ms per collective for a runtime alternating two communicators.
  struct leaving final : ex::progress_driver {
    bool drive(std::chrono::steady_clock::time_point) noexcept override {
      ex::progress_drivers::unregister_driver(this);
      return false;
    }
  };
  leaving first;
  counting second, third;
  ex::progress_drivers::register_driver(&first);
  registration keep_second(&second), keep_third(&third);
  ex::drive_progress_once(std::chrono::steady_clock::now());
  CHECK(second.calls == 1);
  CHECK(third.calls == 1);
  CHECK(ex::progress_drivers::size() == 2);
}

TEST_CASE("a driver that leaves and joins again does not make the round skip the drivers after it") {
  struct rejoining final : ex::progress_driver {
    int calls = 0;
    bool drive(std::chrono::steady_clock::time_point) noexcept override {
      ++calls;
      ex::progress_drivers::unregister_driver(this);
      ex::progress_drivers::register_driver(this);
      return false;
    }
  };
  rejoining first;
  counting second, third;
  registration keep_first(&first), keep_second(&second), keep_third(&third);
  ex::drive_progress_once(std::chrono::steady_clock::now());
  CHECK(first.calls == 1);
  CHECK(second.calls == 1);
  CHECK(third.calls == 1);
}

TEST_CASE("drivers that hand over to one another end the round") {
  // Each leaves and registers the other: a round that followed the list
  // would never end.
  struct handing final : ex::progress_driver {
    handing* other = nullptr;
    int calls = 0;
    bool drive(std::chrono::steady_clock::time_point) noexcept override {
      if (++calls > 100) return false;  // a bound for the broken case, so the test fails instead of hanging
      ex::progress_drivers::unregister_driver(this);
      ex::progress_drivers::register_driver(other);
      return false;
    }
  };
  handing a, b;
  a.other = &b;
  b.other = &a;
  ex::progress_drivers::register_driver(&a);
  ex::drive_progress_once(std::chrono::steady_clock::now());
  CHECK(a.calls + b.calls == 1);
  ex::progress_drivers::unregister_driver(&a);
  ex::progress_drivers::unregister_driver(&b);
  CHECK(ex::progress_drivers::size() == 0);
}

TEST_CASE("registering a driver twice keeps one registration") {
  fake_network network;
  registration reg{&network};
  ex::progress_drivers::register_driver(&network);
  CHECK(ex::progress_drivers::size() == 1);
}

TEST_CASE("drive_progress_once returns false at once when no driver is registered") {
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(ex::drive_progress_once(t0 + 1s));
  CHECK(std::chrono::steady_clock::now() - t0 < 500ms);
}

TEST_CASE("drive_progress_once lets a caller without a run_loop wait for a driver's completion") {
  test::external_slot slot;
  fake_network network;
  network.slot = &slot;
  network.polls_before_completion = 1;
  registration reg{&network};
  test::record rec;
  auto op = ex::connect(test::external_sender{&slot}, test::recording_receiver{&rec});
  ex::start(op);
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!rec.done && std::chrono::steady_clock::now() < deadline) {
    ex::drive_progress_once(std::chrono::steady_clock::now() + 1ms);
  }
  CHECK(rec.value == 42);
}

TEST_CASE("unregistering a driver from another thread waits for its drive call to return") {
  struct slow_driver final : ex::progress_driver {
    std::atomic<bool> inside{false};
    std::atomic<bool> returned{false};
    bool drive(std::chrono::steady_clock::time_point) noexcept override {
      inside = true;
      std::this_thread::sleep_for(20ms);
      returned = true;
      return false;
    }
  } driver;
  ex::progress_drivers::register_driver(&driver);
  std::thread poller([] { ex::drive_progress_once(std::chrono::steady_clock::now() + 1ms); });
  REQUIRE(test::wait_for([&] { return driver.inside.load(); }));
  ex::progress_drivers::unregister_driver(&driver);
  CHECK(driver.returned);
  poller.join();
}

TEST_CASE("a run_loop idle in its drivers still runs work pushed from another thread promptly") {
  fake_network idle;  // never completes anything
  registration reg{&idle};
  ex::run_loop loop;
  test::record rec;
  auto op = ex::connect(ex::schedule(loop.get_scheduler()) | ex::then([&]() noexcept { loop.finish(); }),
                        test::recording_receiver{&rec});
  std::thread pusher([&] {
    std::this_thread::sleep_for(5ms);
    ex::start(op);
  });
  const auto t0 = std::chrono::steady_clock::now();
  loop.run();
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  pusher.join();
  CHECK(rec.completions == 1);
  CHECK(idle.polls > 0);
  CHECK(elapsed < 1s);
}

}  // TEST_SUITE
