// File: memory/gaudi_driver.hpp — the system calls the gaudi domain makes,
// behind an interface, so its logic is tested against a fake driver that
// checks every ioctl and fails the way the kernel does.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace pdcoll::memory {

/// The habanalabs device's system-call surface. Every call returns a
/// non-negative value on success and -errno on failure (the kernel's own
/// convention, which keeps errno out of the interface and thread-safe).
class gaudi_driver {
 public:
  virtual ~gaudi_driver() = default;
  /// open(2) of a device node; the new fd or -errno.
  virtual int open(const char* path, int flags) noexcept = 0;
  /// ioctl(2); >= 0 or -errno. `argument` points to the request's struct.
  virtual int ioctl(int fd, unsigned long request, void* argument) noexcept = 0;
  /// close(2); 0 or -errno.
  virtual int close(int fd) noexcept = 0;
  /// mmap(2) of `length` bytes of `fd` from offset 0, MAP_SHARED, with
  /// `prot`; stores the address in `*address`. 0 or -errno.
  virtual int mmap(int fd, std::size_t length, int prot, void** address) noexcept = 0;
  /// munmap(2); 0 or -errno.
  virtual int munmap(void* address, std::size_t length) noexcept = 0;
};

/// The real thing: the system calls themselves.
class system_gaudi_driver final : public gaudi_driver {
 public:
  int open(const char* path, int flags) noexcept override {
    const int fd = ::open(path, flags);
    return fd >= 0 ? fd : -errno;
  }
  int ioctl(int fd, unsigned long request, void* argument) noexcept override {
    int result = 0;
    do result = ::ioctl(fd, request, argument);
    while (result < 0 && errno == EINTR);  // ioctl(2): a signal may interrupt a sleeping driver call
    return result >= 0 ? result : -errno;
  }
  int close(int fd) noexcept override { return ::close(fd) == 0 ? 0 : -errno; }
  int mmap(int fd, std::size_t length, int prot, void** address) noexcept override {
    void* mapped = ::mmap(nullptr, length, prot, MAP_SHARED, fd, 0);
    if (mapped == MAP_FAILED) return -errno;
    *address = mapped;
    return 0;
  }
  int munmap(void* address, std::size_t length) noexcept override {
    return ::munmap(address, length) == 0 ? 0 : -errno;
  }
};

namespace detail {
/// The process's one system_gaudi_driver (stateless, so sharing is free).
inline gaudi_driver& default_gaudi_driver() noexcept {
  static system_gaudi_driver driver;
  return driver;
}
}  // namespace detail

}  // namespace pdcoll::memory
