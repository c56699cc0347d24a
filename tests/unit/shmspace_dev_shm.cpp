// Unit tests: a /dev/shm too small for the shm endpoint's doorbell or node
// memory. Each case runs in a forked child with its own mount namespace and a
// 64 MiB tmpfs on /dev/shm (a container's default size), so it needs
// CAP_SYS_ADMIN; without it the case says so and checks nothing. Its own
// binary (area "shmspace"): it forks before anything has loaded libfabric.
#include <doctest/doctest.h>

#include <dirent.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "multiproc/fork_harness.hpp"
#include "pdcoll/transport/libfabric/endpoint.hpp"

namespace fabric = pdcoll::transport::libfabric;
using pdcoll::test::drive_until;
using pdcoll::test::rank_checks;
using pdcoll::test::recorded_op;

namespace {

constexpr int no_privilege = 77;  // the child's exit status when it cannot mount

/// In the calling (forked) process: a private mount namespace with a fresh
/// tmpfs of `size` on /dev/shm. False when not permitted.
bool private_dev_shm(const char* size) {
  auto refused = [](const char* what) {
    std::fprintf(stderr, "%s: %s\n", what, std::strerror(errno));
    return false;
  };
  if (::unshare(CLONE_NEWNS) != 0) return refused("unshare(CLONE_NEWNS)");
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return refused("mount --make-rprivate /");
  const std::string options = std::string("size=") + size;
  if (::mount("tmpfs", "/dev/shm", "tmpfs", 0, options.c_str()) != 0) return refused("mount tmpfs /dev/shm");
  return true;
}

/// Names in /dev/shm starting with `prefix`.
std::vector<std::string> shm_names(const std::string& prefix) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name).rfind(prefix, 0) == 0) names.emplace_back(e->d_name);
    ::closedir(d);
  }
  return names;
}

/// Runs `body` in one forked child with a 64 MiB /dev/shm of its own and
/// checks its outcome.
void in_small_dev_shm(const std::function<int(rank_checks&)>& body) {
  auto outcomes = pdcoll::test::run_ranks(1, [&](int, int, const pdcoll::transport::address_exchange&) {
    if (!private_dev_shm("64m")) return no_privilege;
    rank_checks check{0};
    const int status = body(check);
    return status | (check.failures ? 1 : 0);
  });
  if (outcomes[0].exit_code == no_privilege) {
    MESSAGE("skipped: mounting a tmpfs on /dev/shm needs CAP_SYS_ADMIN");
    return;
  }
  CHECK(outcomes[0].exit_code == 0);
  CHECK(outcomes[0].signal == 0);
  CHECK_FALSE(outcomes[0].timed_out);
}

}  // namespace

TEST_CASE("node memory and a doorbell larger than /dev/shm fail to create with ENOSPC and leave nothing behind") {
  in_small_dev_shm([](rank_checks& check) {
    {
      fabric::detail::shared_regions regions;
      errno = 0;
      regions.create(0, 2, std::size_t{96} << 20);
      check(errno == ENOSPC, std::string("node memory: ") + std::strerror(errno));
      check(regions.own_name() == "-" && !regions.region(0), "no node memory region");
      // With ftruncate alone the creation succeeded, and the first touch of a
      // page past the free space was SIGBUS.
    }
    {
      fabric::detail::doorbell bell;
      errno = 0;
      bell.create(true, std::size_t{12} << 20);  // 96 MiB of finish words
      check(errno == ENOSPC, std::string("doorbell: ") + std::strerror(errno));
      check(!bell.words && bell.name.empty(), "no doorbell");
    }
    check(shm_names("pdcoll-").empty(), "nothing left in /dev/shm");
    {  // What fits is created, and touchable to its last byte.
      fabric::detail::shared_regions regions;
      regions.create(0, 1, std::size_t{32} << 20);
      check(regions.region(0) != nullptr, "32 MiB of node memory in a 64 MiB /dev/shm");
      if (regions.region(0)) std::memset(regions.region(0), 1, regions.bytes());
      fabric::detail::doorbell bell;
      bell.create(true, 2 * 256);
      check(bell.words != nullptr && !bell.name.empty(), "a two-rank doorbell");
      check(shm_names("pdcoll-").size() == 2, "both named in /dev/shm until unlinked");
    }
    check(shm_names("pdcoll-").empty(), "both unlinked when destroyed");
    return 0;
  });
}

TEST_CASE("an shm endpoint whose node memory does not fit in /dev/shm runs without it") {
  in_small_dev_shm([](rank_checks& check) {
    fabric::options opts;
    opts.provider = "shm";
    opts.node_memory_bytes = std::size_t{96} << 20;
    auto self = [](std::string_view s) { return std::vector<std::string>{std::string(s)}; };
    fabric::fabric_endpoint ep(0, 1, self, opts);
    check(ep.shared_node_memory() == nullptr, "no node memory");
    check(ep.has_doorbell(), "the doorbell still fits");
    check(shm_names("pdcoll-").empty(), "nothing of pdcoll's left in /dev/shm");
    std::vector<unsigned char> out(std::size_t{1} << 20), in(out.size());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<unsigned char>(i * 7 + 3);
    recorded_op send, recv;
    check(!ep.post_recv(0, in.data(), in.size(), 5, 0, nullptr, &recv), "post recv");
    check(!ep.post_send(0, out.data(), out.size(), 5, nullptr, &send), "post send");
    check(drive_until(ep, [&] { return send.done() && recv.done(); },
                      std::chrono::steady_clock::now() + std::chrono::seconds(10)),
          "a 1 MiB message to self completed");
    check(!recv.result.error && recv.result.bytes == out.size() && in == out, "and arrived intact");
    return 0;
  });
}
