// File: transport/libfabric/shm_object.hpp — a named POSIX shared memory
// object whose pages exist before anyone maps it.
//
// ftruncate(2) on tmpfs only sets a size: the pages come when first touched,
// and when /dev/shm is full by then (a container's default is 64 MiB, shared
// with libfabric's own shm regions) the touching process dies of SIGBUS, in
// the middle of a collective. posix_fallocate(3) takes the pages up front, so
// a /dev/shm too small shows up here, at setup, as an error the caller can
// fall back from (NCCL's shm transport does the same).
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <climits>
#include <limits>
#include <cstddef>
#include <string>
#include <string_view>

namespace pdcoll::transport::libfabric::detail {

/// Removes the objects `/<prefix>.<pid>.<n>` in /dev/shm whose process is
/// gone (kill(pid, 0) fails with ESRCH). A rank's objects are named from
/// creation until every peer has mapped them (one exchange at setup); a
/// rank killed in between (a launcher ending a job whose other rank failed
/// to start) leaves them behind, holding /dev/shm space, and a later
/// process given the same pid would find its names taken. Objects of live
/// processes, and other users' (the sticky /dev/shm refuses), stay. Where
/// /dev/shm is shared across pid namespaces a live process of another
/// namespace looks gone: its job then runs without node memory, not wrong.
inline void remove_stale_shm_objects(std::string_view prefix) noexcept {
  DIR* dir = ::opendir("/dev/shm");
  if (!dir) return;
  const pid_t self = ::getpid();
  while (const dirent* entry = ::readdir(dir)) {
    const std::string_view name(entry->d_name);
    if (name.size() <= prefix.size() + 1 || name.substr(0, prefix.size()) != prefix || name[prefix.size()] != '.')
      continue;
    const std::string_view rest = name.substr(prefix.size() + 1);
    long long pid = 0;
    const auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), pid);
    if (error != std::errc{} || end == rest.data() + rest.size() || *end != '.' || pid <= 0 ||
        pid > std::numeric_limits<pid_t>::max() || pid == self)
      continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    char path[NAME_MAX + 2] = "/";
    name.copy(path + 1, std::min<std::size_t>(name.size(), NAME_MAX));
    ::shm_unlink(path);
  }
  ::closedir(dir);
}

/// Creates `/<prefix>.<pid>.<n>` (a fresh name per call) with `bytes`
/// zero-filled bytes allocated, first removing the prefix's leftovers of
/// processes that are gone (remove_stale_shm_objects). A name still taken
/// (a leftover of a process that had this pid in another pid namespace, or
/// a second copy of this code in the process counting on its own) moves on
/// to the next n. Returns the open fd and sets `name`, or returns -1, sets
/// errno (shm_open's, or posix_fallocate's: ENOSPC when /dev/shm is full)
/// and leaves nothing behind.
inline int create_shm_object(std::string_view prefix, std::size_t bytes, std::string& name) noexcept {
  static std::atomic<unsigned> counter{0};
  remove_stale_shm_objects(prefix);
  std::string n;
  int fd = -1;
  for (int attempt = 0; attempt < 64 && fd < 0; ++attempt) {
    try {
      n = "/" + std::string(prefix) + "." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    } catch (...) {
      errno = ENOMEM;
      return -1;
    }
    fd = ::shm_open(n.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno != EEXIST) return -1;
  }
  if (fd < 0) return -1;  // EEXIST 64 times over
  int error = 0;
  do {
    error = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));  // returns the error; errno untouched
  } while (error == EINTR);
  if (error != 0) {
    ::close(fd);
    ::shm_unlink(n.c_str());
    errno = error;
    return -1;
  }
  name = std::move(n);
  return fd;
}

/// Maps `bytes` of the shared memory object open as `fd`, read-write and
/// shared. Returns the mapping, or nullptr with mmap's errno.
inline void* map_shm_object(int fd, std::size_t bytes) noexcept {
  void* at = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return at == MAP_FAILED ? nullptr : at;
}

/// Creates an object as create_shm_object does and maps it. Returns the
/// mapping and sets `name`, or returns nullptr, sets errno (shm_open's,
/// posix_fallocate's or mmap's, for the caller's report) and leaves nothing
/// behind.
inline void* create_and_map_shm_object(std::string_view prefix, std::size_t bytes, std::string& name) noexcept {
  const int fd = create_shm_object(prefix, bytes, name);
  if (fd < 0) return nullptr;
  void* at = map_shm_object(fd, bytes);
  const int error = errno;
  ::close(fd);
  if (!at) {
    ::shm_unlink(name.c_str());
    name.clear();
    errno = error;
  }
  return at;
}

}  // namespace pdcoll::transport::libfabric::detail
