// Point-to-point senders and concurrent / mismatched collectives over the
// inproc transport (one thread per rank). Each rank records what it saw;
// assertions run on the test's own thread after the ranks have joined.
#include <doctest/doctest.h>

#include <pdcoll/pdcoll.hpp>
#include <support/inproc_world.hpp>
#include <support/reference.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <mutex>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace ex = pdcoll::exec;
using pdcoll::errc;

/// Runs `sndr` to completion and returns the error it failed with (empty on success).
template <class S>
std::error_code error_of(S&& sndr) {
  try {
    ex::sync_wait(std::forward<S>(sndr));
  } catch (const std::system_error& e) {
    return e.code();
  }
  return {};
}

pdcoll::communicator_options with_timeout(std::chrono::milliseconds t) {
  pdcoll::communicator_options o;
  o.timeout = t;
  return o;
}

/// What a counting receiver saw: every completion counts, so "exactly one" is checkable.
struct tally {
  std::atomic<int> completions{0};
  std::atomic<int> values{0};
  std::atomic<int> errors{0};
  std::atomic<int> stops{0};
  std::size_t bytes = 0;
  std::error_code error;
};

struct counting_receiver {
  using receiver_concept = ex::receiver_t;
  tally* t;
  ex::inplace_stop_token token;

  void set_value(std::size_t bytes) noexcept {
    t->bytes = bytes;
    t->values.fetch_add(1);
    t->completions.fetch_add(1);
  }
  void set_value() noexcept {
    t->values.fetch_add(1);
    t->completions.fetch_add(1);
  }
  void set_error(std::error_code ec) noexcept {
    t->error = ec;
    t->errors.fetch_add(1);
    t->completions.fetch_add(1);
  }
  void set_stopped() noexcept {
    t->stops.fetch_add(1);
    t->completions.fetch_add(1);
  }
  struct env {
    ex::inplace_stop_token token;
    ex::inplace_stop_token query(ex::get_stop_token_t) const noexcept { return token; }
  };
  env get_env() const noexcept { return {token}; }
};

/// Drives progress on this thread until pred() or `limit` passes; returns pred().
template <class Pred>
bool drive_until(Pred pred, std::chrono::milliseconds limit = 5000ms) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return pred();
    ex::drive_progress_once(std::chrono::steady_clock::now() + 1ms);
  }
  return true;
}

}  // namespace

TEST_CASE("send and recv move a buffer between two ranks and report the bytes received") {
  std::vector<float> got(1000, -1.0f);
  std::size_t bytes = 0;
  pdcoll::testing::run_inproc(2, [&](pdcoll::communicator& comm) {
    if (comm.rank() == 0) {
      std::vector<float> data(1000);
      std::iota(data.begin(), data.end(), 0.5f);
      ex::sync_wait(pdcoll::send(comm, 1, std::span<const float>(data)));
    } else {
      auto r = ex::sync_wait(pdcoll::recv(comm, 0, got));
      bytes = std::get<0>(r.value());
    }
  });
  CHECK(bytes == 1000 * sizeof(float));
  for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == static_cast<float>(i) + 0.5f);
}

TEST_CASE("a receive larger than the message reports the shorter length, and zero-byte messages arrive") {
  std::size_t short_bytes = 0, empty_bytes = 1;
  pdcoll::testing::run_inproc(2, [&](pdcoll::communicator& comm) {
    std::vector<int> buf(64, 7);
    if (comm.rank() == 0) {
      ex::sync_wait(pdcoll::send(comm, 1, std::span<int>(buf).first(10), 1));
      ex::sync_wait(pdcoll::send(comm, 1, std::span<int>(), 2));
    } else {
      short_bytes = std::get<0>(ex::sync_wait(pdcoll::recv(comm, 0, buf, 1)).value());
      empty_bytes = std::get<0>(ex::sync_wait(pdcoll::recv(comm, 0, buf, 2)).value());
    }
  });
  CHECK(short_bytes == 10 * sizeof(int));
  CHECK(empty_bytes == 0);
}

TEST_CASE("a rank sends to itself when the receive is in flight with the send") {
  std::vector<std::uint64_t> got(16);
  pdcoll::testing::run_inproc(1, [&](pdcoll::communicator& comm) {
    std::vector<std::uint64_t> data(16, 0xfeedface);
    ex::sync_wait(ex::when_all(pdcoll::recv(comm, 0, got, 4), pdcoll::send(comm, 0, data, 4)));
  });
  for (auto v : got) CHECK(v == 0xfeedface);
}

TEST_CASE("receives match by tag, whatever order the messages were sent in") {
  std::array<int, 3> seen{};
  std::array<int, 3> same_tag{};
  pdcoll::testing::run_inproc(2, [&](pdcoll::communicator& comm) {
    if (comm.rank() == 0) {
      int a = 100, b = 200, c = 300;
      ex::sync_wait(ex::when_all(pdcoll::send(comm, 1, std::span<int>(&a, 1), 10),
                                 pdcoll::send(comm, 1, std::span<int>(&b, 1), 20),
                                 pdcoll::send(comm, 1, std::span<int>(&c, 1), 30)));
      // Three messages with one tag arrive in the order they were sent.
      for (int k = 1; k <= 3; ++k) ex::sync_wait(pdcoll::send(comm, 1, std::span<int>(&k, 1), 7));
    } else {
      // Posted in reverse tag order.
      ex::sync_wait(ex::when_all(pdcoll::recv(comm, 0, std::span<int>(&seen[2], 1), 30),
                                 pdcoll::recv(comm, 0, std::span<int>(&seen[1], 1), 20),
                                 pdcoll::recv(comm, 0, std::span<int>(&seen[0], 1), 10)));
      for (auto& v : same_tag) ex::sync_wait(pdcoll::recv(comm, 0, std::span<int>(&v, 1), 7));
    }
  });
  CHECK(seen == std::array<int, 3>{100, 200, 300});
  CHECK(same_tag == std::array<int, 3>{1, 2, 3});
}

TEST_CASE("point-to-point messages never match a collective's receives") {
  std::vector<int> reduced(5);
  int p2p_value = 0;
  pdcoll::testing::run_inproc(2, [&](pdcoll::communicator& comm) {
    std::vector<int> data(5, comm.rank() + 1);
    int v = 42;
    if (comm.rank() == 0) {
      // The user message is sent first but must wait for its own receive.
      ex::sync_wait(pdcoll::send(comm, 1, std::span<int>(&v, 1), 0));
      ex::sync_wait(pdcoll::all_reduce(comm, data));
    } else {
      ex::sync_wait(pdcoll::all_reduce(comm, data));
      ex::sync_wait(pdcoll::recv(comm, 0, std::span<int>(&p2p_value, 1), 0));
      reduced = data;
    }
  });
  CHECK(reduced == std::vector<int>(5, 3));
  CHECK(p2p_value == 42);
}

TEST_CASE("send and recv reject bad arguments before posting anything") {
  std::array<std::error_code, 4> codes;
  bool aborted = true;
  pdcoll::testing::run_inproc(2, [&](pdcoll::communicator& comm) {
    if (comm.rank() != 0) return;
    std::vector<float> buf(4);
    codes[0] = error_of(pdcoll::send(comm, 2, buf));
    codes[1] = error_of(pdcoll::recv(comm, -1, buf));
    codes[2] = error_of(pdcoll::send(comm, 1, pdcoll::view<float>(nullptr, 4)));
    codes[3] = pdcoll::recv(comm, 1, pdcoll::view<float>(nullptr, 4)).validation_error();
    aborted = comm.aborted();
  });
  CHECK(codes[0] == errc::root_out_of_range);
  CHECK(codes[1] == errc::root_out_of_range);
  CHECK(codes[2] == errc::null_buffer);
  CHECK(codes[3] == errc::null_buffer);
  CHECK_FALSE(aborted);
}

TEST_CASE("completions arrive as rvalues, as the declared signatures say") {
  // set_value_t(std::size_t) and set_error_t(std::error_code) promise
  // rvalues: continuations that take them by && must run.
  std::size_t bytes = 0;
  std::error_code send_error, collective_error;
  pdcoll::testing::run_inproc(2, [&](pdcoll::communicator& comm) {
    std::vector<int> buf(16, comm.rank());
    if (comm.rank() == 0) {
      ex::sync_wait(pdcoll::send(comm, 1, buf));
      ex::sync_wait(pdcoll::send(comm, 5, buf) | ex::upon_error([&](std::error_code&& e) noexcept { send_error = e; }));
      std::vector<int> small(4);
      ex::sync_wait(pdcoll::all_reduce(comm, buf, small) |
                    ex::upon_error([&](std::error_code&& e) noexcept { collective_error = e; }));
    } else {
      ex::sync_wait(pdcoll::recv(comm, 0, buf) | ex::then([&](std::size_t&& n) noexcept { bytes = n; }));
    }
  });
  CHECK(bytes == 16 * sizeof(int));
  CHECK(send_error == errc::root_out_of_range);
  CHECK(collective_error == errc::buffer_too_small);
}

TEST_CASE("a message longer than the receive buffer completes the receive with collective_mismatch") {
  std::error_code ec;
  int after = 0;
  bool aborted = true;
  pdcoll::testing::run_inproc(2, [&](pdcoll::communicator& comm) {
    std::vector<int> big(8, 1), small(4);
    int v = 5;
    if (comm.rank() == 0) {
      ex::sync_wait(pdcoll::send(comm, 1, big, 3));
      ex::sync_wait(pdcoll::send(comm, 1, std::span<int>(&v, 1), 4));
    } else {
      ec = error_of(pdcoll::recv(comm, 0, small, 3));
      // Truncation fails only that receive: the communicator stays usable.
      ex::sync_wait(pdcoll::recv(comm, 0, std::span<int>(&after, 1), 4));
      aborted = comm.aborted();
    }
  });
  CHECK(ec == errc::collective_mismatch);
  CHECK(after == 5);
  CHECK_FALSE(aborted);
}

TEST_CASE("a stop request cancels a pending receive with exactly one set_stopped and leaves the communicator usable") {
  tally t;
  int later = 0;
  bool aborted = true;
  std::atomic<bool> cancelled{false};
  pdcoll::testing::run_inproc(2, [&](pdcoll::communicator& comm) {
    if (comm.rank() == 0) {
      int never = 0;
      ex::inplace_stop_source source;
      auto op = ex::connect(pdcoll::recv(comm, 1, std::span<int>(&never, 1), 9), counting_receiver{&t, source.get_token()});
      ex::start(op);
      std::thread stopper([&] {
        std::this_thread::sleep_for(20ms);
        source.request_stop();
      });
      drive_until([&] { return t.completions.load() > 0; });
      stopper.join();
      drive_until([] { return false; }, 50ms);  // a second completion would show up here
      cancelled = true;
      ex::sync_wait(pdcoll::recv(comm, 1, std::span<int>(&later, 1), 9));
      aborted = comm.aborted();
    } else {
      // Tag 9 is sent only after rank 0's first receive was cancelled.
      while (!cancelled.load()) std::this_thread::sleep_for(1ms);
      int v = 77;
      ex::sync_wait(pdcoll::send(comm, 0, std::span<int>(&v, 1), 9));
    }
  });
  CHECK(t.completions.load() == 1);
  CHECK(t.stops.load() == 1);
  CHECK(later == 77);
  CHECK_FALSE(aborted);
}

TEST_CASE("a stop request racing a matching send yields exactly one completion, with the data when the send won") {
  constexpr int rounds = 200;
  std::atomic<int> bad{0}, stopped{0}, received{0};
  pdcoll::testing::run_inproc(2, [&](pdcoll::communicator& comm) {
    for (int i = 0; i < rounds; ++i) {
      if (comm.rank() == 0) {
        tally t;
        int got = -1;
        ex::inplace_stop_source source;
        auto op = ex::connect(pdcoll::recv(comm, 1, std::span<int>(&got, 1), 1), counting_receiver{&t, source.get_token()});
        ex::start(op);
        if (i % 2) std::this_thread::yield();
        source.request_stop();
        if (!drive_until([&] { return t.completions.load() > 0; })) ++bad;
        drive_until([] { return false; }, 1ms);
        if (t.completions.load() != 1) ++bad;
        if (t.values.load() == 1) {
          ++received;
          if (got != i) ++bad;
        } else if (t.stops.load() == 1) {
          ++stopped;
          // The message is still there for the next receive of that tag.
          ex::sync_wait(pdcoll::recv(comm, 1, std::span<int>(&got, 1), 1));
          if (got != i) ++bad;
        } else {
          ++bad;
        }
        ex::sync_wait(pdcoll::send(comm, 1, std::span<int>(&got, 1), 2));  // next round
      } else {
        int v = i, ack = 0;
        ex::sync_wait(pdcoll::send(comm, 0, std::span<int>(&v, 1), 1));
        ex::sync_wait(pdcoll::recv(comm, 0, std::span<int>(&ack, 1), 2));
      }
    }
  });
  CHECK(bad.load() == 0);
  CHECK(stopped.load() + received.load() == rounds);
  MESSAGE("stopped ", stopped.load(), ", received ", received.load());
}

TEST_CASE("a receive whose peer never sends completes with timeout within the communicator's deadline") {
  std::error_code ec;
  std::chrono::milliseconds took{};
  std::error_code peer_reason;
  pdcoll::testing::run_inproc(
      2,
      [&](pdcoll::communicator& comm) {
        if (comm.rank() == 0) {
          int never = 0;
          auto t0 = std::chrono::steady_clock::now();
          ec = error_of(pdcoll::recv(comm, 1, std::span<int>(&never, 1)));
          took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
        } else {
          // The timeout aborts rank 0's communicator, which tells this rank. With
          // nothing pending this communicator is no registered progress driver: drive it.
          const auto limit = std::chrono::steady_clock::now() + 5s;
          while (!comm.aborted() && std::chrono::steady_clock::now() < limit)
            comm.drive(std::chrono::steady_clock::now() + 1ms);
          peer_reason = comm.abort_reason();
        }
      },
      with_timeout(150ms));
  CHECK(ec == errc::timeout);
  CHECK(took >= 140ms);
  CHECK(took < 3000ms);
  CHECK(peer_reason == errc::timeout);
}

TEST_CASE("with_timeout overrides the communicator's deadline for one send or receive") {
  std::error_code ec;
  std::chrono::milliseconds took{};
  pdcoll::testing::run_inproc(1, [&](pdcoll::communicator& comm) {
    int never = 0;
    auto t0 = std::chrono::steady_clock::now();
    ec = error_of(pdcoll::recv(comm, 0, std::span<int>(&never, 1), 5).with_timeout(100ms));
    took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  });  // default timeout: 60 s
  CHECK(ec == errc::timeout);
  CHECK(took < 3000ms);
}

TEST_CASE("a timeout of milliseconds::max() is no deadline: collectives and transfers wait for a late rank") {
  // launch + max() in nanoseconds wrapped to the past: every operation
  // timed out at its first deadline check and aborted the communicator.
  std::array<std::error_code, 2> barrier_ec, reduce_ec, p2p_ec;
  std::array<int, 2> sum{};
  int got = 0;
  pdcoll::testing::run_inproc(2, [&](pdcoll::communicator& comm) {
    const int r = comm.rank();
    if (r == 1) std::this_thread::sleep_for(50ms);
    barrier_ec[r] = error_of(pdcoll::barrier(comm));
    if (r == 0) std::this_thread::sleep_for(50ms);
    int mine = r + 1;
    reduce_ec[r] = error_of(pdcoll::all_reduce(comm, std::span<const int>(&mine, 1), std::span<int>(&sum[r], 1)));
    if (r == 0) {
      p2p_ec[r] = error_of(pdcoll::recv(comm, 1, std::span<int>(&got, 1), 9).with_timeout(std::chrono::milliseconds::max()));
    } else {
      std::this_thread::sleep_for(50ms);
      const int payload = 42;
      p2p_ec[r] = error_of(pdcoll::send(comm, 0, std::span<const int>(&payload, 1), 9));
    }
  }, with_timeout(std::chrono::milliseconds::max()));
  for (int r = 0; r < 2; ++r) {
    CHECK(barrier_ec[r] == std::error_code{});
    CHECK(reduce_ec[r] == std::error_code{});
    CHECK(p2p_ec[r] == std::error_code{});
    CHECK(sum[r] == 3);
  }
  CHECK(got == 42);
}

TEST_CASE("receivers run outside the communicator's lock: continuations crossing two communicators never deadlock") {
  // Two one-rank communicators, each with a progress thread. A message on
  // each completes a receive whose continuation waits until the other
  // one's runs too, then sends on the other communicator. Run under their
  // own communicator's lock, the two continuations would each hold one
  // lock and wait for the other's.
  struct two_party_gate {
    std::mutex m;
    std::condition_variable cv;
    int arrived = 0;
    bool arrive_and_wait(std::chrono::milliseconds bound) {
      std::unique_lock lock(m);
      ++arrived;
      cv.notify_all();
      return cv.wait_for(lock, bound, [&] { return arrived >= 2; });
    }
  } gate;
  pdcoll::communicator_options options;
  options.progress_thread = true;
  options.timeout = 5s;
  auto fabric_a = pdcoll::transport::inproc::fabric::create(1);
  auto fabric_b = pdcoll::transport::inproc::fabric::create(1);
  pdcoll::communicator a{fabric_a->endpoint_for(0), options};
  pdcoll::communicator b{fabric_b->endpoint_for(0), options};
  int in_a = 0, in_b = 0, out_a = 0, out_b = 0, to_b = 3, to_a = 4, first_a = 1, first_b = 2;
  std::atomic<int> met{0};
  auto crossing = [&](pdcoll::communicator& from, pdcoll::communicator& to, int& into, int& value) {
    return pdcoll::recv(from, 0, std::span<int>(&into, 1), 1) |
           ex::then([&](std::size_t) { return gate.arrive_and_wait(2s); }) | ex::let_value([&](bool& both) {
             met += both ? 1 : 0;
             return pdcoll::send(to, 0, std::span<int>(&value, 1), 2);
           });
  };
  auto all = std::async(std::launch::async, [&] {
    ex::sync_wait(ex::when_all(crossing(a, b, in_a, to_b), crossing(b, a, in_b, to_a),
                               pdcoll::recv(a, 0, std::span<int>(&out_a, 1), 2),
                               pdcoll::recv(b, 0, std::span<int>(&out_b, 1), 2)));
  });
  std::this_thread::sleep_for(50ms);  // the receives are posted
  auto send_a = std::async(std::launch::async, [&] { ex::sync_wait(pdcoll::send(a, 0, std::span<int>(&first_a, 1), 1)); });
  auto send_b = std::async(std::launch::async, [&] { ex::sync_wait(pdcoll::send(b, 0, std::span<int>(&first_b, 1), 1)); });
  if (all.wait_for(20s) != std::future_status::ready) {
    // A deadlock cannot be unwound: report it and end the process.
    std::fprintf(stderr, "FAILED: the crossing continuations deadlocked\n");
    std::fflush(stderr);
    std::_Exit(1);
  }
  all.get();
  send_a.get();
  send_b.get();
  CHECK(met == 2);
  CHECK(in_a == 1);
  CHECK(in_b == 2);
  CHECK(out_a == 4);
  CHECK(out_b == 3);
}

TEST_CASE("eight all-reduces of different buckets in flight at once under when_all are each correct") {
  constexpr int P = 4;
  std::atomic<int> failures{0};
  std::vector<std::string> first(P);
  pdcoll::testing::run_inproc(P, [&](pdcoll::communicator& comm) {
    using namespace pdcoll;
    using testing::check_reduced;
    using testing::make_input;
    const std::array<std::size_t, 8> n{1, 3, 1000, 5, 70000, 0, 4097, 300000};
    auto b0 = make_input<float>(1, comm.rank(), n[0], false);
    auto b1 = make_input<std::int32_t>(2, comm.rank(), n[1], false);
    auto b2 = make_input<bfloat16>(3, comm.rank(), n[2], false);
    auto b3 = make_input<double>(4, comm.rank(), n[3], false);
    auto b4 = make_input<float>(5, comm.rank(), n[4], false);
    auto b5 = make_input<float>(6, comm.rank(), n[5], false);
    auto b6 = make_input<std::int32_t>(7, comm.rank(), n[6], false);
    auto b7 = make_input<float>(8, comm.rank(), n[7], false);
    ex::sync_wait(ex::when_all(all_reduce(comm, b0, op::sum), all_reduce<algo::ring>(comm, b1, op::max),
                               all_reduce<algo::recursive_doubling>(comm, b2, op::sum),
                               all_reduce<algo::tree>(comm, b3, op::avg), all_reduce<algo::rabenseifner>(comm, b4, op::sum),
                               all_reduce(comm, b5, op::sum), all_reduce<algo::direct>(comm, b6, op::sum),
                               all_reduce<algo::ring>(comm, b7, op::avg)));
    std::string msg;
    if (msg.empty()) msg = check_reduced<float, op::sum_t>(b0.data(), n[0], 1, P);
    if (msg.empty()) msg = check_reduced<std::int32_t, op::max_t>(b1.data(), n[1], 2, P);
    if (msg.empty()) msg = check_reduced<bfloat16, op::sum_t>(b2.data(), n[2], 3, P);
    if (msg.empty()) msg = check_reduced<double, op::avg_t>(b3.data(), n[3], 4, P);
    if (msg.empty()) msg = check_reduced<float, op::sum_t>(b4.data(), n[4], 5, P);
    if (msg.empty()) msg = check_reduced<std::int32_t, op::sum_t>(b6.data(), n[6], 7, P);
    if (msg.empty()) msg = check_reduced<float, op::avg_t>(b7.data(), n[7], 8, P);
    if (!msg.empty()) {
      ++failures;
      first[static_cast<std::size_t>(comm.rank())] = msg;
    }
  });
  for (auto& m : first)
    if (!m.empty()) MESSAGE(m);
  CHECK(failures.load() == 0);
}

namespace {

/// Runs `body` on P ranks with a 10 s deadline and returns each rank's error.
std::vector<std::error_code> errors_on_every_rank(int P, const std::function<std::error_code(pdcoll::communicator&)>& body) {
  std::vector<std::error_code> codes(static_cast<std::size_t>(P));
  pdcoll::testing::run_inproc(
      P, [&](pdcoll::communicator& comm) { codes[static_cast<std::size_t>(comm.rank())] = body(comm); },
      with_timeout(10s));
  return codes;
}

}  // namespace

TEST_CASE("a rank that calls broadcast while the others all-reduce makes every rank fail with collective_mismatch") {
  for (int P : {2, 3, 4, 5}) {
    for (std::size_t count : {std::size_t{1}, std::size_t{1000}, std::size_t{100000}}) {
      CAPTURE(P);
      CAPTURE(count);
      auto codes = errors_on_every_rank(P, [count](pdcoll::communicator& comm) {
        std::vector<float> data(count, 1.0f);
        if (comm.rank() == 1) return error_of(pdcoll::broadcast(comm, data, 0));
        return error_of(pdcoll::all_reduce(comm, data));
      });
      for (int r = 0; r < P; ++r) {
        CAPTURE(r);
        CHECK(codes[static_cast<std::size_t>(r)] == errc::collective_mismatch);
      }
    }
  }
}

TEST_CASE("a rank that all-reduces another count makes every rank fail with collective_mismatch") {
  for (int P : {2, 3, 4}) {
    for (std::size_t count : {std::size_t{2}, std::size_t{1000}, std::size_t{100000}}) {
      CAPTURE(P);
      CAPTURE(count);
      auto codes = errors_on_every_rank(P, [count, P](pdcoll::communicator& comm) {
        std::vector<float> data(comm.rank() == P - 1 ? count + 1 : count, 1.0f);
        return error_of(pdcoll::all_reduce(comm, data));
      });
      for (int r = 0; r < P; ++r) {
        CAPTURE(r);
        CHECK(codes[static_cast<std::size_t>(r)] == errc::collective_mismatch);
      }
    }
  }
}

TEST_CASE("a rank that all-reduces with another op or type makes every rank fail with collective_mismatch") {
  auto codes = errors_on_every_rank(3, [](pdcoll::communicator& comm) {
    std::vector<float> data(64, 1.0f);
    std::vector<std::int32_t> ints(64, 1);
    if (comm.rank() == 0) return error_of(pdcoll::all_reduce(comm, data, pdcoll::op::max));
    if (comm.rank() == 2) return error_of(pdcoll::all_reduce(comm, ints));
    return error_of(pdcoll::all_reduce(comm, data));
  });
  for (auto& ec : codes) CHECK(ec == errc::collective_mismatch);
}
