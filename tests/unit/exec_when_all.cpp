// Unit tests: when_all values, errors, stops, stop forwarding and races
// (races in TEST_SUITE "exec.race").
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <system_error>
#include <thread>

#include "pdcoll/error.hpp"
#include "pdcoll/exec/exec.hpp"
#include "unit/exec_support.hpp"

namespace ex = pdcoll::exec;
namespace test = pdcoll::exec::test;
using namespace std::chrono_literals;

namespace {
const std::error_code peer_lost = pdcoll::errc::peer_lost;
}

TEST_SUITE("exec.when_all") {

TEST_CASE("when_all concatenates its children's values in argument order") {
  auto [a, b, c] = *ex::sync_wait(ex::when_all(ex::just(1), ex::just(std::string{"two"}, 3.0) | ex::then([](std::string s, double d) {
                                                  return s.size() + static_cast<std::size_t>(d);
                                                }),
                                                ex::just(4)));
  CHECK(a == 1);
  CHECK(b == 6);
  CHECK(c == 4);
  auto none = ex::sync_wait(ex::when_all(ex::just(), ex::just()));
  CHECK(none.has_value());
}

TEST_CASE("an error in one child stops the others and when_all completes with that error") {
  std::atomic<int> stops{0};
  try {
    ex::sync_wait(ex::when_all(test::stop_only_sender{&stops}, ex::just_error(peer_lost), test::stop_only_sender{&stops}));
    FAIL("expected an error");
  } catch (const std::system_error& e) {
    CHECK(e.code() == pdcoll::errc::peer_lost);
  }
  CHECK(stops == 2);
}

TEST_CASE("a stopped child stops the others and when_all completes stopped") {
  std::atomic<int> stops{0};
  auto r = ex::sync_wait(ex::when_all(test::stop_only_sender{&stops}, ex::just_stopped(), ex::just(1) | ex::then([](int) noexcept {})));
  CHECK_FALSE(r.has_value());
  CHECK(stops == 1);
}

TEST_CASE("the first error wins over an earlier stop and over later errors") {
  CHECK_THROWS_WITH_AS(ex::sync_wait(ex::when_all(ex::just_stopped(), ex::just_error(peer_lost),
                                                  ex::just_error(std::error_code{pdcoll::errc::timeout}))),
                       doctest::Contains("peer lost"), std::system_error);
}

TEST_CASE("when_all forwards a stop request from its receiver to every child") {
  ex::inplace_stop_source outer;
  std::atomic<int> stops{0};
  std::thread stopper([&] {
    std::this_thread::sleep_for(5ms);
    outer.request_stop();
  });
  auto r = ex::sync_wait(ex::when_all(test::stop_only_sender{&stops}, test::stop_only_sender{&stops}), outer.get_token());
  stopper.join();
  CHECK_FALSE(r.has_value());
  CHECK(stops == 2);
}

TEST_CASE("when_all started after stop was requested completes stopped without starting children") {
  ex::inplace_stop_source outer;
  outer.request_stop();
  test::record rec;
  bool started = false;
  auto op = ex::connect(ex::when_all(ex::just(1) | ex::then([&](int x) noexcept { started = true; return x; }), ex::just(2)),
                        test::recording_receiver{&rec, outer.get_token()});
  ex::start(op);
  CHECK(rec.stopped);
  CHECK(rec.completions == 1);
  CHECK_FALSE(started);
}

TEST_CASE("when_all completes with values when children complete from other threads") {
  test::external_slot a, b;
  test::record rec;
  auto op = ex::connect(ex::when_all(test::external_sender{&a}, test::external_sender{&b}), test::recording_receiver{&rec});
  ex::start(op);
  std::thread ta([&] { a.fire(1); });
  std::thread tb([&] { b.fire(2); });
  ta.join();
  tb.join();
  REQUIRE(test::wait_for([&] { return rec.done.load(); }));
  CHECK(rec.value == 102);
  CHECK(rec.completions == 1);
}

TEST_CASE("with_deadline around when_all times out and stops every child") {
  std::atomic<int> stops{0};
  CHECK_THROWS_WITH_AS(
      ex::sync_wait(ex::when_all(test::stop_only_sender{&stops}, test::stop_only_sender{&stops}) | ex::with_deadline(5ms)),
      doctest::Contains("timeout"), std::system_error);
  CHECK(stops == 2);
}

}  // TEST_SUITE

TEST_SUITE("exec.race") {

TEST_CASE("an outer stop racing when_all's children completing on other threads delivers exactly one completion") {
  int values = 0, stopped = 0;
  for (int i = 0; i < 1000; ++i) {
    ex::inplace_stop_source outer;
    test::external_slot a, b;
    test::record rec;
    {
      auto op = ex::connect(ex::when_all(test::external_sender{&a}, test::external_sender{&b}),
                            test::recording_receiver{&rec, outer.get_token()});
      ex::start(op);
      std::thread ta([&] { a.fire(1); });
      std::thread tb([&] { b.fire(2); });
      outer.request_stop();
      ta.join();
      tb.join();
      REQUIRE(test::wait_for([&] { return rec.done.load(std::memory_order_acquire); }));
    }
    CHECK(rec.completions == 1);
    if (rec.stopped) {
      ++stopped;
    } else {
      CHECK(rec.value == 102);
      ++values;
    }
  }
  CHECK(values + stopped == 1000);
}

TEST_CASE("a child's error racing another child's completion delivers exactly one completion with the error") {
  for (int i = 0; i < 1000; ++i) {
    test::external_slot a;
    test::record rec;
    {
      test::external_slot failing;
      auto failer = test::external_sender{&failing} |
                    ex::let_value([](int&) noexcept { return ex::just_error(std::error_code{pdcoll::errc::peer_lost}); });
      auto op = ex::connect(ex::when_all(test::external_sender{&a}, std::move(failer)) |
                                ex::upon_error([](std::error_code ec) noexcept { return -ec.value(); }),
                            test::recording_receiver{&rec});
      ex::start(op);
      std::thread ta([&] { a.fire(1); });
      failing.fire(0);
      ta.join();
      REQUIRE(test::wait_for([&] { return rec.done.load(std::memory_order_acquire); }));
    }
    CHECK(rec.completions == 1);
    CHECK(rec.value == -static_cast<int>(pdcoll::errc::peer_lost));
  }
}

}  // TEST_SUITE
