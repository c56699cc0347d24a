// A completion may call progress() again: an algorithm that throws with a
// batch outstanding unwinds inside the transport's progress(), and the
// batch's destructor drains its transfers by calling progress(). The inner
// call must deliver what the outer one took off the queue but has not
// delivered yet (or the drain gives up and the outer call later delivers
// into freed memory), and nothing may be delivered twice.
#include <doctest/doctest.h>

#include "multiproc/fork_harness.hpp"
#include "pdcoll/transport/inproc.hpp"
#include "pdcoll/transport/libfabric/endpoint.hpp"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace {

namespace transport = pdcoll::transport;
using pdcoll::test::drive_until;
using pdcoll::test::recorded_op;

/// A receive whose first completion calls progress() again and notes
/// whether `other` completed inside that inner call.
struct reentering_receive : transport::completion_context {
  transport::endpoint* ep = nullptr;
  const reentering_receive* other = nullptr;
  int completions = 0;
  bool other_done_inside = false;
  reentering_receive() {
    on_complete = [](transport::completion_context* self, const transport::completion&) noexcept {
      auto* op = static_cast<reentering_receive*>(self);
      if (++op->completions == 1 && op->other != nullptr) {
        op->ep->progress();
        op->other_done_inside = op->other->completions == 1;
      }
    };
  }
};

struct outcome {
  int first = 0, second = 0, sends = 0;
  bool second_inside = false;
};

/// Two messages to self, their receives posted first; the first receive's
/// completion re-enters progress(). `settle` runs before the first progress().
template <class Settle>
outcome exchange_to_self(transport::endpoint& ep, Settle&& settle) {
  int in1 = 0, in2 = 0;
  const int out1 = 1, out2 = 2;
  reentering_receive first, second;
  first.ep = second.ep = &ep;
  first.other = &second;
  recorded_op send1, send2;
  REQUIRE_FALSE(ep.post_recv(0, &in1, sizeof in1, 1, 0, nullptr, &first));
  REQUIRE_FALSE(ep.post_recv(0, &in2, sizeof in2, 2, 0, nullptr, &second));
  REQUIRE_FALSE(ep.post_send(0, &out1, sizeof out1, 1, nullptr, &send1));
  REQUIRE_FALSE(ep.post_send(0, &out2, sizeof out2, 2, nullptr, &send2));
  settle();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  CHECK(drive_until(ep, [&] { return first.completions && second.completions && send1.done() && send2.done(); },
                    deadline));
  // Anything delivered twice shows up after a little more progress.
  for (int i = 0; i < 20; ++i) ep.progress();
  CHECK(in1 == 1);
  CHECK(in2 == 2);
  return {first.completions, second.completions, send1.completions + send2.completions, first.other_done_inside};
}

}  // namespace

TEST_CASE("inproc: a completion that re-enters progress() gets the rest of the outer call's completions, once each") {
  auto fabric = transport::inproc::fabric::create(1);
  auto ep = fabric->endpoint_for(0);
  // Sends complete at once: the four completions wait in one queue, which
  // the outer progress() takes whole.
  const outcome o = exchange_to_self(*ep, [] {});
  CHECK(o.first == 1);
  CHECK(o.second == 1);
  CHECK(o.sends == 2);
  CHECK(o.second_inside);
}

TEST_CASE("libfabric: a completion that re-enters progress() gets the entries the outer call read, once each") {
  for (const char* provider : {"shm", "tcp"}) {
    CAPTURE(provider);
    transport::libfabric::options opts;
    opts.provider = provider;
    auto self = [](std::string_view s) { return std::vector<std::string>{std::string(s)}; };
    transport::libfabric::fabric_endpoint ep(0, 1, self, opts);
    // Let both messages arrive before the first progress(), so one read of
    // the completion queue takes both receives where the provider allows.
    const outcome o = exchange_to_self(ep, [&] {
      for (int i = 0; i < 20; ++i) ep.wait(std::chrono::steady_clock::now() + std::chrono::milliseconds(2));
    });
    CHECK(o.first == 1);
    CHECK(o.second == 1);
    CHECK(o.sends == 2);
    // The settling waits stash both entries (wait() reads the queue), so
    // the outer progress() holds both when the first re-enters it.
    CHECK(o.second_inside);
  }
}
