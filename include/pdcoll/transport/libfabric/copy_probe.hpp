// File: transport/libfabric/copy_probe.hpp — whether bulk transfers between
// ranks on one host go faster through node memory or as messages, measured
// by every shm rank at setup.
//
// Through node memory a block is copied twice in user space (into the
// sender's slot, out of it by the receiver), in slot-sized steps that stay
// in cache; as a message it is copied once by the kernel (pdcoll's
// rendezvous, or the provider's CMA: process_vm_readv). Which costs less is
// the machine's business, not the size's alone: on the 2-vCPU VMs of
// sessions 19-43 one kernel copy led from 64 KiB on 2 ranks (all-gather 1
// MiB 20-21 GB/s bus bandwidth by the ring against 8 through the slots), on
// session 45's AMD EPYC VM the kernel copies 256 KiB at 14-15 GB/s, pinning
// every page, where memcpy runs at 120 GB/s in cache, and the slots lead at
// every size (2 ranks, all-gather 1 MiB 28.5 against 13.8; design-notes item
// 48). So each rank times both copies of copy_probe_bytes on itself
// (process_vm_readv of its own memory takes the kernel's path for a peer's:
// 17.2 against 16.6 µs there), publishes the figures with its shm address,
// and every rank reads the same figures and reaches the same verdict.
// Where some pair of ranks may not read each other, or a rank's provider
// has its CMA path off (FI_HMEM), messages take the provider's buffers and
// the slots win unmeasured. PDCOLL_NODE_BULK=slots or =messages decides
// instead (the lowest rank that sets it wins, so ranks that disagree still
// agree).
#pragma once

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

namespace pdcoll::transport::libfabric::detail {

/// Bytes each probe copies: a size where the choice matters (automatic's
/// message and slot paths meet between 64 KiB and 256 KiB).
inline constexpr std::size_t copy_probe_bytes = std::size_t{256} << 10;

/// One rank's measurement, in nanoseconds per copy_probe_bytes; 0 where it
/// could not measure (process_vm_readv refused, no memory).
struct copy_probe {
  std::uint64_t kernel_ns = 0;  ///< one process_vm_readv of this process's own memory
  std::uint64_t user_ns = 0;    ///< two memcpy in a row: into a buffer and out of it
};

/// Times both copies, the fastest of `rounds` after one untimed round each
/// (the fastest: a rank preempted during a copy says nothing of the copy).
/// About 0.2 ms on the machines measured, the first touch of its 768 KiB
/// included.
inline copy_probe measure_copies(int rounds = 5) noexcept {
  const std::size_t n = copy_probe_bytes;
  std::unique_ptr<std::byte[]> memory(new (std::nothrow) std::byte[3 * n]);
  if (!memory) return {};
  std::byte* const source = memory.get();
  std::byte* const middle = source + n;
  std::byte* const target = middle + n;
  std::memset(memory.get(), 1, 3 * n);
  using clock = std::chrono::steady_clock;
  auto fastest = [&](auto copy) {
    std::uint64_t best = UINT64_MAX;
    for (int i = 0; i <= rounds; ++i) {
      const auto t0 = clock::now();
      if (!copy()) return std::uint64_t{0};
      const auto ns = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - t0).count());
      if (i > 0) best = std::min(best, std::max<std::uint64_t>(ns, 1));
    }
    return best;
  };
  copy_probe probe;
  probe.kernel_ns = fastest([&] {
    iovec local{target, n}, remote{source, n};
    return ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) == static_cast<ssize_t>(n);
  });
  probe.user_ns = fastest([&] {
    std::memcpy(middle, source, n);
    asm volatile("" : : "r"(middle) : "memory");  // the copies must happen
    std::memcpy(target, middle, n);
    asm volatile("" : : "r"(target) : "memory");
    return true;
  });
  return probe;
}

/// This process's measurement, taken once: every endpoint it opens (a
/// group's too) publishes the same figures.
inline copy_probe measured_copies() noexcept {
  static const copy_probe probe = measure_copies();
  return probe;
}

/// This rank's token for the setup exchange: PDCOLL_NODE_BULK's "slots" or
/// "messages" when set to one of them, else "<kernel_ns>/<user_ns>" from
/// measured_copies(), with 0 for the kernel's copy where this rank's
/// messages cannot take it (`kernel_copies` false: FI_HMEM on shm turns the
/// provider's CMA off). Any other PDCOLL_NODE_BULK value is reported in
/// `ignored` and measured over.
inline std::string copy_probe_token(bool kernel_copies, std::string& ignored) {
  if (const char* v = std::getenv("PDCOLL_NODE_BULK"); v && *v) {
    if (!std::strcmp(v, "slots") || !std::strcmp(v, "messages")) return v;
    ignored = v;
  }
  const copy_probe p = measured_copies();
  return std::to_string(kernel_copies ? p.kernel_ns : 0) + "/" + std::to_string(p.user_ns);
}

/// The verdict from every rank's token, in rank order, the same on every
/// rank that reads the same tokens: the lowest rank whose token is "slots"
/// or "messages" decides. Else the slots where some pair of ranks may not
/// read each other (`all_readable` false: their messages go through the
/// provider's buffers, not one kernel copy), where some rank has no kernel
/// figure (refused, FI_HMEM, no token), or where the ranks' two user-space
/// copies take less time, summed, than their kernel copies.
inline bool bulk_through_slots(const std::vector<std::string>& tokens, bool all_readable) noexcept {
  for (const auto& t : tokens) {
    if (t == "slots") return true;
    if (t == "messages") return false;
  }
  if (!all_readable || tokens.empty()) return true;
  std::uint64_t kernel = 0, user = 0;
  for (const auto& t : tokens) {
    unsigned long long k = 0, u = 0;
    if (std::sscanf(t.c_str(), "%llu/%llu", &k, &u) != 2 || k == 0 || u == 0) return true;
    kernel += k;
    user += u;
  }
  return user < kernel;
}

}  // namespace pdcoll::transport::libfabric::detail
