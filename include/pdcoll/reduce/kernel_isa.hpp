// File: reduce/kernel_isa.hpp — which instruction set the reduction kernels
// (reduce/kernels.hpp) run with, chosen once per process at run time.
//
// The library is header-only and its users build for baseline x86-64, so the
// kernels cannot rely on the compiler's flags: where the CPU has AVX2 and F16C
// the built-in reductions run copies of the loops compiled for them
// (reduce/avx2_kernels.hpp), and everything else runs the baseline loops.
// Both give the same bits (element-wise IEEE operations, the same rounding
// and NaN encodings) for every input but one: where both operands of a sum
// or product are NaN, which of them comes out is unspecified (IEEE 754
// §6.2.3) and each compilation may pick the other. So the choice is a matter
// of speed only. PDCOLL_KERNEL_ISA=baseline forces the baseline loops
// (for comparison, or to rule the wide ones out when chasing a problem).
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>

/// 1 where the AVX2 kernels are compiled in: x86 with GCC or clang, unless
/// the build defines it to 0 (then only the baseline loops exist).
#ifndef PDCOLL_KERNELS_AVX2
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define PDCOLL_KERNELS_AVX2 1
#else
#define PDCOLL_KERNELS_AVX2 0
#endif
#endif
#if PDCOLL_KERNELS_AVX2
#include <cpuid.h>
#endif

namespace pdcoll::kernels {

/// An instruction set the reduction kernels can run with.
enum class kernel_isa : int {
  baseline = 0,  ///< the loops as the caller's compiler flags build them (SSE2 on plain x86-64)
  avx2 = 1,      ///< 256-bit AVX2 loops, F16C conversions for float16
};

/// "baseline" or "avx2".
constexpr const char* to_string(kernel_isa isa) noexcept { return isa == kernel_isa::avx2 ? "avx2" : "baseline"; }

/// Whether this CPU and this build can run `isa`: baseline always; avx2 on
/// x86 with AVX2 and F16C (and an OS that saves their registers). Cost: a
/// CPUID query, once per call; use kernel_isa_in_use() on hot paths.
inline bool kernel_isa_supported(kernel_isa isa) noexcept {
  if (isa == kernel_isa::baseline) return true;
#if PDCOLL_KERNELS_AVX2
  // __builtin_cpu_supports also checks that the OS saves the YMM registers;
  // clang 14's does not know "f16c", so that bit comes from CPUID leaf 1.
  __builtin_cpu_init();
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __builtin_cpu_supports("avx2") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
#else
  return false;
#endif
}

namespace detail {

/// The kernels' choice: -1 until the first kernel call (or use_kernel_isa) makes it.
inline std::atomic<int> selected_isa{-1};

/// The widest supported ISA unless PDCOLL_KERNEL_ISA says "baseline".
inline kernel_isa default_kernel_isa() noexcept {
  const char* forced = std::getenv("PDCOLL_KERNEL_ISA");
  if (forced && std::strcmp(forced, "baseline") == 0) return kernel_isa::baseline;
  return kernel_isa_supported(kernel_isa::avx2) ? kernel_isa::avx2 : kernel_isa::baseline;
}

}  // namespace detail

/// The ISA the kernels run with in this process: decided at the first call
/// (AVX2 where supported, unless PDCOLL_KERNEL_ISA=baseline), or by
/// use_kernel_isa(). Cost: one relaxed atomic load after the first call.
inline kernel_isa kernel_isa_in_use() noexcept {
  int isa = detail::selected_isa.load(std::memory_order_relaxed);
  if (isa < 0) {
    isa = static_cast<int>(detail::default_kernel_isa());
    int expected = -1;  // a concurrent first call or use_kernel_isa() may have decided already
    if (!detail::selected_isa.compare_exchange_strong(expected, isa, std::memory_order_relaxed)) isa = expected;
  }
  return static_cast<kernel_isa>(isa);
}

/// Makes the kernels run with `isa` from now on, in every thread; false (and
/// nothing changes) when this CPU or build cannot run it. Calls already
/// running finish with the ISA they started with. For benchmarks and tests;
/// results are the same bits either way (but for the NaN of NaN + NaN).
///
///     pdcoll::kernels::use_kernel_isa(pdcoll::kernels::kernel_isa::baseline);
inline bool use_kernel_isa(kernel_isa isa) noexcept {
  if (!kernel_isa_supported(isa)) return false;
  detail::selected_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
  return true;
}

}  // namespace pdcoll::kernels
