// The named /dev/shm objects behind the shm endpoint's doorbell and node
// memory (transport/libfabric/shm_object.hpp): a rank killed during setup
// leaves its objects named; the next creation removes those of processes
// that are gone, and a name still taken moves on instead of failing.
#include <doctest/doctest.h>

#include <pdcoll/transport/libfabric/shm_object.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace {

namespace shm = pdcoll::transport::libfabric::detail;

constexpr const char* prefix = "pdcoll-unit-objects";

std::string object_name(long long pid, unsigned n) {
  return "/" + std::string(prefix) + "." + std::to_string(pid) + "." + std::to_string(n);
}
bool exists(const std::string& name) {
  const int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
  if (fd >= 0) ::close(fd);
  return fd >= 0;
}
void make(const std::string& name) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  ::close(fd);
}
/// The number after the last dot of a name create_shm_object gave.
unsigned counter_of(const std::string& name) { return static_cast<unsigned>(std::stoul(name.substr(name.rfind('.') + 1))); }

/// A pid whose process has ended and been reaped.
pid_t gone_pid() {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  return child;
}

}  // namespace

TEST_CASE("a name left taken under this pid is skipped: creation moves on to the next one") {
  std::string first;
  const int fd = shm::create_shm_object(prefix, 4096, first);
  REQUIRE(fd >= 0);
  ::close(fd);
  ::shm_unlink(first.c_str());
  // The next three names are taken, as a dead process with this pid would
  // have left them.
  std::vector<std::string> taken;
  for (unsigned k = 1; k <= 3; ++k) taken.push_back(object_name(::getpid(), counter_of(first) + k));
  for (const auto& t : taken) make(t);
  std::string second;
  const int fd2 = shm::create_shm_object(prefix, 4096, second);
  CHECK(fd2 >= 0);
  CHECK(counter_of(second) == counter_of(first) + 4);
  for (const auto& t : taken) CHECK(exists(t));  // this pid is alive: not stale
  if (fd2 >= 0) ::close(fd2);
  ::shm_unlink(second.c_str());
  for (const auto& t : taken) ::shm_unlink(t.c_str());
}

TEST_CASE("creation removes the leftovers of processes that are gone and keeps those of live ones") {
  const std::string stale = object_name(gone_pid(), 0);
  const std::string stale_too = object_name(gone_pid(), 7);
  const std::string live = object_name(::getppid(), 12345);  // the parent runs as long as this test
  const std::string not_ours = "/" + std::string(prefix) + "x." + std::to_string(gone_pid()) + ".0";
  for (const auto& n : {stale, stale_too, live, not_ours}) make(n);
  std::string created;
  const int fd = shm::create_shm_object(prefix, 4096, created);
  REQUIRE(fd >= 0);
  ::close(fd);
  CHECK_FALSE(exists(stale));
  CHECK_FALSE(exists(stale_too));
  CHECK(exists(live));
  CHECK(exists(not_ours));  // another prefix
  CHECK(exists(created));
  for (const auto& n : {live, not_ours, created}) ::shm_unlink(n.c_str());
}
