// Unit tests: just / then / upon_* / let_* / sync_wait / start_detached /
// run_loop on all three channels, and the completion signatures they claim.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>

#include "pdcoll/error.hpp"
#include "pdcoll/exec/exec.hpp"
#include "unit/exec_support.hpp"

namespace ex = pdcoll::exec;
using namespace std::chrono_literals;
using ex::completion_signatures;
using ex::completion_signatures_of_t;
using ex::set_error_t;
using ex::set_stopped_t;
using ex::set_value_t;

namespace {

const std::error_code timeout_code = pdcoll::errc::timeout;

template <class S, class Sigs, class Env = ex::empty_env>
constexpr bool claims = ex::sender_in<S, Env> && std::is_same_v<completion_signatures_of_t<S, Env>, Sigs> &&
                        std::is_same_v<typename std::remove_cvref_t<S>::completion_signatures,
                                       completion_signatures_of_t<S, ex::empty_env>>;

auto plus_one = [](int x) { return x + 1; };
[[maybe_unused]] auto plus_one_noexcept = [](int x) noexcept { return x + 1; };

// ---- static checks: each sender claims exactly its completions -----------------
using just_int = decltype(ex::just(1));
static_assert(claims<just_int, completion_signatures<set_value_t(int)>>);
static_assert(claims<decltype(ex::just()), completion_signatures<set_value_t()>>);
static_assert(claims<decltype(ex::just(1, std::string{})), completion_signatures<set_value_t(int, std::string)>>);
static_assert(claims<decltype(ex::just_error(timeout_code)), completion_signatures<set_error_t(std::error_code)>>);
static_assert(claims<decltype(ex::just_stopped()), completion_signatures<set_stopped_t()>>);
static_assert(claims<decltype(ex::just(1) | ex::then(plus_one)),
                     completion_signatures<set_value_t(int), set_error_t(std::exception_ptr)>>);
static_assert(claims<decltype(ex::just(1) | ex::then(plus_one_noexcept)), completion_signatures<set_value_t(int)>>);
static_assert(claims<decltype(ex::just(1) | ex::then([](int) noexcept {})), completion_signatures<set_value_t()>>);
static_assert(claims<decltype(ex::just_error(timeout_code) | ex::then(plus_one_noexcept)),
                     completion_signatures<set_error_t(std::error_code)>>);
static_assert(claims<decltype(ex::just_error(timeout_code) |
                              ex::upon_error([](std::error_code ec) noexcept { return ec.value(); })),
                     completion_signatures<set_value_t(int)>>);
static_assert(claims<decltype(ex::just_stopped() | ex::upon_stopped([]() noexcept { return 7; })),
                     completion_signatures<set_value_t(int)>>);
// f can only run for a stopped child, so a child that never stops adds no exception_ptr.
static_assert(claims<decltype(ex::just(1) | ex::upon_stopped([] { return 7; })),
                     completion_signatures<set_value_t(int)>>);
static_assert(claims<decltype(ex::just(2) | ex::let_value([](int& n) noexcept { return ex::just(n * 2.0); })),
                     completion_signatures<set_value_t(double)>>);
static_assert(claims<decltype(ex::just(2) | ex::let_value([](int&) { return ex::just_stopped(); })),
                     completion_signatures<set_stopped_t(), set_error_t(std::exception_ptr)>>);
static_assert(claims<decltype(ex::just_error(timeout_code) |
                              ex::let_error([](std::error_code&) noexcept { return ex::just(5); })),
                     completion_signatures<set_value_t(int)>>);
static_assert(claims<decltype(ex::when_all(ex::just(1), ex::just(2.0))),
                     completion_signatures<set_value_t(int, double), set_stopped_t()>>);
static_assert(claims<decltype(ex::when_all(ex::just(1), ex::just_error(timeout_code))),
                     completion_signatures<set_error_t(std::error_code), set_stopped_t()>>);
// Moving a string cannot throw, so no exception_ptr for storing it.
static_assert(claims<decltype(ex::when_all(ex::just(std::string{}))),
                     completion_signatures<set_value_t(std::string), set_stopped_t()>>);
static_assert(claims<decltype(ex::just(1) | ex::with_deadline(1s)),
                     completion_signatures<set_value_t(int), set_error_t(std::error_code)>>);
static_assert(claims<decltype(ex::just_stopped() | ex::with_deadline(1s)),
                     completion_signatures<set_stopped_t(), set_error_t(std::error_code)>>);
static_assert(claims<ex::run_loop::schedule_sender, completion_signatures<set_value_t(), set_stopped_t()>>);
static_assert(ex::scheduler<ex::run_loop::scheduler>);
static_assert(std::is_same_v<ex::sync_wait_result_t<decltype(ex::when_all(ex::just(1), ex::just(2.0)))>,
                             std::optional<std::tuple<int, double>>>);

// Completes with whether its receiver's environment names a run_loop scheduler.
struct scheduler_probe {
  using sender_concept = ex::sender_t;
  using completion_signatures = ex::completion_signatures<set_value_t(bool)>;
  template <class R>
  struct op {
    R rcvr;
    void start() noexcept {
      auto sch = ex::get_scheduler(ex::get_env(rcvr));
      ex::set_value(std::move(rcvr), std::is_same_v<decltype(sch), ex::run_loop::scheduler>);
    }
  };
  template <class R>
  op<R> connect(R r) const {
    return {std::move(r)};
  }
};

/// Completes with the id of the thread that completed it: inside start() on
/// the caller's thread, inside start() from a thread that start() waits for,
/// or from work scheduled on the receiver's loop (inside sync_wait's run()).
enum class completer { inline_call, other_thread_in_start, own_loop };

struct completing_sender {
  using sender_concept = ex::sender_t;
  using completion_signatures = ex::completion_signatures<set_value_t(std::thread::id)>;
  completer how;
  template <class R>
  struct op {
    R rcvr;
    completer how;
    struct on_loop {  // a receiver for the schedule sender
      using receiver_concept = ex::receiver_t;
      op* self;
      void set_value() noexcept { ex::set_value(std::move(self->rcvr), std::this_thread::get_id()); }
      void set_stopped() noexcept {}
      ex::empty_env get_env() const noexcept { return {}; }
    };
    using schedule_op = decltype(ex::connect(std::declval<ex::run_loop::schedule_sender>(), std::declval<on_loop>()));
    std::optional<schedule_op> scheduled;
    void start() noexcept {
      switch (how) {
        case completer::inline_call: ex::set_value(std::move(rcvr), std::this_thread::get_id()); break;
        case completer::other_thread_in_start:
          std::thread([this] { ex::set_value(std::move(rcvr), std::this_thread::get_id()); }).join();
          break;
        case completer::own_loop: {
          // The operation cannot move: build it in place through a conversion.
          struct connect_in_place {
            op* self;
            operator schedule_op() const {
              return ex::connect(ex::get_scheduler(ex::get_env(self->rcvr)).schedule(), on_loop{self});
            }
          };
          scheduled.emplace(connect_in_place{this});
          ex::start(*scheduled);
          break;
        }
      }
    }
  };
  template <class R>
  op<R> connect(R r) const {
    return {std::move(r), how, {}};
  }
};

/// Starts detached work on the receiver's scheduler, then completes inline:
/// the work is queued on sync_wait's loop although the loop is never needed
/// for the completion itself.
struct queueing_then_inline_sender {
  using sender_concept = ex::sender_t;
  using completion_signatures = ex::completion_signatures<set_value_t()>;
  std::atomic<int>* ran;
  template <class R>
  struct op {
    R rcvr;
    std::atomic<int>* ran;
    void start() noexcept {
      ex::start_detached(ex::get_scheduler(ex::get_env(rcvr)).schedule() |
                         ex::then([ran = ran]() noexcept { ran->fetch_add(1); }));
      ex::set_value(std::move(rcvr));
    }
  };
  template <class R>
  op<R> connect(R r) const {
    return {std::move(r), ran};
  }
};

}  // namespace

TEST_SUITE("exec.basic") {

// sync_wait skips its loop when the sender completed on its own thread
// inside start(); the other ways must still end the loop.
TEST_CASE("sync_wait returns however and wherever its sender completes") {
  const auto me = std::this_thread::get_id();
  for (auto how : {completer::inline_call, completer::other_thread_in_start, completer::own_loop}) {
    CAPTURE(static_cast<int>(how));
    // On a thread of its own, so that a loop nobody ends fails the check
    // below instead of hanging (the state is shared: a stuck thread is left behind).
    struct outcome {
      std::atomic<bool> returned{false};
      std::thread::id waiter, by;
    };
    auto out = std::make_shared<outcome>();
    std::thread waiter([out, how] {
      out->waiter = std::this_thread::get_id();
      out->by = std::get<0>(*ex::sync_wait(completing_sender{how}));
      out->returned.store(true, std::memory_order_release);
    });
    const bool in_time = ex::test::wait_for([&] { return out->returned.load(std::memory_order_acquire); }, 5000ms);
    if (!in_time) waiter.detach();
    REQUIRE(in_time);
    waiter.join();
    if (how == completer::other_thread_in_start) CHECK(out->by != out->waiter);
    else CHECK(out->by == out->waiter);
    CHECK(out->by != me);
  }
  // Twice in a row on one thread: the inline path leaves nothing behind.
  CHECK(std::get<0>(*ex::sync_wait(completing_sender{completer::inline_call})) == me);
  CHECK(std::get<0>(*ex::sync_wait(completing_sender{completer::own_loop})) == me);
  CHECK_THROWS_AS(ex::sync_wait(ex::just_error(timeout_code)), std::system_error);
}

// A sender that completed inside start() may have queued work on the loop
// on the way; sync_wait runs it before returning (as stdexec's does) rather
// than dropping it with the loop.
TEST_CASE("sync_wait runs work queued on its loop by a sender that completed inline") {
  std::atomic<int> ran{0};
  ex::sync_wait(queueing_then_inline_sender{&ran});
  CHECK(ran.load() == 1);
  ex::sync_wait(queueing_then_inline_sender{&ran} | ex::then([] {}));
  CHECK(ran.load() == 2);
}

TEST_CASE("just completes with its values, just_error throws from sync_wait, just_stopped gives nothing") {
  auto [a, b] = ex::sync_wait(ex::just(1, std::string{"x"})).value();
  CHECK(a == 1);
  CHECK(b == "x");
  try {
    ex::sync_wait(ex::just_error(timeout_code));
    FAIL("sync_wait should have thrown");
  } catch (const std::system_error& e) {
    CHECK(e.code() == pdcoll::errc::timeout);
  }
  CHECK_THROWS_AS(ex::sync_wait(ex::just_error(std::make_exception_ptr(std::runtime_error("boom")))),
                  std::runtime_error);
  CHECK_FALSE(ex::sync_wait(ex::just_stopped()).has_value());
}

TEST_CASE("a just sender connected as an lvalue can be started twice") {
  const auto s = ex::just(41) | ex::then(plus_one);
  CHECK(std::get<0>(*ex::sync_wait(s)) == 42);
  CHECK(std::get<0>(*ex::sync_wait(s)) == 42);
}

TEST_CASE("then transforms values and passes errors and stopped through") {
  auto [v] = *ex::sync_wait(ex::just(20) | ex::then([](int x) { return x + 22; }) | ex::then(plus_one));
  CHECK(v == 43);
  CHECK_THROWS_AS(ex::sync_wait(ex::just_error(timeout_code) | ex::then(plus_one)), std::system_error);
  CHECK_FALSE(ex::sync_wait(ex::just_stopped() | ex::then([] { return 1; })).has_value());
}

TEST_CASE("then completes with exception_ptr when the function throws") {
  auto throwing = ex::just(1) | ex::then([](int) -> int { throw std::out_of_range("f threw"); });
  CHECK_THROWS_AS(ex::sync_wait(std::move(throwing)), std::out_of_range);
}

TEST_CASE("then with a void function completes with no value") {
  int seen = 0;
  auto r = ex::sync_wait(ex::just(5) | ex::then([&](int x) { seen = x; }));
  CHECK(r.has_value());
  CHECK(seen == 5);
}

TEST_CASE("upon_error turns an error into a value and leaves values and stopped alone") {
  auto [code] = *ex::sync_wait(ex::just_error(timeout_code) | ex::upon_error([](std::error_code ec) { return ec.value(); }));
  CHECK(code == static_cast<int>(pdcoll::errc::timeout));
  auto [v] = *ex::sync_wait(ex::just(3) | ex::upon_error([](std::exception_ptr) { return 0; }));
  CHECK(v == 3);
  CHECK_FALSE(ex::sync_wait(ex::just_stopped() | ex::upon_error([](int) { return 0; })).has_value());
  CHECK_THROWS_AS(ex::sync_wait(ex::just_error(1) | ex::upon_error([](int) -> int { throw std::logic_error("x"); })),
                  std::logic_error);
}

TEST_CASE("upon_stopped turns stopped into a value and leaves values and errors alone") {
  auto [v] = *ex::sync_wait(ex::just_stopped() | ex::upon_stopped([] { return 9; }));
  CHECK(v == 9);
  auto [w] = *ex::sync_wait(ex::just(4) | ex::upon_stopped([] { return 9; }));
  CHECK(w == 4);
  CHECK_THROWS_AS(ex::sync_wait(ex::just_error(timeout_code) | ex::upon_stopped([] { return 9; })), std::system_error);
}

TEST_CASE("let_value runs the sender its function returns, on all three channels") {
  auto [v] = *ex::sync_wait(ex::just(4) | ex::let_value([](int& n) { return ex::just(n * 2); }));
  CHECK(v == 8);
  CHECK_THROWS_AS(ex::sync_wait(ex::just(4) | ex::let_value([](int&) { return ex::just_error(timeout_code); })),
                  std::system_error);
  CHECK_FALSE(ex::sync_wait(ex::just(4) | ex::let_value([](int&) { return ex::just_stopped(); })).has_value());
  // The child's own errors and stops pass through without calling f.
  bool called = false;
  auto f = [&](int&) { called = true; return ex::just(0); };
  CHECK_THROWS_AS(ex::sync_wait(ex::just_error(timeout_code) | ex::then(plus_one) | ex::let_value(f)), std::system_error);
  CHECK_FALSE(ex::sync_wait(ex::just_stopped() | ex::then(plus_one) | ex::let_value(f)).has_value());
  CHECK_FALSE(called);
}

TEST_CASE("let_value keeps the stored values alive until the inner sender completes") {
  auto [len] = *ex::sync_wait(ex::just(std::string(100, 'x')) | ex::let_value([](std::string& s) {
                                return ex::just(&s) | ex::then([](std::string* p) { return p->size(); });
                              }));
  CHECK(len == 100);
}

TEST_CASE("let_value completes with exception_ptr when its function throws") {
  auto s = ex::just(1) | ex::let_value([](int&) -> decltype(ex::just(0)) { throw std::runtime_error("no sender"); });
  CHECK_THROWS_AS(ex::sync_wait(std::move(s)), std::runtime_error);
}

TEST_CASE("let_error recovers from an error with another sender") {
  auto [v] = *ex::sync_wait(ex::just_error(timeout_code) | ex::let_error([](std::error_code& ec) {
                              return ex::just(ec == pdcoll::errc::timeout ? 1 : 2);
                            }));
  CHECK(v == 1);
  auto [w] = *ex::sync_wait(ex::just(3) | ex::let_error([](std::error_code&) { return ex::just(0); }));
  CHECK(w == 3);
  CHECK_FALSE(ex::sync_wait(ex::just_stopped() | ex::let_error([](int&) { return ex::just(); })).has_value());
}

TEST_CASE("start_detached runs the sender and frees its operation when it completes") {
  std::atomic<int> ran{0};
  ex::start_detached(ex::just(2) | ex::then([&](int x) noexcept { ran += x; }));
  ex::start_detached(ex::just_stopped() | ex::upon_stopped([&]() noexcept { ran += 10; }));
  CHECK(ran == 12);  // just completes inline; leaks would show under ASan
}

TEST_CASE("start_detached on a run_loop scheduler completes when the loop runs") {
  ex::run_loop loop;
  int ran = 0;
  ex::start_detached(ex::schedule(loop.get_scheduler()) | ex::then([&]() noexcept { ++ran; }));
  CHECK(ran == 0);
  loop.finish();
  loop.run();
  CHECK(ran == 1);
}

TEST_CASE("run_loop runs work scheduled from another thread on the thread that calls run") {
  ex::run_loop loop;
  std::thread::id ran_on;
  std::atomic<bool> done{false};
  auto work = ex::schedule(loop.get_scheduler()) | ex::then([&]() noexcept {
                ran_on = std::this_thread::get_id();
                loop.finish();
              });
  ex::test::record rec;
  auto op = ex::connect(std::move(work), ex::test::recording_receiver{&rec});
  std::thread pusher([&] {
    ex::start(op);
    done = true;
  });
  loop.run();
  pusher.join();
  CHECK(done);
  CHECK(ran_on == std::this_thread::get_id());
  CHECK(rec.completions == 1);
}

TEST_CASE("a schedule sender completes with stopped when its receiver's token was triggered") {
  ex::run_loop loop;
  ex::inplace_stop_source source;
  source.request_stop();
  ex::test::record rec;
  auto op = ex::connect(ex::schedule(loop.get_scheduler()), ex::test::recording_receiver{&rec, source.get_token()});
  ex::start(op);
  loop.finish();
  loop.run();
  CHECK(rec.stopped);
  CHECK(rec.completions == 1);
}

TEST_CASE("sync_wait gives its sender the run_loop's scheduler in the environment") {
  auto [is_loop] = *ex::sync_wait(scheduler_probe{});
  CHECK(is_loop);
}

}  // TEST_SUITE
