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

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <string>
#include <string_view>

namespace pdcoll::transport::libfabric::detail {

/// Creates `/<prefix>.<pid>.<n>` (a fresh name per call) with `bytes`
/// zero-filled bytes allocated. Returns the open fd and sets `name`, or
/// returns -1, sets errno (shm_open's, or posix_fallocate's: ENOSPC when
/// /dev/shm is full) and leaves nothing behind.
inline int create_shm_object(std::string_view prefix, std::size_t bytes, std::string& name) noexcept {
  static std::atomic<unsigned> counter{0};
  std::string n;
  try {
    n = "/" + std::string(prefix) + "." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  } catch (...) {
    errno = ENOMEM;
    return -1;
  }
  const int fd = ::shm_open(n.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return -1;
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
