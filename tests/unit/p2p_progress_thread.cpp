// A communicator's own progress thread (communicator_options::progress_thread):
// it drives every rank's collectives and messages (the callers' run loops do
// not register it, unless an operation starts on the thread itself), it
// sleeps while nothing is pending, and its idle turns still read a peer's
// abort. And completions that act on their own communicator: one destroys
// it, one waits for another of its operations, one starts more while the
// communicator is driven from two threads.
#include <doctest/doctest.h>

#include <pdcoll/pdcoll.hpp>
#include <support/inproc_world.hpp>

#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace ex = pdcoll::exec;

pdcoll::communicator_options with_progress_thread() {
  pdcoll::communicator_options options;
  options.progress_thread = true;
  options.timeout = 20s;
  return options;
}

/// CPU time (user + system) of the whole process so far, in seconds.
double process_cpu_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

}  // namespace

TEST_CASE("the progress thread drives collectives and messages on every rank, issued one after another and with pauses") {
  for (int P : {1, 2, 3, 5}) {
    CAPTURE(P);
    std::atomic<int> wrong{0};
    pdcoll::testing::run_inproc(
        P,
        [&](pdcoll::communicator& comm) {
          const int r = comm.rank();
          for (int round = 0; round < 40; ++round) {
            // Pauses let the progress thread fall idle between operations, so
            // each start has to wake it.
            if (round % 8 == 0) std::this_thread::sleep_for(5ms);
            const std::size_t count = round % 2 == 0 ? 3 : 5000;
            std::vector<std::int64_t> data(count);
            for (std::size_t i = 0; i < count; ++i) data[i] = r * 1000 + static_cast<std::int64_t>(i) + round;
            ex::sync_wait(pdcoll::all_reduce(comm, std::span<std::int64_t>(data), pdcoll::op::sum));
            for (std::size_t i = 0; i < count; ++i) {
              const std::int64_t expect = 1000 * P * (P - 1) / 2 + P * (static_cast<std::int64_t>(i) + round);
              if (data[i] != expect) ++wrong;
            }
            std::int64_t token = r == 0 ? round : -1;
            ex::sync_wait(pdcoll::broadcast(comm, std::span<std::int64_t>(&token, 1), 0));
            if (token != round) ++wrong;
            if (P > 1) {
              std::int64_t out = r * 10 + round, in = -1;
              const int right = (r + 1) % P, left = (r + P - 1) % P;
              ex::sync_wait(ex::when_all(pdcoll::send(comm, right, std::span<std::int64_t>(&out, 1), 3),
                                         pdcoll::recv(comm, left, std::span<std::int64_t>(&in, 1), 3)));
              if (in != left * 10 + round) ++wrong;
            }
          }
        },
        with_progress_thread());
    CHECK(wrong == 0);
  }
}

TEST_CASE("an idle communicator's progress thread sleeps instead of spinning") {
  auto fabric = pdcoll::transport::inproc::fabric::create(2);
  pdcoll::communicator a{fabric->endpoint_for(0), with_progress_thread()};
  pdcoll::communicator b{fabric->endpoint_for(1), with_progress_thread()};
  std::this_thread::sleep_for(50ms);  // both threads are up and idle
  const double before = process_cpu_seconds();
  const auto start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(500ms);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double cpu = process_cpu_seconds() - before;
  // Two spinning threads would take up to 2·wall (1 s here; 0.99 s with one
  // such thread before the fix); two sleeping ones wake about 500 times a
  // second each, a few milliseconds in all.
  CAPTURE(cpu);
  CAPTURE(wall);
  CHECK(cpu < 0.25 * wall);
}

TEST_CASE("a peer's abort reaches an idle communicator through its progress thread, without any call on it") {
  auto fabric = pdcoll::transport::inproc::fabric::create(2);
  pdcoll::communicator a{fabric->endpoint_for(0), with_progress_thread()};
  pdcoll::communicator b{fabric->endpoint_for(1), with_progress_thread()};
  std::this_thread::sleep_for(20ms);  // b's thread is asleep
  a.abort(make_error_code(pdcoll::errc::peer_lost));
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!b.aborted() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  REQUIRE(b.aborted());
  CHECK(b.abort_reason());
}

TEST_CASE("a receiver on the progress thread may destroy its communicator") {
  auto fabric = pdcoll::transport::inproc::fabric::create(2);
  auto a = std::make_unique<pdcoll::communicator>(fabric->endpoint_for(0), with_progress_thread());
  pdcoll::communicator b{fabric->endpoint_for(1), with_progress_thread()};
  std::atomic<bool> destroyed{false};
  std::vector<float> xa(8, 1.0f), xb(8, 2.0f);
  // Rank 1 joins later, so a's all-reduce completes on a's progress thread.
  std::atomic<bool> failed{false};
  ex::start_detached(pdcoll::all_reduce(*a, std::span<float>(xa)) | ex::then([&]() noexcept {
                       a.reset();
                       destroyed = true;
                     }) |
                     ex::upon_error([&](std::error_code) noexcept { failed = true; }) |
                     ex::upon_stopped([&]() noexcept { failed = true; }));
  std::this_thread::sleep_for(20ms);
  ex::sync_wait(pdcoll::all_reduce(b, std::span<float>(xb)));
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!destroyed && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  CHECK(destroyed);
  CHECK_FALSE(failed);
  CHECK(xb[0] == 3.0f);
}

TEST_CASE("a continuation may wait (sync_wait) for another operation of the same communicator, with or without a progress thread") {
  for (bool thread : {false, true}) {
    CAPTURE(thread);
    pdcoll::communicator_options options = with_progress_thread();
    options.progress_thread = thread;
    options.timeout = 5s;
    auto fabric = pdcoll::transport::inproc::fabric::create(2);
    pdcoll::communicator c0{fabric->endpoint_for(0), options};
    pdcoll::communicator c1{fabric->endpoint_for(1), options};
    std::vector<int> x0(4, 1), y0(4, 10), x1(4, 2), y1(4, 20);
    auto rank1 = std::async(std::launch::async, [&] {
      ex::sync_wait(pdcoll::all_reduce(c1, std::span<int>(x1)));
      ex::sync_wait(pdcoll::all_reduce(c1, std::span<int>(y1)));
    });
    auto rank0 = std::async(std::launch::async, [&] {
      // The second all-reduce is waited for inside the first's continuation:
      // on the thread that drives c0 (the caller's, or c0's progress thread).
      ex::sync_wait(pdcoll::all_reduce(c0, std::span<int>(x0)) |
                    ex::then([&] { ex::sync_wait(pdcoll::all_reduce(c0, std::span<int>(y0))); }));
    });
    if (rank0.wait_for(30s) != std::future_status::ready || rank1.wait_for(30s) != std::future_status::ready) {
      // A hang cannot be unwound: report it and end the process.
      std::fprintf(stderr, "FAILED: the nested sync_wait hung past its deadline (progress thread %d)\n", thread);
      std::fflush(stderr);
      std::_Exit(1);
    }
    rank0.get();
    rank1.get();
    CHECK(x0[0] == 3);
    CHECK(y0[0] == 30);
    CHECK(x1[0] == 3);
    CHECK(y1[0] == 30);
  }
}

TEST_CASE("a communicator driven by its progress thread and a caller's run loop at once never deadlocks on leaving the registry") {
  // recv1's receiver runs on a's progress thread and starts recv2 there,
  // which registers a; a caller's sync_wait then drives a through the
  // registry and runs recv3's receiver, which takes a's lock while the
  // progress thread, finding a idle, leaves the registry under that lock.
  // Leaving must not wait for the caller's call to end.
  pdcoll::communicator_options options = with_progress_thread();
  options.timeout = 5s;
  auto fabric = pdcoll::transport::inproc::fabric::create(2);
  pdcoll::communicator a{fabric->endpoint_for(0), options};
  pdcoll::communicator b{fabric->endpoint_for(1), options};
  int in1 = 0, in2 = 0, in3 = 0, out1 = 1, out2 = 2, out3 = 3;
  std::atomic<int> failures{0};
  auto failed = [&](auto&&...) noexcept { ++failures; };
  auto stopped = [&]() noexcept { ++failures; };
  ex::start_detached(pdcoll::recv(a, 1, std::span<int>(&in1, 1), 1) | ex::then([&](std::size_t) noexcept {
                       ex::start_detached(pdcoll::recv(a, 1, std::span<int>(&in2, 1), 2) |
                                          ex::then([](std::size_t) noexcept {}) | ex::upon_error(failed) |
                                          ex::upon_stopped(stopped));
                       std::this_thread::sleep_for(300ms);
                     }) |
                     ex::upon_error(failed) | ex::upon_stopped(stopped));
  auto send = [&](int& value, std::uint32_t tag) {
    ex::start_detached(pdcoll::send(b, 0, std::span<int>(&value, 1), tag) | ex::upon_error(failed) |
                       ex::upon_stopped(stopped));
  };
  send(out1, 1);
  std::this_thread::sleep_for(50ms);
  send(out2, 2);
  send(out3, 3);
  auto caller = std::async(std::launch::async, [&] {
    ex::sync_wait(pdcoll::recv(a, 1, std::span<int>(&in3, 1), 3) | ex::then([&](std::size_t) {
                    std::this_thread::sleep_for(600ms);
                    (void)a.pending_operations();  // takes a's lock
                  }));
  });
  if (caller.wait_for(20s) != std::future_status::ready) {
    std::fprintf(stderr, "FAILED: the caller and the progress thread deadlocked\n");
    std::fflush(stderr);
    std::_Exit(1);
  }
  caller.get();
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (in2 == 0 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  CHECK(in1 == 1);
  CHECK(in2 == 2);
  CHECK(in3 == 3);
  CHECK(failures == 0);
}
