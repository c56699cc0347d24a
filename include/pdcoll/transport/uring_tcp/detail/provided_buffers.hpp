// File: transport/uring_tcp/detail/provided_buffers.hpp — one connection's
// group of provided buffers (IORING_REGISTER_PBUF_RING, Linux 5.19) for its
// multishot recv: the kernel takes a buffer from the group's ring for each
// completion it posts, and the endpoint gives the buffer back once it has
// parsed the bytes in it.
#pragma once

#include <liburing.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

namespace pdcoll::transport::uring_tcp::detail {

/// `count` buffers of `size` bytes and the ring the kernel picks them from,
/// registered as buffer group `group` of one io_uring. Empty until setup()
/// succeeds. The ring must outlive the registration or be torn down first
/// (io_uring_queue_exit drops every group); the memory is freed here after.
class provided_buffers {
 public:
  provided_buffers() = default;
  provided_buffers(const provided_buffers&) = delete;
  provided_buffers& operator=(const provided_buffers&) = delete;
  ~provided_buffers() { release(); }

  /// Allocates the buffers and registers them with `ring` as `group`.
  /// `count` must be a power of two (the kernel's rule) and at most 32 (the
  /// held-buffer mask). Returns 0, or a
  /// negative errno (-ENOMEM, or the kernel's: -EINVAL before Linux 5.19)
  /// and stays empty.
  int setup(io_uring& ring, unsigned short group, unsigned count, std::size_t size) noexcept {
    release();
    if (count == 0 || count > 32 || (count & (count - 1)) != 0) return -EINVAL;
    const std::size_t ring_bytes = count * sizeof(io_uring_buf);
    // The kernel wants the ring page-aligned; mmap gives whole pages.
    void* memory = ::mmap(nullptr, ring_bytes, PROT_READ | PROT_WRITE, MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
    if (memory == MAP_FAILED) return -ENOMEM;
    ring_ = static_cast<io_uring_buf_ring*>(memory);
    ring_bytes_ = ring_bytes;
    data_.reset(new (std::nothrow) std::byte[count * size]);
    if (!data_) {
      release();
      return -ENOMEM;
    }
    io_uring_buf_reg registration{};
    registration.ring_addr = reinterpret_cast<std::uint64_t>(ring_);
    registration.ring_entries = count;
    registration.bgid = group;
    if (int rc = io_uring_register_buf_ring(&ring, &registration, 0); rc < 0) {
      release();
      return rc;
    }
    count_ = count;
    size_ = size;
    group_ = group;
    io_uring_buf_ring_init(ring_);
    for (unsigned id = 0; id < count; ++id) {
      io_uring_buf_ring_add(ring_, buffer(id), static_cast<unsigned>(size), static_cast<unsigned short>(id),
                            io_uring_buf_ring_mask(count), static_cast<int>(id));
    }
    io_uring_buf_ring_advance(ring_, static_cast<int>(count));
    return 0;
  }

  /// Whether setup() succeeded.
  bool active() const noexcept { return count_ != 0; }
  /// The buffer group's id (the SQE's buf_group).
  unsigned short group() const noexcept { return group_; }
  /// Bytes per buffer.
  std::size_t size() const noexcept { return size_; }
  /// Buffer `id`, as a completion's IORING_CQE_BUFFER_SHIFT bits name it.
  std::byte* buffer(unsigned id) const noexcept { return data_.get() + static_cast<std::size_t>(id) * size_; }

  /// Keeps buffer `id` from the kernel until give_back_held(). A multishot
  /// recv that finds no buffer left ends (ENOBUFS).
  void hold(unsigned id) noexcept { held_ |= 1u << id; }

  /// Hands every held buffer back to the kernel.
  void give_back_held() noexcept {
    for (unsigned id = 0; held_ != 0; ++id, held_ >>= 1) {
      if (held_ & 1u) give_back(id);
    }
  }

  /// Hands buffer `id` back to the kernel.
  void give_back(unsigned id) noexcept {
    io_uring_buf_ring_add(ring_, buffer(id), static_cast<unsigned>(size_), static_cast<unsigned short>(id),
                          io_uring_buf_ring_mask(count_), 0);
    io_uring_buf_ring_advance(ring_, 1);
  }

 private:
  void release() noexcept {
    if (ring_) ::munmap(ring_, ring_bytes_);
    ring_ = nullptr;
    ring_bytes_ = 0;
    data_.reset();
    count_ = 0;
    size_ = 0;
    held_ = 0;
  }

  io_uring_buf_ring* ring_ = nullptr;
  std::size_t ring_bytes_ = 0;
  std::unique_ptr<std::byte[]> data_;
  unsigned count_ = 0;
  std::size_t size_ = 0;
  unsigned short group_ = 0;
  std::uint32_t held_ = 0;  ///< bit i: buffer i is held back (hold())
};

}  // namespace pdcoll::transport::uring_tcp::detail
