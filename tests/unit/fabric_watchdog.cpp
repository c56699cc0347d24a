// The libfabric provider watchdog (transport/libfabric/provider_watchdog.hpp)
// without libfabric: a call marked as inside the provider that never returns
// ends the process with status 70 and a message naming it; calls that keep
// returning, and a slot outside any call, never trip it.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "pdcoll/transport/libfabric/provider_watchdog.hpp"

namespace {

using pdcoll::transport::libfabric::detail::provider_call;
using pdcoll::transport::libfabric::detail::provider_call_slot;
using pdcoll::transport::libfabric::detail::provider_watchdog;
using namespace std::chrono_literals;

}  // namespace

TEST_SUITE("fabric.watchdog") {

TEST_CASE("a provider call that never returns ends the process with status 70, naming the call and the peer") {
  int err[2];
  REQUIRE(::pipe(err) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::dup2(err[1], 2);
    provider_watchdog dog;
    provider_call_slot slot;
    slot.rank = 3;
    dog.watch(&slot, 200ms);
    const provider_call stuck(&slot, "fi_tinjectdata", 1);
    std::this_thread::sleep_for(5s);  // the watchdog ends the process long before this
    std::_Exit(0);
  }
  ::close(err[1]);
  std::string text;
  char buffer[512];
  for (ssize_t n; (n = ::read(err[0], buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<std::size_t>(n));
  ::close(err[0]);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CAPTURE(text);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == provider_watchdog::exit_status);
  CHECK(text.find("rank 3 has been inside libfabric's fi_tinjectdata (peer 1)") != std::string::npos);
}

TEST_CASE("calls that keep returning and a slot outside any call never trip the watchdog") {
  provider_watchdog dog;
  provider_call_slot busy, idle;
  dog.watch(&busy, 300ms);
  dog.watch(&idle, 300ms);
  const auto until = std::chrono::steady_clock::now() + 1s;
  while (std::chrono::steady_clock::now() < until) {
    const provider_call call(&busy, "fi_cq_read", -1);
    std::this_thread::sleep_for(100ms);  // each call a third of the limit: slow, but returning
  }
  dog.unwatch(&busy);
  dog.unwatch(&idle);
  CHECK(busy.depth.load() == 0);  // reaching here at all is the test: a trip would have ended the process
}

}  // TEST_SUITE
