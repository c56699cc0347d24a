// File: transport/uring_tcp/detail/fixed_buffers.hpp — the ring's table of
// registered ("fixed") buffers: which slot holds which host range, how many
// bytes are pinned, and the lookup that tells a send whether its payload
// lies inside one.
//
// Why: a zero-copy send of ordinary memory pins its pages
// (get_user_pages) on every submission; a buffer registered once with
// io_uring_register_buffers_update_tag(3) stays pinned, and
// IORING_OP_SEND_ZC with IORING_RECVSEND_FIXED_BUF uses those pages as they
// are. Receives gain nothing: IORING_OP_RECV rejects the flag with EINVAL
// (checked on Linux 6.18; only IORING_OP_RECV_ZCRX, which needs NIC queue
// support, receives into registered memory), so only sends use the table.
//
// The table is sparse (io_uring_register_buffers_sparse, Linux ≥ 5.19) and
// registered on first use; a slot is filled by register_region and emptied
// by deregister. The kernel looks a fixed buffer up when the request is
// issued, not when it is submitted: a payload SQE linked behind a header
// that waits for socket space would find an emptied slot and fail with
// EFAULT (seen on Linux 6.18). So the table counts the sends submitted from
// each slot and not yet completed, and a slot deregistered under them is
// emptied when the last one completes; until then no new send finds it.
//
// Bounds: at most `slots` buffers (the kernel allows 16384 per ring), each
// at most 1 GiB (the kernel's limit), and at most `byte_limit` bytes pinned
// in all. Without CAP_IPC_LOCK the kernel also charges the pages to
// RLIMIT_MEMLOCK and answers ENOMEM past it. Every refusal is reported to
// the caller, which sends from unregistered memory instead.
//
// Caveat: the kernel sends from the pages pinned at registration. Memory
// that is unmapped (freed) and mapped again at the same address while still
// registered would be sent from the old pages, so a registration must be
// dropped before its memory is freed.
#pragma once

#include <liburing.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <vector>

namespace pdcoll::transport::uring_tcp::detail {

/// One slot of the table. `generation` changes whenever the slot is filled
/// or emptied, so a send that remembered the slot can tell whether it still
/// holds the same registration.
struct fixed_buffer {
  std::byte* base = nullptr;
  std::size_t length = 0;
  unsigned index = 0;            ///< the kernel's buf_index
  bool in_use = false;
  bool release_pending = false;  ///< deregistered while sends_in_flight > 0: emptied when they complete
  unsigned sends_in_flight = 0;  ///< payload SQEs submitted from this slot, not yet completed
  std::uint64_t generation = 0;

  /// Whether [address, address + n) lies inside this registration (one that
  /// is not waiting to be emptied).
  bool contains(const std::byte* address, std::size_t n) const noexcept {
    return in_use && !release_pending && address >= base && n <= length &&
           static_cast<std::size_t>(address - base) <= length - n;
  }
};

/// Why fixed_buffer_table::add refused a range.
enum class fixed_refusal : std::uint8_t {
  none,           ///< registered
  disabled,       ///< the table has no slots (options::fixed_buffer_slots == 0)
  unsupported,    ///< the kernel refused a sparse buffer table (Linux < 5.19)
  too_large,      ///< over 1 GiB, or over the table's pinned-byte limit
  slots_full,     ///< every slot holds a registration
  kernel,         ///< the kernel refused (see the errno returned alongside)
};

/// The registered-buffer table of one ring. Not thread-safe (the endpoint is not).
class fixed_buffer_table {
 public:
  /// Largest buffer the kernel registers (io_uring/rsrc.c: SZ_1G).
  static constexpr std::size_t max_buffer_bytes = std::size_t{1} << 30;
  /// Most buffers one ring holds (IORING_MAX_REG_BUFFERS).
  static constexpr unsigned max_slots = 1u << 14;

  /// A table of up to `slots` buffers and `byte_limit` pinned bytes;
  /// nothing is registered with the kernel until the first add().
  fixed_buffer_table(unsigned slots, std::size_t byte_limit) noexcept
      : capacity_(slots < max_slots ? slots : max_slots), byte_limit_(byte_limit) {}

  /// Registers [base, base + length) in a free slot. Returns the slot, or
  /// nullptr with `refusal` (and `error`, a negative errno, for
  /// fixed_refusal::kernel) saying why.
  fixed_buffer* add(io_uring& ring, std::byte* base, std::size_t length, fixed_refusal& refusal, int& error) noexcept {
    error = 0;
    if (capacity_ == 0) return refuse(refusal, fixed_refusal::disabled);
    if (table_failed_) return refuse(refusal, fixed_refusal::unsupported);
    if (length == 0 || length > max_buffer_bytes || length > byte_limit_ - pinned_) {
      return refuse(refusal, fixed_refusal::too_large);
    }
    if (!slots_) {
      try {
        slots_ = std::make_unique<fixed_buffer[]>(capacity_);
        free_.reserve(capacity_);
      } catch (...) {
        slots_.reset();
        return refuse(refusal, fixed_refusal::kernel);
      }
      if (int rc = io_uring_register_buffers_sparse(&ring, capacity_); rc < 0) {
        table_failed_ = true;
        slots_.reset();
        error = rc;
        return refuse(refusal, fixed_refusal::unsupported);
      }
      for (unsigned i = capacity_; i-- > 0;) {
        slots_[i].index = i;
        free_.push_back(i);
      }
    }
    if (free_.empty()) return refuse(refusal, fixed_refusal::slots_full);
    fixed_buffer& slot = slots_[free_.back()];
    iovec range{base, length};
    __u64 tag = 0;
    if (int rc = io_uring_register_buffers_update_tag(&ring, slot.index, &range, &tag, 1); rc < 0) {
      error = rc;
      return refuse(refusal, fixed_refusal::kernel);
    }
    free_.pop_back();
    try {
      by_address_.emplace(reinterpret_cast<std::uintptr_t>(base), &slot);
    } catch (...) {
      clear(ring, slot);
      free_.push_back(slot.index);
      error = -ENOMEM;
      return refuse(refusal, fixed_refusal::kernel);
    }
    slot.base = base;
    slot.length = length;
    slot.in_use = true;
    ++slot.generation;
    pinned_ += length;
    refusal = fixed_refusal::none;
    return &slot;
  }

  /// Empties `slot` (a pointer add() returned and not yet removed), or,
  /// while sends from it are in flight, hides it from find() and empties it
  /// when the last of them completes (send_completed).
  void remove(io_uring& ring, fixed_buffer* slot) noexcept {
    if (!slot || !slot->in_use || slot->release_pending) return;
    if (slot->sends_in_flight > 0) {
      slot->release_pending = true;
      ++slot->generation;  // the handle that named it names nothing now
      return;
    }
    release(ring, *slot);
  }

  /// A payload SQE from `slot` was submitted.
  static void send_submitted(fixed_buffer& slot) noexcept { ++slot.sends_in_flight; }

  /// A payload SQE from `slot` completed (its result CQE, whatever the
  /// result): the kernel has looked the buffer up or never will. Empties a
  /// slot deregistered meanwhile once no send is left.
  void send_completed(io_uring& ring, fixed_buffer& slot) noexcept {
    if (slot.sends_in_flight > 0) --slot.sends_in_flight;
    if (slot.sends_in_flight == 0 && slot.release_pending) release(ring, slot);
  }

  /// The registration holding [address, address + n): `hint` when it does,
  /// else the registration starting nearest below `address` (ranges
  /// registered with the same start are all tried). nullptr when none does.
  fixed_buffer* find(const std::byte* address, std::size_t n, fixed_buffer* hint) const noexcept {
    if (hint && hint->contains(address, n)) return hint;
    if (by_address_.empty()) return nullptr;
    auto it = by_address_.upper_bound(reinterpret_cast<std::uintptr_t>(address));
    if (it == by_address_.begin()) return nullptr;
    const std::uintptr_t start = std::prev(it)->first;
    while (it != by_address_.begin()) {
      --it;
      if (it->first != start) break;
      if (it->second->contains(address, n)) return it->second;
    }
    return nullptr;
  }

  /// The slot `descriptor` names, when it is one of this table's slots
  /// (registration handles carry it); nullptr for anything else.
  fixed_buffer* slot_of(const void* descriptor) const noexcept {
    if (!descriptor || !slots_) return nullptr;
    const auto at = reinterpret_cast<std::uintptr_t>(descriptor);
    const auto first = reinterpret_cast<std::uintptr_t>(slots_.get());
    if (at < first || at >= first + capacity_ * sizeof(fixed_buffer) || (at - first) % sizeof(fixed_buffer) != 0) {
      return nullptr;
    }
    return &slots_[(at - first) / sizeof(fixed_buffer)];
  }

  /// Buffers registered now.
  std::size_t registered() const noexcept { return by_address_.size(); }
  /// Bytes pinned by them.
  std::size_t pinned_bytes() const noexcept { return pinned_; }
  /// Most buffers the table can hold.
  unsigned capacity() const noexcept { return capacity_; }

 private:
  // Empties `slot` now: off the address index, out of the kernel's table.
  void release(io_uring& ring, fixed_buffer& slot) noexcept {
    auto [first, last] = by_address_.equal_range(reinterpret_cast<std::uintptr_t>(slot.base));
    for (auto it = first; it != last; ++it) {
      if (it->second == &slot) {
        by_address_.erase(it);
        break;
      }
    }
    clear(ring, slot);
    pinned_ -= slot.length;
    slot.base = nullptr;
    slot.length = 0;
    slot.in_use = false;
    slot.release_pending = false;
    ++slot.generation;
    free_.push_back(slot.index);  // reserved for capacity_ entries: cannot throw
  }

  static fixed_buffer* refuse(fixed_refusal& out, fixed_refusal why) noexcept {
    out = why;
    return nullptr;
  }

  static void clear(io_uring& ring, fixed_buffer& slot) noexcept {
    // An empty iovec (NULL, 0) turns a slot back into a sparse hole.
    iovec empty{nullptr, 0};
    __u64 tag = 0;
    io_uring_register_buffers_update_tag(&ring, slot.index, &empty, &tag, 1);
  }

  unsigned capacity_;
  std::size_t byte_limit_;
  std::size_t pinned_ = 0;
  bool table_failed_ = false;
  std::unique_ptr<fixed_buffer[]> slots_;
  std::vector<unsigned> free_;
  std::multimap<std::uintptr_t, fixed_buffer*> by_address_;
};

}  // namespace pdcoll::transport::uring_tcp::detail
