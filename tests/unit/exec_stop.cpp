// Unit tests: inplace_stop_source / token / callback semantics, with_deadline,
// stop propagation through let_value and sync_wait, and stop-vs-completion
// races (TEST_SUITE "exec.race": run alone with `test_exec -ts=exec.race`,
// e.g. under -fsanitize=thread).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <system_error>
#include <thread>

#include "pdcoll/detail/deadline.hpp"
#include "pdcoll/error.hpp"
#include "pdcoll/exec/exec.hpp"
#include "unit/exec_support.hpp"

namespace ex = pdcoll::exec;
namespace test = pdcoll::exec::test;
using namespace std::chrono_literals;

TEST_SUITE("exec.stop") {

TEST_CASE("a stop callback runs once when stop is requested, and request_stop reports the first request") {
  ex::inplace_stop_source source;
  auto token = source.get_token();
  CHECK(token.stop_possible());
  CHECK_FALSE(token.stop_requested());
  int runs = 0;
  ex::inplace_stop_callback cb{token, [&]() noexcept { ++runs; }};
  CHECK(runs == 0);
  CHECK(source.request_stop());
  CHECK_FALSE(source.request_stop());
  CHECK(runs == 1);
  CHECK(token.stop_requested());
}

TEST_CASE("a stop callback registered after stop was requested runs in its constructor") {
  ex::inplace_stop_source source;
  source.request_stop();
  int runs = 0;
  ex::inplace_stop_callback cb{source.get_token(), [&]() noexcept { ++runs; }};
  CHECK(runs == 1);
}

TEST_CASE("a destroyed stop callback never runs and a default token is unstoppable") {
  ex::inplace_stop_source source;
  int runs = 0;
  {
    ex::inplace_stop_callback cb{source.get_token(), [&]() noexcept { ++runs; }};
  }
  source.request_stop();
  CHECK(runs == 0);
  ex::inplace_stop_token none;
  CHECK_FALSE(none.stop_possible());
  ex::inplace_stop_callback cb{none, [&]() noexcept { ++runs; }};
  CHECK(runs == 0);
}

TEST_CASE("a stop callback that destroys itself during its own run does not deadlock") {
  ex::inplace_stop_source source;
  struct self_destroying {
    std::optional<ex::inplace_stop_callback<std::function<void()>>>* slot;
  };
  std::optional<ex::inplace_stop_callback<std::function<void()>>> cb;
  int after = 0;
  cb.emplace(source.get_token(), std::function<void()>([&] { cb.reset(); }));
  ex::inplace_stop_callback other{source.get_token(), [&]() noexcept { ++after; }};
  source.request_stop();
  CHECK_FALSE(cb.has_value());
  CHECK(after == 1);
}

TEST_CASE("destroying a stop callback while another thread runs it waits for the run to finish") {
  ex::inplace_stop_source source;
  std::atomic<bool> entered{false};
  std::atomic<bool> finished{false};
  auto* cb = new ex::inplace_stop_callback{source.get_token(), [&]() noexcept {
                                             entered = true;
                                             std::this_thread::sleep_for(30ms);
                                             finished = true;
                                           }};
  std::thread requester([&] { source.request_stop(); });
  REQUIRE(test::wait_for([&] { return entered.load(); }));
  delete cb;
  CHECK(finished);  // the destructor returned only after the callback did
  requester.join();
}

TEST_CASE("with_deadline completes with errc::timeout when the deadline stops the child") {
  std::atomic<int> stops{0};
  const auto started = std::chrono::steady_clock::now();
  try {
    ex::sync_wait(test::stop_only_sender{&stops} | ex::with_deadline(20ms));
    FAIL("expected a timeout");
  } catch (const std::system_error& e) {
    CHECK(e.code() == pdcoll::errc::timeout);
    CHECK(e.code().category() == pdcoll::error_category());
  }
  CHECK(std::chrono::steady_clock::now() - started >= 20ms);
  CHECK(stops == 1);
}

TEST_CASE("with_deadline runs with a receiver that takes exactly its declared completions") {
  // just(42) | with_deadline declares no set_stopped, so a receiver without
  // one must connect and run (the stored result had kept a stopped slot whose
  // visit called set_stopped on it, and did not compile).
  struct exact_receiver {
    using receiver_concept = ex::receiver_t;
    int* value;
    std::error_code* error;
    void set_value(int v) noexcept { *value = v; }
    void set_error(std::error_code e) noexcept { *error = e; }
  };
  int value = 0;
  std::error_code error;
  auto op = ex::connect(ex::just(42) | ex::with_deadline(10s), exact_receiver{&value, &error});
  ex::start(op);
  CHECK(value == 42);
  CHECK_FALSE(error);
}

TEST_CASE("with_deadline passes the child's own completion through when it beats the deadline") {
  auto [v] = *ex::sync_wait(ex::just(3) | ex::with_deadline(10s));
  CHECK(v == 3);
  CHECK_THROWS_AS(ex::sync_wait(ex::just_error(std::make_error_code(std::errc::io_error)) | ex::with_deadline(10s)),
                  std::system_error);
  CHECK_FALSE(ex::sync_wait(ex::just_stopped() | ex::with_deadline(10s)).has_value());
}

TEST_CASE("with_deadline saturates a timeout past the clock's range: duration::max() never fires") {
  CHECK(ex::with_deadline_t::ticks(std::chrono::hours::max()) == std::chrono::steady_clock::duration::max());
  CHECK(ex::with_deadline_t::ticks(std::chrono::hours::min()) == std::chrono::steady_clock::duration::min());
  CHECK(ex::with_deadline_t::ticks(std::chrono::seconds(3)) == std::chrono::seconds(3));
  for (auto timeout : {std::chrono::steady_clock::duration::max(),
                       ex::with_deadline_t::ticks(std::chrono::hours::max())}) {
    test::external_slot slot;
    std::thread completer([&] {
      // Bounded: a deadline wrapped to the past stops the child at once, and
      // its slot may never be seen filled.
      for (int i = 0; i < 1000 && slot.op.load() == nullptr; ++i) std::this_thread::sleep_for(1ms);
      std::this_thread::sleep_for(20ms);  // such a deadline has fired by now
      (void)slot.fire(7);
    });
    std::optional<std::tuple<int>> r;
    CHECK_NOTHROW(r = ex::sync_wait(test::external_sender{&slot} | ex::with_deadline(timeout)));
    completer.join();
    REQUIRE(r.has_value());
    CHECK(std::get<0>(*r) == 7);
  }
  auto [v] = *ex::sync_wait(ex::just(5) | ex::with_deadline(std::chrono::hours::max()));
  CHECK(v == 5);
}

TEST_CASE("deadline_after saturates at the clock's ends and twice at the duration's") {
  using clock = std::chrono::steady_clock;
  using pdcoll::detail::deadline_after;
  const auto now = clock::now();
  CHECK(deadline_after(now, std::chrono::milliseconds::max()) == clock::time_point::max());
  CHECK(deadline_after(now, std::chrono::hours::max()) == clock::time_point::max());
  CHECK(deadline_after(now, clock::duration::max()) == clock::time_point::max());
  CHECK(deadline_after(now, std::chrono::milliseconds::min()) == clock::time_point::min());
  CHECK(deadline_after(now, 1500ms) == now + 1500ms);
  CHECK(deadline_after(now, -2s) == now - 2s);
  CHECK(deadline_after(clock::time_point::max() - 10s, 5s) == clock::time_point::max() - 5s);
  CHECK(deadline_after(clock::time_point::max() - 10s, 9500ms) == clock::time_point::max());  // within a second of the end
  CHECK(deadline_after(clock::time_point{} + 100s, 5s) == clock::time_point{} + 105s);
  static_assert(pdcoll::detail::twice(std::chrono::milliseconds::max()) == std::chrono::milliseconds::max());
  static_assert(pdcoll::detail::twice(std::chrono::milliseconds::min()) == std::chrono::milliseconds::min());
  static_assert(pdcoll::detail::twice(std::chrono::milliseconds(30)) == std::chrono::milliseconds(60));
}

TEST_CASE("with_deadline forwards the receiver's stop request and reports stopped, not timeout") {
  ex::inplace_stop_source outer;
  std::atomic<int> stops{0};
  std::thread stopper([&] {
    std::this_thread::sleep_for(5ms);
    outer.request_stop();
  });
  auto r = ex::sync_wait(test::stop_only_sender{&stops} | ex::with_deadline(10s), outer.get_token());
  stopper.join();
  CHECK_FALSE(r.has_value());
  CHECK(stops == 1);
}

TEST_CASE("with_deadline reports a receiver's stop as stopped even when the child ends after the deadline") {
  test::external_slot slot;
  slot.stop_late = true;
  ex::inplace_stop_source outer;
  std::thread user([&] {
    while (slot.op.load() == nullptr) std::this_thread::yield();
    outer.request_stop();  // the receiver's stop, forwarded to the child first
    while (!slot.stop_seen.load()) std::this_thread::yield();
    std::this_thread::sleep_for(60ms);  // the 20 ms deadline passes while the child winds down
    slot.end_stopped();
  });
  std::optional<std::tuple<int>> r;
  CHECK_NOTHROW(r = ex::sync_wait(test::external_sender{&slot} | ex::with_deadline(20ms), outer.get_token()));
  user.join();
  CHECK_FALSE(r.has_value());
}

TEST_CASE("let_value gives the inner sender the receiver's stop token") {
  ex::inplace_stop_source outer;
  std::atomic<int> stops{0};
  std::thread stopper([&] {
    std::this_thread::sleep_for(5ms);
    outer.request_stop();
  });
  auto r = ex::sync_wait(ex::just(1) | ex::let_value([&](int&) { return test::stop_only_sender{&stops}; }),
                         outer.get_token());
  stopper.join();
  CHECK_FALSE(r.has_value());
  CHECK(stops == 1);
}

TEST_CASE("with_deadline inside let_value times out the inner sender") {
  std::atomic<int> stops{0};
  auto s = ex::just() | ex::let_value([&] { return test::stop_only_sender{&stops} | ex::with_deadline(5ms); }) |
           ex::upon_error([](auto error) {
             if constexpr (std::is_same_v<decltype(error), std::error_code>) {
               return error == pdcoll::errc::timeout;
             } else {
               return false;
             }
           });
  auto [timed_out] = *ex::sync_wait(std::move(s));
  CHECK(timed_out);
}

}  // TEST_SUITE

TEST_SUITE("exec.race") {

TEST_CASE("a stop request racing a callback's destruction either runs it fully or never") {
  for (int i = 0; i < 2000; ++i) {
    ex::inplace_stop_source source;
    std::atomic<int> state{0};  // 1: running, 2: finished
    auto* cb = new ex::inplace_stop_callback{source.get_token(), [&]() noexcept {
                                               state = 1;
                                               state = 2;
                                             }};
    std::thread requester([&] { source.request_stop(); });
    delete cb;
    const int seen = state.load();
    CHECK_MESSAGE(seen != 1, "callback was running after its destructor returned");
    requester.join();
  }
}

TEST_CASE("a stop request racing a completion from another thread delivers exactly one completion") {
  int values = 0, stopped = 0;
  for (int i = 0; i < 2000; ++i) {
    ex::inplace_stop_source source;
    test::external_slot slot;
    test::record rec;
    auto op = ex::connect(test::external_sender{&slot}, test::recording_receiver{&rec, source.get_token()});
    ex::start(op);
    std::thread completer([&] { slot.fire(7); });
    source.request_stop();
    completer.join();
    REQUIRE(test::wait_for([&] { return rec.done.load(std::memory_order_acquire); }));
    CHECK(rec.completions == 1);
    (rec.stopped ? stopped : values) += 1;
  }
  CHECK(values + stopped == 2000);
}

TEST_CASE("a deadline racing the child's completion delivers exactly one completion") {
  int values = 0, timeouts = 0;
  for (int i = 0; i < 500; ++i) {
    test::external_slot slot;
    test::record rec;
    {
      auto op = ex::connect(test::external_sender{&slot} | ex::with_deadline(std::chrono::microseconds(i % 50)),
                            test::recording_receiver{&rec});
      ex::start(op);
      std::thread completer([&] { slot.fire(7); });
      REQUIRE(test::wait_for([&] { return rec.done.load(std::memory_order_acquire); }));
      completer.join();
    }
    CHECK(rec.completions == 1);
    if (rec.error) {
      CHECK(rec.error == pdcoll::errc::timeout);
      ++timeouts;
    } else {
      CHECK(rec.value == 7);
      ++values;
    }
  }
  CHECK(values + timeouts == 500);
}

}  // TEST_SUITE
