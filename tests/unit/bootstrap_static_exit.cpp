// A job (or anything else) with static storage duration, made before
// pdcoll's error categories were first used, may report an error from its
// destructor at exit: a job whose store broke does, in its final barrier.
// The categories must still exist then. The inner case runs alone in a
// fresh process (the outer one starts it), because in this process other
// cases have long since created the categories.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <system_error>

#include "pdcoll/error.hpp"
#include "pdcoll/transport/libfabric/errors.hpp"

namespace {

/// Reads both categories' messages from its destructor, as a static job does.
struct reports_at_exit {
  ~reports_at_exit() {
    const std::string a = pdcoll::make_error_code(pdcoll::errc::peer_lost).message();
    const std::string b = std::error_code(5, pdcoll::transport::libfabric::fabric_category()).message();
    if (a.empty() || b.empty()) _exit(3);
  }
};

}  // namespace

TEST_CASE("static_exit_inner" * doctest::skip()) {
  static reports_at_exit holder;  // constructed before the categories' first use below
  CHECK(!pdcoll::make_error_code(pdcoll::errc::timeout).message().empty());
  CHECK(!std::error_code(5, pdcoll::transport::libfabric::fabric_category()).message().empty());
}

TEST_CASE("an object with static storage may report pdcoll errors from its destructor at exit") {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::execl("/proc/self/exe", "test_bootstrap", "--test-case=static_exit_inner", "--no-skip", "--minimal",
            static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK_MESSAGE(WIFEXITED(status), "the process died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0));
  CHECK(WIFEXITED(status));
  if (WIFEXITED(status)) CHECK(WEXITSTATUS(status) == 0);
}
