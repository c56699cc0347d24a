// File: detail/cpu_relax.hpp — the hint a busy-wait loop gives the CPU.
#pragma once

namespace pdcoll::detail {

/// Tells the CPU that the caller spins on memory another core will write
/// (x86 PAUSE, Arm YIELD): saves power and the memory-order flush on exit.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace pdcoll::detail
